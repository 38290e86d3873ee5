// tests/io/test_torch_hostile.cpp — reliability: hostile and damaged PyTorch
// files give a clear mpitron::Error, never a crash, a hang, a huge allocation or
// a call of anything.
//
// Hand-made cases (each checked for the words of its error): pickles naming
// os.system, builtins.eval and friends; deep nesting; lengths past the data;
// recursive and self-referencing memo; stack underflow; unknown and
// unsupported opcodes; unhashable dict keys; persistent ids naming missing
// records; tensor views past their storage; zips truncated, with entries
// overlapping or past the end, with a bit flipped in the central directory;
// the legacy format; torch_dist metadata naming files outside the directory.
// Then a deterministic mutation fuzz over real reference files: byte flips,
// truncations and splices of the pickle (re-zipped with a correct CRC so the
// unpickler, not the CRC check, meets them) and of the zip itself; every
// outcome is either a clean read (whose every tensor then reads) or an Error.
// mpitron-test: label=reliability
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>

#include "io/torch_checkpoint.h"
#include "io/torch_dist.h"
#include "tests/io/io_test_util.h"
#include "tests/io/torch_test_util.h"

using namespace mpitron;
using namespace mpitron::io;
using mpitron::test::make_torch_zip;
using mpitron::test::make_zip;
using mpitron::test::P;
using mpitron::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

const fs::path kRef = fs::path(MPITRON_SOURCE_DIR) / "tests" / "io" / "ref" / "torch";

// The message of the Error that unpickling `pickle` raises ("" when it does not throw).
std::string pickle_error(const std::string& pickle, const PickleLimits& lim = {}) {
  try {
    unpickle(reinterpret_cast<const uint8_t*>(pickle.data()), pickle.size(), "test.pkl", {}, lim);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The message of the Error that opening (and reading every tensor of) a file with these bytes raises.
std::string file_error(const ScratchDir& dir, const std::string& bytes, const std::string& name = "f.pt") {
  const std::string path = dir / name;
  test::write_file_bytes(path, bytes);
  try {
    const TorchFile f = TorchFile::open(path);
    std::vector<const PyValue*> todo = {&f.root()};
    while (!todo.empty()) {
      const PyValue* v = todo.back();
      todo.pop_back();
      if (v->is_tensor()) (void)f.read_raw(v->tensor());
      if (v->is_dict())
        for (const auto& [k, x] : v->dict_items()) todo.push_back(x.get());
      if (v->is_sequence())
        for (const PyPtr& x : v->items()) todo.push_back(x.get());
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A little-endian float record.
std::string floats(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) s.append(reinterpret_cast<const char*>(&f), 4);
  return s;
}

// Every tensor in the tree (shared values once), read whole when small, else one element.
int64_t touch_all(const TorchFile& f) {
  int64_t n = 0;
  std::vector<const PyValue*> todo = {&f.root()};
  std::set<const PyValue*> seen;
  while (!todo.empty()) {
    const PyValue* v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    ++n;
    switch (v->kind()) {
      case PyKind::Tensor: {
        const TorchTensor& t = v->tensor();
        if (t.nbytes() <= (1u << 20)) {
          (void)f.read_raw(t);
        } else {
          std::vector<int64_t> start(t.shape.size(), 0), count(t.shape.size(), 1);
          uint8_t buf[16];
          f.read_raw(t, start, count, buf);
        }
        if (t.attrs) todo.push_back(t.attrs.get());
        break;
      }
      case PyKind::Dict:
        for (const auto& [k, x] : v->dict_items()) todo.push_back(k.get()), todo.push_back(x.get());
        if (v->state()) todo.push_back(v->state());
        break;
      case PyKind::List:
      case PyKind::Tuple:
      case PyKind::Set:
        for (const PyPtr& x : v->items()) todo.push_back(x.get());
        break;
      case PyKind::Object:
        todo.push_back(v->args());
        if (v->state()) todo.push_back(v->state());
        break;
      default: break;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("hostile pickles: globals off the allow-list are refused by name and never run") {
  // os.system('touch /tmp/pwned') as GLOBAL + REDUCE (protocol 2)
  const std::string e1 =
      pickle_error(P().proto(2).global("os", "system").str("touch /tmp/mpitron_pwned").op(0x85).reduce().stop().bytes);
  CHECK(has(e1, "'os.system'"));
  CHECK(has(e1, "allow-list"));
  CHECK(has(e1, "test.pkl"));
  CHECK_FALSE(fs::exists("/tmp/mpitron_pwned"));
  // builtins.eval by STACK_GLOBAL (protocol 4), and Python 2's name for it
  CHECK(has(pickle_error(P().proto(4).op(0x8c).op(8).raw("builtins").op(0x8c).op(4).raw("eval").op(0x93).stop().bytes),
            "'builtins.eval'"));
  CHECK(has(pickle_error(P().proto(2).global("__builtin__", "exec").stop().bytes), "'builtins.exec'"));
  for (auto [m, n] : std::vector<std::pair<std::string, std::string>>{{"subprocess", "Popen"},
                                                                      {"posix", "system"},
                                                                      {"builtins", "__import__"},
                                                                      {"torch", "load"},
                                                                      {"torch.storage", "_load_from_bytes"},
                                                                      {"numpy", "load"},
                                                                      {"copyreg", "_reconstructor"}})
    CHECK(has(pickle_error(P().proto(2).global(m, n).stop().bytes), "'" + m + "." + n + "'"));
  // getattr is allowed only on an allow-listed class: not to reach torch.load through torch.Tensor
  const std::string e2 = pickle_error(P().proto(2)
                                          .global("builtins", "getattr")
                                          .global("torch", "Tensor")
                                          .str("__reduce_ex__")
                                          .op(0x86)
                                          .reduce()
                                          .stop()
                                          .bytes);
  CHECK(has(e2, "getattr on 'torch.Tensor' is refused"));
  // an allowed data global is not callable
  CHECK(has(pickle_error(P().proto(2).global("torch", "float32").empty_tuple().reduce().stop().bytes),
            "not something a pickle may call"));
  // _codecs.encode with another codec, OrderedDict with junk
  CHECK(has(pickle_error(P().proto(2).global("_codecs", "encode").str("x").str("rot13").op(0x86).reduce().stop().bytes),
            "(str, 'latin1')"));
  CHECK(has(pickle_error(P().proto(2).global("collections", "OrderedDict").int1(5).op(0x85).reduce().stop().bytes),
            "expected a list or tuple"));
}

TEST_CASE("hostile pickles: structure (nesting, lengths, memo, stack, opcodes, keys)") {
  SUBCASE("deep nesting: lists by MARK/LIST, tuples by TUPLE1, dicts by SETITEM") {
    P lists = P().proto(2);
    for (int i = 0; i < 100000; ++i) lists.mark();
    for (int i = 0; i < 100000; ++i) lists.op('l');
    CHECK(has(pickle_error(lists.stop().bytes), "nested deeper than 200"));
    P tuples = P().proto(2).none();
    for (int i = 0; i < 1000000; ++i) tuples.op(0x85);
    CHECK(has(pickle_error(tuples.stop().bytes), "nested deeper than 200"));
    P nested = P().proto(2);
    for (int i = 0; i < 300; ++i) nested.op('}').str("k");
    nested.none();
    for (int i = 0; i < 300; ++i) nested.op('s');
    CHECK(has(pickle_error(nested.stop().bytes), "nested deeper than"));
    // the limit is the caller's
    PickleLimits lim;
    lim.max_depth = 5;
    CHECK(has(pickle_error(P().proto(2).none().op(0x85).op(0x85).op(0x85).op(0x85).op(0x85).op(0x85).stop().bytes, lim),
              "deeper than 5"));
  }
  SUBCASE("declared lengths past the data are refused before any allocation") {
    CHECK(has(pickle_error(P().proto(2).op('X').u32(0xfffffff0u).raw("abc").stop().bytes), "only 4 remain"));
    CHECK(has(pickle_error(P().proto(4).op(0x8d).u64(uint64_t{1} << 62).stop().bytes), "remain"));
    CHECK(has(pickle_error(P().proto(4).op(0x8e).u64(~uint64_t{0}).stop().bytes), "remain"));
    CHECK(has(pickle_error(P().proto(5).op(0x96).u64(uint64_t{1} << 40).stop().bytes), "remain"));
    CHECK(has(pickle_error(P().proto(2).op('B').u32(0x7fffffff).stop().bytes), "remain"));
    CHECK(has(pickle_error(P().proto(2).op(0x8b).u32(0x7fffffff).stop().bytes), "remain"));
    CHECK(has(pickle_error(P().proto(2).op(0x8b).u32(0xffffffffu).stop().bytes), "negative length"));
    CHECK(has(pickle_error(P().proto(4).op(0x95).u64(uint64_t{1} << 50).none().stop().bytes), "a frame of"));
    CHECK(has(pickle_error(P().proto(2).op('T').u32(0x80000000u).stop().bytes), "negative length"));
    std::string big_int = P().proto(2).op(0x8b).u32(4096).bytes + std::string(4096, '\x01') + ".";
    CHECK(has(pickle_error(big_int), "more than 1024"));
    CHECK(has(pickle_error(P().proto(2).op('c').raw("os").bytes), "no end"));  // GLOBAL without its newline
  }
  SUBCASE("recursive and self-referencing memo") {
    // l = []; l.append(l)
    CHECK(has(pickle_error(P().proto(2).op(']').put(0).get(0).op('a').stop().bytes), "inside itself"));
    // a = []; b = [a]; a.append(b): a is changed after it was placed in b
    const std::string cyc =
        P().proto(2).op(']').put(0).op(']').put(1).get(0).op('a').op('0').get(1).op('a').stop().bytes;
    CHECK(has(pickle_error(cyc), "recursive or self-referencing"));
    // d = {}; d['self'] = d
    CHECK(has(pickle_error(P().proto(2).op('}').put(0).str("self").get(0).op('s').stop().bytes), "inside itself"));
    // an object whose BUILD state contains the object
    CHECK(has(pickle_error(P().proto(2)
                               .global("argparse", "Namespace")
                               .empty_tuple()
                               .op(0x81)
                               .put(0)
                               .op('}')
                               .str("me")
                               .get(0)
                               .op('s')
                               .op('b')
                               .stop()
                               .bytes),
              "recursive"));
    // a memo key that was never stored; memo of an empty stack
    CHECK(has(pickle_error(P().proto(2).get(7).stop().bytes), "memo key 7 was never stored"));
    CHECK(has(pickle_error(P().proto(4).op(0x94).stop().bytes), "stack underflow"));
    // shared (not recursive) values are fine: [x, x]
    CHECK(pickle_error(P().proto(2).op(']').put(0).op('0').op(']').mark().get(0).get(0).op('e').stop().bytes) == "");
  }
  SUBCASE("stack underflow, marks, STOP") {
    CHECK(has(pickle_error(P().proto(2).op('a').stop().bytes), "stack underflow"));
    CHECK(has(pickle_error(P().proto(2).none().reduce().stop().bytes), "stack underflow"));
    CHECK(has(pickle_error(P().proto(2).stop().bytes), "stack underflow"));
    CHECK(has(pickle_error(P().proto(2).none().mark().op('a').stop().bytes), "stack underflow"));  // below the MARK
    CHECK(has(pickle_error(P().proto(2).none().tuple().stop().bytes), "no MARK"));
    CHECK(has(pickle_error(P().proto(2).op('1').stop().bytes), "no MARK"));
    CHECK(has(pickle_error(P().proto(2).none().none().stop().bytes), "STOP leaves 1 more"));
    CHECK(has(pickle_error(P().proto(2).mark().none().stop().bytes), "marks"));
    CHECK(has(pickle_error(P().proto(2).none().bytes), "without STOP"));
    CHECK(has(pickle_error(""), "without STOP"));
  }
  SUBCASE("unknown and unsupported opcodes") {
    CHECK(has(pickle_error(P().proto(2).op(0xff).stop().bytes), "unknown opcode 0xff"));
    CHECK(has(pickle_error(P().proto(2).op(0x00).stop().bytes), "unknown opcode 0x00"));
    CHECK(has(pickle_error(P().proto(2).op('z').stop().bytes), "unknown opcode 0x7a"));
    CHECK(has(pickle_error(P().proto(6).stop().bytes), "protocol 6 is newer"));
    CHECK(has(pickle_error(P().proto(2).op('S').raw("'x'\n").stop().bytes), "text strings"));
    CHECK(has(pickle_error(P().proto(2).op('i').raw("os\nsystem\n").stop().bytes), "class instantiation"));
    CHECK(has(pickle_error(P().proto(2).op(0x82).op(1).stop().bytes), "extension codes"));
    CHECK(has(pickle_error(P().proto(5).op(0x97).stop().bytes), "out-of-band"));
    CHECK(has(pickle_error(P().proto(2).op('P').raw("0\n").stop().bytes), "persistent ids"));
    CHECK(has(pickle_error(P().proto(2).mark().str("storage").tuple().op('Q').stop().bytes), "may not hold any"));
  }
  SUBCASE("dict keys: unhashable refused, non-string hashable accepted") {
    CHECK(has(pickle_error(P().proto(2).op('}').op(']').none().op('s').stop().bytes), "unhashable (list"));
    CHECK(has(pickle_error(P().proto(2).op('}').op('}').none().op('s').stop().bytes), "unhashable (dict"));
    CHECK(has(pickle_error(P().proto(2).op(0x8f).mark().op(']').op(0x90).stop().bytes), "unhashable"));
    const std::string ok = P().proto(2)
                               .op('}')
                               .mark()
                               .int1(3)
                               .str("three")
                               .none()
                               .str("none")
                               .int1(1)
                               .int1(2)
                               .op(0x86)
                               .str("tuple")
                               .op('u')
                               .stop()
                               .bytes;
    const PyPtr v = unpickle(reinterpret_cast<const uint8_t*>(ok.data()), ok.size(), "ok");
    CHECK(v->get(int64_t{3})->as_str() == "three");
    CHECK(v->size() == 3);
    CHECK(has(pickle_error(P().proto(2).op('}').mark().none().op('u').stop().bytes), "odd number"));
    CHECK(has(pickle_error(P().proto(2).none().none().none().op('s').stop().bytes), "not a dict"));
  }
  SUBCASE("the value budget") {
    PickleLimits lim;
    lim.max_values = 1000;
    P many = P().proto(2).op(']').mark();
    for (int i = 0; i < 2000; ++i) many.int1(1);
    CHECK(has(pickle_error(many.op('e').stop().bytes, lim), "more than 1000 values"));
  }
}

TEST_CASE("hostile torch files: storages, tensor views, the archive") {
  ScratchDir dir("torch_hostile");
  const std::string rec = floats({1, 2, 3, 4});
  SUBCASE("a well-formed hand-made file reads (zip and ZIP64, any archive name)") {
    const std::string pkl = P().proto(2).tensor_v2("FloatStorage", "0", 4, 1, {3}, {1}).stop().bytes;
    for (bool z64 : {false, true}) {
      test::write_file_bytes(dir / "ok.pt", make_torch_zip(pkl, {{"0", rec}}, z64, "some_name"));
      const TorchFile f = TorchFile::open(dir / "ok.pt");
      CHECK(f.archive_name() == "some_name");
      CHECK(f.to_f32(f.root().tensor()) == std::vector<float>{2, 3, 4});
    }
  }
  SUBCASE("a persistent id naming a missing record, or declaring more than its record holds") {
    CHECK(has(file_error(dir, make_torch_zip(P().proto(2).tensor_v2("FloatStorage", "7", 4, 0, {4}, {1}).stop().bytes,
                                             {{"0", rec}})),
              "names the record 'archive/data/7', which the archive does not have"));
    CHECK(has(file_error(dir, make_torch_zip(P().proto(2).tensor_v2("FloatStorage", "0", 5, 0, {4}, {1}).stop().bytes,
                                             {{"0", rec}})),
              "declares 20 bytes"));
    CHECK(has(file_error(dir, make_torch_zip(P().proto(2).tensor_v2("FloatStorage", "0", -1, 0, {4}, {1}).stop().bytes,
                                             {{"0", rec}})),
              "declares -1 elements"));
    CHECK(has(file_error(dir, make_torch_zip(P().proto(2).storage("DeviceStorage", "0", 4).stop().bytes, {{"0", rec}})),
              "'torch.DeviceStorage' is not on the allow-list"));
    CHECK(has(
        file_error(dir, make_torch_zip(P().proto(2).mark().str("storage").tuple().op('Q').stop().bytes, {{"0", rec}})),
        "is not ('storage', class, key, location, numel)"));
  }
  SUBCASE("tensor views past their storage, negative or absurd sizes") {
    auto view = [&](int numel, int offset, std::vector<int> size, std::vector<int> stride) {
      return file_error(
          dir, make_torch_zip(P().proto(2).tensor_v2("FloatStorage", "0", numel, offset, size, stride).stop().bytes,
                              {{"0", rec}}));
    };
    CHECK(has(view(4, 0, {10}, {1}), "reaches byte 40 of its storage '0' of 16 bytes"));
    CHECK(has(view(4, 3, {2}, {1}), "reaches byte 20"));
    CHECK(has(view(4, 0, {2, 2}, {3, 1}), "reaches byte 20"));
    CHECK(has(view(4, 0, {-2}, {1}), "not an int in [0, 2^62]"));
    CHECK(has(view(4, 0, {2}, {-1}), "not an int in [0, 2^62]"));
    CHECK(has(view(4, -1, {2}, {1}), "storage offset"));
    CHECK(has(view(4, 0, {2, 2}, {1}), "2 sizes but 1 strides"));
    CHECK(has(view(4, 0, {1 << 30, 1 << 30, 1 << 30}, {0, 0, 0}), "more than 2^62 elements"));
    CHECK(view(4, 0, {1 << 12, 4}, {0, 1}) == "");  // an expanded view (stride 0) is legal and reads
    CHECK(has(view(4, 0, {1 << 30, 1 << 30, 2}, {0, 0, 0}), "more than 2^62 bytes"));
  }
  SUBCASE("the legacy format, other files, big-endian") {
    std::string legacy = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.";
    legacy += std::string(100, '\0');
    const std::string e = file_error(dir, legacy);
    CHECK(has(e, "legacy format"));
    CHECK(has(e, "re-save it with PyTorch >= 1.6"));
    std::string tar(1024, '\0');
    tar.replace(257, 5, "ustar");
    CHECK(has(file_error(dir, tar), "legacy format"));
    CHECK(has(file_error(dir, "hello world, not a checkpoint"), "not a torch.save file"));
    CHECK(has(file_error(dir, ""), "not a torch.save file"));
    std::vector<std::pair<std::string, std::string>> big = {{"archive/data.pkl", P().proto(2).none().stop().bytes},
                                                            {"archive/byteorder", "big"}};
    CHECK(has(file_error(dir, make_zip(big)), "byteorder 'big'"));
    CHECK(has(file_error(dir, make_zip({{"archive/other", "x"}})), "no <archive>/data.pkl"));
    CHECK(has(file_error(dir, make_zip({{"a/data.pkl", P().proto(2).none().stop().bytes},
                                        {"b/data.pkl", P().proto(2).none().stop().bytes}})),
              "two pickles"));
    // a directory, a missing file
    fs::create_directories(dir / "d.pt");
    try {
      TorchFile::open(dir / "d.pt");
      FAIL("a directory opened");
    } catch (const Error& err) {
      CHECK(has(err.what(), "not a regular file"));
    }
    CHECK_THROWS_AS(TorchFile::open(dir / "missing.pt"), Error);
  }
  SUBCASE("zip damage: entries overlapping, past the end, compressed, duplicated; truncations; CD bit flips") {
    const std::string good =
        make_torch_zip(P().proto(2).tensor_v2("FloatStorage", "0", 4, 0, {4}, {1}).stop().bytes, {{"0", rec}});
    REQUIRE(file_error(dir, good) == "");
    // central entries: find each and patch fields
    std::vector<size_t> entries;
    for (size_t p = good.find(std::string("PK\x01\x02", 4)); p != std::string::npos;
         p = good.find(std::string("PK\x01\x02", 4), p + 4))
      entries.push_back(p);
    REQUIRE(entries.size() == 4);
    auto patch32 = [](std::string s, size_t at, uint32_t v) {
      for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
      return s;
    };
    auto patch16 = [](std::string s, size_t at, uint16_t v) {
      s[at] = static_cast<char>(v & 0xff), s[at + 1] = static_cast<char>(v >> 8);
      return s;
    };
    // the data record's size made larger than the space before the central directory
    CHECK(has(file_error(dir, patch32(patch32(good, entries[2] + 20, 1u << 20), entries[2] + 24, 1u << 20)),
              "runs into the central directory"));
    // a record's data reaching into the next entry's local header; an entry pointing at another's header
    CHECK(has(file_error(dir, patch32(patch32(good, entries[2] + 20, 26), entries[2] + 24, 26)), "overlap"));
    CHECK(has(file_error(dir, patch32(good, entries[3] + 42, 0)), "its local header names 16 bytes"));
    // a header offset past the end
    CHECK(has(file_error(dir, patch32(good, entries[1] + 42, 0x7fffffff)), "not before the central directory"));
    // compressed, encrypted, sizes differing
    CHECK(has(file_error(dir, patch16(good, entries[0] + 10, 8)), "compressed (method 8)"));
    CHECK(has(file_error(dir, patch16(good, entries[0] + 8, 1)), "encrypted"));
    CHECK(has(file_error(dir, patch32(good, entries[0] + 20, 3)), "sizes differ"));
    // a duplicated name
    CHECK(has(file_error(dir, make_zip({{"archive/data.pkl", P().proto(2).none().stop().bytes},
                                        {"archive/x", "1"},
                                        {"archive/x", "2"}})),
              "appears twice"));
    // the EOCD's central directory bounds and entry count
    const size_t eocd = good.rfind(std::string("PK\x05\x06", 4));
    CHECK(has(file_error(dir, patch32(good, eocd + 12, 1u << 30)), "does not end before its end record"));
    CHECK(has(file_error(dir, patch16(patch16(good, eocd + 8, 9000), eocd + 10, 9000)), "claims 9000 entries"));
    CHECK(has(file_error(dir, patch16(good, eocd + 4, 1)), "multi-disk"));
    // a data.pkl whose bytes no longer match its CRC
    std::string flipped = good;
    test::write_file_bytes(dir / "good.pt", good);
    flipped[ZipArchive::open(dir / "good.pt").at("archive/data.pkl").data_offset + 1] ^= 0x40;
    CHECK(has(file_error(dir, flipped), "fails its CRC-32 check"));
    // every truncation
    int clean = 0;
    for (size_t n = 0; n < good.size(); ++n) {
      const std::string e = file_error(dir, good.substr(0, n));
      CHECK_MESSAGE(!e.empty(), "truncated to ", n);
      clean += !e.empty();
    }
    CHECK(clean == static_cast<int>(good.size()));
    // every single-bit flip in the central directory and end record: an error, or a read equal to the original
    const size_t cd0 = entries[0];
    int errors = 0, reads = 0;
    for (size_t at = cd0; at < good.size(); ++at)
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = good;
        bad[at] = static_cast<char>(bad[at] ^ (1 << bit));
        test::write_file_bytes(dir / "flip.pt", bad);
        try {
          const TorchFile f = TorchFile::open(dir / "flip.pt");
          CHECK(f.to_f32(f.root().tensor()) == std::vector<float>{1, 2, 3, 4});
          ++reads;
        } catch (const Error&) {
          ++errors;
        }
      }
    MESSAGE("central directory bit flips: ", errors, " errors, ", reads, " harmless (times, versions, attributes)");
    CHECK(errors > reads / 4);
  }
}

TEST_CASE("hostile torch_dist: metadata naming files outside the directory, chunks past their tensor") {
  ScratchDir dir("torch_dist_hostile");
  const fs::path src = kRef / "mcore_llama_dp2" / "torch_dist" / "iter_0000002";
  auto copy = [&](const std::string& meta) {
    fs::remove_all(dir / "ck");
    fs::copy(src, dir / "ck");
    test::write_file_bytes(dir / "ck/.metadata", meta);
  };
  const std::string meta = test::read_file_bytes((src / ".metadata").string());
  auto replace_all = [](std::string s, const std::string& a, const std::string& b) {
    REQUIRE(a.size() == b.size());  // keeps every length field valid
    for (size_t p = s.find(a); p != std::string::npos; p = s.find(a, p + b.size())) s.replace(p, a.size(), b);
    return s;
  };
  copy(replace_all(meta, "__0_0.distcp", "../_0.distcp"));
  try {
    DcpCheckpoint ck(dir / "ck");
    FAIL("a path outside the directory was accepted");
  } catch (const Error& e) {
    CHECK(has(e.what(), "names the file '../_0.distcp', not a file of this directory"));
  }
  copy(replace_all(meta, "__0_1.distcp", "/etc/passwdX"));
  CHECK_THROWS_WITH_AS(DcpCheckpoint(dir / "ck"), doctest::Contains("not a file of this directory"), Error);
  // the metadata of something else
  copy(P().proto(4).op(']').stop().bytes);
  CHECK_THROWS_WITH_AS(DcpCheckpoint(dir / "ck"), doctest::Contains("not a torch.distributed.checkpoint Metadata"),
                       Error);
  // a chunk's recorded byte range past its file
  copy(meta);
  const DcpCheckpoint good(dir / "ck");
  const DcpTensor& t = good.metadata().tensors.front();
  test::write_file_bytes(dir / ("ck/" + t.chunks[0].file), "");
  CHECK_THROWS_WITH_AS(
      good.read_raw(t.fqn, std::vector<int64_t>(t.size.size(), 0), t.size, std::vector<uint8_t>(1 << 20).data()),
      doctest::Contains("past the end of the file"), Error);
}

TEST_CASE("torch reader fuzz: mutated real pickles and zips give a clean read or an Error") {
  ScratchDir dir("torch_fuzz");
  const std::vector<fs::path> seeds = {
      kRef / "synthetic/synthetic_p2.pt",
      kRef / "synthetic/synthetic_p5.pt",
      kRef / "mcore_gpt2/torch/iter_0000002/mp_rank_00/model_optim_rng.pt",
      kRef / "ds_zero3/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
      kRef / "ds_zero1/global_step2/mp_rank_00_model_states.pt",
  };
  std::mt19937_64 rng(20261202);
  // MPITRON_TORCH_FUZZ_ROUNDS=N: N pickle mutations per seed (default 700; CI runs the default)
  const char* env = std::getenv("MPITRON_TORCH_FUZZ_ROUNDS");
  const int rounds = env ? std::max(1, std::atoi(env)) : 700;
  int64_t ok = 0, errors = 0, values = 0;
  auto attempt = [&](const std::string& bytes) {
    test::write_file_bytes(dir / "fuzz.pt", bytes);
    try {
      const TorchFile f = TorchFile::open(dir / "fuzz.pt");
      values += touch_all(f);
      ++ok;
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("fuzz.pt") != std::string::npos);  // every error names the file
      ++errors;
    }
  };
  for (const fs::path& seed : seeds) {
    CAPTURE(seed);
    // The seed's entries, to rebuild it with a mutated pickle and a correct CRC.
    const ZipArchive z = ZipArchive::open(seed.string());
    std::vector<std::pair<std::string, std::string>> entries;
    std::string pkl;
    for (const ZipEntry& e : z.entries()) {
      const std::vector<uint8_t> b = z.read_all(e);
      entries.emplace_back(e.name, std::string(b.begin(), b.end()));
      if (e.name.size() > 9 && e.name.substr(e.name.size() - 9) == "/data.pkl") pkl = entries.back().second;
    }
    REQUIRE(!pkl.empty());
    auto with_pickle = [&](const std::string& p) {
      auto e = entries;
      for (auto& [name, data] : e)
        if (name.size() > 9 && name.substr(name.size() - 9) == "/data.pkl") data = p;
      return make_zip(e);
    };
    {  // the rebuilt seed itself reads
      const int64_t before = errors;
      attempt(with_pickle(pkl));
      CHECK(errors == before);
    }
    // 1. pickle byte flips (1-4 bytes), 2. truncations, 3. splices of a random span elsewhere, 4. opcode swaps
    for (int k = 0; k < rounds; ++k) {
      std::string p = pkl;
      const int kind = k % 4;
      if (kind == 0) {
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < flips; ++i) p[rng() % p.size()] ^= static_cast<char>(1 + rng() % 255);
      } else if (kind == 1) {
        p.resize(rng() % p.size());
      } else if (kind == 2) {
        const size_t a = rng() % p.size(), n = rng() % std::min<size_t>(64, p.size() - a), at = rng() % p.size();
        p.insert(at, p.substr(a, n));
      } else {
        const char ops[] = "()0125NKJMXhqjaesutRb.\x80\x85\x86\x87\x88\x89\x8a\x8c\x93\x94\x95Q}]";
        p[rng() % p.size()] = ops[rng() % (sizeof(ops) - 1)];
      }
      attempt(with_pickle(p));
    }
    // 5. flips and truncations of the file itself (zip structure, CRCs, data)
    const std::string raw = test::read_file_bytes(seed.string());
    for (int k = 0; k < 150; ++k) {
      std::string b = raw;
      if (k % 3 == 2)
        b.resize(rng() % b.size());
      else
        b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
      attempt(b);
    }
  }
  const int64_t total = ok + errors;
  MESSAGE(total, " mutated files: ", ok, " read cleanly (", values, " values walked, every tensor read), ", errors,
          " clear errors; no crash");
  CHECK(errors > 1000);
}
