// The families of the sublayer options on the CUDA device (the simulated one in `make test-cuda-sim`;
// a GPU in tools/gpu_check.sh): rope scaling (llama3, linear, dynamic, yarn) in the rope kernel,
// QK-norm (per head and over the TP-split width) in the head-norm kernels, soft-capped attention (the
// cuBLAS fallback: cuDNN takes no soft-cap) and logits, sliding and global layers, sandwich and output
// norms, partial rotary — against transformers 4.57's float64 references (tests/reference/
// hf_family2_ref.py). f32: logits within 1e-4 (cuBLAS's f32 GEMMs sum in another order than OpenBLAS's;
// the CPU path is within 2e-5), loss 1e-4 relative, gradient norms 1e-3 relative, transformers' greedy
// tokens exactly (both cache attention paths); bf16: a 3% relative L2 error on the logits (8 significant
// bits through ~20 roundings per value, as test_gpt_reference's bf16 bound).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/device.h"
#include "io/safetensors.h"
#include "model/inference/generate.h"
#include "model/inference/hf_convert.h"

using namespace mpitron;
using nlohmann::json;

namespace {

const std::string kRef = std::string(MPITRON_SOURCE_DIR) + "/tests/apps/ref/hf_";

json ref_json(const std::string& name) {
  std::ifstream f(kRef + name + "/ref.json");
  std::stringstream s;
  s << f.rdbuf();
  return json::parse(s.str());
}

Tensor ints(const json& rows) {
  std::vector<int64_t> v;
  int64_t b = 0, t = 0;
  for (const auto& r : rows) {
    t = static_cast<int64_t>(r.size());
    for (const auto& x : r) v.push_back(x.get<int64_t>());
    ++b;
  }
  return Tensor::from_ints(v, {b, t});
}

// Max |ours − want| over (B·T, V) logits against the reference's (B, T, V), and the relative L2 error.
std::pair<double, double> logit_errors(const Tensor& logits, const json& want) {
  const std::vector<float> got = logits.to(Device::cpu()).to(DType::F32).to_floats();
  const int64_t V = logits.dim(1);
  double worst = 0, d2 = 0, n2 = 0;
  int64_t row = 0;
  for (const auto& b : want)
    for (const auto& t : b) {
      for (size_t k = 0; k < t.size(); ++k) {
        const double w = t[k], g = got[static_cast<size_t>(row * V) + k];
        worst = std::max(worst, std::abs(g - w));
        d2 += (g - w) * (g - w), n2 += w * w;
      }
      ++row;
    }
  return {worst, std::sqrt(d2 / n2)};
}

}  // namespace

TEST_CASE("the sublayer options' families on CUDA: f32 logits, loss, gradients and greedy tokens; bf16 logits") {
  if (!cuda_available()) {
    MESSAGE("SKIPPED cuda: ", cuda_unavailable_reason());
    return;
  }
  // MPITRON_FAMILIES2_CUDA (comma-separated) narrows the set: the simulated device runs one model of each new
  // kernel path (tests/cuda_sim/run.sh); a GPU runs them all.
  std::vector<std::string> names = {"llama3", "llama3_linear", "llama3_dynamic", "llama3_yarn", "qwen3", "qwen3_moe",
                                    "gemma2", "gemma3", "olmo2", "phi3", "phi4_mini"};
  if (const char* only = std::getenv("MPITRON_FAMILIES2_CUDA")) {
    names.clear();
    std::stringstream in(only);
    for (std::string n; std::getline(in, n, ',');) names.push_back(n);
  }
  for (const std::string& name : names) {
    CAPTURE(name);
    const json ref = ref_json(name);
    const HfCheckpoint ck = read_hf_checkpoint(kRef + name);
    const GPTConfig base = hf_config(ck.config_json, 4);
    auto cpu = gpt_from_hf(ck, base);
    const json& r = ref["batches"][0];
    for (const DType dt : {DType::F32, DType::BF16}) {
      GPTConfig cfg = base;
      cfg.compute_dtype = dt;
      GPT m(cfg, Device::cuda(0));
      m.params().values().copy_from(cpu->params().values().to(dt).to(Device::cuda(0)));
      const auto [worst, rel] = logit_errors(m.logits(ints(r["ids"])), r["logits"]);
      if (dt == DType::BF16) {
        MESSAGE(name, " bf16 on CUDA: relative L2 logit error ", rel);
        CHECK(rel < 3e-2);
        continue;
      }
      MESSAGE(name, " f32 on CUDA: max |logit - transformers f64| = ", worst);
      CHECK(worst < 1e-4);
      Tape tape;
      m.params().zero_grad();
      ForwardOptions o;
      o.train = false;
      Var loss = m.forward(tape, ints(r["ids"]), ints(r["targets"]), o);
      CHECK(std::abs(loss.value().item() - r["loss"].get<double>()) <= 1e-4 * r["loss"].get<double>());
      tape.backward(loss);
      const Tensor grads = m.params().grads().to(Device::cpu()).to(DType::F32);
      const io::Safetensors g = hf_from_gpt(*cpu, {}, &grads);  // the CPU model's layout, the device's values
      for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
        if (it.value().contains("padding_idx")) continue;  // transformers gives its pad row no lookup gradient
        const std::vector<float> v = g.to_f32(it.key()).to_floats();
        double n2 = 0;
        for (float x : v) n2 += double(x) * x;
        const double want = it.value()["norm"];
        CHECK_MESSAGE(std::abs(std::sqrt(n2) - want) <= 1e-3 * want + 1e-6, it.key(), ": |grad| ", std::sqrt(n2), " vs ", want);
      }
      std::vector<std::vector<int32_t>> prompts, want;
      for (const json& gr : ref["greedy"]) {
        prompts.push_back(gr["prompt"].get<std::vector<int32_t>>());
        want.push_back(gr["tokens"].get<std::vector<int32_t>>());
      }
      GenerateOptions go;
      go.max_new_tokens = static_cast<int64_t>(want[0].size());
      go.stop_at_eod = false;
      go.sampling.greedy = true;
      const GenerateOutput out = generate(m, prompts, go);
      for (size_t i = 0; i < prompts.size(); ++i) CHECK_MESSAGE(out.generated[i] == want[i], name, " prompt ", i);
    }
  }
}
