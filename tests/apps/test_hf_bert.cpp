// Hugging Face BERT import/export (model/inference/hf_convert.h, apps/convert_checkpoint) against
// transformers (tests/reference/hf_bert_ref.py: a random BertForPreTraining saved by
// save_pretrained, with float64 MLM and next-sentence logits, the pre-training loss and every
// parameter gradient, in tests/apps/ref/hf_bert/; batches with token types 0/1, padding masked by
// attention_mask, labelled MLM positions and both next-sentence labels):
//  * the MLM logits (every position, padding included), the NSP logits, the loss (MLM + NSP and
//    each part) and every parameter gradient equal transformers';
//  * the erf GELU matters: the same weights with the tanh GELU are off by far more than that;
//  * convert_checkpoint HF → mpitron → HF gives the original tensors bit for bit (F32 and BF16),
//    config.json round-trips, and the exported directory loads in transformers with equal logits
//    (when /usr/bin/python3 has torch and transformers; else a SKIPPED message);
//  * bad config keys, missing tensors, wrong shapes and an untied decoder are named.
//
// Tolerances (f32 in mpitron vs float64 in transformers on the same f32 weights): 2 post-LN layers
// of width 48/80 with O(1) activations (every LayerNorm renormalises), so a dot product sums <= 80
// f32 products (relative error <= 80 · 6e-8 ≈ 5e-6 worst case, ~1e-7 typical); the erf GELU is f32
// erfc (a few ulps); ref.json stores 10 significant digits (1e-10). Logits are O(1): 2e-5 absolute
// (measured: see the MESSAGE lines, 8.8e-7 MLM, 1.4e-7 NSP). Losses are O(1): 1e-5 relative. Gradients: each
// tensor's norm to 1e-4 relative, sampled entries to 1e-4 · |value| + 1e-4 · rms of that tensor's
// gradient, plus an absolute floor of 1e-7 on the norm and 1e-8 on an entry: the key biases'
// gradient is exactly zero (a key bias adds q·b_k to every score of a query alike, and softmax
// is shift-invariant), which float64 gives as ~1e-17 and f32 as ~1e-8 of cancellation noise;
// every other gradient norm here is >= 0.024. A wrong mapping (q/k swapped, ln1/ln2 swapped, type rows swapped, the NSP columns
// swapped) or the tanh GELU (measured 6.0e-4 on the MLM logits, below) changes these by far more.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "autograd/tape.h"
#include "io/safetensors.h"
#include "model/families.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using apps_test::TempDir;
using apps_test::run_app;
using apps_test::slurp;
using nlohmann::json;

namespace {

const std::string kDir = apps_test::kSource + "/tests/apps/ref/hf_bert";
constexpr int64_t kVocab = 120;

json ref_json() { return json::parse(slurp(kDir + "/ref.json")); }

Tensor ints2(const json& rows) {
  std::vector<int64_t> v;
  for (const auto& r : rows)
    for (const auto& x : r) v.push_back(x.get<int64_t>());
  return Tensor::from_ints(v, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, DType::I32);
}

Tensor ints1(const json& row) {
  std::vector<int64_t> v;
  for (const auto& x : row) v.push_back(x.get<int64_t>());
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}, DType::I32);
}

// A reference batch as mpitron's BertBatch: next_sentence_label is is_random (docs/model-families.md "Hugging Face BERT").
BertBatch batch_of(const json& r) {
  BertBatch b;
  b.tokens = ints2(r["ids"]);
  b.types = ints2(r["types"]);
  b.labels = ints2(r["labels"]);
  b.lengths = ints1(r["lengths"]);
  b.is_random = ints1(r["next_sentence_label"]);
  return b;
}

// Max |logit - reference| over the first V columns of (B·T, Vp) MLM logits.
double mlm_err(const Tensor& logits, const json& want) {
  const std::vector<float> lg = logits.to_floats();
  const int64_t Vp = logits.dim(1);
  double worst = 0;
  int64_t row = 0;
  for (const auto& b : want)
    for (const auto& t : b) {
      for (int64_t v = 0; v < kVocab; ++v)
        worst = std::max(worst, std::abs(double(lg[static_cast<size_t>(row * Vp + v)]) - t[static_cast<size_t>(v)].get<double>()));
      ++row;
    }
  return worst;
}

double nsp_err(const Tensor& logits, const json& want) {
  const std::vector<float> lg = logits.to_floats();
  double worst = 0;
  for (size_t b = 0; b < want.size(); ++b)
    for (size_t k = 0; k < 2; ++k) worst = std::max(worst, std::abs(double(lg[b * 2 + k]) - want[b][k].get<double>()));
  return worst;
}

bool has(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

}  // namespace

TEST_CASE("HF BERT (transformers): import, MLM and NSP logits, losses, every gradient") {
  const json ref = ref_json();
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  CHECK(hf_model_type(ck.config_json) == "bert");
  const GPTConfig cfg = hf_config(ck.config_json, 8);  // 120 divides by 8: no padding
  CHECK(cfg.family() == "bert");
  CHECK(cfg.padded_vocab_size == kVocab);
  CHECK(cfg.post_ln);
  CHECK(!cfg.causal);
  CHECK(cfg.binary_head);
  CHECK(cfg.gelu_erf());  // hidden_act "gelu"
  CHECK(cfg.num_tokentypes == 2);
  CHECK(cfg.ffn() == 80);
  CHECK(cfg.layernorm_epsilon == 1e-12f);
  auto model = bert_from_hf(ck, cfg);

  for (size_t b = 0; b < ref["batches"].size(); ++b) {
    const json& r = ref["batches"][b];
    const BertBatch batch = batch_of(r);
    const BertLogits lg = model->logits(batch);
    const double em = mlm_err(lg.mlm, r["mlm_logits"]), en = nsp_err(lg.binary, r["nsp_logits"]);
    MESSAGE("batch ", b, std::string(batch.padded() ? " (padded)" : ""), ": max |MLM logit - transformers f64| = ", em,
            ", NSP = ", en);
    CHECK(em < 2e-5);
    CHECK(en < 2e-5);
    Tape tape;
    model->params().zero_grad();
    ForwardOptions o;
    o.train = false;
    Var loss = model->forward(tape, batch, o);
    const double want = r["loss"], got = loss.value().item();
    MESSAGE("batch ", b, ": loss ", got, " vs transformers ", want, " (lm ", model->last_losses().lm, " vs ",
            r["mlm_loss"].get<double>(), ", sop ", model->last_losses().sop, " vs ", r["nsp_loss"].get<double>(), ")");
    CHECK(std::abs(got - want) <= 1e-5 * want);
    CHECK(std::abs(model->last_losses().lm - r["mlm_loss"].get<double>()) <= 1e-5 * r["mlm_loss"].get<double>());
    CHECK(std::abs(model->last_losses().sop - r["nsp_loss"].get<double>()) <= 1e-5 * r["nsp_loss"].get<double>());
    if (!r.contains("grads")) continue;
    tape.backward(loss);
    // The gradients in HF layout (query|key|value split back), through the exporter.
    const Tensor grads = model->params().grads().clone();
    const io::Safetensors g = hf_from_gpt(model->core(), {}, &grads);
    CHECK(g.tensors.size() == r["grads"].size());
    double worst_norm = 0, worst_zero = 0;
    for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
      REQUIRE_MESSAGE(g.has(it.key()), it.key());
      const std::vector<float> v = g.to_f32(it.key()).to_floats();
      double n2 = 0;
      for (float x : v) n2 += double(x) * x;
      const double norm = std::sqrt(n2), want_norm = it.value()["norm"], rms = it.value()["rms"];
      if (want_norm > 1e-3) worst_norm = std::max(worst_norm, std::abs(norm - want_norm) / want_norm);
      else worst_zero = std::max(worst_zero, norm);
      CHECK_MESSAGE(std::abs(norm - want_norm) <= 1e-4 * want_norm + 1e-7, it.key(), ": |grad| ", norm, " vs ", want_norm);
      for (const auto& s : it.value()["sample"]) {
        const double gv = v[s[0].get<size_t>()], w = s[1];
        CHECK_MESSAGE(std::abs(gv - w) <= 1e-4 * std::abs(w) + 1e-4 * rms + 1e-8, it.key(), "[", s[0], "] ", gv, " vs ", w);
      }
    }
    MESSAGE("worst relative gradient-norm difference ", worst_norm, " over ", r["grads"].size(),
            " tensors; the zero key-bias gradients: norm <= ", worst_zero);
  }
}

TEST_CASE("HF BERT: the tanh GELU would not match transformers' \"gelu\" (why gelu_exact exists)") {
  const json ref = ref_json();
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  GPTConfig cfg = hf_config(ck.config_json, 8);
  cfg.mlp = MlpKind::GeluTanh;
  auto model = bert_from_hf(ck, cfg);
  const json& r = ref["batches"][0];
  const double err = mlm_err(model->logits(batch_of(r)).mlm, r["mlm_logits"]);
  MESSAGE("tanh GELU on HF's erf-GELU BERT: max |MLM logit - transformers| = ", err);
  CHECK(err > 1e-4);  // >> the 2e-5 tolerance above
}

TEST_CASE("convert_checkpoint: HF BERT -> mpitron -> HF is bitwise, config.json round-trips, transformers loads it") {
  TempDir tmp("hfbert");
  const json ref = ref_json();
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  const GPTConfig cfg = hf_config(ck.config_json);
  CHECK(cfg.padded_vocab_size == 128);  // 8 padding rows, dropped on export
  auto direct = bert_from_hf(ck, cfg);
  const std::string ckpt = tmp / "ckpt";
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + kDir + " --output " + ckpt,
                          tmp / "in.log") == 0, slurp(tmp / "in.log"));
  InferenceModel m = load_model_for_inference(ckpt);
  const GPTConfig& mc = m.model->config();
  CHECK(mc.family() == "bert");
  CHECK(mc.gelu_erf());  // recorded in the checkpoint's model_config
  CHECK(mc.post_ln);
  CHECK(m.model->params().values().to_floats() == direct->params().values().to_floats());
  // The checkpoint's model computes HF's logits over the real vocabulary.
  Bert loaded(mc, Device::cpu());
  loaded.params().values().copy_from(m.model->params().values());
  for (const json& r : ref["batches"]) {
    const BertLogits lg = loaded.logits(batch_of(r));
    CHECK(mlm_err(lg.mlm, r["mlm_logits"]) < 2e-5);
    CHECK(nsp_err(lg.binary, r["nsp_logits"]) < 2e-5);
  }

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
  CHECK(out["architectures"] == json::array({"BertForPreTraining"}));
  CHECK(out["model_type"] == "bert");
  for (auto it = out.begin(); it != out.end(); ++it)
    if (orig.contains(it.key()))
      CHECK_MESSAGE(orig[it.key()] == it.value(), it.key(), ": ", it.value().dump(), " vs ", orig[it.key()].dump());
  const GPTConfig again = hf_config(out.dump());
  CHECK(again.num_layers == cfg.num_layers);
  CHECK(again.ffn() == cfg.ffn());
  CHECK(again.layernorm_epsilon == cfg.layernorm_epsilon);
  CHECK(again.num_tokentypes == cfg.num_tokentypes);
  CHECK(again.gelu_erf() == cfg.gelu_erf());
  CHECK(again.max_position_embeddings == cfg.max_position_embeddings);
  // The exported directory imports again with equal values.
  const HfCheckpoint ck2 = read_hf_checkpoint(tmp / "hf");
  CHECK(bert_from_hf(ck2, hf_config(ck2.config_json))->params().values().to_floats() ==
        direct->params().values().to_floats());
  // BF16: export, import (widened exactly), export again: the same bytes.
  apps_test::check_hf_bf16_round_trip(ckpt, tmp, "cls.predictions.bias");
  // GPT-2-only flags are refused for a BERT.
  CHECK(run_app("convert_checkpoint", "--direction mpitron-to-hf --lm-head --input " + ckpt + " --output " + tmp / "x",
                tmp / "bad.log") != 0);
  CHECK(has(slurp(tmp / "bad.log"), "--lm-head"));

  // transformers itself loads the F32 export and gives the reference logits.
  if (std::system("/usr/bin/python3 -c 'import torch, transformers' > /dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED transformers load of the export: /usr/bin/python3 has no torch + transformers "
            "(tests/reference/hf_bert_ref.py's header says how to install them); the C++ comparisons above ran");
    return;
  }
  const int rc = std::system(("/usr/bin/python3 " + apps_test::kSource + "/tests/reference/hf_bert_ref.py --out " + kDir +
                              " --check-export " + tmp / "hf" + " > " + tmp / "py.log" + " 2>&1")
                                 .c_str());
  MESSAGE(slurp(tmp / "py.log"));
  CHECK_MESSAGE(rc == 0, "transformers did not load the export with equal logits: ", slurp(tmp / "py.log"));
  CHECK(has(slurp(tmp / "py.log"), "max |logit - reference|"));
}

TEST_CASE("HF BERT: bad configs and checkpoints are named") {
  const HfCheckpoint ck = read_hf_checkpoint(kDir);
  const json base = json::parse(ck.config_json);
  const auto with = [&](const std::string& key, const json& v) {
    json j = base;
    j[key] = v;
    return error_of([&] { hf_config(j.dump()); });
  };
  CHECK(has(with("hidden_act", "relu"), "hidden_act"));
  CHECK(with("hidden_act", "gelu_new").empty());
  CHECK(!hf_config([&] { json j = base; j["hidden_act"] = "gelu_pytorch_tanh"; return j.dump(); }()).gelu_erf());
  CHECK(has(with("position_embedding_type", "relative_key"), "position_embedding_type"));
  CHECK(has(with("is_decoder", true), "is_decoder"));
  CHECK(has(with("add_cross_attention", true), "add_cross_attention"));
  CHECK(has(with("tie_word_embeddings", false), "tie_word_embeddings"));
  CHECK(has(with("some_new_thing", 3), "some_new_thing"));
  CHECK(has(with("layer_norm_eps", "small"), "layer_norm_eps"));
  CHECK(with("architectures", json::array({"BertForMaskedLM"})).empty());  // the hub's BERTs say this
  CHECK(has(with("model_type", "roberta"), "roberta"));
  CHECK(with("hidden_dropout_prob", 0.2).empty());  // dropout does not change evaluation
  json a = base;
  a.erase("model_type");
  CHECK(hf_model_type(a.dump()) == "bert");  // from architectures BertForPreTraining
  // A config that does not fit the weights names both shapes and the file.
  const std::string shape_err = error_of([&] {
    json j = base;
    j["intermediate_size"] = 96;
    bert_from_hf(ck, hf_config(j.dump()));
  });
  CHECK(has(shape_err, "[80, 48]"));
  CHECK(has(shape_err, "[96, 48]"));
  CHECK(has(shape_err, "model.safetensors"));
  // A missing tensor names the tensor and the directory.
  {
    HfCheckpoint partial = ck;
    const int64_t i = partial.tensors.index("bert.encoder.layer.1.attention.self.key.bias");
    partial.tensors.tensors.erase(partial.tensors.tensors.begin() + i);
    const std::string e = error_of([&] { bert_from_hf(partial, hf_config(partial.config_json)); });
    CHECK(has(e, "bert.encoder.layer.1.attention.self.key.bias"));
    CHECK(has(e, kDir));
  }
  // The tied decoder: equal to the word embeddings is accepted, different is named; a stray
  // tensor is named; the buffers older checkpoints saved are ignored.
  {
    HfCheckpoint tied = ck;
    tied.tensors.add_f32("cls.predictions.decoder.weight", ck.tensors.to_f32("bert.embeddings.word_embeddings.weight"));
    tied.tensors.add_f32("cls.predictions.decoder.bias", ck.tensors.to_f32("cls.predictions.bias"));
    tied.tensors.add_f32("bert.embeddings.position_ids", Tensor::zeros({1, 32}, DType::F32));
    CHECK(error_of([&] { bert_from_hf(tied, hf_config(tied.config_json)); }).empty());
    HfCheckpoint untied = ck;
    Tensor w = ck.tensors.to_f32("bert.embeddings.word_embeddings.weight").clone();
    w.slice(0, 3, 4).fill(0.5);
    untied.tensors.add_f32("cls.predictions.decoder.weight", w);
    CHECK(has(error_of([&] { bert_from_hf(untied, hf_config(untied.config_json)); }), "cls.predictions.decoder.weight"));
    HfCheckpoint stray = ck;
    stray.tensors.add_f32("bert.encoder.layer.2.output.dense.bias", Tensor::zeros({48}, DType::F32));
    CHECK(has(error_of([&] { bert_from_hf(stray, hf_config(stray.config_json)); }), "layer.2.output.dense.bias"));
    HfCheckpoint task = ck;  // a BertForSequenceClassification head
    task.tensors.add_f32("classifier.weight", Tensor::zeros({2, 48}, DType::F32));
    CHECK(has(error_of([&] { bert_from_hf(task, hf_config(task.config_json)); }), "classifier.weight"));
  }
  // TF-era LayerNorm names (gamma / beta) import to the same values.
  {
    HfCheckpoint tf = ck;
    for (io::SafeTensor& t : tf.tensors.tensors) {
      const std::string w = "LayerNorm.weight", b = "LayerNorm.bias";
      if (t.name.size() > w.size() && t.name.compare(t.name.size() - w.size(), w.size(), w) == 0)
        t.name = t.name.substr(0, t.name.size() - 6) + "gamma";
      else if (t.name.size() > b.size() && t.name.compare(t.name.size() - b.size(), b.size(), b) == 0)
        t.name = t.name.substr(0, t.name.size() - 4) + "beta";
    }
    CHECK(tf.tensors.has("bert.encoder.layer.1.output.LayerNorm.gamma"));
    CHECK(bert_from_hf(tf, hf_config(tf.config_json))->params().values().to_floats() ==
          bert_from_hf(ck, hf_config(ck.config_json))->params().values().to_floats());
  }
  // Only the post-LN BERT with its binary head exports as BertForPreTraining.
  GPTConfig c = hf_config(ck.config_json);
  std::string why;
  CHECK(hf_exportable(c, &why));
  c.post_ln = false;
  CHECK(!hf_exportable(c, &why));
  CHECK(has(why, "post-LN"));
  c.post_ln = true;
  c.binary_head = false;
  CHECK(!hf_exportable(c, &why));
  CHECK(has(why, "binary head"));
  CHECK(hf_exportable(GPTConfig{}, &why));  // a GPT-2 exports, as GPT2LMHeadModel, not as a BERT:
  CHECK(has(family_misses(find_family("bert"), GPTConfig{}, /*hf=*/true), "BERT"));
}
