// Hugging Face Llama import/export (model/inference/hf_convert.h, apps/convert_checkpoint)
// against transformers (tests/reference/hf_llama_ref.py; a random GQA LlamaForCausalLM saved
// SHARDED by save_pretrained, with float64 logits, loss and gradients, in tests/apps/ref/hf_llama/):
//  * logits, the mean cross-entropy and every parameter gradient equal transformers';
//  * convert_checkpoint HF → mpitron → HF gives the original tensors bit for bit, and config.json
//    round-trips; bad config keys, missing tensors and wrong shapes are named;
//  * greedy generation with the GQA KV cache equals full recomputation;
//  * a Llama checkpoint written by pretrain_gpt exports to HF and re-imports with equal logits.
//
// Tolerances (f32 in mpitron vs float64 in transformers on the same f32 weights): the model
// is 2 layers of width 48/80 with O(1) activations, so every dot product sums <= 80 terms
// of f32 products (relative error ~ 80 · 6e-8 ≈ 5e-6 worst case, ~1e-7 typical) and rope's
// cos/sin are f32 in both. Logits are O(1): we allow 2e-5 absolute (measured max: see the
// MESSAGE lines: 1.4e-6 and 4.8e-7 on a 2-core CPU VM). The loss is O(5): 1e-5 relative. Gradients: the norm of each
// tensor's gradient to 1e-4 relative, and sampled entries to 1e-4 · |value| + 1e-4 · rms of
// that tensor's gradient (an entry that nearly cancels is judged against the tensor's scale);
// measured worst gradient-norm difference 2.6e-7.
// A wrong mapping (q/k swapped, a permuted rope, gate/up swapped) changes these at O(1).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "autograd/tape.h"
#include "io/safetensors.h"
#include "model/inference/generate.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using apps_test::TempDir;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::ints;
using apps_test::logit_err;
using nlohmann::json;

namespace {

const std::string kDir = apps_test::kSource + "/tests/apps/ref/hf_llama";

json ref_json() { return json::parse(slurp(kDir + "/ref.json")); }

bool has(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

}  // namespace

TEST_CASE("HF Llama (transformers): sharded import, logits, loss and every gradient") {
  const json ref = ref_json();
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  CHECK(ck.file_of.at("lm_head.weight") != ck.file_of.at("model.embed_tokens.weight"));  // really sharded
  CHECK(hf_model_type(ck.config_json) == "llama");
  const GPTConfig cfg = hf_config(ck.config_json, 4);  // 100 divides by 4: no padding, the loss is HF's
  CHECK(cfg.family() == "llama");
  CHECK(cfg.padded_vocab_size == 100);
  CHECK(cfg.query_groups() == 2);
  CHECK(cfg.ffn() == 80);
  CHECK(cfg.qkv_rows() == (4 + 2 * 2) * 12);
  CHECK(cfg.layernorm_epsilon == 1e-5f);
  CHECK(cfg.rotary_base == 10000.0);
  auto model = gpt_from_hf(ck, cfg);

  for (size_t b = 0; b < ref["batches"].size(); ++b) {
    const json& r = ref["batches"][b];
    const Tensor in = ints(r["ids"]), tgt = ints(r["targets"]);
    const double err = logit_err(model->logits(in), r["logits"], 100);
    MESSAGE("batch ", b, ": max |logit - transformers f64| = ", err);
    CHECK(err < 2e-5);
    Tape tape;
    model->params().zero_grad();
    ForwardOptions o;
    o.train = false;
    Var loss = model->forward(tape, in, tgt, o);
    const double want = r["loss"];
    MESSAGE("batch ", b, ": loss ", loss.value().item(), " vs transformers ", want);
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
    MESSAGE("worst relative gradient-norm difference ", worst_norm);
  }
}

TEST_CASE("HF Llama: KV-cache greedy generation (GQA cache) equals full recomputation") {
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  auto model = gpt_from_hf(ck, hf_config(ck.config_json));
  const std::vector<std::vector<int32_t>> prompts{{5, 17, 3, 99, 42}, {7}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.stop_at_eod = false;
  o.eod = 2;
  o.sampling.greedy = true;
  for (const bool ops : {false, true}) {
    o.force_ops_attention = ops;
    const GenerateOutput out = generate(*model, prompts, o);
    for (size_t i = 0; i < prompts.size(); ++i)
      CHECK_MESSAGE(out.generated[i] == generate_full_recompute(*model, prompts[i], 12, 2, false), "prompt ", i, " ops ", ops);
  }
}

TEST_CASE("convert_checkpoint: HF Llama -> mpitron -> HF is bitwise, config.json round-trips") {
  TempDir tmp("hfllama");
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  const GPTConfig cfg = hf_config(ck.config_json);
  CHECK(cfg.padded_vocab_size == 128);
  auto direct = gpt_from_hf(ck, cfg);
  const std::string ckpt = tmp / "ckpt";
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + kDir + " --output " + ckpt,
                          tmp / "in.log") == 0, slurp(tmp / "in.log"));
  InferenceModel m = load_model_for_inference(ckpt);
  CHECK(m.model->config().family() == "llama");
  CHECK(m.model->params().values().to_floats() == direct->params().values().to_floats());
  // The padding rows of wte and head.weight are zero, so the first 100 logits are HF's.
  const json ref = ref_json();
  CHECK(logit_err(m.model->logits(ints(ref["batches"][0]["ids"])), ref["batches"][0]["logits"], 100) < 2e-5);

  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf",
                          tmp / "out.log") == 0, slurp(tmp / "out.log"));
  const io::Safetensors back = io::read_safetensors(tmp / "hf/model.safetensors");
  CHECK(back.tensors.size() == ck.tensors.tensors.size());
  for (const io::SafeTensor& t : ck.tensors.tensors) {
    REQUIRE_MESSAGE(back.has(t.name), t.name);
    const io::SafeTensor& u = back.at(t.name);
    CHECK(u.dtype == t.dtype);
    CHECK(u.shape == t.shape);
    CHECK_MESSAGE(u.bytes == t.bytes, t.name);
  }
  // config.json: every key we write has the original's value, and it reads back to the same config.
  const json orig = json::parse(ck.config_json), out = json::parse(slurp(tmp / "hf/config.json"));
  for (auto it = out.begin(); it != out.end(); ++it)
    if (orig.contains(it.key())) CHECK_MESSAGE(orig[it.key()] == it.value(), it.key(), ": ", it.value().dump(), " vs ", orig[it.key()].dump());
  const GPTConfig again = hf_config(out.dump());
  CHECK(again.num_layers == cfg.num_layers);
  CHECK(again.query_groups() == cfg.query_groups());
  CHECK(again.ffn() == cfg.ffn());
  CHECK(again.layernorm_epsilon == cfg.layernorm_epsilon);
  CHECK(again.rotary_base == cfg.rotary_base);
  CHECK(again.untie_embeddings == cfg.untie_embeddings);
  CHECK(again.max_position_embeddings == cfg.max_position_embeddings);
  // An exported directory imports again (single-file form this time), with equal values.
  const HfCheckpoint ck2 = read_hf_checkpoint(tmp / "hf");
  CHECK(gpt_from_hf(ck2, hf_config(ck2.config_json))->params().values().to_floats() ==
        direct->params().values().to_floats());
  // BF16: export, import (widened exactly), export again: the same bytes.
  apps_test::check_hf_bf16_round_trip(ckpt, tmp, "lm_head.weight");
  // GPT-2-only flags are refused for a Llama.
  CHECK(run_app("convert_checkpoint", "--direction mpitron-to-hf --lm-head --input " + ckpt + " --output " + tmp / "x",
                tmp / "bad.log") != 0);
  CHECK(has(slurp(tmp / "bad.log"), "--lm-head"));
  // --tensor-model-parallel-size pads for that TP (128 x 2).
  REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --tensor-model-parallel-size 2 --input " + kDir +
                      " --output " + tmp / "tp2", tmp / "tp2.log") == 0);
  CHECK(read_checkpoint_config(tmp / "tp2").padded_vocab_size == 256);
}

TEST_CASE("HF Llama: bad configs and checkpoints are named") {
  TempDir tmp("hfllama_bad");
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  const json base = json::parse(ck.config_json);
  const auto with = [&](const std::string& key, const json& v) {
    json j = base;
    j[key] = v;
    return error_of([&] { hf_config(j.dump()); });
  };
  CHECK(has(with("rope_scaling", json{{"rope_type", "longrope"}, {"factor", 2.0}}), "longrope"));
  CHECK(has(with("rope_scaling", json{{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}}), "low_freq_factor"));
  CHECK(with("rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}).empty());  // transformers' linear scaling
  CHECK(has(with("hidden_act", "gelu"), "hidden_act"));
  CHECK(has(with("mlp_bias", true), "mlp_bias"));
  CHECK(has(with("attention_bias", true), "attention_bias"));
  CHECK(has(with("some_new_thing", 3), "some_new_thing"));
  CHECK(with("head_dim", 16).empty());  // heads of their own width (transformers >= 4.44)
  CHECK(has(with("sliding_window", 16), "sliding_window"));
  CHECK(with("sliding_window", 4096).empty());  // never reached within max_position_embeddings
  CHECK(has(with("model_type", "qwen2"), "qwen2"));
  CHECK(has(with("rope_theta", "big"), "rope_theta"));
  CHECK(with("rms_norm_eps", 1e-6).empty());
  CHECK(has(with("num_key_value_heads", 3), "--num-query-groups"));
  // Tied: lm_head.weight must then equal embed_tokens.
  CHECK(has(error_of([&] {
              json j = base;
              j["tie_word_embeddings"] = true;
              gpt_from_hf(ck, hf_config(j.dump()));
            }),
            "lm_head.weight"));
  // A config that does not fit the weights names both shapes.
  const std::string shape_err = error_of([&] {
    json j = base;
    j["intermediate_size"] = 96;
    gpt_from_hf(ck, hf_config(j.dump()));
  });
  CHECK(has(shape_err, "[80, 48]"));
  CHECK(has(shape_err, "[96, 48]"));
  CHECK(has(shape_err, "model-0000"));  // the shard file
  // A missing tensor names the tensor and the directory; a missing shard names the shard.
  {
    HfCheckpoint partial = ck;
    const int64_t i = partial.tensors.index("model.layers.1.mlp.up_proj.weight");
    partial.tensors.tensors.erase(partial.tensors.tensors.begin() + i);
    const std::string e = error_of([&] { gpt_from_hf(partial, hf_config(partial.config_json)); });
    CHECK(has(e, "model.layers.1.mlp.up_proj.weight"));
    CHECK(has(e, kDir));
  }
  std::filesystem::create_directories(tmp / "noshard");
  std::filesystem::copy_file(kDir + "/config.json", tmp / "noshard/config.json");
  std::filesystem::copy_file(kDir + "/model.safetensors.index.json", tmp / "noshard/model.safetensors.index.json");
  CHECK(has(error_of([&] { read_hf_checkpoint(tmp / "noshard"); }), "model-00001-of-00004.safetensors"));
  CHECK(has(error_of([&] { read_hf_checkpoint(tmp / "nothing"); }), "nothing"));
  // A custom architecture (RMSNorm with a GELU MLP) is not exported.
  GPTConfig c = hf_config(ck.config_json);
  c.mlp = MlpKind::GeluTanh;
  CHECK(c.family() == "custom");
  GPT custom(c, Device::cpu());
  custom.init_weights(1);
  save_model_checkpoint(tmp / "custom", custom, "test");
  CHECK(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + tmp / "custom" + " --output " + tmp / "o",
                tmp / "custom.log") != 0);
  CHECK(has(slurp(tmp / "custom.log"), "--swiglu"));
}

TEST_CASE("HF Llama: tied embeddings and linear biases round-trip; Mistral and architectures-only configs") {
  TempDir tmp("hfllama_var");
  const json base = json::parse(read_hf_checkpoint(kDir).config_json);
  for (const bool tied : {false, true})
    for (const bool bias : {false, true}) {
      json j = base;
      j["tie_word_embeddings"] = tied;
      j["attention_bias"] = bias;
      j["mlp_bias"] = bias;
      const GPTConfig c = hf_config(j.dump());
      CHECK(c.untie_embeddings == !tied);
      CHECK(c.add_bias_linear == bias);
      CHECK(hf_exportable(c));
      GPT model(c, Device::cpu());
      model.init_weights(7);
      double k = 0;  // biases init to zero: give each its own value so a swap shows
      for (const ParamInfo& p : model.params().infos())
        if (p.shape.size() == 1 && p.name.find("ln") == std::string::npos)
          model.params().values().flat_range(p.offset, p.numel()).fill(0.01 * ++k);
      // Padding rows are not exported: zero them so the re-import compares equal.
      for (const char* name : {"wte", "head.weight"})
        if (model.params().has(name)) model.params().var(name).value().slice(0, 100, c.padded_vocab_size).zero();
      const io::Safetensors st = hf_from_gpt(model);
      CHECK(st.has("lm_head.weight") == !tied);
      CHECK(st.has("model.layers.1.self_attn.k_proj.bias") == bias);
      CHECK(st.has("model.layers.0.mlp.down_proj.bias") == bias);
      const std::string d = tmp / str("v", tied, bias);
      std::filesystem::create_directories(d);
      io::write_safetensors(d + "/model.safetensors", st);
      std::ofstream(d + "/config.json") << hf_config_json(c);
      const HfCheckpoint ck = read_hf_checkpoint(d);
      CHECK(gpt_from_hf(ck, hf_config(ck.config_json))->params().values().to_floats() ==
            model.params().values().to_floats());
    }
  // A Mistral config.json (MistralConfig has no attention_bias, pretraining_tp or rope_scaling):
  // without a window it is a Llama's function; with one, the mistral family; a LlamaConfig key
  // in it is refused by name.
  json m = base;
  m["model_type"] = "mistral";
  m["architectures"] = {"MistralForCausalLM"};
  for (const char* k : {"attention_bias", "pretraining_tp", "rope_scaling"}) m.erase(k);
  m["sliding_window"] = nullptr;
  CHECK(hf_config(m.dump()).family() == "llama");
  m["sliding_window"] = 4;
  CHECK(hf_config(m.dump()).family() == "mistral");
  CHECK(hf_config(m.dump()).window_size == 4);
  m["pretraining_tp"] = 1;
  CHECK(has(error_of([&] { hf_config(m.dump()); }), "pretraining_tp"));
  json a = base;
  a.erase("model_type");
  CHECK(hf_model_type(a.dump()) == "llama");
  a["architectures"] = {"GPT2LMHeadModel"};
  CHECK(hf_model_type(a.dump()) == "gpt2");
  a["architectures"] = {"FalconForCausalLM"};
  CHECK(has(error_of([&] { hf_model_type(a.dump()); }), "FalconForCausalLM"));
}

TEST_CASE("pretrain_gpt Llama checkpoint -> mpitron-to-hf -> hf-to-mpitron: equal tensors and logits") {
  TempDir tmp("hfllama_train");
  const std::string llama =
      " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2"
      " --ffn-hidden-size 48 --seq-length 16 --max-position-embeddings 32 --normalization RMSNorm --norm-epsilon 1e-5"
      " --swiglu --position-embedding-type rope --rotary-base 500000 --untie-embeddings-and-output-weights"
      " --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 ";
  REQUIRE_MESSAGE(run_app("pretrain_gpt", llama + "--mock-data --micro-batch-size 2 --global-batch-size 2 --train-iters 3 "
                                                  "--lr 1e-2 --lr-decay-style constant --eval-iters 0 --device cpu --save " + tmp / "ck" +
                                                  " --save-interval 3", tmp / "train.log") == 0,
                  slurp(tmp / "train.log"));
  REQUIRE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + tmp / "ck" + " --output " + tmp / "hf",
                  tmp / "out.log") == 0);
  const json hf_cfg = json::parse(slurp(tmp / "hf/config.json"));
  CHECK(hf_cfg["rope_theta"] == 500000.0);
  CHECK(hf_cfg["num_key_value_heads"] == 2);
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + tmp / "hf" + " --output " + tmp / "ck2",
                          tmp / "in.log") == 0, slurp(tmp / "in.log"));
  InferenceModel a = load_model_for_inference(tmp / "ck"), b = load_model_for_inference(tmp / "ck2");
  const GPTConfig& c = a.model->config();
  CHECK(a.iteration == 3);
  CHECK(b.model->config().padded_vocab_size == c.padded_vocab_size);
  // The exported tensors are the trained ones (vocabulary padding rows dropped).
  const io::Safetensors hf = io::read_safetensors(tmp / "hf/model.safetensors");
  const std::vector<float> head = a.model->params().var("head.weight").value().slice(0, 0, c.vocab_size).contiguous().to_floats();
  CHECK(hf.to_f32("lm_head.weight").to_floats() == head);
  const std::vector<float> qkv = a.model->params().var("layers.1.attn.qkv.weight").value().to_floats();
  const std::vector<float> k = hf.to_f32("model.layers.1.self_attn.k_proj.weight").to_floats();
  CHECK(std::vector<float>(qkv.begin() + 4 * 8 * 32, qkv.begin() + 6 * 8 * 32) == k);  // K rows follow 4 query heads
  // Logits over the real vocabulary agree (the trained padding rows are dropped on export).
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 16; ++i) ids.push_back((i * 7919 + 13) % c.vocab_size);
  const Tensor in = Tensor::from_ints(ids, {2, 16});
  const std::vector<float> la = a.model->logits(in).to_floats(), lb = b.model->logits(in).to_floats();
  double worst = 0, scale = 0;
  for (int64_t r = 0; r < 32; ++r)
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      const size_t i = static_cast<size_t>(r * c.padded_vocab_size + v);
      worst = std::max(worst, double(std::abs(la[i] - lb[i])));
      scale = std::max(scale, double(std::abs(la[i])));
    }
  MESSAGE("trained Llama: max |logit difference| after export and re-import ", worst, " (max |logit| ", scale, ")");
  CHECK(worst <= 1e-6 * std::max(scale, 1.0));
}
