// tests/tensor/test_fp8.cpp — fp8 casts and the quantiser's ops (tensor/fp8_format.h, fp8.h; issue 45).
//
// References nobody here wrote: PyTorch's torch.float8_e4m3fn / float8_e5m2 (tests/reference/
// torch_fp8_ref.py → tests/tensor/ref/torch_fp8.json, PyPI torch 2.x): every code decoded, and
// the cast of every value class the quantiser can meet — each representable value, each
// midpoint between neighbours (ties to even) and the f32 values one ulp either side, the
// overflow threshold, subnormals (fp8 and f32), zeros, Inf, NaN, both signs — as tensor.to(fp8)
// casts them (PyTorch 2.x saturates to E4M3 but not to E5M2: ±448 and ±Inf for what overflows)
// and after a clamp to ±max (the saturating cast), bit for bit.
// The ops on every device: amax against the float64 max |x|, quantise–dequantise against the
// host function of the same input (bitwise, every dtype, awkward sizes, in place, scales that
// overflow the format), the output placements, invalid arguments.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tensor/fp8.h"
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

const nlohmann::json& torch_ref() {
  static const nlohmann::json j = [] {
    const std::string path = std::string(MPITRON_SOURCE_DIR) + "/tests/tensor/ref/torch_fp8.json";
    std::ifstream f(path);
    REQUIRE_MESSAGE(f.good(), path, " is missing: run tests/reference/torch_fp8_ref.py with the reference venv");
    return nlohmann::json::parse(f);
  }();
  return j;
}

std::string hex(uint32_t u) { return str("0x", std::hex, u); }

bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

}  // namespace

TEST_CASE("fp8 decode: every code of E4M3 and E5M2 as PyTorch's float8 types") {
  for (const auto& [name, f] : {std::pair{std::string("e4m3"), Fp8Format::E4M3}, std::pair{std::string("e5m2"), Fp8Format::E5M2}}) {
    const auto& ref = torch_ref()["formats"][name]["decode"];
    REQUIRE(ref.size() == 256);
    int bad = 0;
    for (int c = 0; c < 256; ++c) {
      const uint32_t want = ref[static_cast<size_t>(c)].get<uint32_t>(), got = fp8_f32_bits(fp8_decode(static_cast<uint8_t>(c), f));
      // NaN: any payload, the sign kept.
      const bool ok = is_nan_bits(want) ? is_nan_bits(got) && (got >> 31) == (want >> 31) : got == want;
      if (!ok && ++bad <= 5) FAIL_CHECK(name, " code ", c, ": decoded ", hex(got), ", torch ", hex(want));
    }
    CHECK_MESSAGE(bad == 0, name, ": ", bad, " codes decode differently from torch");
  }
}

TEST_CASE("fp8 encode: PyTorch's cast (no saturation) and the saturating cast, bit for bit") {
  for (const auto& [name, f] : {std::pair{std::string("e4m3"), Fp8Format::E4M3}, std::pair{std::string("e5m2"), Fp8Format::E5M2}}) {
    const auto& r = torch_ref()["formats"][name];
    const auto& in = r["inputs"];
    REQUIRE(in.size() > 5000);
    REQUIRE(r["cast"].size() == in.size());
    REQUIRE(r["cast_sat"].size() == in.size());
    int bad = 0, bad_sat = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const float x = fp8_bits_f32(in[i].get<uint32_t>());
      const int want = r["cast"][i].get<int>(), want_sat = r["cast_sat"][i].get<int>();
      // PyTorch's .to(): saturating for E4M3 (every overflow and ±Inf give ±448), not for E5M2 (±Inf).
      const int got = fp8_encode(x, f, f == Fp8Format::E4M3), got_sat = fp8_encode(x, f, true);
      if (got != want && ++bad <= 5) FAIL_CHECK(name, " cast of ", x, " (", hex(in[i].get<uint32_t>()), "): ", got, ", torch ", want);
      if (got_sat != want_sat && ++bad_sat <= 5)
        FAIL_CHECK(name, " saturating cast of ", x, " (", hex(in[i].get<uint32_t>()), "): ", got_sat, ", torch ", want_sat);
    }
    CHECK_MESSAGE(bad == 0, name, ": ", bad, " of ", in.size(), " casts differ from torch");
    CHECK_MESSAGE(bad_sat == 0, name, ": ", bad_sat, " of ", in.size(), " saturating casts differ from torch");
  }
}

TEST_CASE("fp8 encode/decode round trip: every finite code comes back as itself") {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(static_cast<uint8_t>(c), f);
      if (!std::isfinite(v)) continue;
      CHECK(fp8_encode(v, f, false) == c);
      CHECK(fp8_encode(v, f, true) == c);
    }
}

TEST_CASE("fp8 encode without saturation: OCP's overflow (E4M3 NaN, E5M2 Inf), ties to even at the top") {
  CHECK(fp8_encode(448.0f, Fp8Format::E4M3, false) == 0x7E);
  CHECK(fp8_encode(464.0f, Fp8Format::E4M3, false) == 0x7E);  // the tie between 448 and 480 goes to 448 (even)
  CHECK(fp8_encode(std::nextafter(464.0f, 1e9f), Fp8Format::E4M3, false) == 0x7F);  // rounds past 448: NaN
  CHECK(fp8_encode(-INFINITY, Fp8Format::E4M3, false) == 0xFF);
  CHECK(fp8_encode(-INFINITY, Fp8Format::E4M3, true) == 0xFE);
  CHECK(fp8_encode(61440.0f, Fp8Format::E5M2, false) == 0x7C);  // the tie between 57344 and 65536 goes up (even)
  CHECK(fp8_encode(61440.0f, Fp8Format::E5M2, true) == 0x7B);
  CHECK(fp8_encode(std::nextafter(61440.0f, 0.0f), Fp8Format::E5M2, false) == 0x7B);
}

namespace {

void run_ops(Device dev, DType dt, int64_t n, Fp8Format f, double range, bool in_place, uint64_t seed) {
  Rng rng(seed);
  const Shape shape = n % 3 == 0 ? Shape{3, n / 3} : Shape{n};
  Input x = rand_input(rng, shape, dt, dev, -range, range);
  for (size_t i = 0; i < x.v.size(); i += 11) x.v[i] = 0.0;
  x.t = make_tensor(x.v, shape, dt, dev);
  const std::string name = case_name(dev, dt, str("fp8 ", f == Fp8Format::E4M3 ? "e4m3" : "e5m2", " n=", n,
                                                  " range=", range, in_place ? " in place" : ""));
  // amax: exact (a max of stored values).
  double want_amax = 0;
  for (double v : x.v) want_amax = std::max(want_amax, std::fabs(v));
  const Tensor amax = Tensor::zeros({1}, DType::F32, dev);
  fp8_amax(x.t, amax);
  CHECK_MESSAGE(amax.to_floats()[0] == static_cast<float>(want_amax), name, " amax ", amax.to_floats()[0], " want ", want_amax);
  // Scales: current scaling (max / amax), a power of two, and one that overflows the format.
  const float fmax = fp8_spec(f).max;
  for (float sc : {fmax / static_cast<float>(want_amax), 0.5f, 4.0f * fmax / static_cast<float>(want_amax)}) {
    const Tensor scale = Tensor::from_vector(std::vector<float>{sc}, {1}, DType::F32).to(dev);
    std::vector<double> ref(x.v.size());
    for (size_t i = 0; i < ref.size(); ++i)
      ref[i] = round_to(dt, fp8_quantize_dequantize(static_cast<float>(x.v[i]), sc, 1.0f / sc, f));
    const std::string what = str(name, " scale ", sc);
    if (in_place) {
      const Tensor y = x.t.clone();
      fp8_quantize_dequantize(y, scale, f, y);
      check_close(what, y, ref, {0, 0, 0});
    } else {
      Out out = make_out(shape, dt, dev);
      const PathProbe p;
      fp8_quantize_dequantize(x.t, scale, f, out.t);
      check_path(dev, p, vec_path("fp8_quantize_dequantize", true), what);
      check_out(what, out, ref, {0, 0, 0});
    }
  }
}

}  // namespace

TEST_CASE("fp8 amax and quantise-dequantise on every device: bitwise the host function") {
  uint64_t seed = 4500;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
        for (int64_t n : {1, 7, 1019, 4096 + 3, 1 << 17}) run_ops(dev, dt, n, f, n % 2 ? 3.0 : 1e-3, false, ++seed);
}

TEST_CASE("fp8 quantise-dequantise: out may alias x; amax of an empty tensor is 0, NaN ignored") {
  uint64_t seed = 4600;
  for (Device dev : test_devices()) {
    for (DType dt : float_dtypes()) run_ops(dev, dt, 1031, Fp8Format::E4M3, 10.0, true, ++seed);
    const Tensor amax = Tensor::from_vector({7.0f}, {1}).to(dev);
    fp8_amax(Tensor::zeros({0}, DType::F32, dev), amax);
    CHECK(amax.to_floats()[0] == 0.0f);
    fp8_amax(make_tensor({1.0, NAN, -3.0}, {3}, DType::F32, dev), amax);
    CHECK(amax.to_floats()[0] == 3.0f);
  }
}

TEST_CASE("fp8 ops: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32), out = Tensor::zeros({4, 6}, DType::F32);
  const Tensor one = Tensor::from_vector({1.0f}, {1});
  check_throws_naming("fp8_amax", [&] { fp8_amax(x, Tensor::zeros({2}, DType::F32)); }, "amax of 2");
  check_throws_naming("fp8_amax", [&] { fp8_amax(x, Tensor::zeros({1}, DType::BF16)); }, "bf16 amax");
  check_throws_naming("fp8_amax", [&] { fp8_amax(Tensor::zeros({4}, DType::I32), one); }, "int x");
  check_throws_naming("fp8_quantize_dequantize", [&] { fp8_quantize_dequantize(x, Tensor(), Fp8Format::E4M3, out); },
                      "no scale");
  check_throws_naming("fp8_quantize_dequantize",
                      [&] { fp8_quantize_dequantize(x, one, Fp8Format::E4M3, Tensor::zeros({4, 5}, DType::F32)); }, "out shape");
  check_throws_naming("fp8_quantize_dequantize",
                      [&] { fp8_quantize_dequantize(x, one, Fp8Format::E4M3, Tensor::zeros({4, 6}, DType::BF16)); }, "out dtype");
  check_throws_naming("fp8_quantize_dequantize",
                      [&] { fp8_quantize_dequantize(Tensor::zeros({6, 4}, DType::F32).transpose(0, 1), one, Fp8Format::E4M3, out); },
                      "strided x");
}
