// io/torch_save.h: the torch.save writer, read back by mpitron's own reader (io/torch_checkpoint.h,
// whose allow-list and layout checks were built from files real torch wrote). torch itself
// loading the writer's files is checked by tests/apps/test_megatron_export.cpp (megatron-core
// torch.load's them; the bytes are committed as CRCs).
//   - every kind the writer pickles comes back with its value (ints at each opcode's edges,
//     UTF-8 text, bytes with high bytes, nested containers, OrderedDict with a state, a Namespace,
//     torch.Size, globals, tensors of several dtypes sharing nothing);
//   - storages are 64-byte aligned, CRCs right, and the same tree gives the same bytes;
//   - kinds it has no protocol-2 form for are refused by name.
#include <doctest/doctest.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "io/torch_checkpoint.h"
#include "io/torch_save.h"

using namespace mpitron;
using namespace mpitron::io;

namespace {

constexpr int kDepth = 64;

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".pt")).string();
}

PyPtr key(const char* k) { return PyValue::string(k); }

}  // namespace

TEST_CASE("torch.save writer: every kind round-trips through the reader") {
  TorchSaveWriter w;
  const std::vector<int64_t> ints = {0, 1, 255, 256, 65535, 65536, -1, -129, INT32_MAX, INT32_MIN,
                                     int64_t{INT32_MAX} + 1, int64_t{INT32_MIN} - 1, INT64_MAX, INT64_MIN,
                                     int64_t{1} << 40, -(int64_t{1} << 47)};
  PyMut il = PyValue::list();
  for (int64_t v : ints) il->append(PyValue::integer(v), kDepth);
  PyMut one = PyValue::list();
  one->append(PyValue::string("only"), kDepth);
  std::vector<PyPtr> five;
  for (int k = 0; k < 5; ++k) five.push_back(PyValue::floating(k + 0.5));
  PyMut meta = PyValue::dict();
  meta->set_item(key("version"), PyValue::integer(1), kDepth);
  PyMut od = PyValue::dict("collections.OrderedDict");
  std::vector<float> a = {1.5f, -2.25f, 3e-8f, 4e30f, 0.f, -0.f};
  od->set_item(key("a"), w.tensor_f32({2, 3}, a), kDepth);
  std::vector<uint8_t> bf = {0x80, 0x3f, 0x00, 0xc0};  // bfloat16 1.0, -2.0
  od->set_item(key("b"), w.tensor(TorchDType::BF16, {2}, bf), kDepth);
  std::vector<uint8_t> i64(16);
  const int64_t iv[2] = {-7, int64_t{1} << 50};
  std::memcpy(i64.data(), iv, 16);
  od->set_item(key("c"), w.tensor(TorchDType::I64, {2, 1}, i64), kDepth);
  od->set_item(key("extra_state"), PyValue::none(), kDepth);
  od->set_state(meta, kDepth);
  PyMut ns_state = PyValue::dict();
  ns_state->set_item(key("num_layers"), PyValue::integer(2), kDepth);
  ns_state->set_item(key("params_dtype"), PyValue::global("torch.float32"), kDepth);
  PyMut ns = PyValue::object("argparse.Namespace", PyValue::tuple({}));
  ns->set_state(ns_state, kDepth);
  PyMut root = PyValue::dict();
  root->set_item(key("ints"), il, kDepth);
  root->set_item(key("one"), one, kDepth);
  root->set_item(key("five"), PyValue::tuple(five), kDepth);
  root->set_item(key("pair"), PyValue::tuple({PyValue::boolean(true), PyValue::boolean(false)}), kDepth);
  root->set_item(key("empty"), PyValue::tuple({}), kDepth);
  root->set_item(key("text"), PyValue::string("héllo ✓"), kDepth);
  root->set_item(key("bytes"), PyValue::bytes(std::string("\x00\x7f\x80\xff", 4)), kDepth);
  root->set_item(key("nobytes"), PyValue::bytes(""), kDepth);
  root->set_item(key("size"), PyValue::tuple({PyValue::integer(3), PyValue::integer(4)}, "torch.Size"), kDepth);
  root->set_item(key("version"), PyValue::floating(3.0), kDepth);
  root->set_item(PyValue::integer(7), PyValue::string("an int key"), kDepth);
  root->set_item(key("model"), od, kDepth);
  root->set_item(key("args"), ns, kDepth);

  const std::string path = tmp_path("torch_save_rt");
  w.save(path, *root);
  const std::string bytes = w.serialize(*root, "torch_save_rt_" + std::to_string(::getpid()));
  CHECK(bytes == w.serialize(*root, "torch_save_rt_" + std::to_string(::getpid())));  // byte-stable
  {
    TorchFile f = TorchFile::open(path);
    CHECK(f.archive_name() == std::filesystem::path(path).stem().string());
    f.verify();  // every storage's CRC
    for (const ZipEntry& e : f.zip().entries())
      CHECK_MESSAGE(e.data_offset % 64 == 0, e.name, " at ", e.data_offset);
    const PyValue& r = f.root();
    const PyValue& got = r.at("ints");
    REQUIRE(got.size() == ints.size());
    for (size_t k = 0; k < ints.size(); ++k) CHECK(got[k].as_int() == ints[k]);
    CHECK(r.at("one").size() == 1);
    CHECK(r.at("five")[4].as_float() == 4.5);
    CHECK(r.at("pair")[0].as_bool());
    CHECK(!r.at("pair")[1].as_bool());
    CHECK(r.at("empty").size() == 0);
    CHECK(r.at("text").as_str() == "héllo ✓");
    CHECK(r.at("bytes").as_bytes() == std::string("\x00\x7f\x80\xff", 4));
    CHECK(r.at("nobytes").as_bytes().empty());
    CHECK(r.at("size").type_name() == "torch.Size");
    CHECK(r.at("size")[1].as_int() == 4);
    CHECK(r.at("version").as_float() == 3.0);
    REQUIRE(r.get(int64_t{7}));
    CHECK(r.get(int64_t{7})->as_str() == "an int key");
    const PyValue& m = r.at("model");
    CHECK(m.type_name() == "collections.OrderedDict");
    REQUIRE(m.state());
    CHECK(m.state()->at("version").as_int() == 1);
    CHECK(m.at("extra_state").is_none());
    CHECK(f.to_f32(m.at("a").tensor()) == a);
    CHECK(m.at("a").tensor().shape == std::vector<int64_t>{2, 3});
    CHECK(f.to_f32(m.at("b").tensor()) == std::vector<float>{1.f, -2.f});
    CHECK(m.at("c").tensor().dtype == TorchDType::I64);
    CHECK(f.read_raw(m.at("c").tensor()) == i64);
    const PyValue& args = r.at("args");
    CHECK(args.type_name() == "argparse.Namespace");
    REQUIRE(args.attr("num_layers"));
    CHECK(args.attr("num_layers")->as_int() == 2);
    CHECK(args.attr("params_dtype")->type_name() == "torch.float32");
  }
  std::filesystem::remove(path);
}

TEST_CASE("torch.save writer: what has no protocol-2 form here is refused by name") {
  PyMut s = PyValue::set();
  CHECK_THROWS_WITH(pickle_protocol2(*s), doctest::Contains("is not written"));
  CHECK_THROWS_WITH(pickle_protocol2(*PyValue::big_integer("123456789012345678901234567890")),
                    doctest::Contains("is not written"));
  TorchSaveWriter w;
  CHECK_THROWS_WITH(w.tensor(TorchDType::F32, {2, 2}, std::vector<uint8_t>(12)), doctest::Contains("12 bytes"));
  CHECK_THROWS_WITH(w.tensor(TorchDType::F8_E4M3FN, {1}, std::vector<uint8_t>(1)),
                    doctest::Contains("has no typed storage"));
}
