// data/gpt_dataset.h — what one GPT training sample is, exactly as
// megatron-core's GPTDataset builds it (DATA.md):
//   split "969,30,1" → document ranges; doc_idx (documents of the split once per
//   epoch, shuffled with numpy.random.RandomState(seed), a short last epoch
//   shuffled separately); sample_idx (rows (position in doc_idx, offset) every
//   seq_len tokens); shuffle_idx (permutation of the rows, the last partial
//   epoch separately). Sample i = the seq_len + 1 tokens from row
//   shuffle_idx[i] to the next row, across document boundaries.
// The three index arrays are cached on disk beside the data (or in
// cache_dir), keyed by a hash of everything that changes them.
//
// Multi-rank use: let one rank construct first (it builds and writes the
// cache), barrier, then the others construct (they load it). Files are written
// to a temporary name and renamed, so a reader never sees half a file.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace mpitron::data {

// numpy.random.RandomState(seed) for an int seed: MT19937 seeded like numpy's
// legacy seeding (init_genrand), with RandomState.shuffle's Fisher–Yates and
// numpy's bounded integers (mask + rejection), so shuffles match numpy's.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed);
  uint32_t next_uint32();
  uint64_t next_uint64();  // two draws, high word first (numpy's mt19937_next64)
  // Uniform in [0, max] (numpy's random_interval / legacy masked bounded int).
  uint64_t random_interval(uint64_t max);
  // RandomState.shuffle of a 1-D array: for i = n-1 .. 1 swap x[i], x[random_interval(i)].
  template <typename T> void shuffle(T* x, int64_t n) {
    for (int64_t i = n - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(random_interval(static_cast<uint64_t>(i)));
      T t = x[i];
      x[i] = x[j];
      x[j] = t;
    }
  }

 private:
  uint32_t mt_[624];
  int pos_;
};

// Document range [begin, end) of one split.
struct DocRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// How a split string becomes document ranges. The numbers in `split` (e.g.
// "969,30,1" or "98/2/0"; up to 3, missing ones are 0) are normalised to sum 1.
//   MegatronCore (default; megatron-core BlendedMegatronDatasetBuilder):
//     cumulative bookends c = [0, w0, w0+w1, w0+w1+w2] (double sums in that
//     order), split k = [round(c[k]·N), round(c[k+1]·N)), round = half to even.
//   Legacy (Megatron-DeepSpeed, Megatron-LM before megatron-core):
//     b[k+1] = b[k] + round(w[k]·N), then b[1..3] -= b[3] − N.
enum class SplitRule { MegatronCore, Legacy };
// The 1 to 3 weights of a --split string ("969, 30, 1"); each must be a finite number >= 0.
std::vector<double> parse_split_weights(const std::string& split);
std::array<DocRange, 3> split_document_ranges(const std::string& split, int64_t num_documents,
                                              SplitRule rule = SplitRule::MegatronCore);

// The three index arrays (megatron-core gpt_dataset.py + helpers.cpp).
struct GPTIndices {
  std::vector<int32_t> doc_idx;     // [epochs × split documents] document ids
  std::vector<int64_t> sample_idx;  // [(num_samples + 1) × 2] (doc_idx position, token offset)
  std::vector<int64_t> shuffle_idx; // [num_samples] row of sample i
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t num_samples() const { return static_cast<int64_t>(shuffle_idx.size()); }
};

// doc_lengths: tokens of every document of the dataset (indexed by document id);
// the split is documents [docs.begin, docs.end). num_samples ≤ 0 means one epoch.
// Throws when the split holds fewer than seq_length + 1 tokens.
GPTIndices build_gpt_indices(const std::vector<int64_t>& doc_lengths, DocRange docs, int64_t seq_length,
                             int64_t num_samples, uint32_t seed);

struct GPTDatasetConfig {
  int64_t sequence_length = 1024;  // --seq-length: a sample holds sequence_length + 1 tokens
  int64_t num_samples = 0;         // samples wanted (train_iters × global batch); 0: one epoch
  uint32_t seed = 1234;            // --seed (numpy RandomState for the shuffles)
  std::string cache_dir;           // --data-cache-path; "": the directory of the data files
  bool use_cache = true;           // false: always build in memory, write nothing
};

class GPTDataset {
 public:
  // `name` ("train", "valid", "test") only labels messages and cache files.
  GPTDataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, const GPTDatasetConfig& cfg,
             const std::string& name = "train");

  int64_t size() const { return indices_.num_samples(); }
  int64_t sequence_length() const { return cfg_.sequence_length; }
  // Writes the seq_len + 1 tokens of sample i (inputs = [:-1], labels = [1:]).
  void sample(int64_t i, int32_t* out) const;
  std::vector<int32_t> sample(int64_t i) const;

  const GPTIndices& indices() const { return indices_; }
  const std::string& cache_path() const { return cache_path_; }  // "" when not cached
  bool loaded_from_cache() const { return loaded_from_cache_; }
  const IndexedDataset& data() const { return *data_; }

 private:
  void copy_doc_tokens(int64_t doc, int64_t offset, int64_t n, int32_t* out) const;

  std::shared_ptr<const IndexedDataset> data_;
  DocRange docs_;
  GPTDatasetConfig cfg_;
  std::string name_;
  std::vector<int64_t> doc_start_, doc_len_;  // [documents] token offset in .bin, tokens
  GPTIndices indices_;
  std::string cache_path_;
  bool loaded_from_cache_ = false;
};

}  // namespace mpitron::data
