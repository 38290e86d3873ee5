// The families users download in 2026 — Llama 3.x (rope scaling llama3, linear, dynamic, yarn),
// Qwen3 and Qwen3-MoE (QK-norm, a head width of its own), Gemma 2 and Gemma 3 (soft-capping,
// sliding and global layers, sandwich norms, QK-norm, local rope base), OLMo-2 (norms on the
// sublayers' outputs, QK-norm over the whole width) and Phi-3 / Phi-4-mini (fused qkv_proj and
// gate_up_proj, partial rotary) — against transformers 4.57 (tests/reference/hf_family2_ref.py,
// run in the PyPI venv of scripts/setup-reference-venv.sh: a random model of each, shrunk from its
// published config.json and saved by save_pretrained, with float64 logits, loss, gradients and
// greedy decoding in tests/apps/ref/hf_<name>/), through the one converter:
//  * config.json imports flag-less as the family (its identity recorded: family());
//  * logits within 2e-5 of transformers' float64 ones, the loss within 1e-5 relative, every
//    parameter gradient's norm within 1e-4 relative and sampled entries within 1e-4·|g| + 1e-4·rms
//    (f32 against float64 on the same f32 weights, 2–4 layers of width 48: the f32 rounding of a
//    few hundred accumulations; transformers keeps the rope angles, softmax and RMSNorm in float32
//    even in a float64 model, ~1e-7 relative);
//  * transformers' greedy tokens (12 per prompt, with the KV cache) exactly;
//  * HF → mpitron → HF bitwise, config.json round-trips, and — where the venv is there —
//    transformers loads the export and gives the same logits and greedy tokens.
// transformers gives the padding row of the embedding no gradient (nn.Embedding's padding_idx) where
// the config has a pad_token_id: ref.json says so, and those rows are compared without it.
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
#include "model/inference/generate.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
using apps_test::TempDir;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::ints;
using apps_test::logit_err;
using nlohmann::json;

namespace {

struct FamilyCase {
  std::string dir;     // tests/apps/ref/hf_<dir>
  std::string family;  // the mpitron family it imports as
};

const std::vector<FamilyCase> kFamilies = {
    {"llama3", "llama"}, {"llama3_linear", "llama"}, {"llama3_dynamic", "llama"}, {"llama3_yarn", "llama"},
    {"qwen3", "qwen3"}, {"qwen3_moe", "qwen3_moe"}, {"gemma2", "gemma2"}, {"gemma3", "gemma3"},
    {"olmo2", "olmo2"}, {"phi3", "phi3"}, {"phi4_mini", "phi3"},
};

std::string dir_of(const std::string& name) { return apps_test::kSource + "/tests/apps/ref/hf_" + name; }

void check_family(const FamilyCase& f) {
  const json ref = json::parse(slurp(dir_of(f.dir) + "/ref.json"));
  const HfCheckpoint ck = read_hf_checkpoint(dir_of(f.dir));
  const GPTConfig cfg = hf_config(ck.config_json, 4);  // 100 divides by 4: no padding, the loss is HF's
  CHECK(cfg.family() == f.family);
  CHECK(cfg.padded_vocab_size == 100);
  auto model = gpt_from_hf(ck, cfg);
  for (size_t b = 0; b < ref["batches"].size(); ++b) {
    const json& r = ref["batches"][b];
    const Tensor in = ints(r["ids"]), tgt = ints(r["targets"]);
    const double err = logit_err(model->logits(in), r["logits"], 100);
    MESSAGE(f.dir, " batch ", b, ": max |logit - transformers f64| = ", err);
    CHECK(err < 2e-5);
    Tape tape;
    model->params().zero_grad();
    ForwardOptions o;
    o.train = false;
    Var loss = model->forward(tape, in, tgt, o);
    const double want = r["loss"];
    MESSAGE(f.dir, " batch ", b, ": loss ", loss.value().item(), " vs transformers ", want);
    CHECK(std::abs(loss.value().item() - want) <= 1e-5 * want);
    if (!r.contains("grads")) continue;
    tape.backward(loss);
    const Tensor grads = model->params().grads().clone();
    const io::Safetensors g = hf_from_gpt(*model, {}, &grads);
    double worst_norm = 0;
    for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
      REQUIRE_MESSAGE(g.has(it.key()), it.key());
      std::vector<float> v = g.to_f32(it.key()).to_floats();
      const json& w = it.value();
      double want_norm = w["norm"];
      if (w.contains("padding_idx")) {  // transformers' embedding lookup gives the pad row nothing
        const int64_t C = static_cast<int64_t>(v.size()) / 100, pad = w["padding_idx"];
        for (int64_t c = 0; c < C; ++c) v[static_cast<size_t>(pad * C + c)] = 0.0f;
        want_norm = w["norm_without_pad_row"];
      }
      double n2 = 0;
      for (float x : v) n2 += double(x) * x;
      const double norm = std::sqrt(n2), rms = w["rms"];
      worst_norm = std::max(worst_norm, std::abs(norm - want_norm) / want_norm);
      CHECK_MESSAGE(std::abs(norm - want_norm) <= 1e-4 * want_norm, it.key(), ": |grad| ", norm, " vs ", want_norm);
      if (w.contains("padding_idx")) continue;  // the samples may fall on the pad row
      for (const auto& s : w["sample"]) {
        const double got = v[s[0].get<size_t>()], x = s[1];
        CHECK_MESSAGE(std::abs(got - x) <= 1e-4 * std::abs(x) + 1e-4 * rms, it.key(), "[", s[0], "] ", got, " vs ", x);
      }
    }
    MESSAGE(f.dir, ": worst relative gradient-norm difference ", worst_norm);
  }
  // transformers' greedy tokens, with the KV cache (both cache attention paths).
  std::vector<std::vector<int32_t>> prompts, want;
  for (const json& g : ref["greedy"]) {
    prompts.push_back(g["prompt"].get<std::vector<int32_t>>());
    want.push_back(g["tokens"].get<std::vector<int32_t>>());
  }
  GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(want[0].size());
  o.stop_at_eod = false;
  o.sampling.greedy = true;
  for (const bool ops : {false, true}) {
    o.force_ops_attention = ops;
    const GenerateOutput out = generate(*model, prompts, o);
    for (size_t i = 0; i < prompts.size(); ++i)
      CHECK_MESSAGE(out.generated[i] == want[i], f.dir, " prompt ", i, " ops ", ops);
  }
}

}  // namespace

TEST_CASE("HF families (transformers 4.57): Llama 3.x with rope scaling") {
  for (const char* d : {"llama3", "llama3_linear", "llama3_dynamic", "llama3_yarn"}) check_family({d, "llama"});
}
TEST_CASE("HF families (transformers 4.57): Qwen3") { check_family({"qwen3", "qwen3"}); }
TEST_CASE("HF families (transformers 4.57): Qwen3-MoE") { check_family({"qwen3_moe", "qwen3_moe"}); }
TEST_CASE("HF families (transformers 4.57): Gemma 2") { check_family({"gemma2", "gemma2"}); }
TEST_CASE("HF families (transformers 4.57): Gemma 3") { check_family({"gemma3", "gemma3"}); }
TEST_CASE("HF families (transformers 4.57): OLMo-2") { check_family({"olmo2", "olmo2"}); }
TEST_CASE("HF families (transformers 4.57): Phi-3 and Phi-4-mini") {
  check_family({"phi3", "phi3"});
  check_family({"phi4_mini", "phi3"});
}

TEST_CASE("HF families (transformers 4.57): HF -> mpitron -> HF is bitwise; transformers loads the export") {
  const std::string py = apps_test::venv_python();
  for (const FamilyCase& f : kFamilies) {
    CAPTURE(f.dir);
    TempDir tmp("hffam2_" + f.dir);
    const std::string dir = dir_of(f.dir), ckpt = tmp / "ckpt";
    const HfCheckpoint ck = read_hf_checkpoint(dir);
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + dir + " --output " + ckpt,
                            tmp / "in.log") == 0, slurp(tmp / "in.log"));
    InferenceModel m = load_model_for_inference(ckpt);
    CHECK(m.model->config().family() == f.family);
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf",
                            tmp / "out.log") == 0, slurp(tmp / "out.log"));
    const HfCheckpoint back = read_hf_checkpoint(tmp / "hf");
    for (const io::SafeTensor& t : ck.tensors.tensors) {
      REQUIRE_MESSAGE(back.tensors.has(t.name), t.name);
      CHECK(back.tensors.at(t.name).shape == t.shape);
      CHECK_MESSAGE(back.tensors.at(t.name).bytes == t.bytes, t.name);
    }
    const json orig = json::parse(ck.config_json), out = json::parse(back.config_json);
    CHECK(out["architectures"] == orig["architectures"]);
    CHECK(out["model_type"] == orig["model_type"]);
    CHECK(field_differences(hf_config(back.config_json), hf_config(ck.config_json)).empty());
    if (py.empty()) {
      MESSAGE("SKIPPED transformers load of the ", f.dir, " export: no reference venv (scripts/setup-reference-venv.sh)");
      continue;
    }
    const int rc = std::system(("'" + py + "' " + apps_test::kSource + "/tests/reference/hf_family2_ref.py --family " + f.dir +
                                " --check-export " + tmp / "hf" + " > " + tmp / "py.log 2>&1")
                                   .c_str());
    MESSAGE(slurp(tmp / "py.log"));
    CHECK_MESSAGE(rc == 0, "transformers did not reproduce the reference from the export: ", slurp(tmp / "py.log"));
  }
}

// generate_text (the serving engine's runner: paged_layers on the paged KV cache, the tiled head) gives
// transformers' greedy tokens for every family, and under tensor parallelism (TP2, two ranks under mpirun)
// where the heads split: Gemma 2's soft caps and windows, Qwen3's QK-norm.
TEST_CASE("HF families (transformers 4.57): generate_text gives transformers' greedy tokens (TP1, TP2)") {
  for (const FamilyCase& f : kFamilies) {
    CAPTURE(f.dir);
    TempDir tmp("hffam2_gen_" + f.dir);
    const std::string dir = dir_of(f.dir);
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + dir + " --output " + tmp / "ck",
                            tmp / "in.log") == 0, slurp(tmp / "in.log"));
    const json ref = json::parse(slurp(dir + "/ref.json"));
    {
      std::ofstream ids(tmp / "ids.txt");
      for (const json& g : ref["greedy"]) {
        std::string line;
        for (const json& id : g["prompt"]) line += (line.empty() ? "" : " ") + std::to_string(id.get<int>());
        ids << line << "\n";
      }
    }
    const bool tp2 = f.dir == "gemma2" || f.dir == "qwen3";
    for (const int tp : tp2 ? std::vector<int>{1, 2} : std::vector<int>{1}) {
      CAPTURE(tp);
      const std::string args = "--load " + tmp / "ck" + " --sample-input-ids-file " + tmp / "ids.txt" +
                               " --greedy --out-seq-length 12 --genfile " + tmp / "out.jsonl";
      const std::string cmd = tp == 1 ? "OMP_NUM_THREADS=1 apps/generate_text " + args
                                      : "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 apps/generate_text " +
                                            args + " --tensor-model-parallel-size 2";
      const int rc = std::system((cmd + " > " + tmp / "gen.log 2>&1").c_str());
      REQUIRE_MESSAGE(rc == 0, slurp(tmp / "gen.log"));
      std::vector<json> out;
      {
        std::ifstream in(tmp / "out.jsonl");
        for (std::string line; std::getline(in, line);)
          if (!line.empty()) out.push_back(json::parse(line));
      }
      REQUIRE(out.size() == ref["greedy"].size());
      for (size_t i = 0; i < out.size(); ++i)
        CHECK_MESSAGE(out[i]["tokens"].get<std::vector<int>>() == ref["greedy"][i]["tokens"].get<std::vector<int>>(),
                      slurp(tmp / "gen.log"));
    }
  }
}
