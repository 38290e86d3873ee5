#include "io/torch_dist.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "core/error.h"

namespace mpitron::io {

namespace {

const char* kMeta = "torch.distributed.checkpoint.metadata.";

// An allow-listed dataclass's field (its BUILD state is a dict of fields).
const PyValue& field(const PyValue& obj, const char* name, const std::string& where) {
  if (!obj.is(PyKind::Object)) MPT_THROW(str(where, ": expected a dataclass, found a ", obj.describe()), "");
  const PyValue* v = obj.attr(name);
  if (!v) MPT_THROW(str(where, ": a ", obj.type_name(), " has no field '", name, "'"), "");
  return *v;
}

std::vector<int64_t> ints(const PyValue& v, const std::string& where) {
  if (!v.is(PyKind::Tuple) && !v.is(PyKind::List))
    MPT_THROW(str(where, ": expected a tuple of ints, found ", v.describe()), "");
  std::vector<int64_t> out;
  for (const PyPtr& it : v.items()) {
    if (!it->is(PyKind::Int) || it->as_int() < 0)
      MPT_THROW(str(where, ": expected an int >= 0, found ", it->describe()), "");
    out.push_back(it->as_int());
  }
  return out;
}

std::string key_of(const std::string& fqn, const std::vector<int64_t>& offsets) {
  std::string k = fqn + "@";
  for (int64_t o : offsets) k += str(o, ",");
  return k;
}

struct Info {
  std::string file;
  uint64_t offset = 0, length = 0;
};

}  // namespace

const DcpTensor* DcpMetadata::tensor(const std::string& fqn) const {
  for (const DcpTensor& t : tensors)
    if (t.fqn == fqn) return &t;
  return nullptr;
}
const DcpBytes* DcpMetadata::bytes_item(const std::string& fqn) const {
  for (const DcpBytes& b : bytes)
    if (b.fqn == fqn) return &b;
  return nullptr;
}

namespace {
DcpMetadata parse_dcp_metadata(const std::string& path, const PickleLimits& limits);
}

DcpMetadata read_dcp_metadata(const std::string& dir, const PickleLimits& limits) {
  const std::string path = (std::filesystem::path(dir) / ".metadata").string();
  try {
    return parse_dcp_metadata(path, limits);
  } catch (const Error& e) {
    if (e.message().find(path) != std::string::npos) throw;
    MPT_THROW(str(path, ": ", e.message()), e.hint());  // a value of the wrong kind: name the file
  }
}

namespace {
DcpMetadata parse_dcp_metadata(const std::string& path, const PickleLimits& limits) {
  ReadOnlyFile f(path);
  if (f.size() > (uint64_t{1} << 30))
    MPT_THROW(str(path, " is ", f.size(), " bytes, more than the 1 GiB read for a .metadata"), "");
  std::vector<uint8_t> data(f.size());
  f.read(0, data.data(), data.size(), ".metadata");
  DcpMetadata md;
  md.root = unpickle(data.data(), data.size(), path, {}, limits);
  const PyValue& root = *md.root;
  if (!root.is(PyKind::Object) || root.type_name() != str(kMeta, "Metadata"))
    MPT_THROW(str(path, ": the pickle is a ", root.describe(), ", not a torch.distributed.checkpoint Metadata"),
              "name a torch_dist checkpoint directory (iter_XXXXXXX/)");

  // storage_data: MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length)
  std::unordered_map<std::string, Info> where;
  const PyValue& sdata = field(root, "storage_data", path);
  if (!sdata.is_dict()) MPT_THROW(str(path, ": storage_data is a ", sdata.describe()), "");
  for (const auto& [k, v] : sdata.dict_items()) {
    const PyValue& fqn = field(*k, "fqn", path);
    const PyValue* off = k->is(PyKind::Object) ? k->attr("offset") : nullptr;  // absent when None
    const std::string key = key_of(fqn.as_str(), !off || off->is_none() ? std::vector<int64_t>{} : ints(*off, path));
    Info info;
    info.file = field(*v, "relative_path", path).as_str();
    const int64_t o = field(*v, "offset", path).as_int(), n = field(*v, "length", path).as_int();
    if (o < 0 || n < 0) MPT_THROW(str(path, ": item '", key, "' has offset ", o, " and length ", n), "");
    info.offset = static_cast<uint64_t>(o);
    info.length = static_cast<uint64_t>(n);
    if (const PyValue* td = v->attr("transform_descriptors"); td && !td->is_none() && td->size() > 0)
      MPT_THROW(str(path, ": item '", key, "' is stored through transforms (compression or extensions)"),
                "save the checkpoint without storage extensions");
    if (info.file.empty() || info.file.find('/') != std::string::npos || info.file.find('\\') != std::string::npos ||
        info.file == "." || info.file == "..")
      MPT_THROW(str(path, ": item '", key, "' names the file '", info.file, "', not a file of this directory"), "");
    where[key] = info;
  }
  auto locate = [&](const std::string& key) -> const Info& {
    const auto it = where.find(key);
    if (it == where.end()) MPT_THROW(str(path, ": no storage item for '", key, "'"), "the .metadata is incomplete");
    return it->second;
  };

  const PyValue& sdm = field(root, "state_dict_metadata", path);
  if (!sdm.is_dict()) MPT_THROW(str(path, ": state_dict_metadata is a ", sdm.describe()), "");
  for (const auto& [k, v] : sdm.dict_items()) {
    const std::string& fqn = k->as_str();
    const std::string ctx = str(path, ": '", fqn, "'");
    if (v->is(PyKind::Object) && v->type_name() == str(kMeta, "BytesStorageMetadata")) {
      const Info& i = locate(key_of(fqn, {}));
      md.bytes.push_back({fqn, i.file, i.offset, i.length});
      continue;
    }
    if (!v->is(PyKind::Object) || v->type_name() != str(kMeta, "TensorStorageMetadata"))
      MPT_THROW(str(ctx, " is described by a ", v->describe()), "");
    DcpTensor t;
    t.fqn = fqn;
    t.size = ints(field(*v, "size", ctx), ctx);
    // TensorProperties' state is a tuple (dtype, layout, requires_grad, memory_format, pin_memory, ...)
    const PyValue& props = field(*v, "properties", ctx);
    const PyValue* pst = props.is(PyKind::Object) ? props.state() : nullptr;
    const PyValue* dt = pst && pst->is(PyKind::Tuple) && pst->size() > 0 ? &(*pst)[0]
                        : props.is(PyKind::Object)                       ? props.attr("dtype")
                                                                         : nullptr;
    if (!dt || !dt->is(PyKind::Global) || !torch_dtype_from_global(dt->type_name(), t.dtype))
      MPT_THROW(str(ctx, ": its properties give no torch dtype"), "");
    const PyValue& chunks = field(*v, "chunks", ctx);
    for (const PyPtr& c : chunks.items()) {
      DcpChunk ch;
      ch.offsets = ints(field(*c, "offsets", ctx), ctx);
      ch.sizes = ints(field(*c, "sizes", ctx), ctx);
      if (ch.offsets.size() != t.size.size() || ch.sizes.size() != t.size.size())
        MPT_THROW(str(ctx, ": a chunk of rank ", ch.offsets.size(), " in a tensor of rank ", t.size.size()), "");
      for (size_t d = 0; d < t.size.size(); ++d)
        if (ch.offsets[d] > t.size[d] || ch.sizes[d] > t.size[d] - ch.offsets[d])
          MPT_THROW(str(ctx, ": a chunk at ", ch.offsets[d], " +", ch.sizes[d], " is outside dimension ", d, " (",
                        t.size[d], ")"),
                    "");
      const Info& i = locate(key_of(fqn, ch.offsets));
      ch.file = i.file;
      ch.offset = i.offset;
      ch.length = i.length;
      t.chunks.push_back(std::move(ch));
    }
    for (size_t a = 0; a < t.chunks.size(); ++a)
      for (size_t b = a + 1; b < t.chunks.size(); ++b) {
        bool overlap = true;
        for (size_t d = 0; d < t.size.size() && overlap; ++d)
          overlap = t.chunks[a].offsets[d] < t.chunks[b].offsets[d] + t.chunks[b].sizes[d] &&
                    t.chunks[b].offsets[d] < t.chunks[a].offsets[d] + t.chunks[a].sizes[d];
        if (overlap) MPT_THROW(str(ctx, ": chunks ", a, " and ", b, " overlap"), "");
      }
    md.tensors.push_back(std::move(t));
  }
  return md;
}
}  // namespace

DcpCheckpoint::DcpCheckpoint(std::string dir, const PickleLimits& limits)
    : dir_(std::move(dir)), md_(read_dcp_metadata(dir_, limits)) {}

std::shared_ptr<const ReadOnlyFile> DcpCheckpoint::file(const std::string& relative) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(relative);
  if (it == files_.end())
    it = files_
             .emplace(relative, std::make_shared<const ReadOnlyFile>((std::filesystem::path(dir_) / relative).string()))
             .first;
  return it->second;
}

uint64_t DcpCheckpoint::bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [name, f] : files_) n += f->bytes_read();
  return n;
}

TorchFile DcpCheckpoint::open_chunk(const DcpChunk& c) const {
  return TorchFile::open_range(file(c.file), c.offset, c.length);
}
TorchFile DcpCheckpoint::open_bytes(const DcpBytes& b) const {
  return TorchFile::open_range(file(b.file), b.offset, b.length);
}

void DcpCheckpoint::read_raw(const std::string& fqn, const std::vector<int64_t>& start,
                             const std::vector<int64_t>& count, void* dst) const {
  const DcpTensor* t = md_.tensor(fqn);
  if (!t) MPT_THROW(str(dir_, ": no tensor '", fqn, "' in the checkpoint"), "");
  const size_t nd = t->size.size();
  if (start.size() != nd || count.size() != nd)
    MPT_THROW(str(dir_, ": a read of '", fqn, "' (rank ", nd, ") names ", start.size(), " starts"), "");
  int64_t want = 1;
  for (size_t d = 0; d < nd; ++d) {
    if (start[d] < 0 || count[d] < 0 || start[d] > t->size[d] || count[d] > t->size[d] - start[d])
      MPT_THROW(str(dir_, ": '", fqn, "' dimension ", d, ": [", start[d], ", +", count[d], ") is outside [0, ",
                    t->size[d], ")"),
                "");
    want *= count[d];
  }
  if (want == 0) return;
  const size_t es = torch_dtype_size(t->dtype);
  auto* out = static_cast<uint8_t*>(dst);
  int64_t covered = 0;
  std::vector<uint8_t> buf;
  for (const DcpChunk& c : t->chunks) {
    // The intersection of the request with this chunk, in global coordinates.
    std::vector<int64_t> lo(nd), n(nd);
    int64_t vol = 1;
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = std::max(start[d], c.offsets[d]);
      const int64_t hi = std::min(start[d] + count[d], c.offsets[d] + c.sizes[d]);
      n[d] = std::max<int64_t>(0, hi - lo[d]);
      vol *= n[d];
    }
    if (vol == 0) continue;
    const TorchFile blob = open_chunk(c);
    if (!blob.root().is_tensor())
      MPT_THROW(str(blob.label(), ": the chunk of '", fqn, "' holds a ", blob.root().describe(), ", not a tensor"), "");
    const TorchTensor& tt = blob.root().tensor();
    if (tt.shape != c.sizes || tt.dtype != t->dtype)
      MPT_THROW(str(blob.label(), ": the chunk of '", fqn, "' is a ", tt.describe(), ", the .metadata says ",
                    torch_dtype_name(t->dtype), " of its chunk sizes"),
                "");
    std::vector<int64_t> local(nd);
    for (size_t d = 0; d < nd; ++d) local[d] = lo[d] - c.offsets[d];
    buf.resize(static_cast<size_t>(vol) * es);
    blob.read_raw(tt, local, n, buf.data());
    // Scatter rows of the last dimension into dst (row-major over `count`).
    const int64_t row = nd == 0 ? 1 : n[nd - 1];
    const size_t outer = nd == 0 ? 0 : nd - 1;
    std::vector<int64_t> idx(outer, 0);
    const uint8_t* src = buf.data();
    while (true) {
      int64_t at = 0;
      for (size_t d = 0; d < nd; ++d) {
        const int64_t g = lo[d] + (d < outer ? idx[d] : 0) - start[d];
        at = at * count[d] + g;
      }
      std::memcpy(out + static_cast<size_t>(at) * es, src, static_cast<size_t>(row) * es);
      src += static_cast<size_t>(row) * es;
      size_t d = outer;
      while (d > 0 && ++idx[d - 1] == n[d - 1]) idx[--d] = 0;
      if (d == 0) break;
    }
    covered += vol;
  }
  if (covered != want)
    MPT_THROW(str(dir_, ": the chunks of '", fqn, "' cover ", covered, " of the ", want, " elements asked for"),
              "the checkpoint is incomplete");
}

void DcpCheckpoint::read_f32(const std::string& fqn, const std::vector<int64_t>& start,
                             const std::vector<int64_t>& count, float* dst) const {
  const DcpTensor* t = md_.tensor(fqn);
  if (!t) MPT_THROW(str(dir_, ": no tensor '", fqn, "' in the checkpoint"), "");
  if (t->dtype == TorchDType::F32) return read_raw(fqn, start, count, dst);
  size_t n = 1;
  for (int64_t c : count) n *= static_cast<size_t>(c);
  std::vector<uint8_t> raw(n * torch_dtype_size(t->dtype));
  read_raw(fqn, start, count, raw.data());
  torch_dtype_to_f32(t->dtype, raw.data(), dst, n);
}

}  // namespace mpitron::io
