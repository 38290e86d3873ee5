// data/indexed_dataset.h — Megatron's `.bin/.idx` (MMIDIDX version 1), read by
// mmap with zero-copy views and written byte-identically to megatron-core's
// IndexedDatasetBuilder. Layout (little-endian, no padding; DATA.md):
//   .idx: "MMIDIDX\0\0" | u64 version=1 | u8 dtype | u64 sequence_count |
//         u64 document_count (= documents + 1) | i32 lengths[sequence_count] |
//         i64 pointers[sequence_count] (byte offset in .bin) |
//         i64 document_indices[document_count] (0, ..., sequence_count)
//   .bin: the tokens of every sequence back to back, no header.
// A document is a run of sequences (one sequence per document unless the data
// was preprocessed with --split-sentences).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mpitron::data {

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py DType).
enum class DType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

bool is_valid_dtype_code(int code);
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
// Token dtype Megatron picks for a vocabulary: u16 when vocab_size < 65500, else i32.
DType token_dtype_for_vocab(int64_t vocab_size);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::I16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }

inline std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
inline std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

// Read-only memory map of a whole file (size 0 is allowed: data() is null).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A zero-copy view of tokens inside the mapped .bin (valid while the dataset lives).
struct TokenView {
  const void* data = nullptr;
  int64_t size = 0;  // elements
  DType dtype = DType::U16;

  // Element i converted to int64 (floats truncate).
  int64_t operator[](int64_t i) const;
  template <typename T> const T* as() const;  // typed pointer; throws when the dtype differs
  // Appends the elements converted to int32 (token ids).
  void append_to(std::vector<int32_t>& out) const;
  void copy_to(int32_t* out) const;
};

class IndexedDataset {
 public:
  // Opens <prefix>.idx and <prefix>.bin and validates them (DATA.md): magic,
  // version, dtype, array sizes against the file size, pointers consistent with
  // lengths and inside .bin, document_indices from 0, non-decreasing, ending at
  // sequence_count. Every failure is an mpitron::Error naming the file.
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t sequence_count() const { return sequence_count_; }
  int64_t document_count() const { return static_cast<int64_t>(document_count_) - 1; }  // documents
  int64_t num_tokens() const { return num_tokens_; }

  const int32_t* sequence_lengths() const { return lengths_; }            // [sequence_count]
  const int64_t* sequence_pointers() const { return pointers_; }          // [sequence_count]
  const int64_t* document_indices() const { return doc_indices_; }        // [document_count + 1]
  int64_t sequence_length(int64_t i) const;

  // Sequence i, or `length` elements from `offset` inside it (length < 0: to its end).
  TokenView get(int64_t i, int64_t offset = 0, int64_t length = -1) const;

  // Raw bytes of the mapped files (for hashing and tests).
  const MappedFile& idx_file() const { return *idx_; }
  const MappedFile& bin_file() const { return *bin_; }

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  DType dtype_ = DType::U16;
  uint64_t sequence_count_ = 0, document_count_ = 0;
  int64_t num_tokens_ = 0;
  const int32_t* lengths_ = nullptr;
  const int64_t* pointers_ = nullptr;
  const int64_t* doc_indices_ = nullptr;
};

// Writes <prefix>.bin and, on finalize(), <prefix>.idx; both appear atomically
// (written as *.tmp, renamed by finalize()). Bytes equal megatron-core's builder
// given the same sequences and document boundaries.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, DType dtype);
  ~IndexedDatasetWriter();  // without finalize(): removes the temporaries
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one sequence of the writer's dtype (T must match it).
  template <typename T> void add_sequence(const T* data, int64_t n);
  // Appends token ids as one sequence, converting to the dtype (range-checked).
  void add_tokens(const int32_t* ids, int64_t n);
  // Appends one document made of sequences (megatron-core add_document):
  // `lengths` split `ids`; no lengths → an empty document.
  void add_document(const int32_t* ids, const std::vector<int32_t>& lengths);
  // Closes the current document (megatron-core end_document).
  void end_document();
  // Appends all of <prefix>.bin/.idx (same dtype required) — merge_datasets.
  void add_index(const std::string& other_prefix);
  // Writes the .idx and renames both files into place.
  void finalize();

  int64_t sequence_count() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t document_count() const { return static_cast<int64_t>(doc_indices_.size()) - 1; }
  DType dtype() const { return dtype_; }

 private:
  void write_bin(const void* p, size_t bytes);
  void push_length(int64_t n);

  std::string prefix_;
  DType dtype_;
  FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<char> convert_;  // scratch for add_tokens
  bool finalized_ = false;
};

// Throws a clear error (file, sequence, position, id) when any token of the
// dataset is outside [0, vocab_size): data tokenised with another vocabulary.
void validate_token_ids(const IndexedDataset& ds, int64_t vocab_size);
// The same check for a batch of ids about to enter the embedding; `where`
// names them in the error (e.g. "sample 1234 of train").
void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab_size, const std::string& where);

}  // namespace mpitron::data
