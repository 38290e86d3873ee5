// tests/tensor/test_elementwise.cpp — add, add_backward, cast, axpby, scale.
//
// References: float64 arithmetic written here; for cast, the independent
// round-to-nearest-even encoders of op_harness.h (nearest representable value
// by exact comparison in double, ties to even, overflow to ±Inf) over every
// bf16 and f16 bit pattern and over f32 values placed exactly on, beside and
// between the representable neighbours (ties), plus NaN/Inf/±0/subnormals.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

const std::vector<int64_t> kSizes = {1, 7, 13, 37, 127, 1000, 1 << 16, 1000003};

// Raw 16-bit patterns of a bf16/f16 tensor, or 32-bit patterns of an f32 one.
std::vector<uint32_t> raw_bits(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<uint32_t> b(static_cast<size_t>(h.numel()));
  for (size_t i = 0; i < b.size(); ++i) {
    if (h.dtype() == DType::F32) b[i] = f32_bits(h.data<float>()[i]);
    else if (h.dtype() == DType::BF16) b[i] = h.data<bf16_t>()[i].bits;
    else b[i] = h.data<f16_t>()[i].bits;
  }
  return b;
}

Tensor from_raw(const std::vector<uint32_t>& bits, DType dt, Device dev) {
  Tensor h = Tensor::empty({static_cast<int64_t>(bits.size())}, dt);
  for (size_t i = 0; i < bits.size(); ++i) {
    if (dt == DType::F32) h.data<float>()[i] = bits_to_f32(bits[i]);
    else if (dt == DType::BF16) h.data<bf16_t>()[i] = bf16_t{static_cast<uint16_t>(bits[i])};
    else h.data<f16_t>()[i] = f16_t{static_cast<uint16_t>(bits[i])};
  }
  return h.to(dev);
}

double decode(DType dt, uint32_t b) {
  if (dt == DType::F32) return bits_to_f32(b);
  if (dt == DType::BF16) return decode_bf16(static_cast<uint16_t>(b));
  return decode_f16(static_cast<uint16_t>(b));
}

// Expected destination bits of an exact source value (NaN handled by the caller).
uint32_t expected_bits(DType dst, double v) {
  if (dst == DType::F32) return f32_bits(static_cast<float>(v));  // exact: every bf16/f16 value is an f32
  if (dst == DType::BF16) return ref_bf16_bits(v);
  return ref_f16_bits(v);
}

// Source patterns: all 65536 for 16-bit types; for f32, specials plus values on,
// just beside and exactly between neighbouring bf16 and f16 values.
std::vector<uint32_t> cast_sources(DType src) {
  std::vector<uint32_t> s;
  if (src != DType::F32) {
    for (uint32_t b = 0; b < 65536; ++b) s.push_back(b);
    return s;
  }
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                     0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x807fffffu, 0x00800000u, 0x3f800000u})
    s.push_back(u);
  // Around every 64th bf16 value: the value, the midpoint to the next (a tie), ±1 f32 ulp.
  for (uint32_t b = 0; b < 0x7f80; b += 61) {
    const uint32_t u = b << 16, mid = u + 0x8000;
    for (uint32_t x : {u, mid - 1, mid, mid + 1, mid + 0x10000}) {
      s.push_back(x);
      s.push_back(x | 0x80000000u);
    }
  }
  // Around f16 values (normal and subnormal): midpoints between neighbours, ±1 f32 ulp.
  for (uint32_t h = 0; h < 0x7c00; h += 7) {
    const double mid = (decode_f16(static_cast<uint16_t>(h)) + decode_f16(static_cast<uint16_t>(h + 1))) / 2;
    const uint32_t u = f32_bits(static_cast<float>(mid));  // exact: an f16 midpoint has <= 12 significant bits
    for (uint32_t x : {u - 1, u, u + 1}) s.push_back(x);
  }
  // Hand-checked f16 cases (expected bits computed with python3 struct.pack('<e', x), see below).
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e6f, 1.00048828125f, 1.00146484375f, 2.9802322387695312e-08f,
                  4.470348358154297e-08f, 1e-8f, 0.1f})
    s.push_back(f32_bits(f));
  return s;
}

}  // namespace

TEST_CASE("reference encoders agree with Python's IEEE half (struct.pack('<e'))") {
  // x → bits, from `python3 -c "import struct; print(struct.pack('<e', x).hex())"`
  // (little-endian hex, so 'ff7b' is 0x7bff); 65520.0 raised OverflowError (rounds to Inf).
  const std::vector<std::pair<float, uint16_t>> py = {
      {65504.0f, 0x7bff}, {65519.99f, 0x7bff}, {1.00048828125f, 0x3c00}, {1.00146484375f, 0x3c02},
      {2.9802322387695312e-08f, 0x0000}, {4.470348358154297e-08f, 0x0001}, {5.960464477539063e-08f, 0x0001},
      {6.1035156e-05f, 0x0400}, {0.1f, 0x2e66}, {-0.0f, 0x8000}, {1e-8f, 0x0000}};
  for (auto [x, bits] : py) CHECK_MESSAGE(ref_f16_bits(x) == bits, "x=" << x);
  CHECK(ref_f16_bits(65520.0) == 0x7c00);
  // bf16 ties by hand: 1 + 2^-8 lies halfway between 1 (0x3f80) and 1 + 2^-7 (0x3f81): even wins.
  CHECK(ref_bf16_bits(1.0 + std::ldexp(1, -8)) == 0x3f80);
  CHECK(ref_bf16_bits(1.0 + 3 * std::ldexp(1, -8)) == 0x3f82);
  CHECK(ref_bf16_bits(1.0 + std::ldexp(1, -8) + std::ldexp(1, -23)) == 0x3f81);
  CHECK(ref_bf16_bits(bits_to_f32(0x7f7fffffu)) == 0x7f80);  // f32 max rounds up past bf16 max
}

TEST_CASE("cast between every pair of float dtypes: RNE ties, NaN, Inf, subnormals, overflow") {
  for (Device dev : test_devices())
    for (DType src : float_dtypes())
      for (DType dst : float_dtypes()) {
        const std::vector<uint32_t> sbits = cast_sources(src);
        const Tensor s = from_raw(sbits, src, dev);
        Out d = make_out({static_cast<int64_t>(sbits.size())}, dst, dev);
        cast(s, d.t);
        CHECK_MESSAGE(d.guards_ok(), "cast wrote outside dst");
        const std::vector<uint32_t> got = raw_bits(d.t);
        int64_t bad = 0;
        std::string first;
        for (size_t i = 0; i < sbits.size(); ++i) {
          const double v = decode(src, sbits[i]);
          bool ok;
          if (std::isnan(v)) ok = std::isnan(decode(dst, got[i]));
          else ok = got[i] == expected_bits(dst, v);
          if (!ok && bad++ < 5)
            first += str("\n    src 0x", std::hex, sbits[i], " (", v, ") -> 0x", got[i], " want 0x",
                         std::isnan(v) ? 0u : expected_bits(dst, v), std::dec);
        }
        CHECK_MESSAGE(bad == 0, dev.name() << " cast " << dtype_name(src) << " -> " << dtype_name(dst) << ": " << bad
                                           << " of " << sbits.size() << " wrong" << first);
      }
}

TEST_CASE("Tensor::to(dtype) goes through cast") {
  for (Device dev : test_devices()) {
    const Tensor s = from_raw({0x3f808000u, 0x3f818000u, 0x7f800000u, 0x477ff000u}, DType::F32, dev);
    CHECK(raw_bits(s.to(DType::BF16)) == std::vector<uint32_t>{0x3f80, 0x3f82, 0x7f80, 0x4780});
    CHECK(raw_bits(s.to(DType::F16)) == std::vector<uint32_t>{0x3c04, 0x3c0c, 0x7c00, 0x7c00});
  }
}

TEST_CASE("add_forward and add_backward, every dtype") {
  uint64_t seed = 8000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t n : kSizes) {
        Rng rng(++seed);
        const Shape shape = n % 7 == 0 ? Shape{7, n / 7} : Shape{n};
        const Input a = rand_input(rng, shape, dt, dev, -4, 4), b = rand_input(rng, shape, dt, dev, -4, 4);
        std::vector<double> sum(a.v.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = a.v[i] + b.v[i];
        const std::string name = case_name(dev, dt, str("add n=", n));
        Out out = make_out(shape, dt, dev);
        const PathProbe path;
        add_forward(a.t, b.t, out.t);
        check_path(dev, path, vec_path("add_forward", true), name);  // any n: 8-wide with a scalar tail
        check_out(name, out, sum, tol(dt, Kind::Pointwise));
        const Tensor ac = a.t.clone();
        add_forward(ac, b.t, ac);  // out aliases a
        check_close(name + " in place", ac, sum, tol(dt, Kind::Pointwise));

        // add_backward: da = dout (=), db += dout.
        const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
        const std::vector<double> db0 = rand_input(rng, shape, dt, dev, -1, 1).v;
        Out da = make_out(shape, dt, dev), db = make_out(shape, dt, dev, &db0);
        add_backward(dout.t, da.t, Tensor(), false);
        add_backward(dout.t, Tensor(), db.t, true);
        std::vector<double> acc(db0.size());
        for (size_t i = 0; i < acc.size(); ++i) acc[i] = db0[i] + dout.v[i];
        check_out(name + " backward da", da, dout.v, {0, 0, 0});
        check_out(name + " backward db (accumulate)", db, acc, tol(dt, Kind::Pointwise));
        Out da2 = make_out(shape, dt, dev), db2 = make_out(shape, dt, dev);
        add_backward(dout.t, da2.t, db2.t, false);
        check_out(name + " backward both da", da2, dout.v, {0, 0, 0});
        check_out(name + " backward both db", db2, dout.v, {0, 0, 0});
      }
}

TEST_CASE("axpby (mixed dtypes; beta = 0 never reads y) and scale") {
  uint64_t seed = 8100;
  for (Device dev : test_devices())
    for (DType xt : float_dtypes())
      for (DType yt : float_dtypes())
        for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}, int64_t{65537}}) {
          Rng rng(++seed);
          const Input x = rand_input(rng, {n}, xt, dev, -2, 2);
          const std::vector<double> y0 = rand_input(rng, {n}, yt, dev, -2, 2).v;
          Out y = make_out({n}, yt, dev, &y0);
          axpby(0.75f, x.t, -1.5f, y.t);
          std::vector<double> ref(y0.size());
          for (size_t i = 0; i < ref.size(); ++i) ref[i] = 0.75 * x.v[i] - 1.5 * y0[i];
          const std::string name = str(dev.name(), " axpby x=", dtype_name(xt), " y=", dtype_name(yt), " n=", n);
          // Two terms of up to ~4.5 may cancel: allow the rtol of y's dtype on the larger term.
          Tol t = tol(yt, Kind::Pointwise);
          t.ntol = t.rtol;
          check_out(name, y, ref, t);
          Out yz = make_out({n}, yt, dev);  // NaN-poisoned: beta = 0 must not read it
          axpby(-2.0f, x.t, 0.0f, yz.t);
          for (size_t i = 0; i < ref.size(); ++i) ref[i] = -2.0 * x.v[i];
          check_out(name + " beta=0", yz, ref, tol(yt, Kind::Pointwise));
        }
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      Rng rng(++seed);
      const Input x = rand_input(rng, {1031}, dt, dev, -2, 2);
      const Tensor y = x.t.clone();
      scale(y, -0.3f);
      std::vector<double> ref(x.v);
      for (double& v : ref) v *= -0.3f;
      check_close(case_name(dev, dt, "scale"), y, ref, tol(dt, Kind::Pointwise));
    }
}

TEST_CASE("elementwise: invalid arguments throw naming the op") {
  const Tensor a = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("add_forward", [&] { add_forward(a, Tensor::zeros({4, 6}, DType::BF16), a); }, "dtype");
  check_throws_naming("add_forward", [&] { add_forward(a, a, Tensor::zeros({6, 4}, DType::F32)); }, "shape");
  check_throws_naming("add_backward", [&] { add_backward(a, Tensor::zeros({4, 5}, DType::F32), Tensor()); }, "da shape");
  check_throws_naming("cast", [&] { cast(a, Tensor::zeros({4, 6}, DType::I32)); }, "int dst");
  check_throws_naming("cast", [&] { cast(a, Tensor::zeros({4, 5}, DType::F16)); }, "shape");
  check_throws_naming("axpby", [&] { axpby(1, a, 1, Tensor::zeros({4, 5}, DType::F32)); }, "shape");
  check_throws_naming("scale", [&] { scale(Tensor::zeros({3}, DType::I32), 2); }, "int");
}
