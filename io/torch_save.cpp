#include "io/torch_save.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "io/torch_zip.h"

namespace mpitron::io {

// ---- the pickle ------------------------------------------------------------------------------

namespace {

class Pickler {
 public:
  std::string out;

  void value(const PyValue& v) {
    switch (v.kind()) {
      case PyKind::None: op('N'); return;
      case PyKind::Bool: op(v.as_bool() ? '\x88' : '\x89'); return;
      case PyKind::Int: integer(v.as_int()); return;
      case PyKind::Float: floating(v.as_float()); return;
      case PyKind::Str: unicode(v.as_str()); return;
      case PyKind::Bytes: bytes(v); return;
      case PyKind::List: list(v); return;
      case PyKind::Tuple:
        if (!v.type_name().empty()) {  // torch.Size(...) and the like: cls((items,))
          global(v.type_name());
          tuple_items(v.items());
          op('\x85');
          op('R');
        } else {
          tuple_items(v.items());
        }
        return;
      case PyKind::Dict: dict(v); return;
      case PyKind::Global: global(v.type_name()); return;
      case PyKind::Object: object(v); return;
      case PyKind::Tensor: tensor(v.tensor()); return;
      case PyKind::Storage: persistent_id(*v.storage()); return;
      case PyKind::BigInt:
      case PyKind::Set: break;
    }
    MPT_THROW(str("torch.save writer: a ", py_kind_name(v.kind()), " (", v.describe(), ") is not written"),
              "internal: the checkpoint writer built a value it cannot pickle");
  }

 private:
  void op(char c) { out.push_back(c); }
  void le(uint64_t x, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  }
  void integer(int64_t x) {
    if (x >= 0 && x < 256) {
      op('K');
      le(static_cast<uint64_t>(x), 1);
    } else if (x >= 0 && x < 65536) {
      op('M');
      le(static_cast<uint64_t>(x), 2);
    } else if (x >= INT32_MIN && x <= INT32_MAX) {
      op('J');
      le(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(x))), 4);
    } else {  // LONG1: little-endian two's complement, the fewest bytes that keep the sign
      std::string b;
      const uint64_t u = static_cast<uint64_t>(x);
      for (int n = 1; n <= 8; ++n) {
        const int64_t lo = n == 8 ? INT64_MIN : -(int64_t{1} << (8 * n - 1));
        const int64_t hi = n == 8 ? INT64_MAX : (int64_t{1} << (8 * n - 1)) - 1;
        if (x >= lo && x <= hi) {
          for (int i = 0; i < n; ++i) b.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
          break;
        }
      }
      op('\x8a');
      le(b.size(), 1);
      out += b;
    }
  }
  void floating(double d) {
    op('G');
    uint64_t u;
    std::memcpy(&u, &d, 8);
    for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void unicode(const std::string& s) {
    MPT_CHECK(s.size() <= UINT32_MAX, "torch.save writer: a string over 4 GiB", "");
    op('X');
    le(s.size(), 4);
    out += s;
  }
  // GLOBAL 'module\nname\n': the last dotted component is the name.
  void global(const std::string& dotted) {
    const size_t dot = dotted.rfind('.');
    MPT_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < dotted.size(),
              str("torch.save writer: global '", dotted, "' has no module"), "internal");
    op('c');
    out += dotted.substr(0, dot) + "\n" + dotted.substr(dot + 1) + "\n";
  }
  void bytes(const PyValue& v) {
    const std::string& b = v.as_bytes();
    if (b.empty()) {  // bytes(): builtins.bytes()
      global(v.type_name() == "bytearray" ? "builtins.bytearray" : "builtins.bytes");
      op(')');
      op('R');
      return;
    }
    MPT_CHECK(v.type_name().empty(), "torch.save writer: a bytearray is not written", "internal");
    global("_codecs.encode");
    std::string latin1;  // each byte as the code point of its value, in UTF-8
    for (unsigned char c : b) {
      if (c < 0x80) latin1.push_back(static_cast<char>(c));
      else latin1 += {static_cast<char>(0xc0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3f))};
    }
    unicode(latin1);
    unicode("latin1");
    op('\x86');
    op('R');
  }
  void tuple_items(const std::vector<PyPtr>& items) {
    if (items.empty()) return op(')');
    if (items.size() <= 3) {
      for (const PyPtr& i : items) value(*i);
      op(static_cast<char>(0x85 + items.size() - 1));
      return;
    }
    op('(');
    for (const PyPtr& i : items) value(*i);
    op('t');
  }
  void list(const PyValue& v) {
    op(']');
    const auto& items = v.items();
    if (items.size() == 1) {
      value(*items[0]);
      op('a');
    } else if (!items.empty()) {
      op('(');
      for (const PyPtr& i : items) value(*i);
      op('e');
    }
  }
  void dict(const PyValue& v) {
    if (v.type_name() == "collections.OrderedDict") {
      global("collections.OrderedDict");
      op(')');
      op('R');
    } else {
      MPT_CHECK(v.type_name().empty(), str("torch.save writer: a ", v.type_name(), " is not written"), "internal");
      op('}');
    }
    const auto& items = v.dict_items();
    if (items.size() == 1) {
      value(*items[0].first);
      value(*items[0].second);
      op('s');
    } else if (!items.empty()) {
      op('(');
      for (const auto& [k, x] : items) value(*k), value(*x);
      op('u');
    }
    if (v.state()) {
      value(*v.state());
      op('b');
    }
  }
  void object(const PyValue& v) {
    global(v.type_name());
    const PyValue* args = v.args();
    if (args) tuple_items(args->items());
    else op(')');
    op(v.type_name() == "argparse.Namespace" ? '\x81' : 'R');  // copyreg.__newobj__ for plain classes
    if (v.state()) {
      value(*v.state());
      op('b');
    }
  }
  void persistent_id(const TorchStorage& s) {
    op('(');
    unicode("storage");
    global(s.type_name);
    unicode(s.key);
    unicode(s.location);
    integer(static_cast<int64_t>(s.nbytes / torch_dtype_size(s.dtype)));
    op('t');
    op('Q');
  }
  void tensor(const TorchTensor& t) {
    MPT_CHECK(t.storage, "torch.save writer: a tensor without a storage", "internal");
    global("torch._utils._rebuild_tensor_v2");
    op('(');
    persistent_id(*t.storage);
    integer(t.offset);
    std::vector<PyPtr> shape, stride;
    for (int64_t d : t.shape) shape.push_back(PyValue::integer(d));
    for (int64_t d : t.stride) stride.push_back(PyValue::integer(d));
    tuple_items(shape);
    tuple_items(stride);
    op(t.requires_grad ? '\x88' : '\x89');
    global("collections.OrderedDict");  // backward hooks: OrderedDict()
    op(')');
    op('R');
    op('t');
    op('R');
  }
};

}  // namespace

std::string pickle_protocol2(const PyValue& v) {
  Pickler p;
  p.out = "\x80\x02";
  p.value(v);
  p.out.push_back('.');
  return p.out;
}

// ---- tensors ---------------------------------------------------------------------------------

PyPtr TorchSaveWriter::tensor(TorchDType dtype, const std::vector<int64_t>& shape, std::vector<uint8_t> bytes) {
  const char* storage = torch_dtype_storage(dtype);
  MPT_CHECK(storage, str("torch.save writer: ", torch_dtype_name(dtype), " has no typed storage"), "internal");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  MPT_CHECK(bytes.size() == static_cast<size_t>(numel) * torch_dtype_size(dtype),
            str("torch.save writer: ", bytes.size(), " bytes for a ", torch_dtype_name(dtype), " tensor of ", numel,
                " elements"),
            "internal");
  auto s = std::make_shared<TorchStorage>();
  s->key = std::to_string(next_++);
  s->type_name = std::string("torch.") + storage;
  s->dtype = dtype;
  s->nbytes = bytes.size();
  s->location = "cpu";
  TorchTensor t;
  t.storage = s;
  t.dtype = dtype;
  t.shape = shape;
  t.stride.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) t.stride[d - 1] = t.stride[d] * shape[d];
  data_.emplace_back(s->key, std::move(bytes));
  return PyValue::tensor_value(std::move(t));
}

PyPtr TorchSaveWriter::tensor_f32(const std::vector<int64_t>& shape, const std::vector<float>& values) {
  std::vector<uint8_t> b(values.size() * 4);
  std::memcpy(b.data(), values.data(), b.size());  // little-endian hosts only (checked by the reader too)
  return tensor(TorchDType::F32, shape, std::move(b));
}

// ---- the zip ---------------------------------------------------------------------------------

namespace {

constexpr uint64_t kAlign = 64;  // PyTorchStreamWriter's kFieldAlignment

struct Record {
  std::string name;
  const uint8_t* data;
  uint64_t size;
};

void put(std::string& o, uint64_t x, int n) {
  for (int i = 0; i < n; ++i) o.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
}

}  // namespace

std::string TorchSaveWriter::serialize(const PyValue& root, const std::string& archive) const {
  const std::string pkl = pickle_protocol2(root);
  static const std::string kFormat = "1", kAlignText = "64", kOrder = "little", kVersion = "3\n";
  auto bytes_of = [](const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); };
  std::vector<Record> recs = {{archive + "/data.pkl", bytes_of(pkl), pkl.size()},
                              {archive + "/.format_version", bytes_of(kFormat), kFormat.size()},
                              {archive + "/.storage_alignment", bytes_of(kAlignText), kAlignText.size()},
                              {archive + "/byteorder", bytes_of(kOrder), kOrder.size()}};
  for (const auto& [key, b] : data_) recs.push_back({archive + "/data/" + key, b.data(), b.size()});
  recs.push_back({archive + "/version", bytes_of(kVersion), kVersion.size()});

  std::string out, central;
  for (const Record& r : recs) {
    MPT_CHECK(r.size < UINT32_MAX && out.size() < UINT32_MAX,
              str("torch.save writer: ", r.name, " would need ZIP64 (over 4 GiB)"),
              "write a smaller checkpoint (more tensor / pipeline ranks) or use --ckpt-format torch_dist in Megatron");
    const uint64_t offset = out.size();
    const uint32_t crc = zip_crc32(r.data, r.size);
    // Padding so that the data starts on a 64-byte boundary: extra field "FB" + size + 'Z'…
    const uint64_t start = offset + 30 + r.name.size() + 4;
    const uint64_t pad = (kAlign - start % kAlign) % kAlign;
    put(out, 0x04034b50, 4);
    put(out, 20, 2);  // version needed (2.0)
    put(out, 0, 2);   // flags
    put(out, 0, 2);   // stored
    put(out, 0, 2), put(out, 0, 2);  // time, date: none (byte-stable)
    put(out, crc, 4);
    put(out, r.size, 4), put(out, r.size, 4);
    put(out, r.name.size(), 2);
    put(out, 4 + pad, 2);
    out += r.name;
    put(out, 0x4246, 2);
    put(out, pad, 2);
    out.append(pad, 'Z');
    out.append(reinterpret_cast<const char*>(r.data), r.size);

    put(central, 0x02014b50, 4);
    put(central, 20, 2), put(central, 20, 2);  // made by, needed
    put(central, 0, 2), put(central, 0, 2), put(central, 0, 2), put(central, 0, 2);  // flags, method, time, date
    put(central, crc, 4);
    put(central, r.size, 4), put(central, r.size, 4);
    put(central, r.name.size(), 2);
    put(central, 0, 2), put(central, 0, 2);  // extra, comment
    put(central, 0, 2), put(central, 0, 2);  // disk, internal attributes
    put(central, 0, 4);                      // external attributes
    put(central, offset, 4);
    central += r.name;
  }
  const uint64_t cd_offset = out.size();
  MPT_CHECK(cd_offset + central.size() < UINT32_MAX, "torch.save writer: the archive would need ZIP64 (over 4 GiB)",
            "write a smaller checkpoint (more tensor / pipeline ranks)");
  out += central;
  put(out, 0x06054b50, 4);
  put(out, 0, 2), put(out, 0, 2);  // this disk, the directory's disk
  put(out, recs.size(), 2), put(out, recs.size(), 2);
  put(out, central.size(), 4);
  put(out, cd_offset, 4);
  put(out, 0, 2);  // comment
  return out;
}

uint64_t TorchSaveWriter::save(const std::string& path, const PyValue& root) const {
  const std::string bytes = serialize(root, std::filesystem::path(path).stem().string());
  const std::string tmp = path + ".tmp";
  write_file_checked(tmp, bytes, "the torch.save file");
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MPT_CHECK(!ec, str("cannot rename ", tmp, " to ", path, ": ", ec.message()), "check the directory's permissions");
  return bytes.size();
}

}  // namespace mpitron::io
