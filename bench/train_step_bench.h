// bench/train_step_bench.h — the whole training step, timed: shared by
// bench_train (every size, CPU or CUDA, with/without recompute, PyTorch peer)
// and bench_mfu (GPT-2 sizes, bf16, seq 1024, MFU on the GPU).
//
// One step is exactly what model/training/trainer.cpp does per iteration, through the
// library itself (no copy of the model):
//   params.zero_grad();
//   for k < micro_batches: loss = GPT::forward(tape, tokens_k, targets_k, {recompute});
//                          loss.item(); Tape::backward(loss, 1 / micro_batches)
//   ReplicatedOptimizer::step(lr, 1)        (clipping at 1.0, weight decay 0.01)
// Tokens are synthetic (uniform over the vocabulary, a fixed pool of 4
// micro-batches reused in turn), so no data loader or disk is timed.
//
// Numbers reported per row:
//   ms/step      median wall time of the timed steps (the device is synchronised
//                at the end of each step), after `warmup` untimed steps;
//   tokens/s     micro_batches · B · T / median step;
//   TFLOP/s      tokens/s · GPTConfig::flops_per_token() (docs/flops.md);
//   MFU          against the datasheet peak (CUDA) and against the GEMM
//                ceiling measured in the same run (CPU: cblas_sgemm; CUDA: the
//                library's cuBLASLt gemm on a large square product);
//   reserved     (rsv) the peak of what the allocator held for them (CUDA: its
//                segments, live + cached; CPU: equal to peak memory);
//   peak memory  the peak of live tensor bytes over the row (memory_stats in
//                tensor/tensor.h: CUDA the caching allocator's live blocks,
//                CPU every Tensor::empty): params, grads, optimizer state,
//                activations, workspaces. CPU rows also give the process's
//                peak RSS (VmHWM, reset before each row via /proc/self/clear_refs)
//                minus the RSS before the model was built: it includes all the
//                process touched (OpenBLAS buffers, heap that malloc keeps after a
//                free), an upper bound. (malloc is left as the trainer has it:
//                forcing every block through mmap would make rows comparable in
//                RSS but adds page faults to every step.)
//   raw allocs   (JSON raw_allocs_timed, CUDA) segments the caching allocator took from
//                cudaMalloc during the timed steps: allocator stalls, 0 in a steady state.
// With StepSetup::profile the timed steps run between profiler_start and profiler_stop
// (core/profiler.h), so `ncu --profile-from-start off` records exactly them.
#pragma once
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef MPITRON_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "autograd/tape.h"     // Tape: forward records, backward replays
#include "core/allocator.h"    // cuda_caching_allocator: peak_bytes, peak_reserved_bytes
#include "core/device.h"       // Device, Event, device_synchronize
#include "core/error.h"        // mpitron::Error, str
#include "core/profiler.h"     // profiler_start/stop around the timed steps (--profile)
#include "model/config.h"      // GPTConfig, flops_per_token
#include "model/gpt.h"         // GPT::forward
#include "model/training/optimizer.h"   // ReplicatedOptimizer::step
#include "tensor/ops.h"        // gemm (the CUDA ceiling)

namespace mpitron::bench {

// ---- model sizes ---------------------------------------------------------------------
// A preset is a size and a family (model/config.h, docs/model-families.md):
//   GPT-2: LayerNorm, GELU MLP with F = 4·C, learned positions, tied head, biases;
//   Llama: RMSNorm, SwiGLU MLP with F = ffn, rope (rotary_base), grouped-query
//          attention (query_groups kv heads), an untied head, no linear biases.
// vocab 0 keeps GPT-2's 50257 (padded to 50304), so a Llama row beside a GPT-2
// row of the same size differs in the architecture only.
struct Preset {
  const char* name;  // as given to --config
  int64_t layers, hidden, heads;
  const char* what;
  bool llama = false;
  int64_t query_groups = 0;    // G (Llama); 0: NH
  int64_t ffn = 0;             // F (Llama); 0: 4·C
  int64_t vocab = 0;           // 0: 50257 (GPT-2's tokenizer)
  double rotary_base = 10000;  // rope's θ base (Llama)
  int64_t experts = 0, topk = 0, expert_ffn = 0;  // Mixture of Experts (Mixtral-style): E experts of width Fe, top-k
  // DeepSeek-V3-style: multi-latent attention (kv_lora_rank, q/k nope and rope dims, value dim; q-lora
  // rank 0: a plain query projection) and group-limited sigmoid routing (groups, the best group_topk).
  int64_t kv_lora = 0, qk_nope = 0, qk_rope = 0, v_dim = 0, q_lora = 0, groups = 0, group_topk = 0;
};

// GPT-2 (Radford et al. 2019) sizes, Megatron's 1.3B (GPT-3 XL shape) and a tiny one;
// Llama-family rows of the GPT-2 sizes (llama-tiny, llama-124M: F ≈ 8/3·C rounded to
// 64, GQA with NH/G = 2 and 3) and the Llama 3.2 1B shape (untied here, as every
// Llama preset: Llama 3.2 1B itself ties its head, 1.24B parameters tied, 1.50B untied).
inline const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"tiny", 4, 256, 4, "4 layers, hidden 256"},
      {"124M", 12, 768, 12, "GPT-2 small"},
      {"350M", 24, 1024, 16, "GPT-2 medium"},
      {"774M", 36, 1280, 20, "GPT-2 large"},
      {"1.3B", 24, 2048, 16, "GPT-3 XL / Megatron 1.3B"},
      {"1.5B", 48, 1600, 25, "GPT-2 XL"},
      {"llama-tiny", 4, 256, 4, "Llama family, the tiny size: G 2, F 704", true, 2, 704, 0, 10000},
      {"llama-124M", 12, 768, 12, "Llama family, GPT-2 small's width and depth: G 4, F 2048", true, 4, 2048, 0,
       10000},
      // Mixtral-style MoE rows of the Llama sizes: 8 SwiGLU experts, top-2, k·Fe = the Llama row's F (the
      // same active MLP), load-balancing loss 0.01 (bench_train's step; the peer's too).
      {"moe-tiny", 4, 256, 4, "llama-tiny with 8 experts of F 352, top-2 (active = llama-tiny)", true, 2, 704, 0,
       10000, 8, 2, 352},
      {"moe-124M", 12, 768, 12, "llama-124M with 8 experts of F 1024, top-2 (active = llama-124M)", true, 4, 2048, 0,
       10000, 8, 2, 1024},
      // DeepSeek-V3-style rows beside the MoE rows of the same active size: multi-latent attention (the
      // KV cache holds kv_lora + rope = 96 / 288 values per token per layer against the GQA rows' 256 / 512)
      // and 8 sigmoid-scored experts in 4 groups, the best 2 groups, with expert bias.
      {"mla-moe-tiny", 4, 256, 4, "moe-tiny with multi-latent attention (kr 64, dn 64, dr 32, dv 64), 4 groups",
       true, 0, 704, 0, 10000, 8, 2, 352, 64, 64, 32, 64, 0, 4, 2},
      {"mla-moe-124M", 12, 768, 12,
       "moe-124M with multi-latent attention (kr 256, q-lora 384, dn 64, dr 32, dv 64), 4 groups", true, 0, 2048, 0,
       10000, 8, 2, 1024, 256, 64, 32, 64, 384, 4, 2},
      {"llama-1B", 16, 2048, 32, "Llama 3.2 1B shape: G 8, F 8192, vocab 128256, rope base 500000", true, 8, 8192,
       128256, 500000},
  };
  return p;
}

inline const Preset& find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (name == p.name) return p;
  std::string names;
  for (const Preset& p : presets()) names += std::string(names.empty() ? "" : ", ") + p.name;
  MPT_THROW(str("unknown --config ", name), str("pick one of: ", names));
}

// Every preset name, comma-separated (for --config all and the usage line).
inline std::string preset_names() {
  std::string names;
  for (const Preset& p : presets()) names += std::string(names.empty() ? "" : ",") + p.name;
  return names;
}

// Fills the size and architecture of `p` into c (the rest of c is left as it is).
inline void apply_preset(const Preset& p, GPTConfig& c) {
  c.num_layers = p.layers;
  c.hidden_size = p.hidden;
  c.num_attention_heads = p.heads;
  if (p.vocab > 0) {
    c.vocab_size = p.vocab;
    c.padded_vocab_size = (p.vocab + 127) / 128 * 128;  // Megatron's --make-vocab-size-divisible-by 128
  }
  if (!p.llama) return;
  c.normalization = Normalization::RMSNorm;
  c.layernorm_epsilon = 1e-5f;
  c.mlp = MlpKind::SwiGLU;
  c.ffn_hidden_size = p.ffn;
  c.position_embedding = PositionEmbedding::Rope;
  c.rotary_base = p.rotary_base;
  c.rotary_percent = 1.0;
  c.num_query_groups = p.query_groups;
  c.untie_embeddings = true;
  c.add_bias_linear = false;
  c.num_experts = p.experts;
  if (p.experts > 0) {
    c.moe_router_topk = p.topk;
    c.moe_ffn_hidden_size = p.expert_ffn;
  }
  if (p.kv_lora > 0) {
    c.multi_latent_attention = true;
    c.num_query_groups = 0;
    c.kv_lora_rank = p.kv_lora, c.q_lora_rank = p.q_lora;
    c.qk_head_dim = p.qk_nope, c.qk_pos_emb_head_dim = p.qk_rope, c.v_head_dim = p.v_dim;
    c.moe_router_score_function = MoeScore::Sigmoid;
    c.moe_router_enable_expert_bias = true;
    c.moe_router_num_groups = p.groups, c.moe_router_group_topk = p.group_topk;
  }
}

// ---- one benchmark row ------------------------------------------------------------------
struct StepSetup {
  std::string config_name;
  GPTConfig model;           // seq_length = T, compute_dtype = the dtype
  Device device;
  int64_t micro_batch = 4;   // B
  int64_t micro_batches = 1; // gradient-accumulation steps per optimizer step
  int warmup = 2, steps = 5;
  bool recompute = false;    // --recompute-activations (whole-block recompute)
  bool profile = false;      // the timed steps between profiler_start/stop (core/profiler.h)
  uint64_t seed = 1234;
  std::string optimizer = "adam";  // --optimizer (parallel/update_rule.h): muon times its Newton-Schulz too
};

struct StepRow {
  std::string impl = "mpitron";  // or "pytorch" (bench/peers/torch_gpt.py)
  std::string config, family, device, dtype;  // family: GPTConfig::family() (gpt2, llama)
  std::string optimizer = "adam";
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, micro_batch = 0, micro_batches = 0, params = 0;
  bool recompute = false;
  int steps = 0, warmup = 0, threads = 0;
  double ms_per_step = 0, ms_mean = 0, tokens_per_s = 0, tflops = 0;
  double mfu_peak = 0, mfu_ceiling = 0;  // fractions
  double peak_bytes = 0;                 // peak live tensor bytes (see the header comment)
  double peak_reserved_bytes = 0;        // peak bytes the allocator held for them (CUDA: segments)
  double rss_peak_bytes = 0;             // CPU: peak RSS above the pre-model RSS; 0 on CUDA
  std::string memory_kind;               // what peak_bytes counts
  double loss_first = 0, loss_last = 0;
  double flops_per_token = 0;
  double raw_allocs_timed = -1;          // CUDA: segments the caching allocator took from cudaMalloc
                                         // during the timed steps (0 in a steady state); -1 on CPU
};

inline nlohmann::json to_json(const StepRow& r) {
  return {{"impl", r.impl}, {"config", r.config}, {"optimizer", r.optimizer}, {"family", r.family}, {"device", r.device}, {"dtype", r.dtype}, {"layers", r.layers},
          {"hidden", r.hidden}, {"heads", r.heads}, {"seq", r.seq}, {"micro_batch", r.micro_batch},
          {"micro_batches", r.micro_batches}, {"params", r.params}, {"recompute", r.recompute},
          {"steps", r.steps}, {"warmup", r.warmup}, {"threads", r.threads}, {"ms_per_step", r.ms_per_step},
          {"ms_per_step_mean", r.ms_mean}, {"tokens_per_s", r.tokens_per_s}, {"tflops", r.tflops},
          {"mfu_peak", r.mfu_peak}, {"mfu_ceiling", r.mfu_ceiling}, {"peak_bytes", r.peak_bytes},
          {"peak_reserved_bytes", r.peak_reserved_bytes},
          {"rss_peak_bytes", r.rss_peak_bytes}, {"memory_kind", r.memory_kind}, {"loss_first", r.loss_first}, {"loss_last", r.loss_last},
          {"flops_per_token", r.flops_per_token}, {"raw_allocs_timed", r.raw_allocs_timed}};
}

// ---- host memory (CPU rows) --------------------------------------------------------------
// A field of /proc/self/status in bytes ("VmHWM", "VmRSS"); 0 if unreadable.
inline double proc_status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.compare(0, key.size(), key) == 0) return 1024.0 * std::atof(line.c_str() + key.size());
  return 0;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false where not permitted.
inline bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

inline double meminfo_bytes(const char* field) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.compare(0, key.size(), key) == 0) return 1024.0 * std::atof(line.c_str() + key.size());
  return 0;
}

// Memory a row may use: CUDA total device memory; CPU MemAvailable.
inline double device_memory_bytes(const Device& d) {
#ifdef MPITRON_WITH_CUDA
  if (d.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    cuda_set_device(d.index);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return static_cast<double>(total_b);
    cudaGetLastError();
    return 0;
  }
#endif
  return meminfo_bytes("MemAvailable");
}

// What one step needs, from the tables in model/block.h and model/params.h:
//   parameters: values (dtype) + f32 grads + f32 Adam m, v (+ f32 master for bf16/f16)
//   activations per block (saved by block_forward): ln1, qkv ((NH + 2G)·HD per token),
//     att, x2, ln2, the block output (5 × N·C) and fc, gelu (2 × N·F; SwiGLU: fc is
//     2F and the product F, 3 × N·F), in the compute dtype
//   with recompute: each block keeps its input (N·C), plus one block's full set
//   head: logits (N, V) in the dtype (the loss gradient is written in place) and
//     an f32 copy's worth for the fused classifier's temporaries
// plus 15% for gradients in flight, workspaces and fragmentation.
inline double estimate_step_bytes(const StepSetup& s) {
  const GPTConfig& c = s.model;
  const double P = static_cast<double>(c.num_parameters());
  const double ds = static_cast<double>(dtype_size(c.compute_dtype));
  const double params = P * (ds + 4 + 8 + (c.compute_dtype == DType::F32 ? 0 : 4));
  const double N = static_cast<double>(s.micro_batch * c.seq_length);
  const double C = static_cast<double>(c.hidden_size), F = static_cast<double>(c.ffn());
  const double QKV = static_cast<double>(c.qkv_rows()), FC = static_cast<double>(c.fc_rows());
  const double L = static_cast<double>(c.num_layers), V = static_cast<double>(c.padded_vocab_size);
  const double block = (5 * N * C + N * QKV + N * (FC + F)) * ds;
  const double acts = s.recompute ? L * N * C * ds + block : L * block;
  const double head = N * V * (ds + 4);
  return 1.15 * (params + acts + head);
}

// ---- GEMM ceiling ---------------------------------------------------------------------
// Median milliseconds per call of fn (after one warm-up), device-synchronised.
inline double median_ms(const Device& dev, const std::function<void()>& fn, int reps) {
  fn();
  device_synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (dev.is_cuda()) {
      Event a, b;
      a.record();
      fn();
      b.record();
      b.synchronize();
      t.push_back(Event::elapsed_ms(a, b));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// TFLOP/s of the fastest matrix product this device does for `dtype`:
// CPU: cblas_sgemm 2048³ called directly (the CPU backend computes bf16 in f32);
// CUDA: the library's gemm (cuBLASLt, f32 accumulation) on 8192³ in the dtype.
inline double measure_gemm_ceiling(const Device& dev, DType dtype, std::string& what) {
  if (dev.is_cpu()) {
    const int m = 2048;
    std::vector<float> a(size_t(m) * m, 0.5f), b(size_t(m) * m, 0.25f), c(size_t(m) * m);
    const double ms = median_ms(dev, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, a.data(), m, b.data(), m, 0.0f, c.data(), m);
    }, 5);
    what = "cblas_sgemm 2048^3 f32";
    return 2.0 * m * m * m / (ms * 1e9);
  }
  const int64_t m = 8192;
  const Tensor x = Tensor::zeros({m, m}, dtype, dev), y = Tensor::zeros({m, m}, dtype, dev);
  const Tensor z = Tensor::empty({m, m}, dtype, dev);
  // Non-zero inputs: some GPUs clock differently on all-zero data.
  x.fill(0.01f);
  y.fill(0.02f);
  const double ms = median_ms(dev, [&] { gemm(x, y, z); }, 10);
  what = str("cuBLASLt gemm 8192^3 ", dtype_name(dtype));
  return 2.0 * m * m * m / (ms * 1e9);
}

// Datasheet dense peak of an H100 SXM (the GPU this project is lent), TFLOP/s.
inline double datasheet_peak_tflops(const Device& dev, DType dtype, std::string& what) {
  if (!dev.is_cuda()) {
    what = "none (CPU: the measured sgemm ceiling is the peak)";
    return 0;
  }
  if (dtype == DType::F32) {
    // Our f32 gemm is exact f32 (no TF32) unless MPITRON_ALLOW_TF32=1.
    const char* tf32 = std::getenv("MPITRON_ALLOW_TF32");
    if (tf32 && std::string(tf32) == "1") {
      what = "H100 SXM tf32 dense 494.5 TFLOP/s";
      return 494.5;
    }
    what = "H100 SXM fp32 67 TFLOP/s";
    return 67.0;
  }
  what = "H100 SXM bf16/fp16 dense 989 TFLOP/s";
  return 989.0;
}

// MFU of a row against the datasheet peak (0: none, CPU) and the measured GEMM ceiling.
inline void set_mfu(StepRow& r, double peak_tflops, double ceiling_tflops) {
  r.mfu_ceiling = ceiling_tflops > 0 ? r.tflops / ceiling_tflops : 0;
  r.mfu_peak = peak_tflops > 0 ? r.tflops / peak_tflops : r.mfu_ceiling;
}

// ---- the step -------------------------------------------------------------------------
// Fills each parameter as GPT::init_weights does, by its parameter-table init (norm
// weights 1, biases 0, matrices N(0, std), output projections std/sqrt(2L)) but from a 1 Mi-entry
// normal pool tiled over the tensor: GPT::init_weights draws every element
// through Philox on one host thread (about a minute for 1.5B parameters), and
// the values do not change the time of a step.
inline void fast_init(GPT& model, uint64_t seed) {
  const GPTConfig& c = model.config();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> pool(size_t(1) << 20);
  for (float& v : pool) v = nd(rng);
  const float std_out = c.init_method_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  size_t at = 0;
  for (size_t i = 0; i < model.params().infos().size(); ++i) {
    const ParamInfo& p = model.params().infos()[i];
    const bool is_ones = p.init == ParamInit::Ones, is_zeros = p.init == ParamInit::Zeros;
    std::vector<float> host(static_cast<size_t>(p.numel()));
    const float sd = p.init == ParamInit::OutputNormal ? std_out : c.init_method_std;
    for (size_t j = 0; j < host.size(); ++j) {
      host[j] = is_zeros ? 0.0f : is_ones ? 1.0f : sd * pool[at];
      at = (at + 7919) & (pool.size() - 1);  // a stride co-prime to 2^20: rows do not repeat in step
    }
    model.params().var(i).value().copy_from(Tensor::from_vector(host, p.shape, c.compute_dtype).to(model.device()));
  }
}

// Runs warmup + steps training steps and returns the row (peak memory filled in).
inline StepRow run_step_bench(const StepSetup& s, double peak_tflops, double ceiling_tflops) {
  const GPTConfig& c = s.model;
  const Device dev = s.device;
  StepRow r;
  r.config = s.config_name;
  r.optimizer = s.optimizer;
  r.family = c.family();
  r.device = dev.name();
  r.dtype = dtype_name(c.compute_dtype);
  r.layers = c.num_layers, r.hidden = c.hidden_size, r.heads = c.num_attention_heads, r.seq = c.seq_length;
  r.micro_batch = s.micro_batch, r.micro_batches = s.micro_batches, r.params = c.num_parameters();
  r.recompute = s.recompute, r.steps = s.steps, r.warmup = s.warmup, r.threads = omp_get_max_threads();
  r.flops_per_token = c.flops_per_token();

  // Memory baseline: before anything of this row exists.
  double rss_base = 0;
  if (dev.is_cuda()) {
    device_synchronize();
    cuda_caching_allocator(dev.index).empty_cache();
    r.memory_kind = "peak live tensor bytes (caching allocator)";
  } else {
    reset_peak_rss();
    rss_base = proc_status_bytes("VmRSS");
    r.memory_kind = "peak live tensor bytes (CPU Tensor storage)";
  }
  reset_peak_memory(dev);

  double step_ms_sum = 0;
  std::vector<double> times;
  {
    GPT model(c, dev);
    fast_init(model, s.seed);
    OptimizerConfig oc;  // Megatron defaults: betas (0.9, 0.999), eps 1e-8, wd 0.01, clip 1.0
    oc.optimizer = s.optimizer;
    ReplicatedOptimizer opt(model.params(), oc);

    // (B, T) i32 inputs and targets: a pool of 4 micro-batches of uniform token ids.
    const int64_t B = s.micro_batch, T = c.seq_length;
    std::mt19937 rng(static_cast<uint32_t>(s.seed));
    std::uniform_int_distribution<int> tok(0, static_cast<int>(c.vocab_size) - 1);
    std::vector<Tensor> inputs, targets;
    for (int k = 0; k < 4; ++k) {
      std::vector<int64_t> seq(static_cast<size_t>(B * (T + 1)));
      for (auto& t : seq) t = tok(rng);
      std::vector<int64_t> in, tg;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          in.push_back(seq[static_cast<size_t>(b * (T + 1) + t)]);
          tg.push_back(seq[static_cast<size_t>(b * (T + 1) + t + 1)]);
        }
      inputs.push_back(Tensor::from_ints(in, {B, T}));
      targets.push_back(Tensor::from_ints(tg, {B, T}));
    }

    int64_t mb = 0;
    uint64_t raw_allocs_before = 0;
    for (int it = 0; it < s.warmup + s.steps; ++it) {
      device_synchronize();
      if (it == s.warmup) {  // the timed steps begin
        if (dev.is_cuda()) raw_allocs_before = cuda_caching_allocator(dev.index).stats().raw_allocs;
        if (s.profile) profiler_start();
      }
      const auto t0 = std::chrono::steady_clock::now();
      model.params().zero_grad();
      double loss_sum = 0;
      for (int64_t k = 0; k < s.micro_batches; ++k, ++mb) {
        Tape tape;
        ForwardOptions fo;
        fo.recompute = s.recompute;
        MoeRun moe;  // the MoE presets' load-balancing loss, as --moe-aux-loss-coeff 0.01
        moe.aux_loss_coeff = 0.01f;
        moe.loss_scale = 1.0f / static_cast<float>(s.micro_batches);
        if (s.model.moe()) fo.moe = &moe;
        fo.dropout_seed = static_cast<uint64_t>(it) * 1000003ull + static_cast<uint64_t>(k);
        Var loss = model.forward(tape, inputs[static_cast<size_t>(mb % 4)], targets[static_cast<size_t>(mb % 4)], fo);
        loss_sum += loss.value().item();  // the trainer reads every micro-batch's loss too
        tape.backward(loss, 1.0f / static_cast<float>(s.micro_batches));
      }
      const StepResult sr = opt.step(1e-4f, 1.0f);
      device_synchronize();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const double loss = loss_sum / static_cast<double>(s.micro_batches);
      if (it == 0) r.loss_first = loss;
      r.loss_last = loss;
      if (sr.skipped) std::fprintf(stderr, "  warning: step %d skipped (non-finite gradients)\n", it);
      if (it >= s.warmup) {
        times.push_back(ms);
        step_ms_sum += ms;
      }
      std::fprintf(stderr, "  %s%s step %d/%d: %.1f ms, loss %.4f%s\n", s.config_name.c_str(),
                   s.recompute ? " (recompute)" : "", it + 1, s.warmup + s.steps, ms, loss,
                   it < s.warmup ? " (warm-up)" : "");
    }
    if (s.profile) profiler_stop();
    if (dev.is_cuda())
      r.raw_allocs_timed = static_cast<double>(cuda_caching_allocator(dev.index).stats().raw_allocs - raw_allocs_before);
    r.peak_bytes = static_cast<double>(memory_stats(dev).peak_bytes);
    r.peak_reserved_bytes = dev.is_cuda()
                                ? static_cast<double>(cuda_caching_allocator(dev.index).stats().peak_reserved_bytes)
                                : r.peak_bytes;
    if (dev.is_cpu()) r.rss_peak_bytes = std::max(0.0, proc_status_bytes("VmHWM") - rss_base);
  }
  std::sort(times.begin(), times.end());
  r.ms_per_step = times.empty() ? 0 : times[times.size() / 2];
  r.ms_mean = times.empty() ? 0 : step_ms_sum / static_cast<double>(times.size());
  const double tokens = static_cast<double>(s.micro_batches * s.micro_batch * c.seq_length);
  r.tokens_per_s = r.ms_per_step > 0 ? tokens / (r.ms_per_step / 1e3) : 0;
  r.tflops = r.tokens_per_s * r.flops_per_token / 1e12;
  set_mfu(r, peak_tflops, ceiling_tflops);
  return r;
}

// ---- printing -------------------------------------------------------------------------
// A row written by bench/peers/torch_gpt.py --json (the same keys as to_json).
inline StepRow row_from_json(const nlohmann::json& j) {
  StepRow r;
  r.impl = j.value("impl", "pytorch");
  r.config = j.value("config", "");
  r.family = j.value("family", "gpt2");
  r.device = j.value("device", "");
  r.dtype = j.value("dtype", "");
  r.layers = j.value("layers", 0), r.hidden = j.value("hidden", 0), r.heads = j.value("heads", 0);
  r.seq = j.value("seq", 0), r.micro_batch = j.value("micro_batch", 0), r.micro_batches = j.value("micro_batches", 0);
  r.params = j.value("params", int64_t(0));
  r.recompute = j.value("recompute", false);
  r.steps = j.value("steps", 0), r.warmup = j.value("warmup", 0), r.threads = j.value("threads", 0);
  r.ms_per_step = j.value("ms_per_step", 0.0), r.ms_mean = j.value("ms_per_step_mean", 0.0);
  r.tokens_per_s = j.value("tokens_per_s", 0.0), r.tflops = j.value("tflops", 0.0);
  r.peak_bytes = j.value("peak_bytes", 0.0), r.memory_kind = j.value("memory_kind", "");
  r.rss_peak_bytes = j.value("rss_peak_bytes", 0.0);
  r.loss_first = j.value("loss_first", 0.0), r.loss_last = j.value("loss_last", 0.0);
  r.flops_per_token = j.value("flops_per_token", 0.0);
  r.raw_allocs_timed = j.value("raw_allocs_timed", -1.0);
  return r;
}

inline std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", b / double(1ull << 30));
  return buf;
}

inline void print_header() {
  std::printf("%-8s %-10s %-5s %-5s %4s %5s %3s %3s %8s %10s %10s %9s %8s %8s %8s %8s %8s %s\n", "impl", "config",
              "dev", "dtype", "B", "T", "mb", "rc", "params", "ms/step", "tokens/s", "TFLOP/s", "MFU(pk)", "MFU(gm)",
              "mem GiB", "rsv GiB", "RSS GiB", "loss");
}

inline void print_row(const StepRow& r) {
  std::printf("%-8s %-10s %-5s %-5s %4lld %5lld %3lld %3s %7.1fM %10.1f %10.1f %9.4f %7.2f%% %7.2f%% %8s %8s %8s "
              "%.3f->%.3f%s\n",
              r.impl.c_str(), r.config.c_str(), r.device.c_str(), r.dtype.c_str(), static_cast<long long>(r.micro_batch),
              static_cast<long long>(r.seq), static_cast<long long>(r.micro_batches), r.recompute ? "on" : "off",
              r.params / 1e6, r.ms_per_step, r.tokens_per_s, r.tflops, 100 * r.mfu_peak, 100 * r.mfu_ceiling,
              r.peak_bytes > 0 ? gib(r.peak_bytes).c_str() : "-",
              r.peak_reserved_bytes > 0 ? gib(r.peak_reserved_bytes).c_str() : "-",
              r.rss_peak_bytes > 0 ? gib(r.rss_peak_bytes).c_str() : "-",
              r.loss_first, r.loss_last, r.optimizer == "adam" ? "" : (" " + r.optimizer).c_str());
  std::fflush(stdout);
}

}  // namespace mpitron::bench
