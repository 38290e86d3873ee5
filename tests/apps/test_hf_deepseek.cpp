// DeepseekV3ForCausalLM both ways (model/families/deepseek.cpp) against transformers 4.57's float64
// reference (tests/reference/hf_deepseek_ref.py, outputs in tests/apps/ref/hf_deepseek_v3/ and
// hf_deepseek_v3_noqlora/): multi-latent attention with q-lora (and without: a plain q_proj), yarn rope with
// its mscale, q/k heads of 24 and value heads of 12, 2 dense then 2 MoE layers of 8 sigmoid-scored experts
// in 4 groups (the best 2 groups, the sum of each group's best 2 as transformers scores them), the
// e_score_correction_bias, a shared expert, routed_scaling_factor 2.5, and one MTP module
// (model.layers.4.*, DeepSeek's layout, which transformers does not read):
//  * logits within 2e-5 of transformers' f64 (fp32 arithmetic over 4 layers of width 40: ~1e-6 seen);
//  * the mean loss within 1e-5 relative, every parameter's gradient norm within 1e-4 relative and samples
//    within 1e-4 (relative, plus 1e-4 × the tensor's rms: f32 accumulation over 2 batches of 12 tokens);
//  * the MTP loss (Megatron-Core's formula, transcribed in the reference and checked there against
//    megatron-core 0.16.1) within 1e-5 relative, and d(mtp loss)/d(param) within 1e-4;
//  * transformers' greedy tokens (12 per prompt) exactly, here by re-running the whole sequence;
//  * HF -> mpitron -> HF bitwise, and transformers gives the reference from the export (with the venv).
// mpitron-test: label=long
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "autograd/tape.h"
#include "io/safetensors.h"
#include "model/arch_fields.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "tensor/ops.h"

using namespace mpitron;
using apps_test::TempDir;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::ints;
using apps_test::logit_err;
using nlohmann::json;

namespace {

std::string dir_of(const std::string& name) { return apps_test::kSource + "/tests/apps/ref/hf_" + name; }

// Every gradient in `want` ({HF name: {norm, rms, sample}}) against ours, exported under HF names.
void check_grads(GPT& model, const Tensor& grads, const json& want, const std::string& what) {
  const io::Safetensors g = hf_from_gpt(model, {}, &grads);
  double worst = 0;
  for (auto it = want.begin(); it != want.end(); ++it) {
    REQUIRE_MESSAGE(g.has(it.key()), it.key());
    const std::vector<float> v = g.to_f32(it.key()).to_floats();
    double n2 = 0;
    for (float x : v) n2 += double(x) * x;
    const double norm = std::sqrt(n2), want_norm = it.value()["norm"], rms = it.value()["rms"];
    worst = std::max(worst, std::abs(norm - want_norm) / want_norm);
    CHECK_MESSAGE(std::abs(norm - want_norm) <= 1e-4 * want_norm, what, " ", it.key(), ": |grad| ", norm, " vs ", want_norm);
    for (const auto& s : it.value()["sample"]) {
      const double got = v[s[0].get<size_t>()], x = s[1];
      CHECK_MESSAGE(std::abs(got - x) <= 1e-4 * std::abs(x) + 1e-4 * rms, what, " ", it.key(), "[", s[0], "] ", got, " vs ", x);
    }
  }
  MESSAGE(what, ": worst relative gradient-norm difference ", worst, " over ", want.size(), " tensors");
}

void check_deepseek(const std::string& name) {
  const json ref = json::parse(slurp(dir_of(name) + "/ref.json"));
  const HfCheckpoint ck = read_hf_checkpoint(dir_of(name));
  GPTConfig cfg = hf_config(ck.config_json, 4);
  CHECK(cfg.family() == "deepseek_v3");
  CHECK(cfg.multi_latent_attention);
  CHECK(cfg.mtp_num_layers == 1);
  cfg.mtp_loss_scaling_factor = 1.0f;  // the training loss is lm + mtp_1: its gradient minus lm's is mtp's
  auto model = gpt_from_hf(ck, cfg);
  for (size_t b = 0; b < ref["batches"].size(); ++b) {
    const json& r = ref["batches"][b];
    const Tensor in = ints(r["ids"]), tgt = ints(r["targets"]);
    const double err = logit_err(model->logits(in), r["logits"], 100);
    MESSAGE(name, " batch ", b, ": max |logit - transformers f64| = ", err);
    CHECK(err < 2e-5);
    Tape tape;
    model->params().zero_grad();
    ForwardOptions o;
    o.train = false;  // the main head's loss only (Megatron's evaluation)
    Var loss = model->forward(tape, in, tgt, o);
    const double want = r["loss"];
    MESSAGE(name, " batch ", b, ": loss ", loss.value().item(), " vs transformers ", want);
    CHECK(std::abs(loss.value().item() - want) <= 1e-5 * want);
    const bool grads = r.contains("grads") && r["grads"].is_object();  // batch 0's (the reference's choice)
    tape.backward(loss);
    const Tensor lm_grads = model->params().grads().clone();
    if (grads) check_grads(*model, lm_grads, r["grads"], name + " lm loss");
    // Training: lm + mtp_1 (no dropout in the config, no auxiliary losses without a MoE run).
    Tape t2;
    model->params().zero_grad();
    o.train = true;
    Var total = model->forward(t2, in, tgt, o);
    REQUIRE(model->last_mtp_losses().size() == 1);
    const double mtp = model->last_mtp_losses()[0], want_mtp = r["mtp"]["loss"];
    MESSAGE(name, " batch ", b, ": mtp_1 loss ", mtp, " vs Megatron's formula ", want_mtp);
    CHECK(std::abs(mtp - want_mtp) <= 1e-5 * want_mtp);
    CHECK(std::abs(model->last_lm_loss() - want) <= 1e-5 * want);
    CHECK(std::abs(total.value().item() - (want + want_mtp)) <= 1e-5 * (want + want_mtp));
    if (!grads || !r.contains("mtp_grads") || !r["mtp_grads"].is_object()) continue;
    t2.backward(total);
    Tensor mtp_grads = model->params().grads().clone();
    axpby(-1.0f, lm_grads, 1.0f, mtp_grads);
    check_grads(*model, mtp_grads, r["mtp_grads"], name + " mtp loss");
  }
  // transformers' greedy tokens: the whole sequence re-run for each token (the latent KV cache serves them
  // in the serving tests).
  for (const json& g : ref["greedy"]) {
    std::vector<int64_t> seq = g["prompt"].get<std::vector<int64_t>>();
    const std::vector<int32_t> want = g["tokens"].get<std::vector<int32_t>>();
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const Tensor lg = model->logits(Tensor::from_ints(seq, {1, static_cast<int64_t>(seq.size())}));
      const std::vector<float> v = lg.to_floats();
      const int64_t Vp = lg.dim(1), row = static_cast<int64_t>(seq.size()) - 1;
      int32_t best = 0;
      for (int32_t t = 1; t < 100; ++t)
        if (v[static_cast<size_t>(row * Vp + t)] > v[static_cast<size_t>(row * Vp + best)]) best = t;
      got.push_back(best);
      seq.push_back(best);
    }
    CHECK_MESSAGE(got == want, name, " prompt ", g["prompt"].dump());
  }
}

}  // namespace

TEST_CASE("DeepSeek-V3 (transformers 4.57): logits, loss, gradients, MTP loss and greedy tokens on import") {
  check_deepseek("deepseek_v3");
}

TEST_CASE("DeepSeek-V3 without q-lora (a plain q_proj)") { check_deepseek("deepseek_v3_noqlora"); }

TEST_CASE("DeepSeek-V3: HF -> mpitron -> HF is bitwise (MTP module included); transformers loads the export") {
  const std::string py = apps_test::venv_python();
  TempDir tmp("hfdeepseek");
  const std::string dir = dir_of("deepseek_v3"), ckpt = tmp / "ckpt";
  const HfCheckpoint ck = read_hf_checkpoint(dir);
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + dir + " --output " + ckpt,
                          tmp / "in.log") == 0, slurp(tmp / "in.log"));
  InferenceModel m = load_model_for_inference(ckpt);
  CHECK(m.model->config().family() == "deepseek_v3");
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf",
                          tmp / "out.log") == 0, slurp(tmp / "out.log"));
  const HfCheckpoint back = read_hf_checkpoint(tmp / "hf");
  for (const io::SafeTensor& t : ck.tensors.tensors) {
    // The MTP module's copies of the embedding and output layer are not written (transformers reads neither).
    if (t.name.find(".embed_tokens.") != std::string::npos && t.name != "model.embed_tokens.weight") continue;
    if (t.name.find("shared_head.head") != std::string::npos) continue;
    REQUIRE_MESSAGE(back.tensors.has(t.name), t.name);
    CHECK(back.tensors.at(t.name).shape == t.shape);
    CHECK_MESSAGE(back.tensors.at(t.name).bytes == t.bytes, t.name);
  }
  CHECK(field_differences(hf_config(back.config_json), hf_config(ck.config_json)).empty());
  if (py.empty()) {
    MESSAGE("SKIPPED transformers load of the export: no reference venv (scripts/setup-reference-venv.sh)");
    return;
  }
  const int rc = std::system(("'" + py + "' " + apps_test::kSource + "/tests/reference/hf_deepseek_ref.py --family deepseek_v3" +
                              " --check-export " + tmp / "hf" + " > " + tmp / "py.log 2>&1").c_str());
  MESSAGE(slurp(tmp / "py.log"));
  CHECK_MESSAGE(rc == 0, "transformers did not reproduce the reference from the export: ", slurp(tmp / "py.log"));
}

// Served from the latent KV cache (generate_text: the dynamic engine, paged_layers, MLA's absorbed decode):
// the cache holds kv_lora_rank + qk_rope_head_dim = 16 + 8 values per token per layer; transformers' greedy
// tokens at TP1 and TP2; 16 concurrent requests give the one-at-a-time tokens; speculative decoding with the
// MTP layer (--num-speculative-tokens 1) gives exactly the plain greedy tokens and logs its acceptance.
TEST_CASE("DeepSeek-V3: generate_text from the latent KV cache (TP1, TP2, 16 at once, MTP speculative decoding)") {
  TempDir tmp("hfdeepseek_gen");
  const std::string dir = dir_of("deepseek_v3");
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + dir + " --output " + tmp / "ck",
                          tmp / "in.log") == 0, slurp(tmp / "in.log"));
  const json ref = json::parse(slurp(dir + "/ref.json"));
  const size_t nref = ref["greedy"].size();
  {
    std::ofstream ids(tmp / "ids.txt");
    for (const json& g : ref["greedy"]) {
      std::string line;
      for (const json& id : g["prompt"]) line += (line.empty() ? "" : " ") + std::to_string(id.get<int>());
      ids << line << "\n";
    }
    for (size_t i = nref; i < 16; ++i) {  // more prompts of other lengths, for the batch
      std::string line;
      for (size_t j = 0; j < 2 + i % 7; ++j) line += (j ? " " : "") + std::to_string((i * 37 + j * 11) % 100);
      ids << line << "\n";
    }
  }
  const auto generate = [&](const std::string& extra, int np, const std::string& name) {
    const std::string args = "--load " + tmp / "ck" + " --sample-input-ids-file " + tmp / "ids.txt" +
                             " --greedy --out-seq-length 12 --genfile " + tmp / (name + ".jsonl") + " " + extra;
    const std::string cmd = np == 1 ? "OMP_NUM_THREADS=1 apps/generate_text " + args
                                    : "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 apps/generate_text " +
                                          args + " --tensor-model-parallel-size 2";
    const int rc = std::system((cmd + " > " + tmp / (name + ".log") + " 2>&1").c_str());
    REQUIRE_MESSAGE(rc == 0, slurp(tmp / (name + ".log")));
    std::vector<std::vector<int>> out;
    std::ifstream in(tmp / (name + ".jsonl"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) out.push_back(json::parse(line)["tokens"].get<std::vector<int>>());
    REQUIRE(out.size() == 16);
    return out;
  };
  const auto one = generate("--inference-dynamic-batching-max-requests 1", 1, "one");
  CHECK_MESSAGE(slurp(tmp / "one.log").find("24 values (the latent 16 + the rope key 8)") != std::string::npos,
                slurp(tmp / "one.log"));
  for (size_t i = 0; i < nref; ++i)
    CHECK_MESSAGE(one[i] == ref["greedy"][i]["tokens"].get<std::vector<int>>(), "prompt ", i, ": ", slurp(tmp / "one.log"));
  CHECK(generate("--inference-dynamic-batching-max-requests 16", 1, "batch") == one);
  CHECK(generate("--inference-dynamic-batching-max-requests 16", 2, "tp2") == one);
  const auto spec = generate("--inference-dynamic-batching-max-requests 16 --num-speculative-tokens 1", 1, "spec");
  CHECK(spec == one);
  const std::string log = slurp(tmp / "spec.log");
  MESSAGE(log);
  CHECK(log.find("MTP drafts accepted") != std::string::npos);
  CHECK(generate("--inference-dynamic-batching-max-requests 1 --num-speculative-tokens 1", 2, "spec_tp2") == one);
  // More drafts than the model has MTP layers: refused by name.
  const int rc = std::system(("OMP_NUM_THREADS=1 apps/generate_text --load " + tmp / "ck" + " --sample-input-ids-file " +
                              tmp / "ids.txt" + " --greedy --out-seq-length 4 --num-speculative-tokens 2 > " +
                              tmp / "bad.log 2>&1").c_str());
  CHECK(rc != 0);
  CHECK_MESSAGE(slurp(tmp / "bad.log").find("--num-speculative-tokens") != std::string::npos, slurp(tmp / "bad.log"));
}
