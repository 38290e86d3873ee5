// tests/tensor/test_attention.cpp — causal self-attention over fused QKV, forward/backward.
//
// Reference: a float64 implementation written here (scores, causal mask,
// max-subtracted softmax, P·V, lse). Backward: float64 central differences of
// that forward on small shapes (loss Σ dout ⊙ out; lse carries no gradient),
// and the closed-form float64 backward (dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − rowsum),
// dQ = s·dS·K, dK = s·dSᵀ·Q) on the larger ones. On CUDA the cuDNN path and the
// forced cuBLAS fallback are both checked against the reference and each other,
// and every CUDA call asserts which of the two ran (path counters).
// Grouped-query attention (qkv (B, T, NH + 2G, HD), head h reads kv group h/(NH/G))
// runs through the same reference, whose dK/dV sum over a group's heads; a
// PyTorch cross-check (HF's repeat_kv, torch autograd) reads
// tests/tensor/ref/llama_ops_ref.json from tests/reference/llama_ops_ref.py.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tensor/op_harness.h"
#ifdef MPITRON_WITH_CUDA
#include "tensor/cuda/internal.h"
#endif

using namespace mpitron;
using namespace mpitron::test;

namespace {

// g = 0: MHA with qkv (B, T, 3, NH, HD); g > 0: GQA with qkv (B, T, NH + 2g, HD).
struct AttnDims {
  int64_t b, t, nh, hd, g = 0;
  int64_t groups() const { return g ? g : nh; }
};
Shape qkv_shape(const AttnDims& d) {
  return d.g ? Shape{d.b, d.t, d.nh + 2 * d.g, d.hd} : Shape{d.b, d.t, 3, d.nh, d.hd};
}
Shape out_shape(const AttnDims& d) { return {d.b, d.t, d.nh, d.hd}; }
std::string dims_str(const AttnDims& d) {
  return str("B=", d.b, " T=", d.t, " NH=", d.nh, " HD=", d.hd, d.g ? str(" G=", d.g) : std::string());
}

// Element e of Q head h (which 0), or of the K (1) / V (2) group that head h reads.
size_t qkv_at(const AttnDims& d, int64_t b, int64_t t, int which, int64_t h, int64_t e) {
  const int64_t g = d.groups(), grp = h / (d.nh / g);
  const int64_t col = which == 0 ? h : which == 1 ? d.nh + grp : d.nh + g + grp;
  return static_cast<size_t>(((b * d.t + t) * (d.nh + 2 * g) + col) * d.hd + e);
}
size_t out_at(const AttnDims& d, int64_t b, int64_t t, int64_t h, int64_t e) {
  return static_cast<size_t>(((b * d.t + t) * d.nh + h) * d.hd + e);
}

// Causal attention probabilities P (T, T) of one (batch, head); row i has i+1 entries.
std::vector<double> probs(const AttnDims& d, const std::vector<double>& qkv, int64_t b, int64_t h, double scale,
                          std::vector<double>* lse) {
  std::vector<double> p(static_cast<size_t>(d.t * d.t), 0.0);
  for (int64_t i = 0; i < d.t; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (int64_t e = 0; e < d.hd; ++e) s += qkv[qkv_at(d, b, i, 0, h, e)] * qkv[qkv_at(d, b, j, 1, h, e)];
      p[i * d.t + j] = s * scale;
      mx = std::max(mx, s * scale);
    }
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += (p[i * d.t + j] = std::exp(p[i * d.t + j] - mx));
    for (int64_t j = 0; j <= i; ++j) p[i * d.t + j] /= sum;
    if (lse) (*lse)[static_cast<size_t>((b * d.nh + h) * d.t + i)] = mx + std::log(sum);
  }
  return p;
}

std::vector<double> ref_attention(const AttnDims& d, const std::vector<double>& qkv, double scale,
                                  std::vector<double>* lse = nullptr) {
  std::vector<double> out(static_cast<size_t>(d.b * d.t * d.nh * d.hd), 0.0);
  if (lse) lse->assign(static_cast<size_t>(d.b * d.nh * d.t), 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h) {
      const std::vector<double> p = probs(d, qkv, b, h, scale, lse);
      for (int64_t i = 0; i < d.t; ++i)
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < d.hd; ++e) out[out_at(d, b, i, h, e)] += p[i * d.t + j] * qkv[qkv_at(d, b, j, 2, h, e)];
    }
  return out;
}

std::vector<double> ref_attention_backward(const AttnDims& d, const std::vector<double>& qkv,
                                           const std::vector<double>& dout, double scale) {
  std::vector<double> g(qkv.size(), 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h) {
      const std::vector<double> p = probs(d, qkv, b, h, scale, nullptr);
      for (int64_t i = 0; i < d.t; ++i) {
        std::vector<double> dp(static_cast<size_t>(i + 1));
        double rowsum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t e = 0; e < d.hd; ++e) {
            s += dout[out_at(d, b, i, h, e)] * qkv[qkv_at(d, b, j, 2, h, e)];
            g[qkv_at(d, b, j, 2, h, e)] += p[i * d.t + j] * dout[out_at(d, b, i, h, e)];  // dV
          }
          dp[j] = s;
          rowsum += s * p[i * d.t + j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[i * d.t + j] * (dp[j] - rowsum) * scale;
          for (int64_t e = 0; e < d.hd; ++e) {
            g[qkv_at(d, b, i, 0, h, e)] += ds * qkv[qkv_at(d, b, j, 1, h, e)];  // dQ
            g[qkv_at(d, b, j, 1, h, e)] += ds * qkv[qkv_at(d, b, i, 0, h, e)];  // dK
          }
        }
      }
    }
  return g;
}

struct AttnResult {
  Tensor out, lse, dqkv;
};

// The path a CUDA attention call must take: cuDNN when the build has it and it is
// not forced off (cuda_attention_backend() == "cudnn"), the dtype is 16-bit, every
// pointer is 16-byte aligned (inputs always are here, outputs in the aligned pass;
// K and V sit at +C and +2C, aligned when HD % 8 == 0) and the head dim is one
// cuDNN takes (HD % 8 == 0, HD <= 128). Otherwise the fallback. Under the simulated
// device (no cuDNN) this is always the fallback; a GPU session checks the cuDNN half.
std::string attention_path(const std::string& op, DType dt, const AttnDims& d) {
  // cuDNN 9's SDPA backward refuses s_q = s_kv = 1 (seen on an H200): T = 1 backward is the fallback.
  const bool cudnn = cuda_attention_backend() == "cudnn" && dt != DType::F32 && outputs_aligned() && d.hd % 8 == 0 &&
                     d.hd <= 128 && !(op == "attention_backward" && d.t == 1);
  return op + (cudnn ? ".cudnn" : ".fallback");
}

AttnResult run(Device dev, DType dt, const AttnDims& d, double scale, bool fd, uint64_t seed, const std::string& tag = "") {
  Rng rng(seed);
  const Input qkv = rand_input(rng, qkv_shape(d), dt, dev, -1.5, 1.5);
  const Input dout = rand_input(rng, out_shape(d), dt, dev, -1, 1);
  Out out = make_out(out_shape(d), dt, dev), lse = make_out({d.b, d.nh, d.t}, DType::F32, dev);
  const PathProbe fwd_path;
  attention_forward(qkv.t, out.t, lse.t, static_cast<float>(scale));
  std::vector<double> lref;
  const std::vector<double> oref = ref_attention(d, qkv.v, scale, &lref);
  const std::string name = case_name(dev, dt, str("attention ", dims_str(d), " scale=", scale, tag));
  check_path(dev, fwd_path, attention_path("attention_forward", dt, d), name + " forward");
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  Out dqkv = make_out(qkv_shape(d), dt, dev);
  const PathProbe bwd_path;
  attention_backward(dout.t, qkv.t, out.t, lse.t, dqkv.t, static_cast<float>(scale));
  check_path(dev, bwd_path, attention_path("attention_backward", dt, d), name + " backward");
  const std::vector<double> gref =
      fd ? fd_grad(qkv.v, [&](const std::vector<double>& x) { return ref_attention(d, x, scale); }, dout.v)
         : ref_attention_backward(d, qkv.v, dout.v, scale);
  check_out(name + " dqkv", dqkv, gref, tol(dt, Kind::Attention));
  return {out.t, lse.t, dqkv.t};
}

}  // namespace

TEST_CASE("attention vs float64 reference and finite differences: every dtype") {
  uint64_t seed = 4000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {1, 1, 1, 8}, 1 / std::sqrt(8.0), true, ++seed);
      run(dev, dt, {2, 7, 2, 8}, 1 / std::sqrt(8.0), true, ++seed);
      run(dev, dt, {1, 13, 3, 16}, 1 / std::sqrt(16.0), true, ++seed);
      run(dev, dt, {1, 37, 1, 8}, 0.3, true, ++seed);
      if (dev.is_cpu()) run(dev, dt, {1, 5, 2, 3}, 0.7, true, ++seed);  // head dims cuDNN does not take
    }
}

TEST_CASE("attention: moderately large (closed-form f64 backward)") {
  uint64_t seed = 4100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) run(dev, dt, {2, 127, 4, 64}, 0.125, false, ++seed);
}

TEST_CASE("attention on CUDA: cuDNN and the forced cuBLAS fallback agree") {
  if (!cuda_available()) return;  // the file's SKIPPED line says why
  set_placement(Placement::Aligned);  // cuDNN needs 16-byte aligned outputs; run() asserts the path each took
  cuda_attention_force_fallback(false);
  if (cuda_attention_backend() != "cudnn")
    MESSAGE("cuDNN is not available (" << cuda_attention_backend()
                                       << "): this compares the fallback with itself; a GPU session with cuDNN checks it");
  uint64_t seed = 4200;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (AttnDims d : {AttnDims{2, 37, 2, 64}, AttnDims{1, 128, 4, 128}, AttnDims{3, 7, 1, 32}}) {
      ++seed;
      cuda_attention_force_fallback(false);
      const std::string first = cuda_attention_backend();
      const AttnResult a = run(Device::cuda(0), dt, d, 1 / std::sqrt(double(d.hd)), false, seed, " [" + first + "]");
      cuda_attention_force_fallback(true);
      CHECK(cuda_attention_backend() == "cublas");
      const AttnResult b = run(Device::cuda(0), dt, d, 1 / std::sqrt(double(d.hd)), false, seed, " [cublas]");
      cuda_attention_force_fallback(false);
      MESSAGE("attention backend without forcing: " << first);
      const std::string name = case_name(Device::cuda(0), dt, str("attention ", dims_str(d), " cudnn vs cublas"));
      check_close(name + " out", a.out, values(b.out), tol(dt, Kind::Attention));
      check_close(name + " dqkv", a.dqkv, values(b.dqkv), tol(dt, Kind::Attention));
    }
}

TEST_CASE("grouped-query attention vs float64 reference and finite differences: every dtype") {
  uint64_t seed = 4300;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {2, 7, 4, 8, 2}, 1 / std::sqrt(8.0), true, ++seed);
      run(dev, dt, {1, 13, 6, 16, 3}, 1 / std::sqrt(16.0), true, ++seed);
      run(dev, dt, {1, 9, 4, 8, 1}, 0.4, true, ++seed);    // multi-query (G = 1)
      run(dev, dt, {2, 6, 3, 8, 3}, 0.35, true, ++seed);   // G = NH in the 4-D form: MHA
      if (dev.is_cpu()) run(dev, dt, {1, 5, 2, 3, 1}, 0.7, true, ++seed);
    }
}

TEST_CASE("grouped-query attention: moderately large (closed-form f64 backward)") {
  uint64_t seed = 4400;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) run(dev, dt, {2, 127, 8, 64, 2}, 0.125, false, ++seed);
}

TEST_CASE("attention: the 4-D form with G = NH is the 5-D MHA form") {
  for (Device dev : test_devices()) {
    const AttnDims m{2, 11, 3, 8}, g{2, 11, 3, 8, 3};
    const AttnResult a = run(dev, DType::F32, m, 0.3, false, 4500), b = run(dev, DType::F32, g, 0.3, false, 4500);
    const std::string name = case_name(dev, DType::F32, "attention 5-D vs 4-D G=NH");
    check_close(name + " out", a.out, values(b.out), Tol{1e-6, 1e-7, 0});
    check_close(name + " lse", a.lse, values(b.lse), Tol{1e-6, 1e-7, 0});
    check_close(name + " dqkv", a.dqkv, values(b.dqkv), Tol{1e-6, 1e-7, 0});
  }
}

TEST_CASE("grouped-query attention on CUDA: cuDNN and the forced cuBLAS fallback agree") {
  if (!cuda_available()) return;  // the file's SKIPPED line says why
  uint64_t seed = 4600;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (AttnDims d : {AttnDims{2, 37, 4, 64, 2}, AttnDims{1, 128, 8, 128, 1}, AttnDims{3, 7, 6, 32, 3}}) {
      ++seed;
      cuda_attention_force_fallback(false);
      const std::string first = cuda_attention_backend();
      const AttnResult a = run(Device::cuda(0), dt, d, 1 / std::sqrt(double(d.hd)), false, seed, " [" + first + "]");
      cuda_attention_force_fallback(true);
      const AttnResult b = run(Device::cuda(0), dt, d, 1 / std::sqrt(double(d.hd)), false, seed, " [cublas]");
      cuda_attention_force_fallback(false);
      const std::string name = case_name(Device::cuda(0), dt, str("attention ", dims_str(d), " cudnn vs cublas"));
      check_close(name + " out", a.out, values(b.out), tol(dt, Kind::Attention));
      check_close(name + " dqkv", a.dqkv, values(b.dqkv), tol(dt, Kind::Attention));
    }
}

TEST_CASE("grouped-query attention: PyTorch / HF reference (tests/reference/llama_ops_ref.py)") {
  std::ifstream f(std::string(MPITRON_SOURCE_DIR) + "/tests/tensor/ref/llama_ops_ref.json");
  REQUIRE_MESSAGE(f.good(), "tests/tensor/ref/llama_ops_ref.json is missing: run tests/reference/llama_ops_ref.py");
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& c : j.at("attention")) {
    const int64_t b = c.at("B"), t = c.at("T"), nh = c.at("NH"), g = c.at("G"), hd = c.at("HD");
    const float scale = c.at("scale").get<float>();
    const std::vector<double> qkv = c.at("qkv"), want = c.at("out"), lse_ref = c.at("lse"), dout = c.at("dout"),
                              dqkv_ref = c.at("dqkv");
    const bool rope = c.contains("rope");
    RopeArgs ra;
    if (rope) {
      ra.base = c.at("rope").at("base");
      ra.percent = c.at("rope").at("percent");
    }
    for (Device dev : test_devices()) {
      // As HF's LlamaAttention: q and k rotated (in place), then attention over the groups.
      const Tensor x = make_tensor(qkv, {b, t, nh + 2 * g, hd}, DType::F32, dev);
      if (rope) rope_forward(x, x, nh + g, ra);
      const Tensor out = Tensor::empty({b, t, nh, hd}, DType::F32, dev), lse = Tensor::empty({b, nh, t}, DType::F32, dev);
      attention_forward(x, out, lse, scale);
      // torch ran in float64 on the same f32 inputs; HF's RoPE angles are f32 (a few 1e-6).
      const Tol tl{2e-5, rope ? 5e-6 : 1e-6, 2e-5};
      const std::string name = case_name(dev, DType::F32, str("attention vs torch ", c.at("name").get<std::string>()));
      check_close(name + " out", out, want, tl);
      check_close(name + " lse", lse, lse_ref, tl);
      const Tensor dqkv = Tensor::empty(x.shape(), DType::F32, dev);
      attention_backward(make_tensor(dout, {b, t, nh, hd}, DType::F32, dev), x, out, lse, dqkv, scale);
      if (rope) rope_backward(dqkv, dqkv, nh + g, ra);
      check_close(name + " dqkv (torch autograd)", dqkv, dqkv_ref, tl);
    }
  }
}
#ifdef MPITRON_WITH_CUDA
TEST_CASE("attention: cuDNN is eligible only when every pointer, lse included, is 16-byte aligned (host check)") {
  // Addresses only: CPU tensors stand in for device ones. B=1, T=4, NH=2, HD=8 bf16: C·2 = 32 bytes.
  const AttnDims d{1, 4, 2, 8};
  auto at = [](const Shape& shape, DType dt, int64_t offset) {  // a view at `offset` elements into a fresh buffer
    return Tensor::zeros({shape_numel(shape) + 128}, dt).flat_range(offset, shape_numel(shape)).view(shape);
  };
  const Tensor qkv = at(qkv_shape(d), DType::BF16, 0), out = at(out_shape(d), DType::BF16, 0);
  const Tensor lse = at({d.b, d.nh, d.t}, DType::F32, 0), dout = at(out_shape(d), DType::BF16, 0);
  const Tensor dqkv = at(qkv_shape(d), DType::BF16, 0);
  CHECK(cuda::attention_cudnn_aligned(qkv, out, lse, Tensor(), Tensor()));
  CHECK(cuda::attention_cudnn_aligned(qkv, out, lse, dout, dqkv));
  const Tensor lse_off = at({d.b, d.nh, d.t}, DType::F32, 1);  // 4-byte aligned statistics
  CHECK_FALSE(cuda::attention_cudnn_aligned(qkv, out, lse_off, Tensor(), Tensor()));
  CHECK_FALSE(cuda::attention_cudnn_aligned(qkv, out, lse_off, dout, dqkv));
  CHECK_FALSE(cuda::attention_cudnn_aligned(at(qkv_shape(d), DType::BF16, 4), out, lse, Tensor(), Tensor()));
  CHECK_FALSE(cuda::attention_cudnn_aligned(qkv, at(out_shape(d), DType::BF16, 67), lse, Tensor(), Tensor()));
  CHECK_FALSE(cuda::attention_cudnn_aligned(qkv, out, lse, at(out_shape(d), DType::BF16, 1), dqkv));
  CHECK_FALSE(cuda::attention_cudnn_aligned(qkv, out, lse, dout, at(qkv_shape(d), DType::BF16, 2)));
  // HD = 4: K starts C·2 = 16 bytes in (aligned) but with NH = 1 at 8 bytes: not aligned.
  const AttnDims odd{1, 4, 1, 4};
  CHECK_FALSE(cuda::attention_cudnn_aligned(at(qkv_shape(odd), DType::BF16, 0), at(out_shape(odd), DType::BF16, 0),
                                            at({1, 1, 4}, DType::F32, 0), Tensor(), Tensor()));
}
#endif

TEST_CASE("attention: invalid arguments throw naming the op") {
  const Tensor qkv = Tensor::zeros({1, 4, 3, 2, 8}, DType::F32), out = Tensor::zeros({1, 4, 2, 8}, DType::F32);
  const Tensor lse = Tensor::zeros({1, 2, 4}, DType::F32);
  check_throws_naming("attention_forward", [&] { attention_forward(Tensor::zeros({1, 4, 2, 2, 8}, DType::F32), out, lse, 1); },
                      "qkv not (B,T,3,NH,HD)");
  check_throws_naming("attention_forward", [&] { attention_forward(qkv, Tensor::zeros({1, 4, 2, 7}, DType::F32), lse, 1); },
                      "out shape");
  check_throws_naming("attention_forward", [&] { attention_forward(qkv, out, Tensor::zeros({1, 2, 4}, DType::BF16), 1); },
                      "lse dtype");
  check_throws_naming("attention_forward", [&] { attention_forward(qkv, Tensor::zeros({1, 4, 2, 8}, DType::BF16), lse, 1); },
                      "out dtype");
  check_throws_naming("attention_backward", [&] {
    attention_backward(out, qkv, out, lse, Tensor::zeros({1, 4, 3, 2, 7}, DType::F32), 1);
  }, "dqkv shape");
  // GQA: qkv (B, T, NH + 2G, HD) with NH = out's heads.
  const Tensor out3 = Tensor::zeros({1, 4, 3, 8}, DType::F32), lse3 = Tensor::zeros({1, 3, 4}, DType::F32);
  check_throws_naming("attention_forward", [&] { attention_forward(Tensor::zeros({1, 4, 6, 8}, DType::F32), out3, lse3, 1); },
                      "odd kv head count");
  check_throws_naming("attention_forward", [&] { attention_forward(Tensor::zeros({1, 4, 7, 8}, DType::F32), out3, lse3, 1); },
                      "NH not divisible by G");
  check_throws_naming("attention_forward", [&] { attention_forward(Tensor::zeros({1, 4, 3, 8}, DType::F32), out3, lse3, 1); },
                      "no kv heads");
  check_throws_naming("attention_forward", [&] { attention_forward(Tensor::zeros({1, 4, 5, 7}, DType::F32), out3, lse3, 1); },
                      "head dim differs");
  check_throws_naming("attention_forward", [&] { attention_forward(Tensor::zeros({1, 5, 5, 8}, DType::F32), out3, lse3, 1); },
                      "T differs");
  check_throws_naming("attention_forward", [&] {
    attention_forward(Tensor::zeros({1, 4, 5, 8}, DType::F32), out3, Tensor::zeros({1, 1, 4}, DType::F32), 1);
  }, "lse has G heads, not NH");
  check_throws_naming("attention_backward", [&] {
    const Tensor q = Tensor::zeros({1, 4, 5, 8}, DType::F32);
    attention_backward(out3, q, out3, lse3, Tensor::zeros({1, 4, 3, 3, 8}, DType::F32), 1);
  }, "dqkv in the 5-D form for a GQA qkv");
}
