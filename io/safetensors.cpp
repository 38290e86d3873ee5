#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/json.h"
#include "tensor/dtype.h"

namespace mpitron::io {

size_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  MPT_THROW(str("unknown safetensors dtype \"", d, "\""), "expected F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL");
}

int64_t Safetensors::index(const std::string& name) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

const SafeTensor& Safetensors::at(const std::string& name) const {
  const int64_t i = index(name);
  MPT_CHECK(i >= 0, str("safetensors: no tensor named ", name), "");
  return tensors[static_cast<size_t>(i)];
}

Tensor Safetensors::to_f32(const std::string& name) const {
  const SafeTensor& t = at(name);
  const size_t n = static_cast<size_t>(t.numel());
  Tensor out = Tensor::empty(t.shape, DType::F32);
  float* o = out.data<float>();
  const uint8_t* b = t.bytes.data();
  if (t.dtype == "F32") {
    std::memcpy(o, b, n * 4);
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, b + 2 * i, 2);
      o[i] = t.dtype == "F16" ? f16_to_f32(f16_t{bits}) : bf16_to_f32(bf16_t{bits});
    }
  } else if (t.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, b + 8 * i, 8);
      o[i] = static_cast<float>(v);
    }
  } else {
    MPT_THROW(str("safetensors tensor ", name, " has dtype ", t.dtype, "; only F32, F16, BF16 and F64 convert to f32"), "");
  }
  return out;
}

void Safetensors::add_f32(const std::string& name, const Tensor& t, const std::string& dtype) {
  MPT_CHECK(!has(name), str("safetensors: tensor ", name, " added twice"), "");
  const Tensor c = t.to(Device::cpu()).contiguous();
  MPT_CHECK(c.dtype() == DType::F32, str("add_f32: ", name, " is ", c.describe()), "");
  SafeTensor s;
  s.name = name;
  s.dtype = dtype;
  s.shape = c.shape();
  const size_t n = static_cast<size_t>(c.numel());
  const float* v = c.data<float>();
  s.bytes.resize(n * safetensors_dtype_size(dtype));
  if (dtype == "F32") {
    std::memcpy(s.bytes.data(), v, n * 4);
  } else if (dtype == "F16" || dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t bits = dtype == "F16" ? f32_to_f16(v[i]).bits : f32_to_bf16(v[i]).bits;
      std::memcpy(s.bytes.data() + 2 * i, &bits, 2);
    }
  } else {
    MPT_THROW(str("add_f32: cannot store ", name, " as ", dtype), "use F32, F16 or BF16");
  }
  tensors.push_back(std::move(s));
}

Safetensors read_safetensors(const std::string& path) {
  // A FIFO would block the open (and a device never ends): only regular files are read.
  check_regular_file(path, "safetensors file");
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open safetensors file ", path), "check the path");
  f.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  MPT_CHECK(size >= 8, str(path, " is ", size, " bytes: too short for a safetensors file"), "");
  uint8_t len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len_bytes[i];
  MPT_CHECK(hlen <= size - 8 && hlen < (uint64_t{1} << 31),
            str(path, ": header length ", hlen, " exceeds the file (", size, " bytes)"), "is it a safetensors file?");
  std::string header(static_cast<size_t>(hlen), '\0');
  f.read(header.data(), static_cast<std::streamsize>(hlen));
  const nlohmann::json j = parse_json_text(header, str(path, ": the safetensors header"));
  MPT_CHECK(j.is_object(), str(path, ": the safetensors header is not a JSON object"), "");
  const uint64_t data_size = size - 8 - hlen;
  Safetensors st;
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      MPT_CHECK(it.value().is_object(), str(path, ": __metadata__ is not an object"), "");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        MPT_CHECK(m.value().is_string(), str(path, ": __metadata__ value of ", m.key(), " is not a string"), "");
        st.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafeTensor t;
    t.name = it.key();
    uint64_t b = 0, e = 0;
    try {
      const nlohmann::json& v = it.value();
      t.dtype = v.at("dtype").get<std::string>();
      for (const auto& d : v.at("shape")) {
        const int64_t x = d.get<int64_t>();
        MPT_CHECK(x >= 0, str(path, ": tensor ", t.name, " has a negative dimension"), "");
        t.shape.push_back(x);
      }
      const auto& off = v.at("data_offsets");
      MPT_CHECK(off.is_array() && off.size() == 2, str(path, ": tensor ", t.name, " data_offsets is not [begin, end]"), "");
      b = off[0].get<uint64_t>();
      e = off[1].get<uint64_t>();
    } catch (const nlohmann::json::exception& ex) {
      MPT_THROW(str(path, ": tensor ", t.name, " has a malformed header entry: ", ex.what()), "");
    }
    MPT_CHECK(b <= e && e <= data_size,
              str(path, ": tensor ", t.name, " data_offsets [", b, ", ", e, ") outside the data (", data_size, " bytes)"), "");
    const uint64_t want = static_cast<uint64_t>(t.numel()) * safetensors_dtype_size(t.dtype);
    MPT_CHECK(e - b == want, str(path, ": tensor ", t.name, " ", t.dtype, shape_str(t.shape), " needs ", want,
                                 " bytes but data_offsets give ", e - b), "");
    ranges.push_back({b, e, st.tensors.size()});
    st.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& c) { return a.begin < c.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    MPT_CHECK(ranges[i].begin >= ranges[i - 1].end,
              str(path, ": tensors ", st.tensors[ranges[i - 1].index].name, " and ", st.tensors[ranges[i].index].name,
                  " overlap"), "");
  std::vector<SafeTensor> ordered;
  for (const Range& r : ranges) {
    SafeTensor& t = st.tensors[r.index];
    t.bytes.resize(static_cast<size_t>(r.end - r.begin));
    f.seekg(static_cast<std::streamoff>(8 + hlen + r.begin));
    f.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    MPT_CHECK(f.good(), str(path, ": short read of tensor ", t.name), "the file is truncated");
    ordered.push_back(std::move(t));
  }
  st.tensors = std::move(ordered);
  return st;
}

void write_safetensors(const std::string& path, const Safetensors& st) {
  nlohmann::json j = nlohmann::json::object();
  uint64_t off = 0;
  for (const SafeTensor& t : st.tensors) {
    const uint64_t n = static_cast<uint64_t>(t.numel()) * safetensors_dtype_size(t.dtype);
    MPT_CHECK(n == t.bytes.size(), str("write_safetensors: tensor ", t.name, " ", t.dtype, shape_str(t.shape), " has ",
                                       t.bytes.size(), " bytes, expected ", n), "");
    MPT_CHECK(!j.contains(t.name) && t.name != "__metadata__", str("write_safetensors: duplicate tensor ", t.name), "");
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  if (!st.metadata.empty()) j["__metadata__"] = st.metadata;
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  OutputFile f(path, "safetensors file");
  uint8_t len_bytes[8];
  uint64_t hlen = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(hlen >> (8 * i));
  f.write(std::string_view(reinterpret_cast<const char*>(len_bytes), 8));
  f.write(header);
  for (const SafeTensor& t : st.tensors) f.write(std::string_view(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()));
  f.close();  // write, flush, fsync and close checked: a full disk is an error naming the file
}

}  // namespace mpitron::io
