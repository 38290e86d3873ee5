// tests/tensor/op_harness.h — the op conformance harness shared by tests/tensor/test_*.cpp.
//
// Every op test follows one recipe (after ggml's test-backend-ops):
//   1. inputs from a seeded generator (never all zeros, a value range suited to
//      the op), rounded to the dtype under test; the float64 reference sees
//      exactly the rounded values the kernel sees;
//   2. outputs POISONED before the call (NaN for float outputs, 0x7f bytes for
//      integer ones) and surrounded by poisoned GUARD elements, so an unwritten
//      element or an out-of-bounds write fails;
//   3. outputs checked for NaN/Inf, then against a float64 reference written in
//      the test file (not the library's code) with the tolerances below;
//   4. backward checked against float64 central finite differences of that
//      reference forward: dL/dx with L = Σ dout ⊙ f(x);
//   5. on every device: the CPU always, CUDA when mpitron::cuda_available().
//      Without CUDA each test file prints exactly one line
//      "SKIPPED cuda: <reason>" (never a silent pass);
//   6. with two output placements: test_devices() lists every device twice,
//      once with outputs 16-byte aligned (so the vectorised and cuDNN paths can
//      run) and once with outputs at an odd element offset, 67 (the scalar and
//      fallback paths). Iterating it, `for (Device dev : test_devices())`, sets
//      the placement make_out uses for that pass; case names say which;
//   7. where a backend chooses between implementations, the test asserts the
//      one it meant (check_path, tensor/path_stats.h), so a silent fallback fails.
//
// Tolerances (|got − ref| ≤ atol + rtol·|ref| + ntol·max|ref| elementwise).
// ntol normalises by the largest reference magnitude of that output: it covers
// cancellation in reductions and gradients, where the error scales with the
// terms summed, not with the (possibly tiny) result.
//
//   kind        dtype   rtol    atol    ntol    why
//   ----------  -----   ------  ------  ------  ------------------------------------------
//   pointwise   f32     1e-5    1e-6    0       a few f32 ulps (tanhf, expf, 1/(1-p))
//   pointwise   bf16    1e-2    1e-5    0       one output rounding is 2^-9 = 2e-3; slack x5
//   pointwise   f16     2e-3    1e-6    0       one output rounding is 2^-11 = 4.9e-4; slack x4
//   reduction   f32     1e-5    1e-6    1e-5    layernorm, softmax, cross-entropy, norms
//   reduction   bf16    1e-2    1e-5    1e-2
//   reduction   f16     2e-3    1e-6    2e-3
//   attention   f32     2e-5    1e-6    2e-5    two chained reductions (softmax then P·V)
//   attention   bf16    2e-2    1e-4    2e-2    cuDNN rounds P to bf16 before P·V
//   attention   f16     4e-3    1e-5    4e-3
//   gemm        any     rtol of the out dtype's pointwise row, plus the f32 accumulation
//                       bound  2·K·2^-24·Σ_k|a_ik·b_kj|  (+ |beta·c| + |bias| terms): the
//                       classic γ_K bound for K products summed in f32.
// Low-precision inputs are exact in f32, so only the f32 math and the final rounding err.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "tensor/ops.h"
#include "tensor/path_stats.h"

namespace mpitron::test {

// ---- tolerances ------------------------------------------------------------------
struct Tol {
  double rtol, atol, ntol;
};
enum class Kind { Pointwise, Reduction, Attention };

inline Tol tol(DType dt, Kind k) {
  switch (k) {
    case Kind::Pointwise:
      if (dt == DType::BF16) return {1e-2, 1e-5, 0};
      if (dt == DType::F16) return {2e-3, 1e-6, 0};
      return {1e-5, 1e-6, 0};
    case Kind::Reduction:
      if (dt == DType::BF16) return {1e-2, 1e-5, 1e-2};
      if (dt == DType::F16) return {2e-3, 1e-6, 2e-3};
      return {1e-5, 1e-6, 1e-5};
    case Kind::Attention:
      if (dt == DType::BF16) return {2e-2, 1e-4, 2e-2};
      if (dt == DType::F16) return {4e-3, 1e-5, 4e-3};
      return {2e-5, 1e-6, 2e-5};
  }
  return {0, 0, 0};
}

// The float dtypes every op supports, in sweep order.
inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> v{DType::F32, DType::BF16, DType::F16};
  return v;
}

// ---- devices and output placement ---------------------------------------------------
// Where make_out puts an output inside its guarded buffer.
enum class Placement {
  Aligned,     // first element 16-byte aligned (kAlignedLead guard elements before it)
  Misaligned,  // first element at element offset Out::kGuard = 67 (134 bytes in bf16): never 16-byte aligned
};
inline Placement& current_placement() {
  static Placement p = Placement::Misaligned;
  return p;
}
inline void set_placement(Placement p) { current_placement() = p; }
inline bool outputs_aligned() { return current_placement() == Placement::Aligned; }

// A device of the sweep with the output placement of its pass. Converting it to
// a Device (the loop variable of `for (Device dev : test_devices())`) makes its
// placement current, so every make_out of that pass uses it.
struct TestDevice {
  Device device;
  Placement placement;
  operator Device() const {  // NOLINT: implicit on purpose (see above)
    set_placement(placement);
    return device;
  }
};

namespace {  // one copy per test file, so each file prints its SKIPPED line once
inline std::vector<TestDevice> test_devices() {
  static const std::vector<TestDevice> devs = [] {
    std::vector<Device> d{Device::cpu()};
    if (cuda_available()) {
      d.push_back(Device::cuda(0));
    } else {
      std::printf("SKIPPED cuda: %s\n", cuda_unavailable_reason().c_str());
      std::fflush(stdout);
    }
    std::vector<TestDevice> r;
    for (const Device& x : d)
      for (Placement p : {Placement::Aligned, Placement::Misaligned}) r.push_back({x, p});
    return r;
  }();
  return devs;
}
}  // namespace

inline std::string case_name(const Device& d, DType t, const std::string& rest) {
  return str(d.name(), " ", dtype_name(t), outputs_aligned() ? " [aligned out] " : " [out at +67] ", rest);
}

// ---- random inputs ---------------------------------------------------------------
struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g); }
  int64_t randint(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }  // [lo, hi]
};

// The value a double becomes when stored in dtype (through f32, as the library does).
inline double round_to(DType dt, double x) {
  const float f = static_cast<float>(x);
  switch (dt) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(f));
    case DType::F16: return f16_to_f32(f32_to_f16(f));
    default: return f;
  }
}

// A host tensor of dtype holding `v` (converted), moved to `dev`.
inline Tensor make_tensor(const std::vector<double>& v, const Shape& shape, DType dt, Device dev) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(f, shape, dt).to(dev);
}

inline Tensor make_ints(const std::vector<int64_t>& v, const Shape& shape, DType dt, Device dev) {
  return Tensor::from_ints(v, shape, dt).to(dev);
}

// Host values of any float tensor, as doubles.
inline std::vector<double> values(const Tensor& t) {
  std::vector<float> f = t.to_floats();
  return std::vector<double>(f.begin(), f.end());
}

// A random input: the device tensor and the exact (rounded) values it holds.
struct Input {
  Tensor t;
  std::vector<double> v;
};

inline Input rand_input(Rng& rng, const Shape& shape, DType dt, Device dev, double lo, double hi) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  bool nonzero = false;
  for (auto& x : v) {
    x = round_to(dt, rng.uniform(lo, hi));
    nonzero |= x != 0;
  }
  if (n > 0 && !nonzero) v[0] = round_to(dt, hi);  // never all zeros
  return {make_tensor(v, shape, dt, dev), v};
}

// ---- poisoned, guarded outputs ---------------------------------------------------------
// The bit pattern written into every element of an output before a call.
inline std::vector<uint8_t> poison_bytes(DType dt) {
  auto bytes_of = [](auto v) {
    std::vector<uint8_t> b(sizeof(v));
    std::memcpy(b.data(), &v, sizeof(v));
    return b;
  };
  switch (dt) {
    case DType::F32: return bytes_of(uint32_t{0x7fc0dea1u});  // quiet NaN with a payload
    case DType::BF16: return bytes_of(uint16_t{0x7fc1u});      // NaN
    case DType::F16: return bytes_of(uint16_t{0x7e01u});       // NaN
    default: return std::vector<uint8_t>(dtype_size(dt), 0x7f);
  }
}

// An output tensor inside a buffer with poisoned guard elements on each side:
// `lead` before it (kGuard = 67, or kAlignedLead for an aligned placement) and
// kGuard after it. `t` is the tensor the op writes; guards_ok() says whether the
// op stayed inside it.
struct Out {
  static constexpr int64_t kGuard = 67;         // odd, so a vectorised overrun is caught too
  static constexpr int64_t kAlignedLead = 128;  // 256 bytes of 2-byte elements: aligned for any vector width
  Tensor base, t;
  DType dtype;
  int64_t lead = kGuard;

  std::vector<uint8_t> host_bytes(const Tensor& x) const {
    Tensor h = x.to(Device::cpu());
    std::vector<uint8_t> b(h.nbytes());
    if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
    return b;
  }
  bool guards_ok() const {
    const std::vector<uint8_t> all = host_bytes(base), pat = poison_bytes(dtype);
    const size_t es = pat.size(), n = static_cast<size_t>(t.numel());
    const size_t ld = static_cast<size_t>(lead);
    for (size_t i = 0; i < ld; ++i)
      if (std::memcmp(&all[i * es], pat.data(), es) != 0) return false;
    for (size_t i = 0; i < static_cast<size_t>(kGuard); ++i)
      if (std::memcmp(&all[(ld + n + i) * es], pat.data(), es) != 0) return false;
    return true;
  }
  // Number of elements still holding the poison (i.e. never written).
  int64_t unwritten() const {
    const std::vector<uint8_t> b = host_bytes(t), pat = poison_bytes(dtype);
    int64_t k = 0;
    for (size_t i = 0; i < static_cast<size_t>(t.numel()); ++i)
      k += std::memcmp(&b[i * pat.size()], pat.data(), pat.size()) == 0;
    return k;
  }
};

// A poisoned output, placed as the current pass says (current_placement); with
// `init`, the inside holds init (for += outputs) and only the guards are poisoned.
inline Out make_out(const Shape& shape, DType dt, Device dev, const std::vector<double>* init = nullptr) {
  const int64_t n = shape_numel(shape);
  const int64_t lead = outputs_aligned() ? Out::kAlignedLead : Out::kGuard;
  const int64_t total = lead + n + Out::kGuard;
  Tensor host = Tensor::empty({total}, dt);
  const std::vector<uint8_t> pat = poison_bytes(dt);
  auto* p = static_cast<uint8_t*>(host.data_ptr());
  for (int64_t i = 0; i < total; ++i) std::memcpy(p + i * pat.size(), pat.data(), pat.size());
  if (init) {
    REQUIRE(static_cast<int64_t>(init->size()) == n);
    std::vector<float> f(init->begin(), init->end());
    Tensor inside = Tensor::from_vector(f, {n}, dt);
    std::memcpy(p + lead * pat.size(), inside.data_ptr(), inside.nbytes());
  }
  Out o;
  o.dtype = dt;
  o.lead = lead;
  o.base = host.to(dev);
  o.t = o.base.flat_range(lead, n).view(shape);
  const bool aligned16 = reinterpret_cast<uintptr_t>(o.t.data_ptr()) % 16 == 0;
  REQUIRE_MESSAGE(aligned16 == outputs_aligned(), "make_out: output placement is not what the pass asked for");
  return o;
}

// ---- which implementation ran (tensor/path_stats.h) --------------------------------------
// The counter a width-choosing kernel of `op` must take in this pass: "<op>.vec8"
// when the outputs are aligned and `vec_possible` (e.g. the row length is a
// multiple of 8 and every input is aligned), else "<op>.scalar".
inline std::string vec_path(const std::string& op, bool vec_possible) {
  return op + (outputs_aligned() && vec_possible ? ".vec8" : ".scalar");
}

// On CUDA: checks that since `probe` the counter `expected` ("<op>.<path>") grew
// and no other path of the same op did. The CPU backend has one implementation
// per op and counts nothing, so there is nothing to check.
inline void check_path(const Device& dev, const PathProbe& probe, const std::string& expected,
                       const std::string& what) {
  if (!dev.is_cuda()) return;
  const std::string op = expected.substr(0, expected.find('.') + 1);
  bool others = false;
  for (const auto& [name, v] : path_counts())
    if (name != expected && name.compare(0, op.size(), op) == 0 && probe.delta(name) > 0) others = true;
  CHECK_MESSAGE((probe.delta(expected) > 0 && !others),
                what << ": expected path " << expected << ", took " << probe.taken());
}

// ---- comparison ------------------------------------------------------------------------
// Compares `got` with float64 `ref`: same size, finite where ref is finite, within tol.
// `extra[i]` (optional) is added to the bound of element i (the gemm accumulation bound).
// Returns "" when everything matches, else a description of the first mismatches.
inline std::string compare(const std::vector<double>& got, const std::vector<double>& ref, Tol t,
                           const std::vector<double>* extra = nullptr) {
  if (got.size() != ref.size()) return str(got.size(), " values, reference has ", ref.size());
  double maxref = 0;
  for (double r : ref)
    if (std::isfinite(r)) maxref = std::max(maxref, std::fabs(r));
  int64_t bad = 0, nonfinite = 0;
  double worst = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    bool ok;
    if (!std::isfinite(r)) {
      ok = std::isnan(r) ? std::isnan(g) : g == r;
    } else if (!std::isfinite(g)) {
      ok = false;
      ++nonfinite;
    } else {
      const double bound = t.atol + t.rtol * std::fabs(r) + t.ntol * maxref + (extra ? (*extra)[i] : 0.0);
      const double err = std::fabs(g - r);
      ok = err <= bound;
      worst = std::max(worst, err / bound);
    }
    if (!ok) {
      if (bad < 5) first += str("\n    [", i, "] got ", g, " want ", r);
      ++bad;
    }
  }
  if (!bad) return "";
  return str(bad, " of ", ref.size(), " elements out of tolerance (", nonfinite, " non-finite; worst err/bound ",
             worst, "; rtol ", t.rtol, " atol ", t.atol, " ntol ", t.ntol, ")", first);
}

inline bool check_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                        Tol t, const std::vector<double>* extra = nullptr) {
  const std::string err = compare(got, ref, t, extra);
  CHECK_MESSAGE(err.empty(), what << ": " << err);
  return err.empty();
}

inline bool check_close(const std::string& what, const Tensor& got, const std::vector<double>& ref, Tol t,
                        const std::vector<double>* extra = nullptr) {
  return check_close(what, values(got), ref, t, extra);
}

// Checks a poisoned output: every element written, guards intact, then values.
inline bool check_out(const std::string& what, const Out& o, const std::vector<double>& ref, Tol t,
                      const std::vector<double>* extra = nullptr) {
  const bool guards = o.guards_ok();
  CHECK_MESSAGE(guards, what << ": write outside the output (guard elements changed)");
  return check_close(what, o.t, ref, t, extra) && guards;
}

inline bool all_finite(const Tensor& t) {
  for (float f : t.to_floats())
    if (!std::isfinite(f)) return false;
  return true;
}

// ---- finite differences --------------------------------------------------------------------
// dL/dx of L(x) = Σ_i w_i · f(x)_i, by float64 central differences (h absolute).
inline std::vector<double> fd_grad(std::vector<double> x,
                                   const std::function<std::vector<double>(const std::vector<double>&)>& f,
                                   const std::vector<double>& w, double h = 1e-5) {
  std::vector<double> g(x.size());
  auto loss = [&](const std::vector<double>& xs) {
    const std::vector<double> y = f(xs);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += w[i] * y[i];
    return l;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// ---- errors ------------------------------------------------------------------------------------
// Runs fn, which must throw mpitron::Error whose message names `op`.
template <typename Fn>
void check_throws_naming(const char* op, Fn&& fn, const std::string& what = "") {
  bool threw = false;
  try {
    fn();
  } catch (const Error& e) {
    threw = true;
    CHECK_MESSAGE(std::string(e.what()).find(op) != std::string::npos,
                  what << ": error does not name the op '" << op << "': " << e.what());
  } catch (const std::exception& e) {
    FAIL_CHECK(what << ": threw a non-mpitron exception: " << e.what());
    return;
  }
  CHECK_MESSAGE(threw, what << ": " << op << " accepted invalid arguments");
}

// ---- independent float-format references -----------------------------------------------------
// Decoders from the IEEE bit layout by ldexp (not the library's bit tricks), and
// round-to-nearest-even encoders that pick between the two neighbouring
// representable values by exact comparison in double.
inline double decode_f16(uint16_t b) {
  const int s = b >> 15, e = (b >> 10) & 31, m = b & 1023;
  double v;
  if (e == 0) v = std::ldexp(m, -24);
  else if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}
inline double decode_bf16(uint16_t b) {
  const int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
  double v;
  if (e == 0) v = std::ldexp(m, -133);
  else if (e == 255) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(128 + m, e - 134);
  return s ? -v : v;
}

// Nearest-even encoding of x in a format whose positive finite patterns 0..max_bits
// decode monotonically through `dec`; overflow (|x| ≥ max + half an ulp) gives Inf.
inline uint16_t encode_rne(double x, double (*dec)(uint16_t), uint16_t max_bits, uint16_t inf_bits,
                           uint16_t nan_bits) {
  if (std::isnan(x)) return nan_bits;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  // Binary search for the largest pattern with value <= a.
  int lo = 0, hi = max_bits;
  if (a >= dec(max_bits)) {
    const double half_ulp = (dec(max_bits) - dec(max_bits - 1)) / 2;
    return static_cast<uint16_t>(sign | (a >= dec(max_bits) + half_ulp ? inf_bits : max_bits));
  }
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (dec(static_cast<uint16_t>(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  const double below = dec(static_cast<uint16_t>(lo)), above = dec(static_cast<uint16_t>(lo + 1));
  int pick;
  if (a - below < above - a) pick = lo;
  else if (a - below > above - a) pick = lo + 1;
  else pick = (lo & 1) ? lo + 1 : lo;  // tie: even mantissa
  return static_cast<uint16_t>(sign | pick);
}
inline uint16_t ref_f16_bits(double x) { return encode_rne(x, decode_f16, 0x7bff, 0x7c00, 0x7e00); }
inline uint16_t ref_bf16_bits(double x) { return encode_rne(x, decode_bf16, 0x7f7f, 0x7f80, 0x7fc0); }

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace mpitron::test
