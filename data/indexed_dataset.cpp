// data/indexed_dataset.cpp — MMIDIDX v1 reader (mmap + validation) and writer.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/log.h"

namespace mpitron::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // 34

template <typename T> T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

// ---- dtypes --------------------------------------------------------------------------
bool is_valid_dtype_code(int code) { return code >= 1 && code <= 8; }

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::U8: case DType::I8: return 1;
    case DType::I16: case DType::U16: return 2;
    case DType::I32: case DType::F32: return 4;
    case DType::I64: case DType::F64: return 8;
  }
  MPT_THROW(str("invalid dtype code ", static_cast<int>(dt)), "");
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::F64: return "float64";
    case DType::F32: return "float32";
    case DType::U16: return "uint16";
  }
  return "invalid";
}

DType token_dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? DType::U16 : DType::I32; }

// ---- MappedFile ----------------------------------------------------------------------
MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MPT_CHECK(fd >= 0, str("cannot open '", path, "': ", std::strerror(errno)),
            "check the data path (a dataset is given by its prefix, without .bin/.idx)");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    MPT_THROW(str("cannot stat '", path, "': ", std::strerror(e)), "");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    MPT_CHECK(p != MAP_FAILED, str("cannot mmap '", path, "' (", size_, " bytes): ", std::strerror(e)), "");
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---- TokenView -----------------------------------------------------------------------
int64_t TokenView::operator[](int64_t i) const {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case DType::U8: return p[i];
    case DType::I8: return load<int8_t>(p + i);
    case DType::I16: return load<int16_t>(p + 2 * i);
    case DType::U16: return load<uint16_t>(p + 2 * i);
    case DType::I32: return load<int32_t>(p + 4 * i);
    case DType::I64: return load<int64_t>(p + 8 * i);
    case DType::F32: return static_cast<int64_t>(load<float>(p + 4 * i));
    case DType::F64: return static_cast<int64_t>(load<double>(p + 8 * i));
  }
  return 0;
}

template <typename T> const T* TokenView::as() const {
  MPT_CHECK(dtype == dtype_of<T>(),
            str("token view holds ", dtype_name(dtype), ", not ", dtype_name(dtype_of<T>())), "");
  return static_cast<const T*>(data);
}
template const uint8_t* TokenView::as<uint8_t>() const;
template const int8_t* TokenView::as<int8_t>() const;
template const int16_t* TokenView::as<int16_t>() const;
template const uint16_t* TokenView::as<uint16_t>() const;
template const int32_t* TokenView::as<int32_t>() const;
template const int64_t* TokenView::as<int64_t>() const;
template const float* TokenView::as<float>() const;
template const double* TokenView::as<double>() const;

void TokenView::copy_to(int32_t* out) const {
  if (dtype == DType::U16) {
    const auto* p = static_cast<const uint16_t*>(data);
    for (int64_t i = 0; i < size; ++i) out[i] = p[i];
  } else if (dtype == DType::I32) {
    std::memcpy(out, data, static_cast<size_t>(size) * 4);
  } else {
    for (int64_t i = 0; i < size; ++i) out[i] = static_cast<int32_t>((*this)[i]);
  }
}

void TokenView::append_to(std::vector<int32_t>& out) const {
  size_t n = out.size();
  out.resize(n + static_cast<size_t>(size));
  copy_to(out.data() + n);
}

// ---- IndexedDataset ------------------------------------------------------------------
IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ipath = idx_path(prefix), bpath = bin_path(prefix);
  idx_ = std::make_unique<MappedFile>(ipath);
  const uint8_t* p = idx_->data();
  const size_t size = idx_->size();
  const std::string regen = "re-create it with preprocess_data (the file is truncated or not an MMIDIDX index)";

  MPT_CHECK(size >= kHeaderBytes,
            str("index '", ipath, "' is ", size, " bytes, shorter than the 34-byte MMIDIDX header"), regen);
  MPT_CHECK(std::memcmp(p, kMagic, 9) == 0,
            str("index '", ipath, "' has a bad magic (expected \"MMIDIDX\\0\\0\")"),
            "this is not a Megatron mmap index (.idx of --dataset-impl mmap)");
  const uint64_t version = load<uint64_t>(p + 9);
  MPT_CHECK(version == 1, str("index '", ipath, "' has version ", version, ", only version 1 is supported"), "");
  const int code = p[17];
  MPT_CHECK(is_valid_dtype_code(code),
            str("index '", ipath, "' has dtype code ", code, " (valid: 1..8)"), regen);
  dtype_ = static_cast<DType>(code);
  sequence_count_ = load<uint64_t>(p + 18);
  document_count_ = load<uint64_t>(p + 26);
  MPT_CHECK(document_count_ >= 1,
            str("index '", ipath, "' has document_count 0 (it must be documents + 1 >= 1)"), regen);

  // Arrays must fit exactly (guard against overflow with huge counts).
  const uint64_t max_count = std::numeric_limits<uint64_t>::max() / 64;
  MPT_CHECK(sequence_count_ < max_count && document_count_ < max_count,
            str("index '", ipath, "' has absurd counts: sequences=", sequence_count_,
                " documents+1=", document_count_),
            regen);
  const uint64_t need = kHeaderBytes + sequence_count_ * (4 + 8) + document_count_ * 8;
  MPT_CHECK(size >= need,
            str("index '", ipath, "' is truncated: ", size, " bytes, but ", sequence_count_, " sequences and ",
                document_count_, " document indices need ", need),
            regen);
  MPT_CHECK(size == need,
            str("index '", ipath, "' has ", size - need, " unexpected trailing bytes after its arrays (",
                need, " expected)"),
            "multimodal indices (sequence modes) are not supported; otherwise re-create the file");
  // The arrays sit at odd offsets (34 + ...); x86/ARM64 tolerate unaligned loads
  // and numpy reads them the same way.
  lengths_ = reinterpret_cast<const int32_t*>(p + kHeaderBytes);
  pointers_ = reinterpret_cast<const int64_t*>(p + kHeaderBytes + 4 * sequence_count_);
  doc_indices_ = reinterpret_cast<const int64_t*>(p + kHeaderBytes + 12 * sequence_count_);

  bin_ = std::make_unique<MappedFile>(bpath);
  const int64_t itemsize = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t bin_size = static_cast<int64_t>(bin_->size());
  int64_t expect = 0;
  for (uint64_t i = 0; i < sequence_count_; ++i) {
    const int32_t len = load<int32_t>(p + kHeaderBytes + 4 * i);
    const int64_t ptr = load<int64_t>(p + kHeaderBytes + 4 * sequence_count_ + 8 * i);
    MPT_CHECK(len >= 0, str("index '", ipath, "': sequence ", i, " has negative length ", len), regen);
    MPT_CHECK(ptr == expect,
              str("index '", ipath, "': sequence ", i, " starts at byte ", ptr, " of .bin, expected ", expect,
                  " (previous pointer + length × ", itemsize, ")"),
              regen);
    expect = ptr + static_cast<int64_t>(len) * itemsize;
  }
  num_tokens_ = expect / itemsize;
  MPT_CHECK(expect <= bin_size,
            str("data file '", bpath, "' is truncated: ", bin_size, " bytes, but index '", ipath, "' needs ",
                expect, " (", num_tokens_, " tokens of ", dtype_name(dtype_), ")"),
            "the .bin was cut short (disk full or interrupted copy?); re-create or re-copy it");
  // Megatron reads such a file; warn rather than refuse.
  if (expect != bin_size)
    log_warn("data file '", bpath, "' has ", bin_size - expect, " bytes beyond the ", expect, " its index '", ipath,
             "' describes (do .bin and .idx belong together?)");

  int64_t prev = -1;
  for (uint64_t d = 0; d < document_count_; ++d) {
    const int64_t v = load<int64_t>(p + kHeaderBytes + 12 * sequence_count_ + 8 * d);
    MPT_CHECK(d != 0 || v == 0, str("index '", ipath, "': document_indices[0] is ", v, ", must be 0"), regen);
    MPT_CHECK(v >= prev,
              str("index '", ipath, "': document_indices decreases at ", d, " (", prev, " then ", v, ")"), regen);
    prev = v;
  }
  MPT_CHECK(prev == static_cast<int64_t>(sequence_count_),
            str("index '", ipath, "': last document index is ", prev, ", must equal sequence_count ",
                sequence_count_),
            regen);
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  MPT_CHECK(i >= 0 && i < sequence_count(),
            str("sequence ", i, " out of range [0, ", sequence_count(), ") in '", prefix_, "'"), "");
  return load<int32_t>(reinterpret_cast<const uint8_t*>(lengths_ + i));
}

TokenView IndexedDataset::get(int64_t i, int64_t offset, int64_t length) const {
  const int64_t n = sequence_length(i);
  if (length < 0) length = n - offset;
  MPT_CHECK(offset >= 0 && length >= 0 && offset + length <= n,
            str("slice [", offset, ", ", offset + length, ") of sequence ", i, " (length ", n, ") in '", prefix_,
                "' is out of range"),
            "");
  const int64_t ptr = load<int64_t>(reinterpret_cast<const uint8_t*>(pointers_ + i));
  TokenView v;
  v.dtype = dtype_;
  v.size = length;
  v.data = bin_->data() ? bin_->data() + ptr + offset * static_cast<int64_t>(dtype_size(dtype_)) : nullptr;
  return v;
}

// ---- IndexedDatasetWriter -----------------------------------------------------------
IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, DType dtype) : prefix_(prefix), dtype_(dtype) {
  MPT_CHECK(is_valid_dtype_code(static_cast<int>(dtype)), str("invalid dtype code ", static_cast<int>(dtype)), "");
  const std::string tmp = bin_path(prefix) + ".tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  MPT_CHECK(bin_, str("cannot create '", tmp, "': ", std::strerror(errno)),
            "check that the output directory exists and is writable");
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {
    std::remove((bin_path(prefix_) + ".tmp").c_str());
    std::remove((idx_path(prefix_) + ".tmp").c_str());
  }
}

void IndexedDatasetWriter::write_bin(const void* p, size_t bytes) {
  MPT_CHECK(!finalized_, str("writer for '", prefix_, "' is already finalized"), "");
  if (bytes && std::fwrite(p, 1, bytes, bin_) != bytes)
    MPT_THROW(str("write to '", bin_path(prefix_), ".tmp' failed: ", std::strerror(errno)), "disk full?");
}

void IndexedDatasetWriter::push_length(int64_t n) {
  MPT_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(),
            str("sequence of ", n, " elements does not fit the i32 length field of '", idx_path(prefix_), "'"),
            "split the document");
  lengths_.push_back(static_cast<int32_t>(n));
}

template <typename T> void IndexedDatasetWriter::add_sequence(const T* data, int64_t n) {
  MPT_CHECK(dtype_of<T>() == dtype_, str("add_sequence<", dtype_name(dtype_of<T>()), "> on a writer of ",
                                         dtype_name(dtype_), " ('", prefix_, "')"),
            "");
  push_length(n);
  write_bin(data, static_cast<size_t>(n) * sizeof(T));
}
template void IndexedDatasetWriter::add_sequence<uint8_t>(const uint8_t*, int64_t);
template void IndexedDatasetWriter::add_sequence<int8_t>(const int8_t*, int64_t);
template void IndexedDatasetWriter::add_sequence<int16_t>(const int16_t*, int64_t);
template void IndexedDatasetWriter::add_sequence<uint16_t>(const uint16_t*, int64_t);
template void IndexedDatasetWriter::add_sequence<int32_t>(const int32_t*, int64_t);
template void IndexedDatasetWriter::add_sequence<int64_t>(const int64_t*, int64_t);
template void IndexedDatasetWriter::add_sequence<float>(const float*, int64_t);
template void IndexedDatasetWriter::add_sequence<double>(const double*, int64_t);

namespace {
template <typename T>
void convert_ids(const int32_t* ids, int64_t n, std::vector<char>& buf, const std::string& prefix) {
  buf.resize(static_cast<size_t>(n) * sizeof(T));
  T* out = reinterpret_cast<T*>(buf.data());
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T> && sizeof(T) < 4) {
      MPT_CHECK(ids[i] >= std::numeric_limits<T>::min() && ids[i] <= std::numeric_limits<T>::max(),
                str("token id ", ids[i], " does not fit the ", sizeof(T) * 8, "-bit dtype of '", prefix, "'"),
                "use a wider dtype (vocab >= 65500 needs int32)");
    }
    out[i] = static_cast<T>(ids[i]);
  }
}
}  // namespace

void IndexedDatasetWriter::add_tokens(const int32_t* ids, int64_t n) {
  push_length(n);
  switch (dtype_) {
    case DType::U16: convert_ids<uint16_t>(ids, n, convert_, prefix_); break;
    case DType::I32: write_bin(ids, static_cast<size_t>(n) * 4); return;
    case DType::U8: convert_ids<uint8_t>(ids, n, convert_, prefix_); break;
    case DType::I8: convert_ids<int8_t>(ids, n, convert_, prefix_); break;
    case DType::I16: convert_ids<int16_t>(ids, n, convert_, prefix_); break;
    case DType::I64: convert_ids<int64_t>(ids, n, convert_, prefix_); break;
    case DType::F32: convert_ids<float>(ids, n, convert_, prefix_); break;
    case DType::F64: convert_ids<double>(ids, n, convert_, prefix_); break;
  }
  write_bin(convert_.data(), convert_.size());
}

void IndexedDatasetWriter::add_document(const int32_t* ids, const std::vector<int32_t>& lengths) {
  int64_t off = 0;
  for (int32_t len : lengths) {
    add_tokens(ids + off, len);
    off += len;
  }
  end_document();
}

void IndexedDatasetWriter::end_document() { doc_indices_.push_back(static_cast<int64_t>(lengths_.size())); }

void IndexedDatasetWriter::add_index(const std::string& other_prefix) {
  IndexedDataset other(other_prefix);
  MPT_CHECK(other.dtype() == dtype_,
            str("cannot merge '", other_prefix, "' (", dtype_name(other.dtype()), ") into '", prefix_, "' (",
                dtype_name(dtype_), "): dtypes differ"),
            "re-tokenise the inputs with the same tokenizer (Megatron picks uint16 below 65500 tokens, else int32)");
  const int64_t offset = static_cast<int64_t>(lengths_.size());
  for (int64_t i = 0; i < other.sequence_count(); ++i) lengths_.push_back(static_cast<int32_t>(other.sequence_length(i)));
  const uint8_t* di = reinterpret_cast<const uint8_t*>(other.document_indices());
  for (int64_t d = 1; d <= other.document_count(); ++d) doc_indices_.push_back(offset + load<int64_t>(di + 8 * d));
  write_bin(other.bin_file().data(), other.bin_file().size());
}

void IndexedDatasetWriter::finalize() {
  MPT_CHECK(!finalized_, str("writer for '", prefix_, "' finalized twice"), "");
  if (std::fflush(bin_) != 0 || std::fclose(bin_) != 0) {
    bin_ = nullptr;
    MPT_THROW(str("closing '", bin_path(prefix_), ".tmp' failed: ", std::strerror(errno)), "disk full?");
  }
  bin_ = nullptr;
  const std::string itmp = idx_path(prefix_) + ".tmp";
  FILE* f = std::fopen(itmp.c_str(), "wb");
  MPT_CHECK(f, str("cannot create '", itmp, "': ", std::strerror(errno)), "");
  const uint64_t version = 1, nseq = lengths_.size(), ndoc = doc_indices_.size();
  const uint8_t code = static_cast<uint8_t>(dtype_);
  std::vector<int64_t> pointers(nseq);
  int64_t ptr = 0;
  const int64_t itemsize = static_cast<int64_t>(dtype_size(dtype_));
  for (uint64_t i = 0; i < nseq; ++i) {
    pointers[i] = ptr;
    ptr += static_cast<int64_t>(lengths_[i]) * itemsize;
  }
  bool ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 &&
            std::fwrite(&code, 1, 1, f) == 1 && std::fwrite(&nseq, 8, 1, f) == 1 && std::fwrite(&ndoc, 8, 1, f) == 1 &&
            std::fwrite(lengths_.data(), 4, nseq, f) == nseq && std::fwrite(pointers.data(), 8, nseq, f) == nseq &&
            std::fwrite(doc_indices_.data(), 8, ndoc, f) == ndoc;
  ok = (std::fclose(f) == 0) && ok;
  MPT_CHECK(ok, str("writing '", itmp, "' failed: ", std::strerror(errno)), "disk full?");
  MPT_CHECK(std::rename((bin_path(prefix_) + ".tmp").c_str(), bin_path(prefix_).c_str()) == 0 &&
                std::rename(itmp.c_str(), idx_path(prefix_).c_str()) == 0,
            str("cannot rename the temporaries of '", prefix_, "' into place: ", std::strerror(errno)), "");
  finalized_ = true;
}

// ---- validation ----------------------------------------------------------------------
void validate_token_ids(const IndexedDataset& ds, int64_t vocab_size) {
  for (int64_t i = 0; i < ds.sequence_count(); ++i) {
    TokenView v = ds.get(i);
    int64_t bad = -1;
    if (v.dtype == DType::U16) {
      const auto* p = static_cast<const uint16_t*>(v.data);
      for (int64_t k = 0; k < v.size && bad < 0; ++k)
        if (p[k] >= vocab_size) bad = k;
    } else {
      for (int64_t k = 0; k < v.size && bad < 0; ++k)
        if (v[k] < 0 || v[k] >= vocab_size) bad = k;
    }
    if (bad >= 0)
      MPT_THROW(str("token id ", v[bad], " at position ", bad, " of sequence ", i, " in '", bin_path(ds.prefix()),
                    "' is outside the vocabulary [0, ", vocab_size, ")"),
                "the data was tokenised with a different (larger) vocabulary: re-run preprocess_data with the "
                "model's tokenizer, or fix --vocab-file/--vocab-size");
  }
}

void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab_size, const std::string& where) {
  for (int64_t k = 0; k < n; ++k)
    if (ids[k] < 0 || ids[k] >= vocab_size)
      MPT_THROW(str("token id ", ids[k], " at position ", k, " of ", where, " is outside the vocabulary [0, ",
                    vocab_size, ")"),
                "the data was tokenised with a different (larger) vocabulary than the model's");
}

}  // namespace mpitron::data
