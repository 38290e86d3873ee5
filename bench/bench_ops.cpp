// bench/bench_ops.cpp — per-op throughput against ceilings measured in the same run.
//
//   bench_ops [--json FILE] [--device cpu|cuda|all] [--min-time SECONDS] [--filter SUBSTRING]
//
// For every op family on the CPU (and on CUDA when a device is present) prints:
//   op, shape, dtype, time per call, GB/s or TFLOP/s, and the fraction of the
//   ceiling measured in this run:
//   - bandwidth ceiling: a large contiguous copy (memcpy on the CPU, a
//     device-to-device Tensor copy on CUDA), counting bytes read + written;
//   - compute ceiling: cblas_sgemm called directly on a large square product
//     (CPU); the library's bf16 gemm (cuBLASLt) on a large square product (CUDA).
// Ceilings are measured before and after the op rows and the larger is used
// (the machine may be shared). Memory-bound ops report GB/s of their minimum traffic (each input read once,
// each output written once); gemm and attention report TFLOP/s (attention is
// causal: half the dense 4·T²·HD FLOPs per head forward, 2.5x that backward).
// A final block compares our CPU gemm with cblas_sgemm called directly on the
// same shapes (should reach >= 80%). --json writes the same rows.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "tensor/ops.h"

using namespace mpitron;

namespace {

struct Options {
  std::string json, device = "all", filter;
  double min_time = 0.15;  // seconds of timed calls per row (after one warm-up call)
};

struct Row {
  std::string op, shape, dtype, device;
  double ms = 0, gbps = 0, tflops = 0, fraction = 0;
  std::string ceiling;  // "bw" or "flops"
};

// Median time per call in ms; synchronises the device around each call.
double time_ms(Device dev, const std::function<void()>& fn, double min_time) {
  fn();  // warm-up (allocations, BLAS thread start, cuDNN plan)
  device_synchronize();
  std::vector<double> ts;
  double total = 0;
  while ((total < min_time * 1e3 && ts.size() < 200) || ts.size() < 3) {
    if (dev.is_cuda()) {
      Event a, b;
      a.record();
      fn();
      b.record();
      b.synchronize();
      ts.push_back(Event::elapsed_ms(a, b));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    total += ts.back();
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

Tensor randn(const Shape& s, DType dt, Device dev, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& f : v) {  // xorshift: fast and good enough for benchmark inputs
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = scale * (static_cast<float>(x >> 40) / 16777216.0f * 2.0f - 1.0f);
  }
  return Tensor::from_vector(v, s, dt).to(dev);
}

size_t bytes(const Shape& s, DType dt) { return static_cast<size_t>(shape_numel(s)) * dtype_size(dt); }

class Bench {
 public:
  Bench(Options o) : opt_(std::move(o)) {}

  void ceilings(Device dev) {
    if (dev.is_cpu()) {
      // Bandwidth: 2 x 128 MiB memcpy split across the OpenMP threads.
      const size_t n = size_t(128) << 20;
      std::vector<char> src(n, 1), dst(n, 0);
      const double ms = time_ms(dev, [&] {
#pragma omp parallel
        {
          const int t = omp_get_thread_num(), nt = omp_get_num_threads();
          const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
          std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
        }
      }, opt_.min_time);
      bw_ = std::max(bw_, 2.0 * n / (ms * 1e6));
      // Compute: cblas_sgemm 2048^3.
      const int m = 2048;
      std::vector<float> a(size_t(m) * m, 0.5f), b(size_t(m) * m, 0.25f), c(size_t(m) * m);
      const double gms = time_ms(dev, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, a.data(), m, b.data(), m, 0.0f, c.data(), m);
      }, opt_.min_time);
      flops_ = std::max(flops_, 2.0 * m * m * m / (gms * 1e9));  // TFLOP/s
      add_raw(dev, "ceiling: memcpy", "2x128MiB", "u8", ms, 2.0 * n / (ms * 1e6), 0, "bw");
      add_raw(dev, "ceiling: cblas_sgemm", "2048x2048x2048", "f32", gms, 0, 2.0 * m * m * m / (gms * 1e9), "flops");
    } else {
      const int64_t n = int64_t(512) << 20;
      const Tensor a = Tensor::zeros({n / 4}, DType::F32, dev), b = Tensor::empty({n / 4}, DType::F32, dev);
      const double ms = time_ms(dev, [&] { b.copy_from(a); }, opt_.min_time);
      bw_ = std::max(bw_, 2.0 * n / (ms * 1e6));
      const int64_t m = 8192;
      const Tensor x = randn({m, m}, DType::BF16, dev, 1), y = randn({m, m}, DType::BF16, dev, 2);
      const Tensor z = Tensor::empty({m, m}, DType::BF16, dev);
      const double gms = time_ms(dev, [&] { gemm(x, y, z); }, opt_.min_time);
      flops_ = std::max(flops_, 2.0 * m * m * m / (gms * 1e9));
      add_raw(dev, "ceiling: device copy", "2x512MiB", "u8", ms, 2.0 * n / (ms * 1e6), 0, "bw");
      add_raw(dev, "ceiling: gemm bf16", "8192x8192x8192", "bf16", gms, 0, 2.0 * m * m * m / (gms * 1e9), "flops");
    }
  }

  // A memory-bound row: `traffic` bytes per call.
  void mem(Device dev, const std::string& op, const std::string& shape, DType dt, size_t traffic,
           const std::function<void()>& fn) {
    if (skip(op)) return;
    const double ms = time_ms(dev, fn, opt_.min_time);
    add_raw(dev, op, shape, dtype_name(dt), ms, traffic / (ms * 1e6), 0, "bw");
  }
  // A compute-bound row: `flop` per call.
  void compute(Device dev, const std::string& op, const std::string& shape, DType dt, double flop,
               const std::function<void()>& fn) {
    if (skip(op)) return;
    const double ms = time_ms(dev, fn, opt_.min_time);
    add_raw(dev, op, shape, dtype_name(dt), ms, 0, flop / (ms * 1e9), "flops");
  }

  void ops(Device dev) {
    // GPT-2 small-like sizes on the CPU, GPT-2 medium-like on CUDA.
    const bool gpu = dev.is_cuda();
    const int64_t tok = gpu ? 8192 : 1024, c = gpu ? 1024 : 768, v = gpu ? 50304 : 50304;
    const int64_t xent_rows = gpu ? 8192 : 128, bsz = gpu ? 8 : 1, t = gpu ? 1024 : 256, nh = gpu ? 16 : 12, hd = 64;
    const std::vector<DType> dts = gpu ? std::vector<DType>{DType::BF16, DType::F32} : std::vector<DType>{DType::F32, DType::BF16};
    for (DType dt : dts) {
      const bool lowp = dt != DType::F32;
      // gemm: the linear layers of an MLP, y = x·Wᵀ + b.
      for (auto [m, n, k] : {std::array<int64_t, 3>{tok, 4 * c, c}, std::array<int64_t, 3>{tok, c, 4 * c}}) {
        const Tensor x = randn({m, k}, dt, dev, 1), w = randn({n, k}, dt, dev, 2), bias = randn({n}, dt, dev, 3);
        const Tensor y = Tensor::empty({m, n}, dt, dev);
        GemmArgs g;
        g.trans_b = true;
        const std::string sh = str(m, "x", n, "x", k);
        compute(dev, "gemm fwd x·Wᵀ+b", sh, dt, 2.0 * m * n * k, [&] { gemm(x, w, y, g, bias); });
        const Tensor dx = Tensor::empty({m, k}, dt, dev), dw = Tensor::zeros({n, k}, DType::F32, dev),
                     db = Tensor::zeros({n}, DType::F32, dev);
        compute(dev, "gemm bwd (dx, dW, db)", sh, dt, 4.0 * m * n * k, [&] { gemm_backward(y, x, w, dx, dw, db, g); });
      }
      {
        const Tensor x = randn({tok, c}, dt, dev, 4), w = randn({c}, dt, dev, 5), b = randn({c}, dt, dev, 6);
        const Tensor y = Tensor::empty({tok, c}, dt, dev), mean = Tensor::empty({tok}, DType::F32, dev),
                     rstd = Tensor::empty({tok}, DType::F32, dev);
        const std::string sh = str(tok, "x", c);
        mem(dev, "layernorm fwd", sh, dt, 2 * bytes({tok, c}, dt), [&] { layernorm_forward(x, w, b, y, mean, rstd); });
        const Tensor dx = Tensor::empty({tok, c}, dt, dev), dw = Tensor::zeros({c}, DType::F32, dev),
                     dbb = Tensor::zeros({c}, DType::F32, dev);
        mem(dev, "layernorm bwd", sh, dt, 3 * bytes({tok, c}, dt),
            [&] { layernorm_backward(y, x, w, mean, rstd, dx, dw, dbb); });
      }
      {  // Llama: RMSNorm, SwiGLU over fc1's 2·F outputs (F = 8C/3 rounded to 64), RoPE on q and k in place
        const Tensor x = randn({tok, c}, dt, dev, 14), w = randn({c}, dt, dev, 15);
        const Tensor y = Tensor::empty({tok, c}, dt, dev), rstd = Tensor::empty({tok}, DType::F32, dev);
        const std::string sh = str(tok, "x", c);
        mem(dev, "rmsnorm fwd", sh, dt, 2 * bytes({tok, c}, dt), [&] { rmsnorm_forward(x, w, y, rstd); });
        const Tensor dx = Tensor::empty({tok, c}, dt, dev), dw = Tensor::zeros({c}, DType::F32, dev);
        mem(dev, "rmsnorm bwd", sh, dt, 3 * bytes({tok, c}, dt), [&] { rmsnorm_backward(y, x, w, rstd, dx, dw); });
        const int64_t f = (8 * c / 3 + 63) / 64 * 64;
        const Tensor h = randn({tok, 2 * f}, dt, dev, 16, 3), a = Tensor::empty({tok, f}, dt, dev);
        const Tensor dh = Tensor::empty({tok, 2 * f}, dt, dev);
        const std::string shf = str(tok, "x2·", f);
        mem(dev, "swiglu fwd", shf, dt, 3 * bytes({tok, f}, dt), [&] { swiglu_forward(h, a); });
        mem(dev, "swiglu bwd", shf, dt, 5 * bytes({tok, f}, dt), [&] { swiglu_backward(a, h, dh); });
        const int64_t g = nh / 4;  // GQA with 4 query heads per kv group
        const Shape q4{bsz, t, nh + 2 * g, hd};
        const Tensor qkv = randn(q4, dt, dev, 17);
        const std::string shr = str("B", bsz, " T", t, " NH", nh, " G", g, " HD", hd);
        const size_t rot = bytes({bsz, t, nh + g, hd}, dt);
        RopeArgs ra;
        mem(dev, "rope fwd (q,k in place)", shr, dt, 2 * rot, [&] { rope_forward(qkv, qkv, nh + g, ra); });
        mem(dev, "rope bwd (in place)", shr, dt, 2 * rot, [&] { rope_backward(qkv, qkv, nh + g, ra); });
        RopeArgs yarn = ra;  // Qwen2.5-style yarn x4: per-pair frequencies and the attention factor in the kernel
        yarn.scaling.type = RopeScalingType::Yarn;
        yarn.scaling.factor = 4;
        yarn.scaling.original_max_position_embeddings = 32768;
        mem(dev, "rope yarn fwd (q,k in place)", shr, dt, 2 * rot, [&] { rope_forward(qkv, qkv, nh + g, yarn); });
        // QK-norm (Qwen3): the q heads of the packed qkv (a strided view) normalised per head, both phases
        const Tensor qh = qkv.view({bsz * t, nh + 2 * g, hd}).slice(1, 0, nh), qw = randn({hd}, dt, dev, 20);
        const Tensor qn = Tensor::empty({bsz * t, nh, hd}, dt, dev), dq = Tensor::empty({bsz * t, nh, hd}, dt, dev);
        const Tensor ss = Tensor::empty({bsz * t, nh}, DType::F32, dev), rs = Tensor::empty({bsz * t, nh}, DType::F32, dev),
                     dot = Tensor::empty({bsz * t, nh}, DType::F32, dev), qdw = Tensor::zeros({hd}, DType::F32, dev);
        const size_t qb = bytes({bsz, t, nh, hd}, dt);
        mem(dev, "head_norm fwd (q per head)", shr, dt, 3 * qb, [&] {
          head_norm_sumsq(qh, ss);
          head_norm_forward(qh, ss, hd, 1e-6f, qw, qn, rs);
        });
        mem(dev, "head_norm bwd (q per head)", shr, dt, 7 * qb, [&] {
          head_norm_backward_dot(qn, qh, qw, rs, dot);
          head_norm_backward(qn, qh, qw, rs, dot, hd, dq, qdw);
        });
      }
      {
        const Shape s{tok, 4 * c};
        const Tensor x = randn(s, dt, dev, 7, 3), y = Tensor::empty(s, dt, dev), dx = Tensor::empty(s, dt, dev);
        const std::string sh = str(tok, "x", 4 * c);
        mem(dev, "gelu fwd", sh, dt, 2 * bytes(s, dt), [&] { gelu_forward(x, y); });
        mem(dev, "gelu bwd", sh, dt, 3 * bytes(s, dt), [&] { gelu_backward(y, x, dx); });
        // The exact erf GELU (BERT, --exact-gelu) beside the tanh form.
        mem(dev, "gelu erf fwd", sh, dt, 2 * bytes(s, dt), [&] { gelu_erf_forward(x, y); });
        mem(dev, "gelu erf bwd", sh, dt, 3 * bytes(s, dt), [&] { gelu_erf_backward(y, x, dx); });
        mem(dev, "dropout fwd p=0.1", sh, dt, 2 * bytes(s, dt), [&] { dropout_forward(x, y, 0.1f, 1, 0); });
        mem(dev, "add (residual)", sh, dt, 3 * bytes(s, dt), [&] { add_forward(x, y, dx); });
        const Tensor o = Tensor::empty(s, lowp ? DType::F32 : DType::BF16, dev);
        mem(dev, str("cast ", dtype_name(dt), "->", dtype_name(o.dtype())), sh, dt, bytes(s, dt) + bytes(s, o.dtype()),
            [&] { cast(x, o); });
        const Tensor acc = Tensor::zeros({1}, DType::F32, dev);
        mem(dev, "sum_squares", sh, dt, bytes(s, dt), [&] { sum_squares(x, acc); });
        mem(dev, "softcap fwd (cap 30)", sh, dt, 2 * bytes(s, dt), [&] { softcap_forward(x, y, 30.0f); });
        mem(dev, "softcap bwd", sh, dt, 3 * bytes(s, dt), [&] { softcap_backward(x, y, dx, 30.0f); });
        // fp8 (issue 45): the amax pass and the saturating quantise-dequantise of an operand.
        mem(dev, "fp8 amax", sh, dt, bytes(s, dt), [&] { fp8_amax(x, acc); });
        const Tensor scale = Tensor::from_vector({64.0f}, {1}).to(dev);
        mem(dev, "fp8 e4m3 quantize-dequantize", sh, dt, 2 * bytes(s, dt),
            [&] { fp8_quantize_dequantize(x, scale, Fp8Format::E4M3, y); });
      }
      {  // MoE token permutation (Mixtral-like top-2 of 8 experts): rows moved by expert and back
        const int64_t k = 2, E = 8;
        std::vector<int64_t> idx;
        for (int64_t n = 0; n < tok; ++n) idx.push_back(n % E), idx.push_back((n % E + 1 + (n / E) % (E - 1)) % E);
        const MoeRouting r = moe_routing(Tensor::from_ints(idx, {tok, k}, DType::I64), E);
        const Tensor dest = Tensor::from_ints(std::vector<int64_t>(r.dest.begin(), r.dest.end()), {tok * k}, DType::I32).to(dev);
        const Tensor x = randn({tok, c}, dt, dev, 18), rows = Tensor::empty({tok * k, c}, dt, dev);
        const Tensor probs = Tensor::from_vector(std::vector<float>(static_cast<size_t>(tok * k), 0.5f), {tok, k}).to(dev);
        const Tensor y = Tensor::empty({tok, c}, dt, dev), din = Tensor::empty({tok * k, c}, dt, dev),
                     dp = Tensor::empty({tok, k}, DType::F32, dev);
        const std::string sh = str(tok, "x", c, " top", k, "/", E);
        const size_t moved = bytes({tok * k, c}, dt);
        mem(dev, "moe permute", sh, dt, bytes({tok, c}, dt) + moved, [&] { moe_permute(x, dest, rows); });
        mem(dev, "moe unpermute", sh, dt, moved + bytes({tok, c}, dt), [&] { moe_unpermute(rows, dest, probs, y); });
        mem(dev, "moe unpermute bwd", sh, dt, 2 * moved + bytes({tok, c}, dt),
            [&] { moe_unpermute_backward(y, rows, dest, probs, din, dp); });
        if (!lowp) {  // the router's top-k (f32 scores; DeepSeek-like 64 experts, top 6)
          const Tensor scores = randn({tok, 64}, DType::F32, dev, 19), tv = Tensor::empty({tok, 6}, DType::F32, dev);
          const Tensor ti = Tensor::empty({tok, 6}, DType::I32, dev);
          mem(dev, "moe topk", str(tok, "x64 top6"), DType::F32, bytes({tok, 64}, DType::F32) + 2 * bytes({tok, 6}, DType::F32),
              [&] { moe_topk(scores, 6, tv, ti); });
          // The router's score path (tensor/moe_router.h, f32): DeepSeek-like 64 experts top 6 with an
          // expert bias, Mixtral-like 8 top 2; every forward output, the backward with both losses.
          for (const auto& [E, k] : {std::pair<int64_t, int64_t>{64, 6}, std::pair<int64_t, int64_t>{8, 2}}) {
            const int64_t n = 4096;
            const Tensor lg = randn({n, E}, DType::F32, dev, 20, 3), pr = Tensor::empty({n, k}, DType::F32, dev);
            const Tensor ix = Tensor::empty({n, k}, DType::I32, dev), aux = Tensor::empty({E}, DType::F32, dev);
            const Tensor lse = Tensor::empty({n}, DType::F32, dev), dl = Tensor::empty({n, E}, DType::F32, dev);
            const Tensor dpr = randn({n, k}, DType::F32, dev, 21), aw = randn({E}, DType::F32, dev, 22);
            MoeRouterArgs ra;
            ra.score = E == 64 ? MoeScore::Sigmoid : MoeScore::Softmax;
            ra.topk = k;
            if (E == 64) ra.expert_bias = randn({E}, DType::F32, dev, 23, 0.1f);
            const std::string shr = str(n, "x", E, " top", k, E == 64 ? " sigmoid+bias" : " softmax");
            const size_t row = bytes({n, E}, DType::F32), sel = bytes({n, k}, DType::F32);
            mem(dev, "moe router fwd", shr, DType::F32, row + 2 * sel + bytes({n}, DType::F32) + bytes({E}, DType::F32),
                [&] { moe_router_forward(lg, ra, pr, ix, aux, lse); });
            mem(dev, "moe router bwd", shr, DType::F32, 2 * row + 2 * sel + bytes({E}, DType::F32),
                [&] { moe_router_backward(dpr, lg, ix, ra, aw, 1e-3f, dl); });
          }
        }
      }
      {  // MoE experts' GEMMs (8 experts, top-2; uneven counts): y rows e = x rows e · w_eᵀ, w_e (F, C),
         // beside the same rows as one dense gemm (the ceiling a grouped gemm can reach)
        const int64_t E = 8, ntok = gpu ? 4096 : 512, C = 1024, F = 2816, R = 2 * ntok;
        const double share[E] = {0.18, 0.16, 0.14, 0.12, 0.12, 0.10, 0.10, 0.08};  // of the rows, sums to 1
        std::vector<int64_t> counts;
        int64_t used = 0;
        for (int64_t e = 0; e + 1 < E; ++e) used += counts.emplace_back(static_cast<int64_t>(R * share[e]));
        counts.push_back(R - used);
        const Tensor x = randn({R, C}, dt, dev, 20), dy = randn({R, F}, dt, dev, 21);
        const Tensor y = Tensor::empty({R, F}, dt, dev), dx = Tensor::empty({R, C}, dt, dev);
        std::vector<Tensor> w, dw, dw32;
        for (int64_t e = 0; e < E; ++e) {
          w.push_back(randn({F, C}, dt, dev, 22 + static_cast<uint64_t>(e), 0.05f));
          dw.push_back(Tensor::zeros({F, C}, dt, dev));
          if (lowp) dw32.push_back(Tensor::zeros({F, C}, DType::F32, dev));
        }
        const std::string sh = str(ntok, "tok top2/8 C", C, " F", F);
        const double f = 2.0 * R * F * C;
        compute(dev, "grouped gemm fwd", sh, dt, f, [&] { grouped_gemm(x, w, counts, y); });
        compute(dev, "grouped gemm bwd (dx, dW)", sh, dt, 2 * f,
                [&] { grouped_gemm_backward(dy, x, w, counts, dx, dw, {}); });
        if (lowp)  // f32 weight gradients of 16-bit weights: dW a gemm per expert (no f32 C in the grouped API)
          compute(dev, "grouped gemm bwd (dx, dW f32)", sh, dt, 2 * f,
                  [&] { grouped_gemm_backward(dy, x, w, counts, dx, dw32, {}); });
        const Tensor wd = randn({F, C}, dt, dev, 30, 0.05f), dwd = Tensor::zeros({F, C}, dt, dev);
        GemmArgs g;
        g.trans_b = true;
        compute(dev, "dense gemm fwd (same rows)", sh, dt, f, [&] { gemm(x, wd, y, g); });
        compute(dev, "dense gemm bwd (same rows, dx, dW)", sh, dt, 2 * f,
                [&] { gemm_backward(dy, x, wd, dx, dwd, Tensor(), g); });
      }
      {
        const Shape s{bsz * nh * t, t};
        const Tensor x = randn(s, dt, dev, 8, 4), y = Tensor::empty(s, dt, dev), dx = Tensor::empty(s, dt, dev);
        const std::string sh = str(bsz * nh * t, "x", t);
        mem(dev, "softmax fwd", sh, dt, 2 * bytes(s, dt), [&] { softmax_forward(x, y); });
        mem(dev, "softmax bwd", sh, dt, 3 * bytes(s, dt), [&] { softmax_backward(y, y, dx); });
      }
      {
        const Tensor qkv = randn({bsz, t, 3, nh, hd}, dt, dev, 9), out = Tensor::empty({bsz, t, nh, hd}, dt, dev);
        const Tensor lse = Tensor::empty({bsz, nh, t}, DType::F32, dev), dqkv = Tensor::empty({bsz, t, 3, nh, hd}, dt, dev);
        const double f = 2.0 * bsz * nh * double(t) * t * hd;  // causal: half of 4·T²·HD
        const std::string sh = str("B", bsz, " T", t, " NH", nh, " HD", hd);
        compute(dev, "attention fwd", sh, dt, f, [&] { attention_forward(qkv, out, lse, 0.125f); });
        compute(dev, "attention bwd", sh, dt, 2.5 * f, [&] { attention_backward(out, qkv, out, lse, dqkv, 0.125f); });
      }
      {  // BERT: bidirectional with a key padding mask, lengths 7T/8, 3T/4, 5T/8, T/2, … (useful FLOPs)
        const Tensor qkv = randn({bsz, t, 3, nh, hd}, dt, dev, 19), out = Tensor::empty({bsz, t, nh, hd}, dt, dev);
        const Tensor lse = Tensor::empty({bsz, nh, t}, DType::F32, dev), dqkv = Tensor::empty(qkv.shape(), dt, dev);
        std::vector<int64_t> lens(static_cast<size_t>(bsz));
        int64_t keys = 0;
        for (int64_t b = 0; b < bsz; ++b) keys += lens[static_cast<size_t>(b)] = std::max<int64_t>(1, t - (b % 4 + 1) * t / 8);
        const AttentionMask mask{false, Tensor::from_ints(lens, {bsz}, DType::I32).to(dev)};
        const double f = 4.0 * nh * double(t) * double(keys) * hd;  // 4·T·len·HD per (sample, head)
        const std::string sh = str("B", bsz, " T", t, " NH", nh, " HD", hd, " pad");
        compute(dev, "attention bidir+pad fwd", sh, dt, f, [&] { attention_forward(qkv, out, lse, 0.125f, {}, mask); });
        compute(dev, "attention bidir+pad bwd", sh, dt, 2.5 * f,
                [&] { attention_backward(out, qkv, out, lse, dqkv, 0.125f, {}, mask); });
      }
      {  // Mistral: causal within a sliding window of W = T/8 keys (useful FLOPs: min(i, W) + 1/2 keys per query)
        const int64_t w = std::max<int64_t>(1, t / 8);
        const Tensor qkv = randn({bsz, t, 3, nh, hd}, dt, dev, 29), out = Tensor::empty({bsz, t, nh, hd}, dt, dev);
        const Tensor lse = Tensor::empty({bsz, nh, t}, DType::F32, dev), dqkv = Tensor::empty(qkv.shape(), dt, dev);
        double keys = 0;
        for (int64_t i = 0; i < t; ++i) keys += static_cast<double>(std::min(i, w)) + 0.5;
        const double f = 4.0 * bsz * nh * double(t) * (keys / double(t)) * hd;
        AttentionMask mask;
        mask.window = w;
        const std::string sh = str("B", bsz, " T", t, " NH", nh, " HD", hd, " W", w);
        compute(dev, "attention window fwd", sh, dt, f, [&] { attention_forward(qkv, out, lse, 0.125f, {}, mask); });
        compute(dev, "attention window bwd", sh, dt, 2.5 * f,
                [&] { attention_backward(out, qkv, out, lse, dqkv, 0.125f, {}, mask); });
      }
      {  // grouped-query attention: the same FLOPs per query head, G = NH/4 kv heads
        const int64_t g = nh / 4;
        const Tensor qkv = randn({bsz, t, nh + 2 * g, hd}, dt, dev, 18), out = Tensor::empty({bsz, t, nh, hd}, dt, dev);
        const Tensor lse = Tensor::empty({bsz, nh, t}, DType::F32, dev), dqkv = Tensor::empty(qkv.shape(), dt, dev);
        const double f = 2.0 * bsz * nh * double(t) * t * hd;
        const std::string sh = str("B", bsz, " T", t, " NH", nh, " G", g, " HD", hd);
        compute(dev, "attention GQA fwd", sh, dt, f, [&] { attention_forward(qkv, out, lse, 0.125f); });
        compute(dev, "attention GQA bwd", sh, dt, 2.5 * f, [&] { attention_backward(out, qkv, out, lse, dqkv, 0.125f); });
        // Gemma 2's attention logit soft-capping (the CUDA fallback always: cuDNN has no soft-cap)
        const AttentionMask capped{true, Tensor(), 0, 50.0f};
        compute(dev, "attention GQA softcap fwd", sh, dt, f,
                [&] { attention_forward(qkv, out, lse, 0.125f, {}, capped); });
        compute(dev, "attention GQA softcap bwd", sh, dt, 2.5 * f,
                [&] { attention_backward(out, qkv, out, lse, dqkv, 0.125f, {}, capped); });
      }
      {  // DeepSeek-V3's MLA core: q/k heads 192 wide (nope 128 + rope 64), v/out heads 128, NH = 16 on
         // the GPU; the block form (attention_block.h) over the whole causal sequence, as the MLA layer
         // calls it. Causal FLOPs: half of 2·T²·(Dqk + Dv) per head forward, 2.5x that backward.
        const int64_t dqk = 192, dv = 128, nhm = gpu ? 16 : 4;
        const Tensor q = randn({bsz, t, nhm, dqk}, dt, dev, 31), k = randn({bsz, t, nhm, dqk}, dt, dev, 32),
                     v = randn({bsz, t, nhm, dv}, dt, dev, 33);
        const Tensor out = Tensor::empty({bsz, t, nhm, dv}, dt, dev), lse = Tensor::empty({bsz, nhm, t}, DType::F32, dev);
        const Tensor dq = Tensor::empty(q.shape(), dt, dev), dk = Tensor::empty(k.shape(), dt, dev),
                     dvv = Tensor::empty(v.shape(), dt, dev);
        const double f = double(bsz) * nhm * double(t) * t * (dqk + dv);
        const float scale = 1.0f / std::sqrt(static_cast<float>(dqk));
        const AttentionBlock blk{0, 0, t, true};
        const std::string sh = str("B", bsz, " T", t, " NH", nhm, " Dqk", dqk, " Dv", dv);
        compute(dev, "attention MLA fwd", sh, dt, f, [&] { attention_block_forward(q, k, v, out, lse, scale, blk); });
        compute(dev, "attention MLA bwd", sh, dt, 2.5 * f,
                [&] { attention_block_backward(out, q, k, v, out, lse, dq, dk, dvv, scale, blk); });
      }
      {
        std::vector<int64_t> ids(static_cast<size_t>(tok));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % v);
        const Tensor tid = Tensor::from_ints(ids, {tok}).to(dev), table = randn({v, c}, dt, dev, 10);
        const Tensor out = Tensor::empty({tok, c}, dt, dev), dtab = Tensor::zeros({v, c}, DType::F32, dev);
        const std::string sh = str("N", tok, " V", v, " C", c);
        mem(dev, "embedding fwd", sh, dt, 2 * bytes({tok, c}, dt), [&] { embedding_forward(tid, table, out); });
        mem(dev, "embedding bwd", sh, dt, bytes({tok, c}, dt) + 2 * bytes({tok, c}, DType::F32),
            [&] { embedding_backward(out, tid, dtab); });
      }
      {
        std::vector<int64_t> tg(static_cast<size_t>(xent_rows));
        for (size_t i = 0; i < tg.size(); ++i) tg[i] = static_cast<int64_t>((i * 104729) % v);
        const Tensor targets = Tensor::from_ints(tg, {xent_rows}).to(dev), logits = randn({xent_rows, v}, dt, dev, 11, 4);
        const Tensor losses = Tensor::empty({xent_rows}, DType::F32, dev), dl = Tensor::empty({xent_rows, v}, dt, dev);
        const std::string sh = str(xent_rows, "x", v);
        mem(dev, "softmax_xent fwd+bwd", sh, dt, 2 * bytes({xent_rows, v}, dt),
            [&] { softmax_cross_entropy(logits, targets, losses, dl, 1.0f / xent_rows); });
      }
      if (!lowp || gpu) {  // the optimizer always runs on f32 master weights
        const int64_t n = gpu ? int64_t(350) << 20 : int64_t(16) << 20;
        const Tensor p = randn({n}, DType::F32, dev, 12), g = randn({n}, dt, dev, 13),
                     m = Tensor::zeros({n}, DType::F32, dev), vv = Tensor::zeros({n}, DType::F32, dev),
                     pc = Tensor::empty({n}, DType::BF16, dev);
        AdamWArgs a;
        mem(dev, "adamw (+bf16 copy)", str(n), dt, 6 * bytes({n}, DType::F32) + bytes({n}, dt) + bytes({n}, DType::BF16),
            [&] { adamw_step(p, g, m, vv, pc, a); });
      }
    }
  }

  // Our CPU gemm vs cblas_sgemm called directly on the same shapes and transposes.
  void gemm_vs_blas() {
    struct Case {
      int64_t m, n, k;
      bool ta, tb;
    };
    for (const Case& cs : {Case{1024, 3072, 768, false, true}, Case{1024, 768, 3072, false, true},
                           Case{768, 3072, 1024, true, false}, Case{1000, 1000, 1000, false, false}}) {
      const Tensor a = randn(cs.ta ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k}, DType::F32, Device::cpu(), 20);
      const Tensor b = randn(cs.tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n}, DType::F32, Device::cpu(), 21);
      const Tensor c = Tensor::empty({cs.m, cs.n}, DType::F32);
      GemmArgs g;
      g.trans_a = cs.ta;
      g.trans_b = cs.tb;
      const float *pa = a.data<float>(), *pb = b.data<float>();
      float* pc = c.data<float>();
      const int lda = static_cast<int>(a.dim(1)), ldb = static_cast<int>(b.dim(1));
      const double f = 2.0 * cs.m * cs.n * cs.k;
      // Interleave the two so clock and thermal drift hit both alike.
      double ours = 1e30, blas = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        ours = std::min(ours, time_ms(Device::cpu(), [&] { gemm(a, b, c, g); }, opt_.min_time / 3));
        blas = std::min(blas, time_ms(Device::cpu(), [&] {
          cblas_sgemm(CblasRowMajor, cs.ta ? CblasTrans : CblasNoTrans, cs.tb ? CblasTrans : CblasNoTrans,
                      static_cast<int>(cs.m), static_cast<int>(cs.n), static_cast<int>(cs.k), 1.0f, pa, lda, pb, ldb,
                      0.0f, pc, static_cast<int>(cs.n));
        }, opt_.min_time / 3));
      }
      const std::string sh = str(cs.m, "x", cs.n, "x", cs.k, cs.ta ? " aT" : "", cs.tb ? " bT" : "");
      vs_.push_back({sh, f / (ours * 1e9), f / (blas * 1e9), blas / ours});
    }
  }

  void print_and_save() const {
    std::printf("\n%-6s %-26s %-22s %-6s %10s %10s %10s %8s\n", "device", "op", "shape", "dtype", "ms", "GB/s",
                "TFLOP/s", "of ceil");
    for (const Row& r : rows_) {
      std::printf("%-6s %-26s %-22s %-6s %10.3f %10s %10s %7.1f%%\n", r.device.c_str(), r.op.c_str(), r.shape.c_str(),
                  r.dtype.c_str(), r.ms, r.gbps > 0 ? str_fixed(r.gbps, 2).c_str() : "-",
                  r.tflops > 0 ? str_fixed(r.tflops, 4).c_str() : "-", 100.0 * r.fraction);
    }
    std::printf("\nCPU gemm vs cblas_sgemm called directly (f32, same shapes; target >= 80%%)\n");
    std::printf("%-26s %12s %12s %8s %s\n", "shape", "ours TFLOP/s", "blas TFLOP/s", "ratio", "");
    for (const auto& v : vs_)
      std::printf("%-26s %12.4f %12.4f %7.1f%% %s\n", v.shape.c_str(), v.ours, v.blas, 100 * v.ratio,
                  v.ratio >= 0.8 ? "ok" : "BELOW 80%");
    if (opt_.json.empty()) return;
    nlohmann::json j;
    j["ceilings"] = {{"cpu_bw_gbps", cpu_bw_}, {"cpu_sgemm_tflops", cpu_flops_}};
    for (const Row& r : rows_)
      j["rows"].push_back({{"device", r.device}, {"op", r.op}, {"shape", r.shape}, {"dtype", r.dtype}, {"ms", r.ms},
                           {"gbps", r.gbps}, {"tflops", r.tflops}, {"fraction_of_ceiling", r.fraction},
                           {"ceiling", r.ceiling}});
    for (const auto& v : vs_)
      j["gemm_vs_blas"].push_back({{"shape", v.shape}, {"ours_tflops", v.ours}, {"blas_tflops", v.blas},
                                   {"ratio", v.ratio}, {"ok", v.ratio >= 0.8}});
    std::ofstream(opt_.json) << j.dump(2) << "\n";
    std::printf("\nwrote %s\n", opt_.json.c_str());
  }

  // Ceilings are measured before and after the op rows (the machine may be shared);
  // each row's fraction is of the larger of the two measurements.
  void begin_device(Device dev) {
    bw_ = flops_ = 0;
    first_row_ = rows_.size();
    ceilings(dev);
  }
  void end_device(Device dev) {
    ceilings(dev);
    for (size_t i = first_row_; i < rows_.size(); ++i)
      rows_[i].fraction = rows_[i].ceiling == "bw" ? rows_[i].gbps / bw_ : rows_[i].tflops / flops_;
    if (dev.is_cpu()) cpu_bw_ = bw_, cpu_flops_ = flops_;
  }

 private:
  struct Vs {
    std::string shape;
    double ours, blas, ratio;
  };
  static std::string str_fixed(double x, int prec) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", prec, x);
    return b;
  }
  bool skip(const std::string& op) const { return !opt_.filter.empty() && op.find(opt_.filter) == std::string::npos; }
  void add_raw(Device dev, const std::string& op, const std::string& shape, const std::string& dt, double ms,
               double gbps, double tflops, const std::string& ceil) {
    rows_.push_back(Row{op, shape, dt, dev.name(), ms, gbps, tflops, 0, ceil});
    std::fprintf(stderr, "  %-6s %-26s %-22s %-5s %9.3f ms\n", dev.name().c_str(), op.c_str(), shape.c_str(), dt.c_str(), ms);
  }

  Options opt_;
  double bw_ = 0, flops_ = 0, cpu_bw_ = 0, cpu_flops_ = 0;  // GB/s, TFLOP/s
  size_t first_row_ = 0;
  std::vector<Row> rows_;
  std::vector<Vs> vs_;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_ops: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") opt.json = next();
    else if (a == "--device") opt.device = next();
    else if (a == "--min-time") opt.min_time = std::stod(next());
    else if (a == "--filter") opt.filter = next();
    else {
      std::fprintf(stderr, "usage: bench_ops [--json FILE] [--device cpu|cuda|all] [--min-time S] [--filter OP]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    Bench b(opt);
    std::fprintf(stderr, "bench_ops: %d OpenMP threads\n", omp_get_max_threads());
    if (opt.device != "cuda") {
      b.begin_device(Device::cpu());
      b.ops(Device::cpu());
      b.end_device(Device::cpu());
      b.gemm_vs_blas();
    }
    if (opt.device != "cpu") {
      if (cuda_available()) {
        b.begin_device(Device::cuda(0));
        b.ops(Device::cuda(0));
        b.end_device(Device::cuda(0));
      } else {
        std::printf("SKIPPED cuda: %s\n", cuda_unavailable_reason().c_str());
      }
    }
    b.print_and_save();
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
