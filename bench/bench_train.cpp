// bench/bench_train.cpp — the whole training step (forward + backward + AdamW
// over micro-batches) through the library, per model size, with and without
// --recompute-activations, optionally beside the PyTorch peer.
//
//   bench_train [--config tiny,124M,llama-124M,... | all] [--device auto|cpu|cuda] [--dtype f32|bf16]
//               [--batch B] [--seq T] [--micro-batches K] [--warmup N] [--steps N]
//               [--recompute off|on|both] [--dropout P] [--threads N] [--json FILE]
//               [--peer] [--peer-compile] [--python PY] [--peer-script PATH] [--profile]
//
// Presets (train_step_bench.h): GPT-2 tiny, 124M, 350M, 774M, 1.3B, 1.5B and the Llama
// family llama-tiny, llama-124M (the GPT-2 sizes with RMSNorm, SwiGLU, rope, GQA, an
// untied head, no biases) and llama-1B (the Llama 3.2 1B shape); the Mixtral-style MoE rows
// moe-tiny and moe-124M (8 experts, top-2, the active size of the Llama row above them), and the
// DeepSeek-V3-style mla-moe-tiny and mla-moe-124M (multi-latent attention, group-limited sigmoid routing,
// the same experts; their KV-cache bytes per token are printed beside the GQA rows').
// Defaults — CPU: tiny, llama-tiny, moe-tiny, 124M, llama-124M, f32, B=4, T=256, 1 warm-up + 3
// timed steps; CUDA: tiny, llama-tiny, moe-tiny, 124M, llama-124M, moe-124M, 350M, 1.3B, llama-1B, bf16,
// B=8, T=1024, 3 warm-up + 10 timed steps. Rows print in --config order, so a Llama
// row sits under the GPT-2 row of its size.
// Both: recompute off and on, K=1 micro-batch, dropout 0 (--dropout: hidden dropout, the peer's too),
// attention dropout 0 (the peer has none; Megatron's default 0.1 would also take cuDNN attention off).
// A size whose estimated memory (train_step_bench.h: estimate_step_bytes)
// exceeds what the device has is skipped with the reason printed.
//
// Columns: see train_step_bench.h. FLOPs: GPTConfig::flops_per_token
// (6·N_matmul + 6·L·T·C, docs/flops.md). MFU(pk) is against the H100 datasheet
// (CUDA) or the sgemm ceiling (CPU: there is no datasheet number); MFU(gm) is
// against the GEMM ceiling measured in this run (before and after the rows; the
// larger is used, since the machine may be shared).
// After the rows, the recompute memory saving per size, and with --peer the
// PyTorch rows (bench/peers/torch_gpt.py, same config and family, batch, threads,
// steps) and the ratio mpitron / PyTorch of tokens/s, per config (GPT-2 and Llama).
// --profile: each row's timed steps between cudaProfilerStart/Stop (core/profiler.h), for
// `ncu --profile-from-start off` (tools/gpu_check.sh's profile step, bench/kernel_profile.py).
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/train_step_bench.h"  // StepSetup, run_step_bench, ceilings, printing
#include "model/inference/paged_kv_cache.h"  // kv_layout: the KV-cache bytes per token

using namespace mpitron;
using namespace mpitron::bench;

namespace {

struct Options {
  std::string configs, device = "auto", dtype, recompute = "both", json;
  int64_t batch = 0, seq = 0, micro_batches = 1;
  int warmup = -1, steps = -1, threads = 0;
  float dropout = 0.0f;
  bool peer = false, peer_compile = false, profile = false;
  std::string optimizer = "adam";  // adam | sgd | muon (its Newton-Schulz timed in the step)
  std::string python = "python3", peer_script;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

[[noreturn]] void usage(int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: bench_train [--config NAME,NAME,...|all] [--device auto|cpu|cuda]\n"
               "                   [--dtype f32|bf16] [--batch B] [--seq T] [--micro-batches K] [--warmup N]\n"
               "                   [--steps N] [--recompute off|on|both] [--dropout P] [--threads N]\n"
               "                   [--json FILE] [--peer] [--peer-compile] [--python PY] [--peer-script PATH]\n"
               "                   [--profile] [--optimizer adam|sgd|muon]\n"
               "presets: %s\n",
               preset_names().c_str());
  std::exit(rc);
}

// bench/peers/torch_gpt.py: from the working directory (the repository root),
// else next to this source file.
std::string find_peer_script(const Options& o) {
  if (!o.peer_script.empty()) return o.peer_script;
  namespace fs = std::filesystem;
  for (const fs::path& p : {fs::path("bench/peers/torch_gpt.py"), fs::path(__FILE__).parent_path() / "peers/torch_gpt.py"})
    if (fs::exists(p)) return p.string();
  MPT_THROW("bench/peers/torch_gpt.py not found", "run from the repository root or pass --peer-script PATH");
}

// Runs the PyTorch peer on the same setup; returns its row (impl "pytorch").
bool run_peer(const Options& o, const StepSetup& s, StepRow& out) {
  const std::string tmp = (std::filesystem::temp_directory_path() / ("bench_train_peer_" + std::to_string(::getpid()) + ".json")).string();
  const GPTConfig& c = s.model;
  // The peer has the GPT-2 and the Llama architectures (family() "custom" cannot come from a preset).
  std::string arch = " --family gpt2";
  if (c.family() == "llama" || c.family() == "mixtral")
    arch = str(" --family ", c.moe() ? "moe" : "llama", " --query-groups ", c.query_groups(), " --ffn ", c.ffn(),
               " --rotary-base ", c.rotary_base, " --norm-eps ", c.layernorm_epsilon);
  else
    MPT_CHECK(c.family() == "gpt2", str("--peer for ", s.config_name), "the peer has the gpt2, llama and MoE families");
  if (c.moe())
    arch += str(" --experts ", c.num_experts, " --topk ", c.moe_router_topk, " --expert-ffn ", c.moe_ffn(),
                " --aux-loss-coeff 0.01");
  const std::string cmd =
      str(o.python, " ", find_peer_script(o), " --name ", s.config_name, " --layers ", c.num_layers, " --hidden ",
          c.hidden_size, " --heads ", c.num_attention_heads, arch, " --vocab ", c.vocab_size, " --padded-vocab ",
          c.padded_vocab_size, " --seq ", c.seq_length, " --batch ", s.micro_batch, " --micro-batches ",
          s.micro_batches, " --warmup ", s.warmup, " --steps ", s.steps, " --dropout ", c.hidden_dropout,
          " --device ", s.device.is_cuda() ? "cuda" : "cpu", " --dtype ", dtype_name(c.compute_dtype), " --threads ",
          omp_get_max_threads(), o.peer_compile ? " --compile" : "", " --json ", tmp);
  std::fprintf(stderr, "peer: %s\n", cmd.c_str());
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::printf("PEER FAILED (exit %d): %s\n", rc, cmd.c_str());
    return false;
  }
  std::ifstream f(tmp);
  nlohmann::json j;
  f >> j;
  std::filesystem::remove(tmp);
  out = row_from_json(j.contains("rows") ? j["rows"][0] : j);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_train: %s needs a value\n", a.c_str());
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
    else if (a == "--recompute") o.recompute = next();
    else if (a == "--dropout") o.dropout = std::stof(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else if (a == "--json") o.json = next();
    else if (a == "--peer") o.peer = true;
    else if (a == "--peer-compile") o.peer_compile = true;
    else if (a == "--python") o.python = next();
    else if (a == "--peer-script") o.peer_script = next();
    else if (a == "--profile") o.profile = true;
    else if (a == "--optimizer") o.optimizer = next();
    else if (a == "--help" || a == "-h") usage(0);
    else {
      std::fprintf(stderr, "bench_train: unknown flag %s\n", a.c_str());
      usage(2);
    }
  }
  if (o.recompute != "off" && o.recompute != "on" && o.recompute != "both") {
    std::fprintf(stderr, "bench_train: --recompute must be off, on or both (got %s)\n", o.recompute.c_str());
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear in order with the stderr progress
  try {
    if (o.threads > 0) omp_set_num_threads(o.threads);
    Device dev = Device::cpu();
    if (o.device == "cuda" || (o.device == "auto" && cuda_available())) {
      if (!cuda_available()) {
        std::printf("SKIPPED bench_train --device cuda: %s\n", cuda_unavailable_reason().c_str());
        return 0;
      }
      dev = Device::cuda(0);
    } else if (o.device != "cpu" && o.device != "auto") {
      std::fprintf(stderr, "bench_train: --device must be auto, cpu or cuda (got %s)\n", o.device.c_str());
      return 2;
    }
    const bool gpu = dev.is_cuda();
    if (o.configs.empty())
      o.configs = gpu ? "tiny,llama-tiny,moe-tiny,124M,llama-124M,moe-124M,350M,1.3B,llama-1B"
                      : "tiny,llama-tiny,moe-tiny,124M,llama-124M";
    if (o.configs == "all") o.configs = preset_names();
    if (o.dtype.empty()) o.dtype = gpu ? "bf16" : "f32";
    MPT_CHECK(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "f16", str("--dtype ", o.dtype), "f32, bf16 or f16");
    const DType dt = o.dtype == "f32" ? DType::F32 : o.dtype == "bf16" ? DType::BF16 : DType::F16;
    const int64_t batch = o.batch > 0 ? o.batch : gpu ? 8 : 4;
    const int64_t seq = o.seq > 0 ? o.seq : gpu ? 1024 : 256;
    const int warmup = o.warmup >= 0 ? o.warmup : gpu ? 3 : 1;
    const int steps = o.steps > 0 ? o.steps : gpu ? 10 : 3;
    std::vector<bool> rc_modes;
    if (o.recompute != "on") rc_modes.push_back(false);
    if (o.recompute != "off") rc_modes.push_back(true);

    std::printf("bench_train: device %s, %d OpenMP threads, dtype %s, B=%lld T=%lld micro-batches=%lld, "
                "%d warm-up + %d timed steps, dropout %.2f\n",
                dev.name().c_str(), omp_get_max_threads(), o.dtype.c_str(), static_cast<long long>(batch),
                static_cast<long long>(seq), static_cast<long long>(o.micro_batches), warmup, steps, o.dropout);
    std::string ceil_what, peak_what;
    double ceiling = measure_gemm_ceiling(dev, gpu ? dt : DType::F32, ceil_what);
    const double peak = datasheet_peak_tflops(dev, dt, peak_what);
    std::printf("GEMM ceiling (before): %.4f TFLOP/s (%s); datasheet peak: %s\n", ceiling, ceil_what.c_str(),
                peak_what.c_str());
    const double avail = device_memory_bytes(dev);

    std::vector<StepRow> rows, peer_rows;
    std::vector<std::string> skipped;
    std::vector<StepSetup> setups;
    for (const std::string& name : split_list(o.configs)) {
      const Preset& p = find_preset(name);
      for (bool rc : rc_modes) {
        StepSetup s;
        s.config_name = p.name;
        apply_preset(p, s.model);  // size and family
        s.model.seq_length = seq;
        s.model.max_position_embeddings = std::max<int64_t>(1024, seq);
        s.model.hidden_dropout = o.dropout;
        s.model.attention_dropout = 0.0f;  // the peers have none (SDPA, llm.c); p > 0 also turns cuDNN attention off
        s.model.compute_dtype = dt;
        s.device = dev;
        s.micro_batch = batch;
        s.micro_batches = o.micro_batches;
        s.warmup = warmup;
        s.steps = steps;
        s.recompute = rc;
        s.profile = o.profile;
        s.optimizer = o.optimizer;
        const double need = estimate_step_bytes(s);
        if (avail > 0 && need > 0.92 * avail) {
          const std::string why = str("SKIPPED ", p.name, rc ? " recompute" : "", ": estimated ", gib(need),
                                      " GiB > 92% of the ", gib(avail), " GiB ", gpu ? "on the GPU" : "available (MemAvailable)");
          std::printf("%s\n", why.c_str());
          skipped.push_back(why);
          continue;
        }
        std::fprintf(stderr, "%s%s: %.1fM parameters, estimated %s GiB\n", p.name, rc ? " (recompute)" : "",
                     s.model.num_parameters() / 1e6, gib(need).c_str());
        try {
          rows.push_back(run_step_bench(s, peak, ceiling));
          setups.push_back(s);
          if (rows.back().raw_allocs_timed >= 0)
            std::fprintf(stderr, "  %s%s: %.0f cudaMalloc segments during the timed steps\n", p.name,
                         rc ? " (recompute)" : "", rows.back().raw_allocs_timed);
        } catch (const Error& e) {
          const std::string why = str("FAILED ", p.name, rc ? " recompute" : "", ": ", e.what());
          std::printf("%s\n", why.c_str());
          skipped.push_back(why);
        }
      }
    }
    std::string after_what;
    const double ceiling_after = measure_gemm_ceiling(dev, gpu ? dt : DType::F32, after_what);
    std::printf("GEMM ceiling (after): %.4f TFLOP/s\n", ceiling_after);
    ceiling = std::max(ceiling, ceiling_after);
    for (StepRow& r : rows) set_mfu(r, peak, ceiling);

    if (o.peer) {
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].recompute) continue;  // the peer keeps every activation
        StepRow pr;
        if (run_peer(o, setups[i], pr)) {
          set_mfu(pr, peak, ceiling);
          peer_rows.push_back(pr);
        }
      }
    }

    std::printf("\nwhole training step: forward + backward + AdamW; MFU(pk) vs %s, MFU(gm) vs %s %.4f TFLOP/s; "
                "mem: %s\n",
                gpu ? peak_what.c_str() : "the measured sgemm", ceil_what.c_str(), ceiling,
                gpu ? "peak live tensor bytes (caching allocator); rsv: peak reserved (its segments, live + cached)"
                    : "peak live tensor bytes; RSS: peak RSS above the pre-model RSS (VmHWM, whole process)");
    print_header();
    for (const StepRow& r : rows) print_row(r);
    for (const StepRow& r : peer_rows) print_row(r);
    // What serving the model keeps per token (model/inference/paged_kv_cache.h): the GQA rows' keys and
    // values against multi-latent attention's latent row.
    std::string kv_seen;
    for (const StepSetup& s : setups) {
      if (kv_seen.find("," + s.config_name + ",") != std::string::npos) continue;
      kv_seen += "," + s.config_name + ",";
      const KvLayout k = kv_layout(s.model, 1);
      std::printf("KV cache %s: %s per token per layer, %s bytes per token (%lld layers, bf16)\n", s.config_name.c_str(),
                  describe(k, DType::BF16).c_str(),
                  std::to_string(k.elements_per_token() * 2 * s.model.num_layers).c_str(),
                  static_cast<long long>(s.model.num_layers));
    }

    nlohmann::json savings = nlohmann::json::array();
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t j = 0; j < rows.size(); ++j) {
        if (rows[i].config != rows[j].config || rows[i].recompute || !rows[j].recompute) continue;
        const double off = rows[i].peak_bytes, on = rows[j].peak_bytes;
        const double saved = off - on, slow = 1.0 - rows[j].tokens_per_s / rows[i].tokens_per_s;
        std::printf("recompute %s: peak tensor memory %s -> %s GiB, saves %s GiB (%.1f%%); tokens/s %.1f%% %s",
                    rows[i].config.c_str(), gib(off).c_str(), gib(on).c_str(), gib(saved).c_str(),
                    off > 0 ? 100.0 * saved / off : 0.0, 100.0 * std::abs(slow), slow >= 0 ? "lower" : "higher");
        if (rows[i].rss_peak_bytes > 0)
          std::printf("; peak RSS %s -> %s GiB", gib(rows[i].rss_peak_bytes).c_str(), gib(rows[j].rss_peak_bytes).c_str());
        std::printf("\n");
        savings.push_back({{"config", rows[i].config}, {"peak_bytes_off", off}, {"peak_bytes_on", on},
                           {"saved_bytes", saved}, {"saved_fraction", off > 0 ? saved / off : 0.0},
                           {"rss_peak_bytes_off", rows[i].rss_peak_bytes}, {"rss_peak_bytes_on", rows[j].rss_peak_bytes},
                           {"tokens_per_s_off", rows[i].tokens_per_s}, {"tokens_per_s_on", rows[j].tokens_per_s}});
      }
    nlohmann::json ratios = nlohmann::json::array();
    for (const StepRow& p : peer_rows)
      for (const StepRow& r : rows) {
        if (r.recompute || r.config != p.config) continue;
        const double ratio = p.tokens_per_s > 0 ? r.tokens_per_s / p.tokens_per_s : 0;
        std::printf("mpitron / PyTorch %s (%s): %.1f / %.1f tokens/s = %.2fx\n", r.config.c_str(), r.family.c_str(),
                    r.tokens_per_s, p.tokens_per_s, ratio);
        // The two must count the same model: parameters and FLOPs per token (docs/flops.md).
        if (p.params != r.params || std::abs(p.flops_per_token - r.flops_per_token) > 1e-9 * r.flops_per_token)
          std::printf("WARNING %s: the peer's model differs: params %lld vs %lld, FLOPs/token %.6g vs %.6g\n",
                      r.config.c_str(), static_cast<long long>(p.params), static_cast<long long>(r.params),
                      p.flops_per_token, r.flops_per_token);
        ratios.push_back({{"config", r.config}, {"family", r.family}, {"mpitron_tokens_per_s", r.tokens_per_s},
                          {"pytorch_tokens_per_s", p.tokens_per_s}, {"ratio", ratio}});
      }

    if (!o.json.empty()) {
      nlohmann::json j;
      j["bench"] = "bench_train";
      j["device"] = dev.name();
      j["threads"] = omp_get_max_threads();
      j["gemm_ceiling_tflops"] = ceiling;
      j["gemm_ceiling_what"] = ceil_what;
      j["peak_tflops"] = peak;
      j["peak_what"] = peak_what;
      j["flops_formula"] = "6*N_matmul + 6*L*T*C per token (docs/flops.md)";
      j["rows"] = nlohmann::json::array();
      for (const StepRow& r : rows) j["rows"].push_back(to_json(r));
      j["peer_rows"] = nlohmann::json::array();
      for (const StepRow& r : peer_rows) j["peer_rows"].push_back(to_json(r));
      j["recompute_saving"] = savings;
      j["peer_ratio"] = ratios;
      j["skipped"] = skipped;
      std::ofstream(o.json) << j.dump(2) << "\n";
      std::printf("wrote %s\n", o.json.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
