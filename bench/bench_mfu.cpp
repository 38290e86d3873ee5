// bench/bench_mfu.cpp — model FLOPs utilisation of the whole training step on
// the GPU: GPT-2 124M / 350M / 774M / 1.5B, bf16, seq 1024, synthetic tokens.
//
//   bench_mfu [--config 124M,350M,774M,1.5B | any bench_train preset, e.g. llama-1B] [--batch B] [--seq T] [--micro-batches K]
//             [--warmup N] [--steps N] [--recompute] [--dtype bf16|f32] [--device cuda|cpu] [--json FILE]
//
// Per size: tokens/s, ms/step (median of the timed steps after the warm-up),
// TFLOP/s by GPTConfig::flops_per_token (6·N_matmul + 6·L·T·C, docs/flops.md),
// MFU against the H100 SXM datasheet (989 TFLOP/s bf16 dense) and against the
// GEMM ceiling measured in this run (the library's cuBLASLt bf16 gemm on
// 8192³, before and after the rows, the larger of the two), and the caching
// allocator's peak bytes. Micro-batch per size (unless --batch): 124M and 350M
// 16, 774M and 1.5B 8 — sized to fit 80 GB without recompute; a size whose
// estimate does not fit is skipped with the reason.
//
// Without a GPU it prints "SKIPPED bench_mfu: <reason>" and exits 0, unless
// --device cpu: then it runs a CPU mini-config (the tiny preset, f32, B=2,
// T=128, 1 + 2 steps) so the code path is exercised here too.
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/train_step_bench.h"  // StepSetup, run_step_bench, ceilings, printing

using namespace mpitron;
using namespace mpitron::bench;

namespace {

struct Options {
  std::string configs, device = "cuda", dtype, json;
  int64_t batch = 0, seq = 0, micro_batches = 1;
  int warmup = -1, steps = -1;
  bool recompute = false;
};

[[noreturn]] void usage(int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: bench_mfu [--config 124M,350M,774M,1.5B] [--batch B] [--seq T] [--micro-batches K]\n"
               "                 [--warmup N] [--steps N] [--recompute] [--dtype bf16|f32] [--device cuda|cpu]\n"
               "                 [--json FILE]\n");
  std::exit(rc);
}

int64_t default_batch(const std::string& name) {
  return name == "124M" || name == "350M" || name == "llama-124M" ? 16 : 8;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_mfu: %s needs a value\n", a.c_str());
        usage(2);
      }
      return argv[++i];
    };
    if (a == "--config") o.configs = next();
    else if (a == "--device") o.device = next();
    else if (a == "--dtype") o.dtype = next();
    else if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--seq") o.seq = std::stoll(next());
    else if (a == "--micro-batches") o.micro_batches = std::stoll(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--recompute") o.recompute = true;
    else if (a == "--json") o.json = next();
    else if (a == "--help" || a == "-h") usage(0);
    else {
      std::fprintf(stderr, "bench_mfu: unknown flag %s\n", a.c_str());
      usage(2);
    }
  }
  try {
    Device dev;
    if (o.device == "cuda") {
      if (!cuda_available()) {
        std::printf("SKIPPED bench_mfu: %s (no usable GPU; --device cpu runs a CPU mini-config)\n",
                    cuda_unavailable_reason().c_str());
        return 0;
      }
      dev = Device::cuda(0);
    } else if (o.device == "cpu") {
      dev = Device::cpu();
    } else {
      std::fprintf(stderr, "bench_mfu: --device must be cuda or cpu (got %s)\n", o.device.c_str());
      return 2;
    }
    const bool gpu = dev.is_cuda();
    if (o.configs.empty()) o.configs = gpu ? "124M,350M,774M,1.5B" : "tiny";
    if (o.dtype.empty()) o.dtype = gpu ? "bf16" : "f32";
    MPT_CHECK(o.dtype == "f32" || o.dtype == "bf16", str("--dtype ", o.dtype), "bf16 or f32");
    const DType dt = o.dtype == "f32" ? DType::F32 : DType::BF16;
    const int64_t seq = o.seq > 0 ? o.seq : gpu ? 1024 : 128;
    const int warmup = o.warmup >= 0 ? o.warmup : gpu ? 3 : 1;
    const int steps = o.steps > 0 ? o.steps : gpu ? 10 : 2;

    std::string ceil_what, peak_what;
    double ceiling = measure_gemm_ceiling(dev, gpu ? dt : DType::F32, ceil_what);
    const double peak = datasheet_peak_tflops(dev, dt, peak_what);
    std::printf("bench_mfu: device %s, dtype %s, T=%lld, %d warm-up + %d timed steps, recompute %s\n",
                dev.name().c_str(), o.dtype.c_str(), static_cast<long long>(seq), warmup, steps,
                o.recompute ? "on" : "off");
    std::printf("GEMM ceiling (before): %.4f TFLOP/s (%s); datasheet peak: %s\n", ceiling, ceil_what.c_str(),
                peak_what.c_str());
    const double avail = device_memory_bytes(dev);

    std::vector<StepRow> rows;
    std::vector<std::string> skipped;
    std::stringstream ss(o.configs);
    std::string name;
    while (std::getline(ss, name, ',')) {
      if (name.empty()) continue;
      const Preset& p = find_preset(name);
      StepSetup s;
      s.config_name = p.name;
      apply_preset(p, s.model);  // size and family (a llama-* preset: RMSNorm, SwiGLU, rope, GQA, untied)
      s.model.seq_length = seq;
      s.model.max_position_embeddings = std::max<int64_t>(1024, seq);
      s.model.hidden_dropout = 0.0f;  // as llm.c and the PyTorch peer; dropout is memory-bound work
      s.model.attention_dropout = 0.0f;  // likewise (GPTConfig's default is Megatron's 0.1)
      s.model.compute_dtype = dt;
      s.device = dev;
      s.micro_batch = o.batch > 0 ? o.batch : gpu ? default_batch(p.name) : 2;
      s.micro_batches = o.micro_batches;
      s.warmup = warmup;
      s.steps = steps;
      s.recompute = o.recompute;
      const double need = estimate_step_bytes(s);
      if (avail > 0 && need > 0.92 * avail) {
        const std::string why = str("SKIPPED ", p.name, " B=", s.micro_batch, ": estimated ", gib(need),
                                    " GiB > 92% of the ", gib(avail), " GiB ", gpu ? "on the GPU" : "available");
        std::printf("%s\n", why.c_str());
        skipped.push_back(why);
        continue;
      }
      std::fprintf(stderr, "%s: %.1fM parameters, B=%lld, estimated %s GiB\n", p.name, s.model.num_parameters() / 1e6,
                   static_cast<long long>(s.micro_batch), gib(need).c_str());
      try {
        rows.push_back(run_step_bench(s, peak, ceiling));
      } catch (const Error& e) {
        const std::string why = str("FAILED ", p.name, ": ", e.what());
        std::printf("%s\n", why.c_str());
        skipped.push_back(why);
      }
    }
    std::string after_what;
    const double ceiling_after = measure_gemm_ceiling(dev, gpu ? dt : DType::F32, after_what);
    std::printf("GEMM ceiling (after): %.4f TFLOP/s\n", ceiling_after);
    ceiling = std::max(ceiling, ceiling_after);
    for (StepRow& r : rows) set_mfu(r, peak, ceiling);

    std::printf("\nMFU of the whole training step; MFU(pk) vs %s, MFU(gm) vs %s %.4f TFLOP/s\n",
                gpu ? peak_what.c_str() : "the measured sgemm", ceil_what.c_str(), ceiling);
    print_header();
    for (const StepRow& r : rows) print_row(r);
    if (!o.json.empty()) {
      nlohmann::json j;
      j["bench"] = "bench_mfu";
      j["device"] = dev.name();
      j["gemm_ceiling_tflops"] = ceiling;
      j["gemm_ceiling_what"] = ceil_what;
      j["peak_tflops"] = peak;
      j["peak_what"] = peak_what;
      j["flops_formula"] = "6*N_matmul + 6*L*T*C per token (docs/flops.md)";
      j["rows"] = nlohmann::json::array();
      for (const StepRow& r : rows) j["rows"].push_back(to_json(r));
      j["skipped"] = skipped;
      std::ofstream(o.json) << j.dump(2) << "\n";
      std::printf("wrote %s\n", o.json.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_mfu: %s\n", e.what());
    return 1;
  }
  return 0;
}
