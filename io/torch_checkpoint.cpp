#include "io/torch_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "io/torch_globals.h"

namespace mpitron::io {

struct TorchFile::State {
  std::unique_ptr<ZipArchive> zip;
  std::string archive;  // "<archive>" of "<archive>/data.pkl"
  int64_t version = -1;
  std::map<std::string, std::shared_ptr<const TorchStorage>> storages;  // "key|dtype" -> storage
};

namespace {

// torch.save's legacy format: protocol 2 pickle of the magic number 0x1950a86a20f9469cfc6c (LONG1 of 10 bytes).
constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

std::string printable(const std::string& s) {
  std::string o;
  for (unsigned char c : s.substr(0, 120)) o += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  return s.size() > 120 ? o + "..." : o;
}

}  // namespace

std::string sniff_torch_format(const ReadOnlyFile& f, uint64_t offset, uint64_t length) {
  uint8_t head[512] = {};
  const uint64_t n = std::min<uint64_t>({length, sizeof(head), offset <= f.size() ? f.size() - offset : 0});
  f.read(offset, head, n, "file header");
  if (n >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) return "zip";
  if (n >= sizeof(kLegacyMagic) && std::memcmp(head, kLegacyMagic, sizeof(kLegacyMagic)) == 0) return "legacy";
  if (n >= 262 && std::memcmp(head + 257, "ustar", 5) == 0) return "legacy";  // torch < 0.4's tar archive
  return "";
}

TorchFile::TorchFile(std::shared_ptr<State> s) : s_(std::move(s)) {}

const std::string& TorchFile::label() const { return s_->zip->label(); }
const std::string& TorchFile::archive_name() const { return s_->archive; }
const ZipArchive& TorchFile::zip() const { return *s_->zip; }
int64_t TorchFile::format_version() const { return s_->version; }

TorchFile TorchFile::open(const std::string& path, const TorchFileOptions& opt) {
  auto f = std::make_shared<const ReadOnlyFile>(path);
  const uint64_t n = f->size();
  return open_range(std::move(f), 0, n, opt);
}

TorchFile TorchFile::open_range(std::shared_ptr<const ReadOnlyFile> file, uint64_t offset, uint64_t length,
                                const TorchFileOptions& opt) {
  const std::string label =
      offset == 0 && length == file->size() ? file->path() : str(file->path(), " [", offset, " +", length, "]");
  if (offset > file->size() || length > file->size() - offset)
    MPT_THROW(str(label, ": the range is past the end of the file (", file->size(), " bytes)"),
              "the file is truncated, or its index names wrong offsets");
  const std::string kind = sniff_torch_format(*file, offset, length);
  if (kind == "legacy")
    MPT_THROW(str(label,
                  " is in torch.save's legacy format (PyTorch < 1.6, or _use_new_zipfile_serialization=False), "
                  "which mpitron does not read"),
              "re-save it with PyTorch >= 1.6: python -c \"import torch; "
              "torch.save(torch.load('old.pt', weights_only=False), 'new.pt')\"");
  if (kind != "zip")
    MPT_THROW(str(label, " is not a torch.save file (no zip header)"),
              "expected a file written by torch.save (PyTorch >= 1.6)");

  auto s = std::make_shared<State>();
  s->zip = std::make_unique<ZipArchive>(std::move(file), offset, length, label);
  const ZipArchive& z = *s->zip;
  // The archive directory: the one top-level directory holding data.pkl.
  for (const ZipEntry& e : z.entries()) {
    const size_t slash = e.name.find('/');
    if (slash != std::string::npos && e.name.substr(slash) == "/data.pkl") {
      if (!s->archive.empty())
        MPT_THROW(str(label, ": two pickles ('", s->archive, "/data.pkl' and '", printable(e.name), "')"),
                  "the file is not a torch.save archive");
      s->archive = e.name.substr(0, slash);
    }
  }
  if (s->archive.empty())
    MPT_THROW(str(label, ": no <archive>/data.pkl entry"), "the file is a zip but not a torch.save archive");
  if (const ZipEntry* bo = z.find(s->archive + "/byteorder")) {
    const std::vector<uint8_t> b = z.read_all(*bo, 64);
    const std::string order(b.begin(), b.end());
    if (order != "little")
      MPT_THROW(str(label, ": byteorder '", printable(order), "'; only little-endian files are read"),
                "re-save it on a little-endian machine");
  }
  for (const char* v : {"/.data/version", "/version"})
    if (const ZipEntry* ve = z.find(s->archive + v)) {
      const std::vector<uint8_t> b = z.read_all(*ve, 64);
      std::string t(b.begin(), b.end());
      while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
      if (!t.empty() && t.size() < 10 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
        s->version = std::stoll(t);
      break;
    }

  const ZipEntry& pkl = z.at(s->archive + "/data.pkl");
  const std::vector<uint8_t> data = z.read_all(pkl, opt.max_pickle_bytes);
  State* st = s.get();
  const PersistentLoad load = [st](const PyValue& pid) -> PyPtr {
    // ('storage', storage class, key, location, numel)
    if (!pid.is(PyKind::Tuple) || pid.size() != 5 || !pid[0].is(PyKind::Str) || pid[0].as_str() != "storage" ||
        !pid[1].is(PyKind::Global) || !pid[2].is(PyKind::Str) || !pid[3].is(PyKind::Str) || !pid[4].is(PyKind::Int))
      throw PickleFault{str("a persistent id ", pid.describe(), " is not ('storage', class, key, location, numel)"),
                        ""};
    TorchStorage ts;
    ts.type_name = pid[1].type_name();
    ts.key = pid[2].as_str();
    ts.location = pid[3].as_str();
    if (ts.type_name == "torch.storage.UntypedStorage" || ts.type_name == "torch.UntypedStorage")
      ts.dtype = TorchDType::U8;
    else if (!torch_dtype_from_storage(ts.type_name, ts.dtype))
      throw PickleFault{str("a persistent id names '", printable(ts.type_name), "', not a storage class"), ""};
    const int64_t numel = pid[4].as_int();
    const uint64_t es = torch_dtype_size(ts.dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > (uint64_t{1} << 62) / es)
      throw PickleFault{str("storage '", printable(ts.key), "' declares ", numel, " elements"), ""};
    ts.nbytes = static_cast<uint64_t>(numel) * es;
    const std::string cache_key = ts.key + "|" + torch_dtype_name(ts.dtype);
    auto it = st->storages.find(cache_key);
    if (it == st->storages.end()) {
      const ZipEntry* rec = st->zip->find(st->archive + "/data/" + ts.key);
      if (!rec)
        throw PickleFault{str("storage '", printable(ts.key), "' names the record '", st->archive, "/data/",
                              printable(ts.key), "', which the archive does not have"),
                          "the file is damaged or incomplete"};
      if (rec->size < ts.nbytes)
        throw PickleFault{str("storage '", printable(ts.key), "' declares ", ts.nbytes, " bytes (", numel, " x ",
                              ts.type_name, ") but its record holds ", rec->size),
                          "the file is damaged or incomplete"};
      it = st->storages.emplace(cache_key, std::make_shared<const TorchStorage>(ts)).first;
    }
    return PyValue::storage_value(it->second);
  };
  TorchFile out(s);
  out.root_ = unpickle(data.data(), data.size(), str(label, ": entry '", printable(pkl.name), "'"), load, opt.limits);
  return out;
}

std::vector<std::shared_ptr<const TorchStorage>> TorchFile::storages() const {
  std::vector<std::shared_ptr<const TorchStorage>> v;
  for (const auto& [k, s] : s_->storages) v.push_back(s);
  return v;
}

const ZipEntry& TorchFile::record_of(const TorchTensor& t) const {
  MPT_CHECK(t.storage != nullptr, str(label(), ": a tensor without a storage"));
  const auto it = s_->storages.find(t.storage->key + "|" + torch_dtype_name(t.storage->dtype));
  if (it == s_->storages.end() || it->second != t.storage)
    MPT_THROW(str(label(), ": the tensor ", t.describe(), " does not come from this file"),
              "read a tensor through the TorchFile that unpickled it");
  return s_->zip->at(s_->archive + "/data/" + t.storage->key);
}

void TorchFile::read_raw(const TorchTensor& t, void* dst) const {
  std::vector<int64_t> start(t.shape.size(), 0);
  read_raw(t, start, t.shape, dst);
}

std::vector<uint8_t> TorchFile::read_raw(const TorchTensor& t) const {
  std::vector<uint8_t> out(t.nbytes());
  read_raw(t, out.data());
  return out;
}

void TorchFile::read_raw(const TorchTensor& t, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                         void* dst) const {
  const size_t nd = t.shape.size();
  if (start.size() != nd || count.size() != nd)
    MPT_THROW(
        str(label(), ": a read of ", t.describe(), " names ", start.size(), " starts and ", count.size(), " counts"),
        "give one start and one count per dimension");
  for (size_t d = 0; d < nd; ++d)
    if (start[d] < 0 || count[d] < 0 || start[d] > t.shape[d] || count[d] > t.shape[d] - start[d])
      MPT_THROW(str(label(), ": dimension ", d, " of ", t.describe(), ": [", start[d], ", +", count[d],
                    ") is outside [0, ", t.shape[d], ")"),
                "");
  for (size_t d = 0; d < nd; ++d)
    if (count[d] == 0) return;
  const ZipEntry& rec = record_of(t);
  const uint64_t es = torch_dtype_size(t.dtype);
  auto* out = static_cast<uint8_t*>(dst);
  // Runs along the last dimension: one of count[last] elements when its stride is 1, else single elements.
  const bool unit = nd == 0 || t.stride[nd - 1] == 1 || count[nd - 1] == 1;
  const int64_t run_len = nd == 0 ? 1 : (unit ? count[nd - 1] : 1);
  const int64_t runs_per_row = nd == 0 ? 1 : (unit ? 1 : count[nd - 1]);
  int64_t pending_start = -1, pending_len = 0;  // a storage run not yet read (merged while adjacent)
  uint8_t* pending_dst = out;
  auto flush = [&] {
    if (pending_len > 0)
      s_->zip->read(rec, static_cast<uint64_t>(pending_start) * es, pending_dst,
                    static_cast<uint64_t>(pending_len) * es);
    pending_dst += static_cast<uint64_t>(pending_len) * es;
    pending_len = 0;
  };
  const size_t outer = nd == 0 ? 0 : nd - 1;
  std::vector<int64_t> idx(outer, 0);  // odometer over the outer dimensions
  while (true) {
    int64_t base = t.offset;
    for (size_t d = 0; d < outer; ++d) base += (start[d] + idx[d]) * t.stride[d];
    if (nd > 0) base += start[nd - 1] * t.stride[nd - 1];
    for (int64_t r = 0; r < runs_per_row; ++r) {
      const int64_t s0 = base + (unit ? 0 : r * t.stride[nd - 1]);
      if (pending_len > 0 && s0 == pending_start + pending_len) {
        pending_len += run_len;
      } else {
        flush();
        pending_start = s0;
        pending_len = run_len;
      }
    }
    size_t d = outer;
    while (d > 0 && ++idx[d - 1] == count[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  flush();
}

void TorchFile::read_f32(const TorchTensor& t, float* dst) const {
  std::vector<int64_t> start(t.shape.size(), 0);
  read_f32(t, start, t.shape, dst);
}

void TorchFile::read_f32(const TorchTensor& t, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                         float* dst) const {
  if (t.dtype == TorchDType::F32) return read_raw(t, start, count, dst);
  if (t.dtype == TorchDType::C64 || t.dtype == TorchDType::C128)
    MPT_THROW(str(label(), ": a ", t.describe(), " tensor has no f32 conversion"), "read its raw bytes (read_raw)");
  size_t n = 1;
  for (int64_t c : count) n *= static_cast<size_t>(c);
  std::vector<uint8_t> raw(n * torch_dtype_size(t.dtype));
  read_raw(t, start, count, raw.data());
  torch_dtype_to_f32(t.dtype, raw.data(), dst, n);
}

std::vector<float> TorchFile::to_f32(const TorchTensor& t) const {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  read_f32(t, out.data());
  return out;
}

void TorchFile::verify() const {
  for (const auto& [k, st] : s_->storages) {
    const ZipEntry& rec = s_->zip->at(s_->archive + "/data/" + st->key);
    if (!s_->zip->crc_ok(rec))
      MPT_THROW(str(label(), ": record '", printable(rec.name), "' fails its CRC-32 check"),
                "the file is damaged; copy it again from its source");
  }
}

}  // namespace mpitron::io
