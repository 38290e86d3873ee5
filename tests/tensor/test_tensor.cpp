// tests/tensor/test_tensor.cpp — Tensor creation, views, copies, fills, dtype conversion,
// and self-tests of the op harness (a harness that cannot fail tests nothing).
//
// bf16/f16 conversion is checked against decoders/encoders derived from the IEEE
// bit layouts (op_harness.h: ldexp decoding, nearest-even by exact comparison in
// double), over all 65536 patterns of each 16-bit type and over f32 inputs that
// sit exactly on ties; a few f16 values were also computed independently with
// python3 `struct.pack('<e', x)` (IEEE binary16, round-half-even) and hard-coded.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {
std::vector<float> iota(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return v;
}
}  // namespace

TEST_CASE("creation: empty, zeros, from_vector, from_ints, properties") {
  const Tensor t = Tensor::empty({4, 8}, DType::F32);
  CHECK(t.defined());
  CHECK(t.shape() == Shape{4, 8});
  CHECK(t.strides() == Shape{8, 1});
  CHECK(t.ndim() == 2);
  CHECK(t.numel() == 32);
  CHECK(t.nbytes() == 128);
  CHECK(t.dim(-1) == 8);
  CHECK(t.dim(0) == 4);
  CHECK(t.is_contiguous());
  CHECK(t.device() == Device::cpu());
  CHECK(t.describe() == "f32[4, 8] cpu");
  CHECK_FALSE(Tensor().defined());
  CHECK_THROWS_AS(t.dim(2), Error);
  CHECK_THROWS_AS(Tensor::empty({3, -1}, DType::F32), Error);
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16}) {
    const Tensor z = Tensor::zeros({3, 5}, dt);
    CHECK(z.dtype() == dt);
    CHECK(z.nbytes() == 15 * dtype_size(dt));
    const auto* b = static_cast<const uint8_t*>(z.data_ptr());
    CHECK(std::all_of(b, b + z.nbytes(), [](uint8_t x) { return x == 0; }));
  }
  const Tensor f = Tensor::from_vector({1.0f, -2.5f, 3.0f, 0.1f}, {2, 2}, DType::BF16);
  CHECK(f.to_floats() == std::vector<float>{1.0f, -2.5f, 3.0f, bf16_to_f32(bf16_t{0x3dcd})});
  CHECK(f.data<bf16_t>()[3].bits == 0x3dcd);  // 0.1 in bf16
  const Tensor i = Tensor::from_ints({1, -2, 300000}, {3}, DType::I64);
  CHECK(i.to_ints() == std::vector<int64_t>{1, -2, 300000});
  CHECK(Tensor::from_ints({65535, 7}, {2}, DType::U16).to_ints() == std::vector<int64_t>{65535, 7});
  CHECK(Tensor::from_ints({5}, {1}, DType::I32).item() == 5.0f);
  CHECK_THROWS_AS(Tensor::from_vector({1.0f, 2.0f}, {3}), Error);
  CHECK_THROWS_AS(Tensor::from_ints({1, 2}, {2}, DType::F32), Error);
  CHECK_THROWS_AS(Tensor::from_vector({1.0f}, {1}, DType::I32), Error);
  CHECK_THROWS_AS(t.data<bf16_t>(), Error);  // wrong element type
  CHECK_THROWS_AS(t.item(), Error);
  CHECK_THROWS_AS(Tensor::from_vector({1}, {1}).to_ints(), Error);  // to_ints of a float tensor
  // from_blob keeps its owner alive until the last view goes.
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = owner;
  {
    Tensor b = Tensor::from_blob(owner->data(), {2, 3}, DType::F32, Device::cpu(), owner);
    owner.reset();
    CHECK_FALSE(watch.expired());
    CHECK(b.slice(1, 1, 3).to_floats() == std::vector<float>{2, 3, 5, 6});
  }
  CHECK(watch.expired());
}

TEST_CASE("dtype names and sizes") {
  CHECK(dtype_size(DType::F32) == 4);
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(dtype_size(DType::F16) == 2);
  CHECK(dtype_size(DType::I64) == 8);
  CHECK(dtype_from_name("bfloat16") == DType::BF16);
  CHECK(dtype_from_name("fp16") == DType::F16);
  CHECK(dtype_from_name(dtype_name(DType::U16)) == DType::U16);
  CHECK_THROWS_AS(dtype_from_name("f8"), Error);
  CHECK(is_floating(DType::BF16));
  CHECK_FALSE(is_floating(DType::I32));
}

TEST_CASE("views: view, flatten_to_2d, slice, select, transpose, flat_range share storage") {
  const Tensor t = Tensor::from_vector(iota(24), {2, 3, 4});
  const Tensor v = t.view({6, -1});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.shares_storage(t));
  CHECK(t.flatten_to_2d().shape() == Shape{6, 4});
  CHECK_THROWS_AS(t.view({5, -1}), Error);
  CHECK_THROWS_AS(t.view({-1, -1}), Error);
  CHECK_THROWS_AS(t.view({25}), Error);

  const Tensor s = t.slice(2, 1, 3);  // (2, 3, 2)
  CHECK(s.shape() == Shape{2, 3, 2});
  CHECK_FALSE(s.is_contiguous());
  CHECK(s.shares_storage(t));
  std::vector<float> want;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 1; c < 3; ++c) want.push_back(float(a * 12 + b * 4 + c));
  CHECK(s.to_floats() == want);
  CHECK(t.slice(0, 1, 2).is_contiguous());
  CHECK_THROWS_AS(t.slice(1, 2, 4), Error);
  CHECK_THROWS_AS(t.slice(3, 0, 1), Error);
  CHECK_THROWS_AS(s.view({12}), Error);  // view of a non-contiguous tensor

  const Tensor sel = t.select(1, 2);  // (2, 4): t[:, 2, :]
  CHECK(sel.shape() == Shape{2, 4});
  CHECK(sel.to_floats() == std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23});
  CHECK(t.select(-1, 0).to_floats() == std::vector<float>{0, 4, 8, 12, 16, 20});

  const Tensor tr = t.transpose(0, 2);  // (4, 3, 2)
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.strides() == Shape{1, 4, 12});
  std::vector<float> wt;
  for (int c = 0; c < 4; ++c)
    for (int b = 0; b < 3; ++b)
      for (int a = 0; a < 2; ++a) wt.push_back(float(a * 12 + b * 4 + c));
  CHECK(tr.to_floats() == wt);
  CHECK_THROWS_AS(t.transpose(0, 3), Error);

  const Tensor fr = t.flat_range(5, 7);
  CHECK(fr.shape() == Shape{7});
  CHECK(fr.offset() == 5);
  CHECK(fr.to_floats() == std::vector<float>{5, 6, 7, 8, 9, 10, 11});
  CHECK(fr.flat_range(2, 3).to_floats() == std::vector<float>{7, 8, 9});  // offsets compose
  CHECK_THROWS_AS(t.flat_range(20, 5), Error);
  CHECK_THROWS_AS(tr.flat_range(0, 1), Error);
  // Writes through a view land in the shared storage.
  fr.fill(-1);
  CHECK(t.to_floats()[4] == 4);
  CHECK(t.to_floats()[5] == -1);
  CHECK(t.to_floats()[11] == -1);
  CHECK(t.to_floats()[12] == 12);
}

TEST_CASE("contiguous, clone, copy_from strided, to(dtype), fill") {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    Tensor t = dt == DType::I32 ? Tensor::from_ints(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, dt)
                                : Tensor::from_vector(iota(12), {3, 4}, dt);
    const Tensor tr = t.transpose(0, 1);
    const Tensor c = tr.contiguous();
    CHECK(c.is_contiguous());
    CHECK_FALSE(c.shares_storage(t));
    CHECK(c.to_floats() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
    CHECK(t.contiguous().shares_storage(t));
    const Tensor cl = t.clone();
    CHECK_FALSE(cl.shares_storage(t));
    CHECK(cl.to_floats() == t.to_floats());

    // Strided destination: write a contiguous (4, 3) into the transposed view of a (3, 4) buffer.
    Tensor buf = Tensor::zeros({3, 4}, dt);
    buf.transpose(0, 1).copy_from(c);
    CHECK(buf.to_floats() == t.to_floats());
    // Strided to strided: every other column.
    Tensor dst = Tensor::zeros({3, 8}, dt);
    Tensor src2 = Tensor::zeros({3, 8}, dt);
    src2.slice(1, 0, 4).copy_from(t);
    dst.slice(1, 4, 8).copy_from(src2.slice(1, 0, 4));
    const std::vector<float> d = dst.to_floats();
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 4; ++k) {
        CHECK(d[r * 8 + k] == 0);
        CHECK(d[r * 8 + 4 + k] == float(r * 4 + k));
      }
    CHECK_THROWS_AS(buf.copy_from(Tensor::zeros({4, 3}, dt)), Error);
    t.fill(2.5);
    for (float f : t.to_floats()) CHECK(f == (dt == DType::I32 ? 2.0f : 2.5f));
    CHECK_THROWS_AS(tr.fill(1), Error);
  }
  CHECK_THROWS_AS(Tensor::zeros({2}, DType::F32).copy_from(Tensor::zeros({2}, DType::BF16)), Error);
  const Tensor f = Tensor::from_vector({1.0f, 1.00390625f, 65520.0f, -3.0f}, {4});
  const Tensor h = f.to(DType::F16), b = f.to(DType::BF16);
  CHECK(h.dtype() == DType::F16);
  CHECK(h.data<f16_t>()[1].bits == 0x3c04);
  CHECK(h.data<f16_t>()[2].bits == 0x7c00);  // overflow to Inf
  CHECK(b.data<bf16_t>()[1].bits == 0x3f80);  // tie to even
  CHECK(f.to(DType::F32).shares_storage(f));
  CHECK(f.transpose(0, 0).to(DType::BF16).to_floats() == b.to_floats());
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}}) {
    Tensor big = Tensor::empty({n}, DType::BF16);
    big.fill(-0.1);
    const std::vector<float> v = big.to_floats();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == bf16_to_f32(bf16_t{0xbdcd}); }));
  }
}

TEST_CASE("bf16 and f16 decoding of every bit pattern") {
  int64_t bad_bf = 0, bad_h = 0, bad_rt = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t u = static_cast<uint16_t>(b);
    const double rb = decode_bf16(u), rh = decode_f16(u);
    const float gb = bf16_to_f32(bf16_t{u}), gh = f16_to_f32(f16_t{u});
    bad_bf += std::isnan(rb) ? !std::isnan(gb) : (double(gb) != rb || std::signbit(gb) != std::signbit(rb));
    bad_h += std::isnan(rh) ? !std::isnan(gh) : (double(gh) != rh || std::signbit(gh) != std::signbit(rh));
    // Round trips are exact for every non-NaN pattern, NaN stays NaN.
    if (std::isnan(rh)) bad_rt += !std::isnan(f16_to_f32(f32_to_f16(gh)));
    else bad_rt += f32_to_f16(gh).bits != u;
    if (std::isnan(rb)) bad_rt += !std::isnan(bf16_to_f32(f32_to_bf16(gb)));
    else bad_rt += f32_to_bf16(gb).bits != u;
  }
  CHECK(bad_bf == 0);
  CHECK(bad_h == 0);
  CHECK(bad_rt == 0);
  CHECK(f16_to_f32(f16_t{0x0001}) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_f32(f16_t{0x03ff}) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(f16_to_f32(f16_t{0x7bff}) == 65504.0f);
}

TEST_CASE("f32 -> bf16/f16 rounding: ties to even, subnormals, overflow, NaN") {
  // Ties and their neighbours around every f16 and bf16 value, plus random bit patterns.
  std::vector<float> xs;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double mid = (decode_f16(static_cast<uint16_t>(h)) + decode_f16(static_cast<uint16_t>(h + 1))) / 2;
    const uint32_t u = f32_bits(static_cast<float>(mid));
    for (uint32_t x : {u - 1, u, u + 1}) xs.push_back(bits_to_f32(x)), xs.push_back(-bits_to_f32(x));
  }
  for (uint32_t b = 0; b < 0x7f80; ++b)
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u}) xs.push_back(bits_to_f32((b << 16) | lo));
  Rng rng(31337);
  for (int i = 0; i < 200000; ++i) xs.push_back(bits_to_f32(static_cast<uint32_t>(rng.g())));
  int64_t bad_bf = 0, bad_h = 0;
  std::string first;
  for (float x : xs) {
    const uint16_t gb = f32_to_bf16(x).bits, gh = f32_to_f16(x).bits;
    if (std::isnan(x)) {
      bad_bf += !std::isnan(decode_bf16(gb));
      bad_h += !std::isnan(decode_f16(gh));
      continue;
    }
    const uint16_t wb = ref_bf16_bits(x), wh = ref_f16_bits(x);
    if (gb != wb && bad_bf++ < 3) first += str("\n  bf16(", x, ") = 0x", std::hex, gb, " want 0x", wb, std::dec);
    if (gh != wh && bad_h++ < 3) first += str("\n  f16(", x, ") = 0x", std::hex, gh, " want 0x", wh, std::dec);
  }
  CHECK_MESSAGE(bad_bf + bad_h == 0, bad_bf << " bf16 and " << bad_h << " f16 conversions wrong" << first);
  // Hand-derived cases.
  CHECK(f32_to_bf16(bits_to_f32(0x3f808000u)).bits == 0x3f80);  // tie, even below
  CHECK(f32_to_bf16(bits_to_f32(0x3f818000u)).bits == 0x3f82);  // tie, even above
  CHECK(f32_to_bf16(bits_to_f32(0x7f7fffffu)).bits == 0x7f80);  // f32 max rounds to Inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0x7f800001u)))));  // signalling NaN stays NaN
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)).bits == 0x0000);         // half the smallest subnormal: tie to 0
  CHECK(f32_to_f16(std::ldexp(3.0f, -26)).bits == 0x0001);         // 1.5 x 2^-25 rounds up
  CHECK(f32_to_f16(std::ldexp(3.0f, -25)).bits == 0x0002);         // 1.5 subnormal ulps: tie to even (2)
  CHECK(f32_to_f16(65519.99f).bits == 0x7bff);
  CHECK(f32_to_f16(65520.0f).bits == 0x7c00);
  CHECK(f32_to_f16(-1e9f).bits == 0xfc00);
  CHECK(f32_to_f16(-0.0f).bits == 0x8000);
  CHECK(f32_to_f16(0.1f).bits == 0x2e66);  // python3 struct.pack('<e', 0.1) == b'\x66\x2e'
}

TEST_CASE("copies between devices, strided on both sides") {
  for (Device dev : test_devices()) {
    const Tensor h = Tensor::from_vector(iota(60), {3, 4, 5}, DType::BF16);
    const Tensor d = h.transpose(0, 2).to(dev);  // (5, 4, 3), strided source
    CHECK(d.device() == dev);
    CHECK(d.to_floats() == h.transpose(0, 2).to_floats());
    Tensor back = Tensor::zeros({3, 4, 5}, DType::BF16);
    back.transpose(0, 2).copy_from(d);  // strided destination on the host
    CHECK(back.to_floats() == h.to_floats());
    const Tensor z = Tensor::zeros({2, 6}, DType::F16, dev);
    z.slice(1, 1, 4).copy_from(Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::F16));
    CHECK(z.to_floats() == std::vector<float>{0, 1, 2, 3, 0, 0, 0, 4, 5, 6, 0, 0});
  }
}

TEST_CASE("harness self-test: poison, guards and compare can fail") {
  Out o = make_out({5}, DType::F32, Device::cpu());
  CHECK(o.unwritten() == 5);
  CHECK_FALSE(compare(values(o.t), std::vector<double>(5, 0.0), {1, 1, 1}).empty());  // NaN poison fails any tolerance
  o.t.flat_range(0, 4).fill(1.0);
  CHECK(o.unwritten() == 1);
  CHECK(o.guards_ok());
  o.base.flat_range(o.lead + 5, 1).fill(1.0);  // one element past the end
  CHECK_FALSE(o.guards_ok());
  for (Placement pl : {Placement::Aligned, Placement::Misaligned}) {
    set_placement(pl);
    for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
      Out q = make_out({9}, dt, Device::cpu());
      const bool aligned = reinterpret_cast<uintptr_t>(q.t.data_ptr()) % 16 == 0;
      CHECK(aligned == (pl == Placement::Aligned));
      CHECK(q.guards_ok());
      q.base.flat_range(q.lead - 1, 1).fill(1.0);  // one element before the start
      CHECK_FALSE(q.guards_ok());
    }
  }
  int passes = 0, aligned_passes = 0;
  for (Device dev : test_devices()) {  // every device once per placement
    ++passes;
    aligned_passes += outputs_aligned();
    CHECK(make_out({3}, DType::BF16, dev).lead == (outputs_aligned() ? Out::kAlignedLead : Out::kGuard));
  }
  CHECK(passes == 2 * aligned_passes);
  for (DType dt : {DType::BF16, DType::F16}) {
    Out p = make_out({3}, dt, Device::cpu());
    for (float f : p.t.to_floats()) CHECK(std::isnan(f));
  }
  CHECK(compare({1.0, 2.0}, {1.0, 2.0 + 1e-7}, {1e-6, 0, 0}).empty());
  CHECK_FALSE(compare({1.0, 2.0}, {1.0, 2.0 + 1e-5}, {1e-6, 0, 0}).empty());
  CHECK_FALSE(compare({1.0}, {1.0, 2.0}, {1, 1, 1}).empty());
  CHECK_FALSE(compare({INFINITY}, {1.0}, {1, 1, 1}).empty());
  CHECK(compare({NAN}, {NAN}, {0, 0, 0}).empty());
  // Finite differences of a known function.
  const std::vector<double> g = fd_grad({0.5, -2.0}, [](const std::vector<double>& x) {
    return std::vector<double>{x[0] * x[0] * x[1], std::sin(x[1])};
  }, {1.0, 3.0});
  CHECK(std::fabs(g[0] - 2 * 0.5 * -2.0) < 1e-8);
  CHECK(std::fabs(g[1] - (0.25 + 3 * std::cos(-2.0))) < 1e-8);
}

TEST_CASE("path counters: count, probe the change over a call, reset") {
  path_counts_reset();
  CHECK(path_count("demo_op.vec8") == 0);
  const PathProbe probe;
  path_count_add("demo_op", "vec8");
  path_count_add("demo_op", "vec8");
  path_count_add("demo_op", "scalar");
  CHECK(path_count("demo_op.vec8") == 2);
  CHECK(probe.delta("demo_op.vec8") == 2);
  CHECK(probe.delta("demo_op.scalar") == 1);
  CHECK(probe.delta("other.path") == 0);
  CHECK(probe.taken() == "demo_op.scalar+1, demo_op.vec8+2");
  const PathProbe later;
  CHECK(later.taken() == "(none)");
  CHECK(path_counts().size() == 2);
  path_counts_reset();
  CHECK(path_count("demo_op.vec8") == 0);
  // The CPU backend has one implementation per op and counts nothing.
  const PathProbe cpu;
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {1, 8}, DType::F32), y = Tensor::empty({1, 8}, DType::F32);
  softmax_forward(x, y);
  CHECK(cpu.taken() == "(none)");
}
