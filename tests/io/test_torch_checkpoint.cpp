// tests/io/test_torch_checkpoint.cpp — mpitron's reader of PyTorch files against
// torch's own reading of files written by the real tools.
//
// tests/io/ref/torch/<name>/ holds checkpoints written by torch.save,
// megatron-core (torch_dist and Megatron-LM's legacy layout, TP/PP/DP),
// DeepSpeed ZeRO-1/2/3 (+ zero_to_fp32 and ds_to_universal) and a synthetic
// file with every dtype and pickle feature, each with a ref.json listing what
// torch.load / pickle.load / torch.distributed.checkpoint read in it
// (tests/reference/torch_checkpoint_ref.py). Here every file is opened, its
// whole value tree walked and compared node by node with that listing, every
// tensor read (CRC-32 of its bytes in the stored dtype, its norm and sampled
// values), the torch_dist metadata helper compared with torch's chunk list,
// chunks assembled into global tensors and checked against both the chunk
// blobs and the legacy checkpoint of the same model, sub-rectangle reads
// counted to the byte, and DeepSpeed's ZeRO-1/2/3 weights and Adam moments
// assembled from the flat partitions by lazy reads equal to zero_to_fp32's
// output and ds_to_universal's files.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/torch_checkpoint.h"
#include "io/torch_dist.h"
#include "io/torch_globals.h"
#include "tests/io/torch_test_util.h"

using namespace mpitron;
using namespace mpitron::io;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kRef = fs::path(MPITRON_SOURCE_DIR) / "tests" / "io" / "ref" / "torch";

// One stored element as a double (integers exactly up to 2^53, which the listings respect).
double element(TorchDType t, const uint8_t* p) {
  switch (t) {
    case TorchDType::F64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case TorchDType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case TorchDType::U64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    default: {
      float f;
      torch_dtype_to_f32(t, p, &f, 1);
      return f;
    }
  }
}
int64_t element_int(TorchDType t, const uint8_t* p) {
  switch (t) {
    case TorchDType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case TorchDType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case TorchDType::I16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case TorchDType::I8: return static_cast<int8_t>(*p);
    default: return static_cast<int64_t>(element(t, p));
  }
}

bool same_float(double a, const json& j) {
  if (j.is_object()) {
    const std::string s = j.at("float");
    return s == "nan" ? std::isnan(a) : s == "inf" ? a == INFINITY : a == -INFINITY;
  }
  const double b = j.get<double>();
  return a == b && std::signbit(a) == std::signbit(b);
}

// Compares our value tree with the listing; returns "" or the first difference with its path.
struct Walker {
  const TorchFile* file = nullptr;  // reads tensors (null: tensors are not expected)
  int64_t tensors = 0, nodes = 0;
  uint64_t tensor_bytes = 0;

  std::string diff(const PyValue& v, const json& j, const std::string& at) {
    ++nodes;
    auto bad = [&](const std::string& what) {
      return str(at, ": ", what, " (ours: ", v.describe(), ", torch: ", j.dump().substr(0, 200), ")");
    };
    if (j.is_null()) return v.is_none() ? "" : bad("not None");
    if (j.is_boolean()) return v.is(PyKind::Bool) && v.as_bool() == j.get<bool>() ? "" : bad("bool differs");
    if (j.is_number_integer()) return v.is(PyKind::Int) && v.as_int() == j.get<int64_t>() ? "" : bad("int differs");
    if (j.is_number_float()) return v.is(PyKind::Float) && same_float(v.as_float(), j) ? "" : bad("float differs");
    if (j.is_string()) return v.is(PyKind::Str) && v.as_str() == j.get<std::string>() ? "" : bad("str differs");
    if (!j.is_object()) return bad("unexpected listing");
    if (j.contains("float")) return v.is(PyKind::Float) && same_float(v.as_float(), j) ? "" : bad("float differs");
    if (j.contains("bigint")) return v.is(PyKind::BigInt) && v.big_int() == j["bigint"] ? "" : bad("big int differs");
    if (j.contains("bytes")) {
      if (!v.is(PyKind::Bytes) || v.as_bytes().size() != j["bytes"].get<size_t>()) return bad("bytes differ in size");
      if (zip_crc32(v.as_bytes().data(), v.as_bytes().size()) != j["crc32"].get<uint32_t>()) return bad("bytes differ");
      return "";
    }
    if (j.contains("global")) return v.is(PyKind::Global) && v.type_name() == j["global"] ? "" : bad("global differs");
    const std::string type = j.value("type", "");
    if (j.contains("list") || j.contains("tuple")) {
      const bool list = j.contains("list");
      const json& items = list ? j["list"] : j["tuple"];
      if (!v.is(list ? PyKind::List : PyKind::Tuple) || v.type_name() != type) return bad("kind or type differs");
      if (v.size() != items.size()) return bad(str("length ", v.size(), " vs ", items.size()));
      for (size_t i = 0; i < items.size(); ++i)
        if (std::string d = diff(v[i], items[i], str(at, "[", i, "]")); !d.empty()) return d;
      return "";
    }
    if (j.contains("set")) {
      if (!v.is(PyKind::Set) || (v.type_name() == "frozenset") != j["frozen"].get<bool>()) return bad("set kind");
      if (v.size() != j["set"].size()) return bad("set size");
      std::vector<bool> used(v.size());
      for (const json& e : j["set"]) {  // order differs between Python runs: match each item
        bool found = false;
        for (size_t i = 0; i < v.size() && !found; ++i)
          if (!used[i] && diff(v[i], e, at).empty()) found = used[i] = true;
        if (!found) return bad(str("no set item equals ", e.dump()));
      }
      return "";
    }
    if (j.contains("dict")) {
      if (!v.is_dict() || v.type_name() != type) return bad("not a dict of that type");
      const json& items = j["dict"];
      if (v.size() != items.size()) return bad(str("size ", v.size(), " vs ", items.size()));
      for (size_t i = 0; i < items.size(); ++i) {
        const auto& [k, val] = v.dict_items()[i];
        const std::string kat =
            str(at, "{", items[i][0].is_string() ? items[i][0].get<std::string>() : items[i][0].dump(), "}");
        if (std::string d = diff(*k, items[i][0], kat + " key"); !d.empty()) return d;
        if (std::string d = diff(*val, items[i][1], kat); !d.empty()) return d;
        // the key is found again by lookup
        if (k->is(PyKind::Str) && v.get(k->as_str()) != val.get()) return bad("lookup by key fails");
      }
      return state_diff(v.state(), j, at);
    }
    if (j.contains("object")) {
      if (!v.is(PyKind::Object) || v.type_name() != j["object"]) return bad("object class differs");
      if (std::string d = diff(*v.args(), j["args"], at + ".args"); !d.empty()) return d;
      return state_diff(v.state(), j, at);
    }
    if (j.contains("tensor")) return tensor_diff(v, j["tensor"], at);
    return bad("unknown listing node");
  }

  std::string state_diff(const PyValue* state, const json& j, const std::string& at) {
    if (!j.contains("state")) return state ? str(at, ": has a state torch does not list") : "";
    if (!state) return str(at, ": no state, torch lists one");
    return diff(*state, j["state"], at + ".state");
  }

  std::string tensor_diff(const PyValue& v, const json& j, const std::string& at) {
    if (!v.is_tensor()) return str(at, ": not a tensor but ", v.describe());
    if (!file) return str(at, ": a tensor where none is expected");
    const TorchTensor& t = v.tensor();
    auto bad = [&](const std::string& what) { return str(at, ": tensor ", t.describe(), ": ", what); };
    if (torch_dtype_name(t.dtype) != j["dtype"].get<std::string>())
      return bad("dtype " + j["dtype"].get<std::string>());
    if (t.shape != j["shape"].get<std::vector<int64_t>>()) return bad("shape differs");
    if (t.stride != j["stride"].get<std::vector<int64_t>>()) return bad("stride differs");
    if (t.offset != j["offset"].get<int64_t>()) return bad("storage offset differs");
    if (t.storage->nbytes != j["storage_bytes"].get<uint64_t>()) return bad("storage size differs");
    if (t.requires_grad != j["requires_grad"].get<bool>()) return bad("requires_grad differs");
    if (t.parameter != j["parameter"].get<bool>()) return bad("parameter flag differs");
    const std::vector<uint8_t> raw = file->read_raw(t);
    ++tensors;
    tensor_bytes += raw.size();
    if (zip_crc32(raw.data(), raw.size()) != j["crc32"].get<uint32_t>()) return bad("bytes differ (CRC-32)");
    const size_t es = torch_dtype_size(t.dtype);
    const bool integer = !torch_dtype_is_floating(t.dtype);
    double sum = 0;
    for (size_t i = 0; i < raw.size(); i += es) {
      const double x = element(t.dtype, raw.data() + i);
      sum += x * x;
    }
    const json& jn = j["norm"];
    const double norm = std::sqrt(sum);
    if (jn.is_object()) {
      if (!same_float(norm, jn)) return bad("norm differs");
    } else if (std::fabs(norm - jn.get<double>()) > 1e-9 * std::max(1.0, std::fabs(jn.get<double>()))) {
      return bad(str("norm ", norm, " vs ", jn.get<double>()));
    }
    for (const json& s : j["samples"]) {
      const size_t i = s[0].get<size_t>();
      const uint8_t* p = raw.data() + i * es;
      if (integer ? element_int(t.dtype, p) != s[1].get<int64_t>() : !same_float(element(t.dtype, p), s[1]))
        return bad(str("element ", i, " differs from ", s[1].dump()));
    }
    // f32 conversion agrees with the raw element values
    if (t.dtype != TorchDType::C64 && t.dtype != TorchDType::C128) {
      const std::vector<float> f = file->to_f32(t);
      for (size_t i = 0; i < f.size(); ++i) {
        const float want = static_cast<float>(element(t.dtype, raw.data() + i * es));
        if (!(f[i] == want || (std::isnan(f[i]) && std::isnan(want)))) return bad(str("to_f32 element ", i));
      }
    }
    if (j.contains("attrs")) {
      if (!t.attrs) return bad("no attrs");
      return diff(*t.attrs, j["attrs"], at + ".attrs");
    }
    return t.attrs ? bad("attrs torch does not list") : "";
  }
};

json load_listing(const fs::path& dir) {
  std::ifstream in(dir / "ref.json");
  REQUIRE(in.good());
  return json::parse(in);
}

std::vector<fs::path> ref_dirs() {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(kRef))
    if (e.is_directory() && fs::exists(e.path() / "ref.json")) v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("torch reader: every reference file reads as torch reads it") {
  const std::vector<fs::path> dirs = ref_dirs();
  REQUIRE(dirs.size() >= 8);
  int64_t files = 0, tensors = 0, nodes = 0, blobs = 0;
  uint64_t bytes = 0;
  for (const fs::path& dir : dirs) {
    const json ref = load_listing(dir);
    for (const json& f : ref["files"]) {
      const std::string path = (dir / f["path"].get<std::string>()).string();
      const std::string kind = f["kind"];
      CAPTURE(path);
      ++files;
      Walker w;
      if (kind == "torch_save") {
        const TorchFile tf = TorchFile::open(path);
        w.file = &tf;
        CHECK(w.diff(tf.root(), f["root"], "root") == "");
        tf.verify();
      } else if (kind == "pickle") {
        const std::string data = test::read_file_bytes(path);
        const PyPtr root = unpickle(reinterpret_cast<const uint8_t*>(data.data()), data.size(), path);
        if (!f["root"].is_null()) CHECK(w.diff(*root, f["root"], "root") == "");
      } else if (kind == "distcp") {
        auto file = std::make_shared<const ReadOnlyFile>(path);
        for (const json& b : f["blobs"]) {
          const TorchFile tf = TorchFile::open_range(file, b["offset"].get<uint64_t>(), b["length"].get<uint64_t>());
          w.file = &tf;
          CHECK(w.diff(tf.root(), b["root"], b["key"].get<std::string>()) == "");
          ++blobs;
        }
      } else if (kind == "safetensors") {
        const Safetensors st = read_safetensors(path);
        CHECK(st.tensors.size() == f["tensors"].size());
        for (const auto& [name, e] : f["tensors"].items()) {
          const SafeTensor& t = st.at(name);
          CHECK(t.shape == e["tensor"]["shape"].get<std::vector<int64_t>>());
          CHECK(zip_crc32(t.bytes.data(), t.bytes.size()) == e["tensor"]["crc32"].get<uint32_t>());
        }
      } else {
        REQUIRE(kind == "text");
        CHECK(test::read_file_bytes(path) == f["text"].get<std::string>());
      }
      tensors += w.tensors;
      nodes += w.nodes;
      bytes += w.tensor_bytes;
    }
  }
  MESSAGE(files, " files (", blobs, " torch_dist blobs), ", nodes, " values, ", tensors, " tensors (", bytes,
          " bytes) equal torch's reading");
  CHECK(tensors > 1000);
}

TEST_CASE("torch reader: the synthetic file's features (every dtype, views, protocols 2 and 5)") {
  for (const char* name : {"synthetic_p2.pt", "synthetic_p5.pt"}) {
    CAPTURE(name);
    const TorchFile f = TorchFile::open((kRef / "synthetic" / name).string());
    const PyValue& dt = f.root().at("dtypes");
    for (const char* d : {"float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "bool", "uint8",
                          "int8", "int16", "int32", "int64"})
      CHECK(torch_dtype_name(dt.at(d).tensor().dtype) == std::string(d));
    const PyValue& views = f.root().at("views");
    CHECK(views.at("transposed").tensor().stride == std::vector<int64_t>{1, 10});
    CHECK(views.at("expanded").tensor().stride == std::vector<int64_t>{0, 1});
    CHECK(views.at("shared_a").tensor().storage == views.at("shared_b").tensor().storage);
    // argparse.Namespace reads like a dict; enums and devices stay opaque objects
    const PyValue& args = f.root().at("objects").at("args");
    REQUIRE(args.attr("hidden_size") != nullptr);
    CHECK(args.attr("hidden_size")->as_int() == 32);
    CHECK(args.attr("params_dtype")->type_name() == "torch.bfloat16");
    CHECK(f.root().at("objects").at("device").type_name() == "torch.device");
    // the state_dict's OrderedDict keeps its _metadata
    const PyValue& sd = f.root().at("state_dict");
    CHECK(sd.type_name() == "collections.OrderedDict");
    REQUIRE(sd.state() != nullptr);
    CHECK(sd.state()->at("_metadata").is_dict());
    CHECK(sd.at("w").tensor().parameter);
    // non-string keys
    const PyValue& c = f.root().at("containers");
    CHECK(c.at("int_keys").get(-5)->as_str() == "c");
    CHECK(c.at("long_list").size() == 2500);
    CHECK(f.root().at("param_with_state").tensor().attrs->at("partition_dim").as_int() == 0);
  }
}

TEST_CASE("torch_dist: the .metadata helper, chunk assembly and the legacy checkpoint agree") {
  int64_t checked_chunks = 0, cross = 0;
  for (const fs::path& dir : ref_dirs()) {
    const json ref = load_listing(dir);
    if (!ref.contains("dcp_metadata")) continue;
    // crc32 of each (fqn, chunk offsets) blob as torch listed it
    std::map<std::string, uint32_t> blob_crc;
    for (const json& f : ref["files"])
      if (f["kind"] == "distcp")
        for (const json& b : f["blobs"])
          if (b["root"].contains("tensor"))
            blob_crc[b["key"].get<std::string>() + b["chunk_offset"].dump()] =
                b["root"]["tensor"]["crc32"].get<uint32_t>();
    for (const auto& [rel, want] : ref["dcp_metadata"].items()) {
      CAPTURE(rel);
      const DcpCheckpoint ck((dir / rel).string());
      const DcpMetadata& md = ck.metadata();
      size_t n_tensors = 0, n_bytes = 0;
      for (const auto& [fqn, w] : want.items()) {
        CAPTURE(fqn);
        if (w["type"] == "bytes") {
          const DcpBytes* b = md.bytes_item(fqn);
          REQUIRE(b);
          CHECK(b->file == w["file"].get<std::string>());
          CHECK(b->offset == w["offset"].get<uint64_t>());
          CHECK(b->length == w["length"].get<uint64_t>());
          const TorchFile obj = ck.open_bytes(*b);  // a pickled object: reads over the allow-list
          CHECK(obj.root().depth() >= 1);
          ++n_bytes;
          continue;
        }
        const DcpTensor* t = md.tensor(fqn);
        REQUIRE(t);
        ++n_tensors;
        CHECK(torch_dtype_name(t->dtype) == w["dtype"].get<std::string>());
        CHECK(t->size == w["size"].get<std::vector<int64_t>>());
        REQUIRE(t->chunks.size() == w["chunks"].size());
        for (size_t i = 0; i < t->chunks.size(); ++i) {
          const json& wc = w["chunks"][i];
          CHECK(t->chunks[i].offsets == wc["offsets"].get<std::vector<int64_t>>());
          CHECK(t->chunks[i].sizes == wc["sizes"].get<std::vector<int64_t>>());
          CHECK(t->chunks[i].file == wc["file"].get<std::string>());
          CHECK(t->chunks[i].offset == wc["offset"].get<uint64_t>());
          CHECK(t->chunks[i].length == wc["length"].get<uint64_t>());
        }
        // The global tensor assembled from its chunks; each chunk's window equals torch's chunk bytes.
        int64_t numel = 1;
        for (int64_t d : t->size) numel *= d;
        const size_t es = torch_dtype_size(t->dtype);
        std::vector<uint8_t> global(static_cast<size_t>(numel) * es);
        ck.read_raw(fqn, std::vector<int64_t>(t->size.size(), 0), t->size, global.data());
        for (const DcpChunk& c : t->chunks) {
          int64_t cn = 1;
          for (int64_t s : c.sizes) cn *= s;
          std::vector<uint8_t> win(static_cast<size_t>(cn) * es);
          ck.read_raw(fqn, c.offsets, c.sizes, win.data());
          const auto it = blob_crc.find(fqn + json(c.offsets).dump());
          REQUIRE(it != blob_crc.end());
          CHECK(zip_crc32(win.data(), win.size()) == it->second);
          ++checked_chunks;
        }
      }
      CHECK(md.tensors.size() == n_tensors);
      CHECK(md.bytes.size() == n_bytes);
    }
  }
  // The same weights through both formats: megatron-core saved one model as torch_dist and legacy.
  struct Pair {
    const char* legacy;  // in model_optim_rng.pt's "model"
    const char* dist;    // torch_dist key
    int layer;           // index into the stacked layer dimension, -1 for none
  };
  const Pair pairs[] = {
      {"embedding.word_embeddings.weight", "embedding.word_embeddings.weight", -1},
      {"embedding.position_embeddings.weight", "embedding.position_embeddings.weight", -1},
      {"decoder.final_layernorm.weight", "decoder.final_layernorm.weight", -1},
      {"decoder.layers.0.input_layernorm.weight", "decoder.layers.self_attention.linear_qkv.layer_norm_weight", 0},
      {"decoder.layers.1.pre_mlp_layernorm.bias", "decoder.layers.mlp.linear_fc1.layer_norm_bias", 1},
      {"decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.self_attention.linear_qkv.weight", 0},
      {"decoder.layers.1.self_attention.linear_proj.weight", "decoder.layers.self_attention.linear_proj.weight", 1},
      {"decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.mlp.linear_fc1.weight", 1},
      {"decoder.layers.0.mlp.linear_fc2.bias", "decoder.layers.mlp.linear_fc2.bias", 0},
  };
  {
    const TorchFile legacy =
        TorchFile::open((kRef / "mcore_gpt2/torch/iter_0000002/mp_rank_00/model_optim_rng.pt").string());
    const DcpCheckpoint dist((kRef / "mcore_gpt2/torch_dist/iter_0000002").string());
    for (const Pair& p : pairs) {
      CAPTURE(p.legacy);
      const TorchTensor& lt = legacy.root().at("model").at(p.legacy).tensor();
      const DcpTensor* dt = dist.metadata().tensor(p.dist);
      REQUIRE(dt);
      std::vector<int64_t> start(dt->size.size(), 0), count = dt->size;
      if (p.layer >= 0) start[0] = p.layer, count[0] = 1;
      std::vector<float> a(static_cast<size_t>(lt.numel())), b(a.size());
      legacy.read_f32(lt, a.data());
      dist.read_f32(p.dist, start, count, b.data());
      CHECK(a == b);
      ++cross;
    }
  }
  {  // TP2 x PP2: the legacy file of (tp, pp) holds stage pp's layer 0 and the tp-th third of QKV rows
    const DcpCheckpoint dist((kRef / "mcore_gpt2_tp2pp2/torch_dist/iter_0000002").string());
    for (int tp = 0; tp < 2; ++tp)
      for (int pp = 0; pp < 2; ++pp) {
        const TorchFile legacy = TorchFile::open(
            (kRef / str("mcore_gpt2_tp2pp2/torch/iter_0000002/mp_rank_0", tp, "_00", pp, "/model_optim_rng.pt"))
                .string());
        const TorchTensor& q =
            legacy.root().at("model").at("decoder.layers.0.self_attention.linear_qkv.weight").tensor();
        std::vector<float> a(static_cast<size_t>(q.numel())), b(a.size());
        legacy.read_f32(q, a.data());
        dist.read_f32("decoder.layers.self_attention.linear_qkv.weight", {pp, tp * q.shape[0], 0},
                      {1, q.shape[0], q.shape[1]}, b.data());
        CHECK(a == b);
        if (pp == 0) {
          const TorchTensor& e = legacy.root().at("model").at("embedding.word_embeddings.weight").tensor();
          std::vector<float> c(static_cast<size_t>(e.numel())), d(c.size());
          legacy.read_f32(e, c.data());
          dist.read_f32("embedding.word_embeddings.weight", {tp * e.shape[0], 0}, {e.shape[0], e.shape[1]}, d.data());
          CHECK(c == d);
        }
        cross += 2;
      }
  }
  MESSAGE(checked_chunks, " torch_dist chunks assembled and equal to torch's; ", cross,
          " tensors equal between the legacy and torch_dist saves of one model");
  CHECK(checked_chunks > 100);
}

TEST_CASE("torch reader: a sub-rectangle reads only its bytes") {
  const TorchFile f = TorchFile::open((kRef / "mcore_gpt2/torch/iter_0000002/mp_rank_00/model_optim_rng.pt").string());
  const ReadOnlyFile& file = f.zip().file();
  const TorchTensor& w = f.root().at("model").at("decoder.layers.0.mlp.linear_fc1.weight").tensor();  // [64, 16] f32
  REQUIRE(w.shape == std::vector<int64_t>{64, 16});
  const std::vector<float> all = f.to_f32(w);
  // rows 8..15: one contiguous run
  file.reset_counters();
  std::vector<float> rows(8 * 16);
  f.read_f32(w, {8, 0}, {8, 16}, rows.data());
  CHECK(file.bytes_read() == 8 * 16 * 4);
  CHECK(file.reads() == 1);
  CHECK(std::equal(rows.begin(), rows.end(), all.begin() + 8 * 16));
  // columns 4..7 of every row (a TP shard of the input dimension): 64 runs of 4 elements
  file.reset_counters();
  std::vector<float> cols(64 * 4);
  f.read_f32(w, {0, 4}, {64, 4}, cols.data());
  CHECK(file.bytes_read() == 64 * 4 * 4);
  CHECK(file.reads() == 64);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 4; ++c) CHECK(cols[static_cast<size_t>(r * 4 + c)] == all[static_cast<size_t>(r * 16 + 4 + c)]);

  // A slice of a flat ZeRO buffer: DeepSpeed's single_partition_of_fp32_groups[0].
  const TorchFile ds =
      TorchFile::open((kRef / "ds_zero2/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").string());
  const PyValue& osd = ds.root().at("optimizer_state_dict");
  const TorchTensor& flat = osd.at("single_partition_of_fp32_groups")[0].tensor();
  REQUIRE(flat.shape.size() == 1);
  REQUIRE(flat.shape[0] > 150);
  const std::vector<float> fl = ds.to_f32(flat);
  ds.zip().file().reset_counters();
  std::vector<float> part(50);
  ds.read_f32(flat, {100}, {50}, part.data());
  CHECK(ds.zip().file().bytes_read() == 50 * 4);
  CHECK(ds.zip().file().reads() == 1);
  CHECK(std::equal(part.begin(), part.end(), fl.begin() + 100));

  // A transposed view (stride (1, 10)): every element is its own run, and only those are read.
  const TorchFile syn = TorchFile::open((kRef / "synthetic/synthetic_p2.pt").string());
  const TorchTensor& tr = syn.root().at("views").at("transposed").tensor();  // [10, 6] over a [6, 10] base
  const TorchTensor& base = syn.root().at("views").at("base").tensor();
  const std::vector<float> b = syn.to_f32(base);
  syn.zip().file().reset_counters();
  std::vector<float> sub(3 * 2);
  syn.read_f32(tr, {4, 1}, {3, 2}, sub.data());
  CHECK(syn.zip().file().bytes_read() == 6 * 4);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      CHECK(sub[static_cast<size_t>(i * 2 + j)] == b[static_cast<size_t>((1 + j) * 10 + 4 + i)]);

  // torch_dist: a window of one chunk opens only that chunk's blob and reads its elements.
  const DcpCheckpoint ck((kRef / "mcore_gpt2_tp2pp2/torch_dist/iter_0000002").string());
  const DcpTensor* qkv =
      ck.metadata().tensor("decoder.layers.self_attention.linear_qkv.weight");  // [2, 48, 16], 4 chunks
  REQUIRE(qkv);
  REQUIRE(qkv->chunks.size() == 4);
  uint64_t file_bytes = 0;
  for (const auto& e : fs::directory_iterator(kRef / "mcore_gpt2_tp2pp2/torch_dist/iter_0000002"))
    if (e.path().extension() == ".distcp") {
      ck.file(e.path().filename().string())->reset_counters();
      file_bytes += fs::file_size(e.path());
    }
  std::vector<float> win(2 * 16);
  ck.read_f32("decoder.layers.self_attention.linear_qkv.weight", {1, 30, 0}, {1, 2, 16}, win.data());
  uint64_t read = 0, touched = 0;
  for (const auto& e : fs::directory_iterator(kRef / "mcore_gpt2_tp2pp2/torch_dist/iter_0000002"))
    if (e.path().extension() == ".distcp") {
      const uint64_t n = ck.file(e.path().filename().string())->bytes_read();
      read += n;
      touched += n > 0;
    }
  const DcpChunk* hit = nullptr;
  for (const DcpChunk& c : qkv->chunks)
    if (c.offsets[0] == 1 && c.offsets[1] <= 30 && 30 < c.offsets[1] + c.sizes[1]) hit = &c;
  REQUIRE(hit);
  CHECK(touched == 1);
  CHECK(read < hit->length);  // the blob's directory, its pickle and 128 tensor bytes: not even the whole blob
  MESSAGE("a 2x16 window of a torch_dist tensor read ", read, " bytes of ", file_bytes, " in its .distcp files");
}

TEST_CASE("torch dtypes: float8, float16 and bfloat16 widen exactly") {
  CHECK(f8_e4m3fn_to_f32(0x7e) == 448.0f);
  CHECK(f8_e4m3fn_to_f32(0xfe) == -448.0f);
  CHECK(std::isnan(f8_e4m3fn_to_f32(0x7f)));
  CHECK(std::isnan(f8_e4m3fn_to_f32(0xff)));
  CHECK(f8_e4m3fn_to_f32(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(f8_e4m3fn_to_f32(0x08) == std::ldexp(1.0f, -6));  // smallest normal
  CHECK(f8_e4m3fn_to_f32(0x38) == 1.0f);
  CHECK(f8_e5m2_to_f32(0x3c) == 1.0f);
  CHECK(f8_e5m2_to_f32(0x7b) == 57344.0f);
  CHECK(f8_e5m2_to_f32(0x7c) == INFINITY);
  CHECK(std::isnan(f8_e5m2_to_f32(0x7d)));
  CHECK(f8_e5m2_to_f32(0x01) == std::ldexp(1.0f, -16));
  // every e4m3fn code is ordered like its value (the positive half is monotone)
  for (int c = 1; c < 0x7f; ++c)
    CHECK(f8_e4m3fn_to_f32(static_cast<uint8_t>(c)) > f8_e4m3fn_to_f32(static_cast<uint8_t>(c - 1)));
  TorchDType t;
  CHECK(torch_dtype_from_storage("torch.BFloat16Storage", t));
  CHECK(t == TorchDType::BF16);
  CHECK(torch_dtype_from_storage("torch.cuda.HalfStorage", t));
  CHECK(t == TorchDType::F16);
  CHECK(torch_dtype_from_global("torch.float", t));
  CHECK(t == TorchDType::F32);
  CHECK_FALSE(torch_dtype_from_global("torch.device", t));
  // the allow-list is what io/torch_globals.h documents (spot checks)
  const std::vector<std::string> allow = torch_global_allow_list();
  for (const char* g :
       {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict", "argparse.Namespace",
        "torch.distributed.checkpoint.metadata.Metadata", "deepspeed.runtime.zero.config.ZeroStageEnum"})
    CHECK(std::find(allow.begin(), allow.end(), g) != allow.end());
  for (const char* g : {"os.system", "builtins.eval", "builtins.exec", "subprocess.Popen", "posix.system"})
    CHECK(std::find(allow.begin(), allow.end(), g) == allow.end());
}

// What the DeepSpeed loader will do, shown on the reference files: every parameter's fp32 master weight and
// Adam moments assembled from the ranks' flat partitions, reading only its own elements, equal
// zero_to_fp32's output and ds_to_universal's files bit for bit.
//   ZeRO-1/2: a group's flat vector is the ranks' single_partition_of_fp32_groups[g] (moments:
//             base_optimizer_state.state[g]) concatenated; the parameters of param_shapes[g] follow
//             each other in it.
//   ZeRO-3:   each parameter is split over the ranks in pieces of ceil(numel / world); rank r's piece
//             is at the running offset of its fp32_flat_groups[0] (moments: optimizer_state_dict.state[0]).
TEST_CASE("DeepSpeed ZeRO-1/2/3: weights and moments read lazily equal zero_to_fp32 and the universal checkpoint") {
  const int world = 2;
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const fs::path dir = kRef / str("ds_zero", stage);
    const std::string tag = test::read_file_bytes((dir / "latest").string());
    const Safetensors want = read_safetensors((dir / "zero_to_fp32.safetensors").string());
    std::vector<TorchFile> optim;
    for (int r = 0; r < world; ++r)
      optim.push_back(
          TorchFile::open((dir / tag / str("bf16_zero_pp_rank_", r, "_mp_rank_00_optim_states.pt")).string()));
    const TorchFile model = TorchFile::open(
        (dir / tag / (stage == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt"))
            .string());
    CHECK(model.root().at("dp_world_size").as_int() == world);
    const PyValue& groups = model.root().at("param_shapes");
    REQUIRE(groups.size() == 1);
    // The flat partition of rank r holding `which` ("fp32", "exp_avg", "exp_avg_sq").
    auto flat = [&](int r, const std::string& which) -> const TorchTensor& {
      const PyValue& osd = optim[static_cast<size_t>(r)].root().at("optimizer_state_dict");
      if (stage < 3)
        return which == "fp32" ? osd.at("single_partition_of_fp32_groups")[0].tensor()
                               : osd.at("base_optimizer_state").at("state").get(int64_t{0})->at(which).tensor();
      return which == "fp32" ? osd.at("fp32_flat_groups")[0].tensor()
                             : osd.at("optimizer_state_dict").at("state").get(int64_t{0})->at(which).tensor();
    };
    uint64_t numel_all = 0;
    for (const std::string which : {"fp32", "exp_avg", "exp_avg_sq"}) {
      CAPTURE(which);
      for (const TorchFile& f : optim) f.zip().file().reset_counters();
      int64_t offset = 0;
      size_t params = 0;
      for (const auto& [name, shape] : groups[0].dict_items()) {
        int64_t numel = 1;
        for (const PyPtr& d : shape->items()) numel *= d->as_int();
        std::vector<float> got(static_cast<size_t>(numel));
        if (stage < 3) {  // the pieces in each rank's partition of the concatenation
          const int64_t part = flat(0, which).shape[0];
          for (int64_t done = 0; done < numel;) {
            const int64_t at = offset + done, r = at / part, n = std::min(numel - done, (r + 1) * part - at);
            REQUIRE(r < world);
            optim[static_cast<size_t>(r)].read_f32(flat(static_cast<int>(r), which), {at - r * part}, {n},
                                                   got.data() + done);
            done += n;
          }
          offset += numel;
        } else {  // one piece per rank
          const int64_t piece = (numel + world - 1) / world;
          for (int r = 0; r < world; ++r)
            if (const int64_t n = std::min(piece, numel - r * piece); n > 0)
              optim[static_cast<size_t>(r)].read_f32(flat(r, which), {offset}, {n}, got.data() + r * piece);
          offset += piece;
        }
        const std::string& pname = name->as_str();
        if (which == "fp32") CHECK_MESSAGE(got == want.to_f32(pname).to_floats(), pname);
        // ds_to_universal's file: the tensor itself (ZeRO-3, flat) or {"param": tensor, "cat_dim": 0}
        const TorchFile u = TorchFile::open((dir / "universal" / "zero" / pname / (which + ".pt")).string());
        const TorchTensor& ut = u.root().is_tensor() ? u.root().tensor() : u.root().at("param").tensor();
        CHECK_MESSAGE(got == u.to_f32(ut), pname);
        ++params;
      }
      CHECK(params == want.tensors.size());
      uint64_t read = 0;
      for (const TorchFile& f : optim) read += f.zip().file().bytes_read();
      numel_all = 0;
      for (const SafeTensor& t : want.tensors) numel_all += static_cast<uint64_t>(t.numel());
      CHECK(read == 4 * numel_all);  // exactly the parameters' fp32 bytes, nothing else
    }
  }
}
