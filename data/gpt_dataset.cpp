// data/gpt_dataset.cpp — Megatron's GPT sample indices, numpy's RandomState,
// and the on-disk index cache.
#include "data/gpt_dataset.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/number.h"
#include "core/log.h"
#include "core/timer.h"

namespace mpitron::data {

// ---- numpy RandomState (MT19937) ----------------------------------------------------
NumpyRandomState::NumpyRandomState(uint32_t seed) {
  // numpy's mt19937_seed (legacy seeding of an int): Knuth's init_genrand.
  mt_[0] = seed;
  for (int i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  pos_ = 624;
}

uint32_t NumpyRandomState::next_uint32() {
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kMatrix = 0x9908b0dfu;
  if (pos_ >= 624) {
    int k = 0;
    for (; k < 624 - 397; ++k) {
      uint32_t y = (mt_[k] & kUpper) | (mt_[k + 1] & kLower);
      mt_[k] = mt_[k + 397] ^ (y >> 1) ^ ((y & 1u) ? kMatrix : 0u);
    }
    for (; k < 623; ++k) {
      uint32_t y = (mt_[k] & kUpper) | (mt_[k + 1] & kLower);
      mt_[k] = mt_[k + 397 - 624] ^ (y >> 1) ^ ((y & 1u) ? kMatrix : 0u);
    }
    uint32_t y = (mt_[623] & kUpper) | (mt_[0] & kLower);
    mt_[623] = mt_[396] ^ (y >> 1) ^ ((y & 1u) ? kMatrix : 0u);
    pos_ = 0;
  }
  uint32_t y = mt_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::next_uint64() {
  uint64_t hi = next_uint32();
  return (hi << 32) | next_uint32();
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t v;
  if (max <= 0xffffffffull) {
    while ((v = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((v = (next_uint64() & mask)) > max) {
    }
  }
  return v;
}

// ---- split ----------------------------------------------------------------------------
std::vector<double> parse_split_weights(const std::string& split) {
  // Megatron finds the numbers with re.findall(r"[.0-9]+"), which reads "90,-5,15" as
  // 90,5,15 and "nan,5,5" as 5,5: here every comma- (or '/'-) separated field must
  // be a finite number >= 0.
  std::vector<double> w;
  const char* hint = "use e.g. --split 969,30,1 (up to three weights >= 0, comma-separated)";
  size_t start = 0;
  while (start <= split.size()) {
    size_t end = split.find_first_of(",/", start);
    if (end == std::string::npos) end = split.size();
    std::istringstream fields(split.substr(start, end - start));  // "0.8 0.1 0.1" is space-separated
    std::string field;
    int in_field = 0;
    while (fields >> field) {
      double v = 0;
      MPT_CHECK(parse_decimal(field, &v), str("--split '", split, "': '", field, "' is not a decimal number"), hint);
      MPT_CHECK(std::isfinite(v) && v >= 0, str("--split '", split, "': weight ", field, " must be finite and >= 0"),
                hint);
      w.push_back(v);
      ++in_field;
    }
    MPT_CHECK(in_field > 0, str("--split '", split, "' has an empty field"), hint);
    start = end + 1;
  }
  MPT_CHECK(!w.empty() && w.size() <= 3, str("--split '", split, "' must hold 1 to 3 weights (train,valid,test)"), hint);
  MPT_CHECK(w[0] + (w.size() > 1 ? w[1] : 0) + (w.size() > 2 ? w[2] : 0) > 0, str("--split '", split, "' sums to 0"),
            hint);
  return w;
}

std::array<DocRange, 3> split_document_ranges(const std::string& split, int64_t num_documents, SplitRule rule) {
  // Megatron: the numbers of split, padded with 0 to 3, normalised.
  std::vector<double> w = parse_split_weights(split);
  w.resize(3, 0.0);
  const double sum = w[0] + w[1] + w[2];
  MPT_CHECK(sum > 0, str("--split '", split, "' sums to 0"), "use e.g. --split 969,30,1");
  MPT_CHECK(num_documents >= 0, str("negative document count ", num_documents), "");
  for (double& x : w) x /= sum;
  const double n = static_cast<double>(num_documents);
  // Python round(): half to even on the double; nearbyint under the default rounding mode.
  auto round_even = [](double x) { return static_cast<int64_t>(std::nearbyint(x)); };
  std::array<int64_t, 4> b{0, 0, 0, 0};
  if (rule == SplitRule::MegatronCore) {
    double c = 0;
    for (int k = 0; k < 3; ++k) {
      c += w[k];
      b[k + 1] = round_even(c * n);
    }
    std::array<DocRange, 3> r;
    double lo = 0;
    for (int k = 0; k < 3; ++k) {
      // A zero-weight split is None in megatron-core: an empty range here.
      r[k] = w[k] > 0 ? DocRange{round_even(lo * n), b[k + 1]} : DocRange{b[k + 1], b[k + 1]};
      lo += w[k];
    }
    return r;
  }
  for (int k = 0; k < 3; ++k) b[k + 1] = b[k] + round_even(w[k] * n);
  const int64_t over = b[3] - num_documents;
  for (int k = 1; k < 4; ++k) b[k] -= over;
  std::array<DocRange, 3> r;
  for (int k = 0; k < 3; ++k) r[k] = DocRange{b[k], b[k + 1]};
  return r;
}

// ---- indices --------------------------------------------------------------------------
GPTIndices build_gpt_indices(const std::vector<int64_t>& doc_lengths, DocRange docs, int64_t seq_length,
                             int64_t num_samples, uint32_t seed) {
  MPT_CHECK(seq_length > 0, str("sequence length ", seq_length, " must be positive"), "");
  MPT_CHECK(docs.begin >= 0 && docs.end <= static_cast<int64_t>(doc_lengths.size()) && docs.begin <= docs.end,
            str("document range [", docs.begin, ", ", docs.end, ") outside the ", doc_lengths.size(), " documents"),
            "");
  MPT_CHECK(docs.end - docs.begin <= std::numeric_limits<int32_t>::max(), "more than 2^31 documents in a split", "");
  int64_t tokens_per_epoch = 0;
  for (int64_t d = docs.begin; d < docs.end; ++d) tokens_per_epoch += doc_lengths[d];
  const int64_t extra = 1;  // add_extra_token_to_sequence: a sample holds seq_length + 1 tokens
  MPT_CHECK(tokens_per_epoch >= seq_length + extra,
            str("the split (documents [", docs.begin, ", ", docs.end, ")) holds ", tokens_per_epoch,
                " tokens, fewer than one sample of --seq-length ", seq_length, " needs (", seq_length + extra, ")"),
            "use a shorter --seq-length, more data, or a larger share of --split for this split");

  GPTIndices out;
  // Epochs: until epochs × tokens_per_epoch ≥ num_samples × seq_length + 1.
  int64_t num_epochs = 1;
  if (num_samples > 0) {
    const int64_t requested = num_samples * seq_length + extra;
    for (int64_t tokens = tokens_per_epoch; tokens < requested; tokens += tokens_per_epoch) ++num_epochs;
  }
  bool separate_final_epoch = false;
  int64_t samples_sans_final = 0;
  if (num_epochs > 1) {
    samples_sans_final = ((num_epochs - 1) * tokens_per_epoch - extra) / seq_length;
    const int64_t from_final = num_samples - samples_sans_final;
    const int64_t per_epoch = (tokens_per_epoch - extra) / seq_length;
    MPT_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "inconsistent epoch arithmetic", "");
    separate_final_epoch = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  out.num_epochs = num_epochs;
  out.separate_final_epoch = separate_final_epoch;

  NumpyRandomState rng(seed);
  // doc_idx: each epoch lists the split's documents in order; shuffled as one
  // block, or (separate final epoch) the first epochs then the last.
  const int64_t ndocs = docs.size();
  out.doc_idx.resize(static_cast<size_t>(num_epochs * ndocs));
  for (int64_t e = 0; e < num_epochs; ++e)
    for (int64_t d = 0; d < ndocs; ++d) out.doc_idx[e * ndocs + d] = static_cast<int32_t>(docs.begin + d);
  if (!separate_final_epoch) {
    rng.shuffle(out.doc_idx.data(), static_cast<int64_t>(out.doc_idx.size()));
  } else {
    rng.shuffle(out.doc_idx.data(), (num_epochs - 1) * ndocs);
    rng.shuffle(out.doc_idx.data() + (num_epochs - 1) * ndocs, ndocs);
  }

  // sample_idx (helpers.cpp build_sample_idx, drop_last_partial_sequence = true).
  const int64_t n = (num_epochs * tokens_per_epoch - extra) / seq_length;
  out.sample_idx.resize(static_cast<size_t>(2 * (n + 1)));
  int64_t di = 0, offset = 0;
  out.sample_idx[0] = 0;
  out.sample_idx[1] = 0;
  const int64_t ndoc_idx = static_cast<int64_t>(out.doc_idx.size());
  for (int64_t s = 1; s <= n; ++s) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t doc_len = doc_lengths[out.doc_idx[di]] - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - extra;
        remaining = 0;
      } else {
        if (di == ndoc_idx - 1) {  // only for the very last sample
          MPT_CHECK(s == n, "sample index ran out of documents", "");
          offset = doc_lengths[out.doc_idx[di]] - extra;
          break;
        }
        ++di;
        offset = 0;
      }
    }
    out.sample_idx[2 * s] = di;
    out.sample_idx[2 * s + 1] = offset;
  }

  // shuffle_idx: arange(rows) shuffled; the rows of a separate final epoch apart.
  const int64_t first = separate_final_epoch ? samples_sans_final : n;
  out.shuffle_idx.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.shuffle_idx[i] = i;
  rng.shuffle(out.shuffle_idx.data(), first);
  if (first < n) rng.shuffle(out.shuffle_idx.data() + first, n - first);
  return out;
}

// ---- cache file -------------------------------------------------------------------------
namespace {

constexpr char kCacheMagic[8] = {'M', 'P', 'T', 'G', 'P', 'T', 'I', 'X'};
constexpr uint64_t kCacheVersion = 1;

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

struct CacheHeader {
  char magic[8];
  uint64_t version, key;
  int64_t num_epochs, separate_final_epoch, n_doc, n_sample, n_shuffle;
};

template <typename T> void append_bytes(std::string& buf, const std::vector<T>& v) {
  buf.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

bool load_cache(const std::string& path, uint64_t key, GPTIndices& out, std::string& why) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    why = "absent";
    return false;
  }
  std::string buf;
  char tmp[1 << 16];
  size_t got;
  while ((got = std::fread(tmp, 1, sizeof tmp, f)) > 0) buf.append(tmp, got);
  std::fclose(f);
  CacheHeader h;
  if (buf.size() < sizeof h + 8) return why = "truncated", false;
  std::memcpy(&h, buf.data(), sizeof h);
  if (std::memcmp(h.magic, kCacheMagic, 8) != 0 || h.version != kCacheVersion) return why = "bad header", false;
  if (h.key != key) return why = "stale key", false;
  if (h.n_doc < 0 || h.n_sample < 0 || h.n_shuffle < 0) return why = "bad header", false;
  const size_t body = static_cast<size_t>(h.n_doc) * 4 + static_cast<size_t>(h.n_sample + h.n_shuffle) * 8;
  if (buf.size() != sizeof h + body + 8) return why = "wrong size", false;
  uint64_t sum;
  std::memcpy(&sum, buf.data() + sizeof h + body, 8);
  if (sum != fnv1a(buf.data(), sizeof h + body)) return why = "checksum mismatch", false;
  const char* p = buf.data() + sizeof h;
  out.num_epochs = h.num_epochs;
  out.separate_final_epoch = h.separate_final_epoch != 0;
  out.doc_idx.resize(h.n_doc);
  std::memcpy(out.doc_idx.data(), p, h.n_doc * 4);
  p += h.n_doc * 4;
  out.sample_idx.resize(h.n_sample);
  std::memcpy(out.sample_idx.data(), p, h.n_sample * 8);
  p += h.n_sample * 8;
  out.shuffle_idx.resize(h.n_shuffle);
  std::memcpy(out.shuffle_idx.data(), p, h.n_shuffle * 8);
  return true;
}

bool save_cache(const std::string& path, uint64_t key, const GPTIndices& idx) {
  CacheHeader h;
  std::memcpy(h.magic, kCacheMagic, 8);
  h.version = kCacheVersion;
  h.key = key;
  h.num_epochs = idx.num_epochs;
  h.separate_final_epoch = idx.separate_final_epoch;
  h.n_doc = static_cast<int64_t>(idx.doc_idx.size());
  h.n_sample = static_cast<int64_t>(idx.sample_idx.size());
  h.n_shuffle = static_cast<int64_t>(idx.shuffle_idx.size());
  std::string buf(reinterpret_cast<const char*>(&h), sizeof h);
  append_bytes(buf, idx.doc_idx);
  append_bytes(buf, idx.sample_idx);
  append_bytes(buf, idx.shuffle_idx);
  uint64_t sum = fnv1a(buf.data(), buf.size());
  buf.append(reinterpret_cast<const char*>(&sum), 8);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
  ok = (std::fclose(f) == 0) && ok;
  ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) std::remove(tmp.c_str());
  return ok;
}

}  // namespace

// ---- GPTDataset ---------------------------------------------------------------------------
GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, const GPTDatasetConfig& cfg,
                       const std::string& name)
    : data_(std::move(data)), docs_(docs), cfg_(cfg), name_(name) {
  MPT_CHECK(data_ != nullptr, "GPTDataset needs data", "");
  const IndexedDataset& ds = *data_;
  const int64_t ndocs = ds.document_count();
  MPT_CHECK(docs.begin >= 0 && docs.end <= ndocs && docs.begin < docs.end,
            str(name, " split of '", ds.prefix(), "': document range [", docs.begin, ", ", docs.end,
                ") is empty or outside its ", ndocs, " documents"),
            "give this split a larger share in --split, or more documents");
  // A document is a run of sequences, contiguous in .bin (the reader checked it).
  const int64_t itemsize = static_cast<int64_t>(dtype_size(ds.dtype()));
  doc_start_.resize(ndocs);
  doc_len_.resize(ndocs);
  const int64_t* di = ds.document_indices();
  for (int64_t d = 0; d < ndocs; ++d) {
    int64_t s0, s1;
    std::memcpy(&s0, di + d, 8);
    std::memcpy(&s1, di + d + 1, 8);
    int64_t len = 0;
    for (int64_t s = s0; s < s1; ++s) len += ds.sequence_length(s);
    int64_t ptr = 0;
    if (s0 < ds.sequence_count()) std::memcpy(&ptr, ds.sequence_pointers() + s0, 8);
    doc_start_[d] = ptr / itemsize;
    doc_len_[d] = len;
  }

  // Cache key: everything that changes the indices.
  const std::string desc =
      str("mpitron GPTDataset indices v", kCacheVersion, "|idx=", fnv1a(ds.idx_file().data(), ds.idx_file().size()),
          "|bin_bytes=", ds.bin_file().size(), "|docs=", docs.begin, ",", docs.end, "|seq=", cfg.sequence_length,
          "|samples=", cfg.num_samples, "|seed=", cfg.seed, "|extra_token=1|drop_last=1");
  const uint64_t key = fnv1a(desc.data(), desc.size());
  if (cfg.use_cache) {
    namespace fs = std::filesystem;
    fs::path prefix(ds.prefix());
    fs::path dir = cfg.cache_dir.empty() ? prefix.parent_path() : fs::path(cfg.cache_dir);
    if (dir.empty()) dir = ".";
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
    cache_path_ = (dir / (prefix.filename().string() + "_" + name + "_" + hex + ".gptidx")).string();
    std::string why;
    if (load_cache(cache_path_, key, indices_, why)) {
      loaded_from_cache_ = true;
      log_debug("GPTDataset ", name, ": loaded indices from ", cache_path_);
    } else {
      if (why != "absent") log_warn("GPTDataset ", name, ": cache ", cache_path_, " is unusable (", why, "), rebuilding");
      Timer t;
      indices_ = build_gpt_indices(doc_len_, docs, cfg.sequence_length, cfg.num_samples, cfg.seed);
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (!save_cache(cache_path_, key, indices_)) {
        log_warn("GPTDataset ", name, ": cannot write index cache ", cache_path_,
                 " (read-only?); indices stay in memory. Set --data-cache-path to a writable directory.");
        cache_path_.clear();
      }
      log_info("GPTDataset ", name, ": built indices (", indices_.num_samples(), " samples, ", indices_.num_epochs,
               " epochs) in ", t.seconds(), " s");
    }
  } else {
    indices_ = build_gpt_indices(doc_len_, docs, cfg.sequence_length, cfg.num_samples, cfg.seed);
  }
  MPT_CHECK(indices_.num_samples() > 0, str(name, " split of '", ds.prefix(), "' yields no sample"), "");
  MPT_CHECK(cfg.num_samples <= 0 || indices_.num_samples() >= cfg.num_samples,
            str(name, " split of '", ds.prefix(), "' yields ", indices_.num_samples(), " samples, ",
                cfg.num_samples, " were asked for"),
            "");
}

void GPTDataset::copy_doc_tokens(int64_t doc, int64_t offset, int64_t n, int32_t* out) const {
  if (n <= 0) return;
  MPT_CHECK(offset >= 0 && offset + n <= doc_len_[doc],
            str("token range [", offset, ", ", offset + n, ") outside document ", doc, " (", doc_len_[doc],
                " tokens) of '", data_->prefix(), "'"),
            "");
  // The whole .bin is one run of tokens; a document is a slice of it.
  TokenView v;
  v.dtype = data_->dtype();
  v.size = n;
  v.data = data_->bin_file().data() + (doc_start_[doc] + offset) * static_cast<int64_t>(dtype_size(v.dtype));
  v.copy_to(out);
}

void GPTDataset::sample(int64_t i, int32_t* out) const {
  MPT_CHECK(i >= 0 && i < size(),
            str("sample ", i, " out of range: the ", name_, " split of '", data_->prefix(), "' has ", size(),
                " samples"),
            "");
  const int64_t row = indices_.shuffle_idx[i];
  const int64_t d0 = indices_.sample_idx[2 * row], o0 = indices_.sample_idx[2 * row + 1];
  const int64_t d1 = indices_.sample_idx[2 * row + 2], o1 = indices_.sample_idx[2 * row + 3];
  int64_t written = 0;
  if (d0 == d1) {
    copy_doc_tokens(indices_.doc_idx[d0], o0, o1 - o0 + 1, out);
    written = o1 - o0 + 1;
  } else {
    for (int64_t d = d0; d <= d1; ++d) {
      const int64_t doc = indices_.doc_idx[d];
      const int64_t begin = d == d0 ? o0 : 0;
      const int64_t end = d == d1 ? o1 + 1 : doc_len_[doc];
      copy_doc_tokens(doc, begin, end - begin, out + written);
      written += end - begin;
    }
  }
  MPT_CHECK(written == cfg_.sequence_length + 1,
            str("sample ", i, " of '", data_->prefix(), "' has ", written, " tokens, expected ",
                cfg_.sequence_length + 1, " (index cache inconsistent with the data?)"),
            "delete the .gptidx cache files beside the data and restart");
}

std::vector<int32_t> GPTDataset::sample(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(cfg_.sequence_length + 1));
  sample(i, out.data());
  return out;
}

}  // namespace mpitron::data
