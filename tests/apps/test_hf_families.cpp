// The families built on Llama's names — Qwen2, Mistral, Gemma — against transformers 4.40
// (tests/reference/hf_family_ref.py: a random model of each, saved by save_pretrained, with
// float64 logits, loss and gradients in tests/apps/ref/hf_<family>/), through the one
// converter (model/inference/hf_convert.h):
//  * the family is recognised from config.json, and the imported model's logits, mean
//    cross-entropy and every parameter gradient equal transformers';
//  * HF → mpitron → HF is bitwise (F32 and BF16) and config.json round-trips;
//  * greedy generation with the KV cache equals full recomputation;
//  * a checkpoint pretrain_gpt trains with the family's flags exports, and transformers loads
//    the export and computes our logits (SKIPPED without /usr/bin/python3 + transformers).
// Tolerances as tests/apps/test_hf_llama.cpp (f32 against float64 on the same f32 weights, a
// 2-layer model of width 48/80): logits 2e-5 absolute, loss 1e-5 relative, gradient norms 1e-4
// relative and sampled entries 1e-4·|g| + 1e-4·rms. Gemma's RMSNorm runs in float32 inside
// transformers even on a float64 model (its forward casts to float), ~1e-7 relative: far inside.
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
  std::string name;
  std::string train_flags;  // pretrain_gpt's flags for the family (Megatron's names)
  std::string probe = "model.layers.1.mlp.down_proj.weight";  // a tensor the BF16 round trip checks
};

const std::vector<FamilyCase> kFamilies = {
    {"qwen2",
     "--normalization RMSNorm --norm-epsilon 1e-6 --swiglu --position-embedding-type rope --disable-bias-linear "
     "--add-qkv-bias --group-query-attention --num-query-groups 2"},
    {"mistral",
     "--normalization RMSNorm --norm-epsilon 1e-5 --swiglu --position-embedding-type rope --disable-bias-linear "
     "--untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 --window-size 5"},
    {"gemma",
     "--normalization RMSNorm --norm-epsilon 1e-6 --geglu --apply-layernorm-1p --scale-embeddings "
     "--position-embedding-type rope --disable-bias-linear --kv-channels 16 --group-query-attention --num-query-groups 2"},
    // Mixture of Experts: 4 SwiGLU experts, top-2 (Mixtral: softmax of the two; Qwen2-MoE: the
    // softmax over all four, unnormalised, and a gated shared expert).
    {"mixtral",
     "--normalization RMSNorm --norm-epsilon 1e-5 --swiglu --position-embedding-type rope --disable-bias-linear "
     "--untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 --num-experts 4 "
     "--moe-router-topk 2 --moe-ffn-hidden-size 40",
     "model.layers.1.block_sparse_moe.experts.3.w2.weight"},
    {"qwen2_moe",
     "--normalization RMSNorm --norm-epsilon 1e-6 --swiglu --position-embedding-type rope --disable-bias-linear "
     "--add-qkv-bias --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 --num-experts 4 "
     "--moe-router-topk 2 --moe-ffn-hidden-size 24 --moe-router-pre-softmax --moe-shared-expert-intermediate-size 40 "
     "--moe-shared-expert-gate",
     "model.layers.1.mlp.shared_expert.down_proj.weight"},
};

std::string dir_of(const std::string& family) { return apps_test::kSource + "/tests/apps/ref/hf_" + family; }

bool have_transformers() { return std::system("/usr/bin/python3 -c 'import torch, transformers' > /dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("HF families (transformers 4.40): logits, loss and every gradient") {
  for (const FamilyCase& f : kFamilies) {
    CAPTURE(f.name);
    const json ref = json::parse(slurp(dir_of(f.name) + "/ref.json"));
    const HfCheckpoint ck = read_hf_checkpoint(dir_of(f.name));
    CHECK(hf_model_type(ck.config_json) == f.name);
    const GPTConfig cfg = hf_config(ck.config_json, 4);  // 100 divides by 4: no padding, the loss is HF's
    CHECK(cfg.family() == f.name);
    CHECK(cfg.padded_vocab_size == 100);
    auto model = gpt_from_hf(ck, cfg);
    for (size_t b = 0; b < ref["batches"].size(); ++b) {
      const json& r = ref["batches"][b];
      const Tensor in = ints(r["ids"]), tgt = ints(r["targets"]);
      const double err = logit_err(model->logits(in), r["logits"], 100);
      MESSAGE(f.name, " batch ", b, ": max |logit - transformers f64| = ", err);
      CHECK(err < 2e-5);
      Tape tape;
      model->params().zero_grad();
      ForwardOptions o;
      o.train = false;
      Var loss = model->forward(tape, in, tgt, o);
      const double want = r["loss"];
      MESSAGE(f.name, " batch ", b, ": loss ", loss.value().item(), " vs transformers ", want);
      CHECK(std::abs(loss.value().item() - want) <= 1e-5 * want);
      if (!r.contains("grads")) continue;
      tape.backward(loss);
      // The gradients in HF layout (q|k|v and gate|up split back), through the exporter.
      const Tensor grads = model->params().grads().clone();
      const io::Safetensors g = hf_from_gpt(*model, {}, &grads);
      CHECK(g.tensors.size() == r["grads"].size());
      double worst_norm = 0;
      for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
        REQUIRE_MESSAGE(g.has(it.key()), it.key());
        const std::vector<float> v = g.to_f32(it.key()).to_floats();
        double n2 = 0;
        for (float x : v) n2 += double(x) * x;
        const double norm = std::sqrt(n2), want_norm = it.value()["norm"], rms = it.value()["rms"];
        worst_norm = std::max(worst_norm, std::abs(norm - want_norm) / want_norm);
        CHECK_MESSAGE(std::abs(norm - want_norm) <= 1e-4 * want_norm, it.key(), ": |grad| ", norm, " vs ", want_norm);
        for (const auto& s : it.value()["sample"]) {
          const double got = v[s[0].get<size_t>()], w = s[1];
          CHECK_MESSAGE(std::abs(got - w) <= 1e-4 * std::abs(w) + 1e-4 * rms, it.key(), "[", s[0], "] ", got, " vs ", w);
        }
      }
      MESSAGE(f.name, ": worst relative gradient-norm difference ", worst_norm);
    }
  }
}

// The load-balancing loss against transformers' load_balancing_loss_func: per layer (a one-layer
// tuple), HF's E · Σ_e f_e · P_e is Megatron's aux loss times k / coeff, so with --moe-aux-loss-coeff
// k our per-layer sum equals Σ_l aux_per_layer, and the gradient of LM loss + aux is transformers'
// grads + aux_grads (sampled entries). HF's own aux_loss pools every layer's tokens before the
// product: the same statistics give it (tokens per expert and the scores' sums over the layers).
TEST_CASE("HF MoE families: the load-balancing loss and its gradient as transformers computes them") {
  for (const std::string name : {"mixtral", "qwen2_moe"}) {
    CAPTURE(name);
    const json ref = json::parse(slurp(dir_of(name) + "/ref.json"));
    const HfCheckpoint ck = read_hf_checkpoint(dir_of(name));
    const GPTConfig cfg = hf_config(ck.config_json, 4);
    auto model = gpt_from_hf(ck, cfg);
    const json& r = ref["batches"][0];
    MoeStats stats;
    MoeRun run;
    run.aux_loss_coeff = static_cast<float>(cfg.moe_router_topk);
    run.stats = &stats;
    Tape tape;
    model->params().zero_grad();
    ForwardOptions o;
    o.train = false;
    o.moe = &run;
    Var loss = model->forward(tape, ints(r["ids"]), ints(r["targets"]), o);
    double want_aux = 0;
    for (const double a : r["aux_per_layer"]) want_aux += a;
    MESSAGE(name, ": aux loss ", stats.aux_loss, " vs transformers' per-layer sum ", want_aux);
    CHECK(stats.layers == cfg.num_layers);
    CHECK(std::abs(stats.aux_loss - want_aux) <= 1e-5 * want_aux);
    // The forward is unchanged by the auxiliary loss.
    CHECK(std::abs(loss.value().item() - r["loss"].get<double>()) <= 1e-5 * r["loss"].get<double>());
    tape.backward(loss);
    const Tensor grads = model->params().grads().clone();
    const io::Safetensors g = hf_from_gpt(*model, {}, &grads);
    int64_t checked = 0;
    for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
      const json& a = r["aux_grads"][it.key()];
      const std::vector<float> v = g.to_f32(it.key()).to_floats();
      const double rms = it.value()["rms"].get<double>() + a["rms"].get<double>();
      for (size_t i = 0; i < it.value()["sample"].size(); ++i) {
        const json& s = it.value()["sample"][i];
        REQUIRE(a["sample"][i][0] == s[0]);  // the same entries
        const double want = s[1].get<double>() + a["sample"][i][1].get<double>(), got = v[s[0].get<size_t>()];
        CHECK_MESSAGE(std::abs(got - want) <= 1e-4 * std::abs(want) + 1e-4 * rms, it.key(), "[", s[0], "] ", got, " vs ", want);
        ++checked;
      }
    }
    CHECK(checked > 100);
  }
}

TEST_CASE("HF families: HF -> mpitron -> HF is bitwise, config.json round-trips, KV-cache generation") {
  for (const FamilyCase& f : kFamilies) {
    CAPTURE(f.name);
    TempDir tmp("hffam_" + f.name);
    const std::string dir = dir_of(f.name);
    const HfCheckpoint ck = read_hf_checkpoint(dir);
    const GPTConfig cfg = hf_config(ck.config_json);
    auto direct = gpt_from_hf(ck, cfg);
    const std::string ckpt = tmp / "ckpt";
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + dir + " --output " + ckpt,
                            tmp / "in.log") == 0, slurp(tmp / "in.log"));
    InferenceModel m = load_model_for_inference(ckpt);
    CHECK(m.model->config().family() == f.name);
    CHECK(m.model->params().values().to_floats() == direct->params().values().to_floats());
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf",
                            tmp / "out.log") == 0, slurp(tmp / "out.log"));
    const io::Safetensors back = io::read_safetensors(tmp / "hf/model.safetensors");
    CHECK(back.tensors.size() == ck.tensors.tensors.size());
    for (const io::SafeTensor& t : ck.tensors.tensors) {
      REQUIRE_MESSAGE(back.has(t.name), t.name);
      CHECK(back.at(t.name).dtype == t.dtype);
      CHECK(back.at(t.name).shape == t.shape);
      CHECK_MESSAGE(back.at(t.name).bytes == t.bytes, t.name);
    }
    const json orig = json::parse(ck.config_json), out = json::parse(slurp(tmp / "hf/config.json"));
    CHECK(out["architectures"] == orig["architectures"]);
    for (auto it = out.begin(); it != out.end(); ++it)
      if (orig.contains(it.key()))
        CHECK_MESSAGE(orig[it.key()] == it.value(), it.key(), ": ", it.value().dump(), " vs ", orig[it.key()].dump());
    const GPTConfig again = hf_config(out.dump());
    CHECK(field_differences(again, cfg).empty());
    apps_test::check_hf_bf16_round_trip(ckpt, tmp, f.probe);
    // Greedy decoding with the KV cache (prompts longer than any window) equals recomputation.
    const std::vector<std::vector<int32_t>> prompts{{5, 17, 3, 99, 42, 8, 61, 7, 12}, {7}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};
    GenerateOptions o;
    o.max_new_tokens = 12;
    o.stop_at_eod = false;
    o.eod = 2;
    o.sampling.greedy = true;
    for (const bool ops : {false, true}) {
      o.force_ops_attention = ops;
      const GenerateOutput g = generate(*direct, prompts, o);
      for (size_t i = 0; i < prompts.size(); ++i)
        CHECK_MESSAGE(g.generated[i] == generate_full_recompute(*direct, prompts[i], 12, 2, false), "prompt ", i, " ops ", ops);
    }
  }
}

TEST_CASE("HF families: pretrain_gpt with the family's flags exports a model transformers computes") {
  for (const FamilyCase& f : kFamilies) {
    CAPTURE(f.name);
    TempDir tmp("hffam_train_" + f.name);
    const std::string flags = " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --ffn-hidden-size 48 "
                              "--seq-length 16 --max-position-embeddings 32 --attention-dropout 0 --hidden-dropout 0 " +
                              f.train_flags + " ";
    REQUIRE_MESSAGE(run_app("pretrain_gpt", flags + "--mock-data --micro-batch-size 2 --global-batch-size 2 --train-iters 3 "
                                                    "--lr 1e-2 --lr-decay-style constant --eval-iters 0 --device cpu --save " +
                                                    tmp / "ck" + " --save-interval 3",
                            tmp / "train.log") == 0,
                    slurp(tmp / "train.log"));
    InferenceModel a = load_model_for_inference(tmp / "ck");
    CHECK(a.model->config().family() == f.name);
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + tmp / "ck" + " --output " + tmp / "hf",
                            tmp / "out.log") == 0, slurp(tmp / "out.log"));
    REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + tmp / "hf" + " --output " + tmp / "ck2",
                            tmp / "in.log") == 0, slurp(tmp / "in.log"));
    InferenceModel b = load_model_for_inference(tmp / "ck2");
    CHECK(b.model->config().family() == f.name);
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 2 * 16; ++i) ids.push_back((i * 7919 + 13) % a.model->config().vocab_size);
    const Tensor in = Tensor::from_ints(ids, {2, 16});
    const Tensor la = a.model->logits(in);
    const int64_t V = a.model->config().vocab_size, Vp = a.model->config().padded_vocab_size;
    const std::vector<float> x = la.to_floats(), y = b.model->logits(in).to_floats();
    double worst = 0;
    json rows = json::array();
    for (int64_t r = 0; r < 32; ++r) {
      json row = json::array();
      for (int64_t v = 0; v < V; ++v) {
        const size_t i = static_cast<size_t>(r * Vp + v);
        worst = std::max(worst, double(std::abs(x[i] - y[i])));
        row.push_back(x[i]);
      }
      rows.push_back(row);
    }
    MESSAGE(f.name, ": trained model, max |logit difference| after export and re-import ", worst);
    CHECK(worst <= 1e-6);
    if (!have_transformers()) {
      MESSAGE("SKIPPED transformers load of the ", f.name, " export: /usr/bin/python3 has no torch + transformers "
              "(tests/reference/hf_family_ref.py's header says how to install them)");
      continue;
    }
    json ids_json = json::array();
    for (int b = 0; b < 2; ++b) ids_json.push_back(std::vector<int64_t>(ids.begin() + b * 16, ids.begin() + (b + 1) * 16));
    std::ofstream(tmp / "ours.json") << json{{"ids", ids_json}, {"logits", rows}}.dump();
    const int rc = std::system(("/usr/bin/python3 " + apps_test::kSource + "/tests/reference/hf_family_ref.py --family " +
                                f.name + " --compare-logits " + tmp / "hf" + " " + tmp / "ours.json > " + tmp / "py.log 2>&1")
                                   .c_str());
    MESSAGE(slurp(tmp / "py.log"));
    CHECK_MESSAGE(rc == 0, "transformers did not compute our logits from the export: ", slurp(tmp / "py.log"));
  }
}
