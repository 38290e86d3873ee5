// T5 (model/t5.h) against transformers 4.40's T5ForConditionalGeneration
// (tests/reference/hf_t5_ref.py → tests/apps/ref/hf_t5_{gated,relu}/: two small random models saved by
// save_pretrained — t5-v1.1 style gated-GELU with an untied head, and the original ReLU with the tied head
// and its d_model^−½ output scale — with float64 logits, encoder outputs, losses, every parameter
// gradient and greedy decodes; a 2-layer encoder and a 3-layer decoder, so a wrong stack mapping shows):
//  * the relative position buckets equal transformers' (bidirectional and causal, 6 and 20 positions:
//    the log range and the clip at max_distance);
//  * the encoder output, the logits (every decoder position), the loss and every gradient equal
//    transformers' on padded encoder inputs, and greedy decoding gives transformers' tokens;
//  * export gives back the checkpoint's tensors (the query and tied-norm factors undone) and its config.json
//    reads back to the same configuration.
// Tolerances (f32 here vs transformers' float64 on the same f32 weights): 5 blocks of width 32/48 with
// RMSNorm renormalising, dot products of <= 48 f32 terms (relative error ~1e-7 typical); transformers'
// T5LayerNorm takes its mean of squares in f32 even in a float64 model (the reference script measured
// 3.7e-7 on the gated logits from that); ref.json keeps 10 significant digits. Logits and encoder
// outputs are O(1): 2e-5 absolute. Losses: 1e-5 relative. Gradients: each tensor's norm to 1e-4 relative
// plus 1e-7 (the relative-bias rows of buckets that never occur and the embedding rows of tokens absent
// from the batch are exactly 0 in both), entries to 1e-4·|value| + 1e-4·rms + 1e-8. A swapped q/k or
// wi_0/wi_1, or a missing √HD or d_model^−½ factor miss these by far more (the query factor is checked
// below).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/tape.h"
#include "core/device.h"
#include "io/safetensors.h"
#include "model/arch_fields.h"
#include "model/families.h"
#include "model/inference/hf_convert.h"
#include "model/t5.h"
#include "tensor/ops.h"
#include "tests/model/t5_ref.h"

using namespace mpitron;
using nlohmann::json;

namespace {

using t5_test::kRef;
using t5_test::ref_json;

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

T5Batch batch_of(const json& r) {
  T5Batch b;
  b.enc = ints2(r["enc_ids"]);
  b.dec = ints2(r["dec_ids"]);
  b.labels = ints2(r["labels"]);
  b.enc_lengths = ints1(r["enc_lengths"]);
  return b;
}

// Max |x − reference| over a (rows, cols ≤ width) matrix against nested (B, T, cols) JSON.
double max_err(const Tensor& x, const json& want) {
  const std::vector<float> v = x.to(Device::cpu()).to(DType::F32).to_floats();
  const int64_t width = x.dim(1);
  double worst = 0;
  int64_t row = 0;
  for (const auto& b : want)
    for (const auto& t : b) {
      for (size_t k = 0; k < t.size(); ++k)
        worst = std::max(worst, std::abs(double(v[static_cast<size_t>(row * width) + k]) - t[k].get<double>()));
      ++row;
    }
  return worst;
}

struct Loaded {
  GPTConfig cfg;
  std::unique_ptr<T5> model;
};
Loaded load(const std::string& variant) {
  const HfCheckpoint ck = read_hf_checkpoint(kRef + variant);
  Loaded l;
  l.cfg = hf_config(ck.config_json, 8);  // 96 divides by 8: no padding
  l.model = t5_from_hf(ck, l.cfg);
  return l;
}

}  // namespace

TEST_CASE("T5 relative position buckets equal transformers' (bidirectional and causal)") {
  const json ref = ref_json("gated");
  for (const char* key : {"relative_buckets", "relative_buckets_long"}) {
    const json& r = ref[key];
    const int64_t nb = r["num_buckets"], md = r["max_distance"];
    for (const bool bi : {true, false}) {
      const json& want = r[bi ? "bidirectional" : "unidirectional"];
      int wrong = 0;
      for (size_t i = 0; i < want.size(); ++i)
        for (size_t j = 0; j < want[i].size(); ++j)
          wrong += relative_bucket(static_cast<int64_t>(i), static_cast<int64_t>(j), bi, nb, md) != want[i][j].get<int64_t>();
      CHECK_MESSAGE(wrong == 0, key, bi ? " bidirectional" : " causal");
    }
  }
}

TEST_CASE("HF T5 (transformers): import, encoder output, logits, loss, every gradient, greedy decoding") {
  for (const std::string variant : {"gated", "relu"}) {
    CAPTURE(variant);
    const json ref = ref_json(variant);
    Loaded l = load(variant);
    const GPTConfig& c = l.cfg;
    CHECK(c.family() == "t5");
    CHECK(c.t5);
    CHECK(c.encoder_num_layers == 2);
    CHECK(c.decoder_num_layers() == 3);
    CHECK(c.head_dim() == 8);
    CHECK(c.relative_attention_num_buckets == 8);
    CHECK(c.mlp == (variant == "gated" ? MlpKind::GeGLU : MlpKind::ReLU));
    CHECK(c.untie_embeddings == (variant == "gated"));
    T5& m = *l.model;
    for (size_t bi = 0; bi < ref["batches"].size(); ++bi) {
      const json& r = ref["batches"][bi];
      const T5Batch batch = batch_of(r);
      const double ee = max_err(m.encode(batch.enc, batch.enc_lengths), r["enc_out"]);
      const double el = max_err(m.logits(batch), r["logits"]);
      MESSAGE(variant, " batch ", bi, ": max |encoder output − transformers f64| = ", ee, ", logits ", el);
      CHECK(ee < 2e-5);
      CHECK(el < 2e-5);
      Tape tape;
      m.params().zero_grad();
      ForwardOptions o;
      o.train = false;
      Var loss = m.forward(tape, batch, o);
      const double want = r["loss"], got = loss.value().item();
      CHECK_MESSAGE(std::abs(got - want) <= 1e-5 * want, "loss ", got, " vs transformers ", want);
      if (!r.contains("grads")) continue;
      tape.backward(loss);
      const Tensor grads = m.params().grads().clone();
      HfExportOptions eo;
      eo.gradients = true;
      const io::Safetensors g = hf_from_gpt(m.core(), eo, &grads);
      CHECK(g.tensors.size() == r["grads"].size());
      double worst = 0;
      for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
        REQUIRE_MESSAGE(g.has(it.key()), it.key());
        const std::vector<float> v = g.to_f32(it.key()).to_floats();
        double n2 = 0;
        for (float x : v) n2 += double(x) * x;
        const double norm = std::sqrt(n2), want_norm = it.value()["norm"], rms = it.value()["rms"];
        if (want_norm > 1e-3) worst = std::max(worst, std::abs(norm - want_norm) / want_norm);
        CHECK_MESSAGE(std::abs(norm - want_norm) <= 1e-4 * want_norm + 1e-7, it.key(), ": |grad| ", norm, " vs ", want_norm);
        for (const auto& s : it.value()["sample"]) {
          const double gv = v[s[0].get<size_t>()], w = s[1];
          CHECK_MESSAGE(std::abs(gv - w) <= 1e-4 * std::abs(w) + 1e-4 * rms + 1e-8, it.key(), "[", s[0], "] ", gv, " vs ", w);
        }
      }
      MESSAGE(variant, ": worst relative gradient-norm difference ", worst, " over ", r["grads"].size(), " tensors");
    }
    for (const json& gr : ref["greedy"]) {
      const Tensor enc = ints1(gr["input_ids"]).view({1, -1});
      const std::vector<int64_t> got = m.greedy(enc, enc.dim(1), 0, 1, 8);
      std::vector<int64_t> want;
      for (const auto& x : gr["output"]) want.push_back(x.get<int64_t>());
      CHECK(got == want);
    }
  }
}

TEST_CASE("HF T5: without the query factor sqrt(HD) the logits would not match (transformers does not scale scores)") {
  const json ref = ref_json("gated");
  Loaded l = load("gated");
  const int64_t q = l.cfg.num_attention_heads * l.cfg.head_dim();
  const float undo = 1.0f / std::sqrt(static_cast<float>(l.cfg.head_dim()));
  for (int64_t layer = 0; layer < l.cfg.num_layers; ++layer) {
    const Tensor w = l.model->core().block_params(layer)[ParamRole::QkvWeight].value().slice(0, 0, q);
    axpby(undo, w, 0.0f, w);
  }
  const double err = max_err(l.model->logits(batch_of(ref["batches"][0])), ref["batches"][0]["logits"]);
  MESSAGE("self-attention queries without sqrt(HD): max |logit - transformers| = ", err);
  CHECK(err > 1e-3);
}

TEST_CASE("HF T5: export gives back the checkpoint's tensors and config.json") {
  for (const std::string variant : {"gated", "relu"}) {
    CAPTURE(variant);
    const HfCheckpoint ck = read_hf_checkpoint(kRef + variant);
    Loaded l = load(variant);
    const io::Safetensors out = hf_from_gpt(l.model->core());
    for (const io::SafeTensor& t : out.tensors) {
      REQUIRE_MESSAGE(ck.tensors.has(t.name), t.name);
      const std::vector<float> a = out.to_f32(t.name).to_floats(), b = ck.tensors.to_f32(t.name).to_floats();
      REQUIRE(a.size() == b.size());
      double worst = 0;  // the √8 and 32^−½ factors round once each way: 1 ulp at most
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (std::abs(double(b[i])) + 1e-30));
      CHECK_MESSAGE(worst <= 1.2e-7, t.name, " differs by ", worst);
    }
    for (const io::SafeTensor& t : ck.tensors.tensors) CHECK_MESSAGE(out.has(t.name), t.name, " not exported");
    const GPTConfig back = hf_config(hf_config_json(l.cfg), 8);
    CHECK(config_to_json(back) == config_to_json(l.cfg));
  }
}

TEST_CASE("HF T5: bad config keys are named") {
  const HfCheckpoint ck = read_hf_checkpoint(kRef + "gated");
  json j = json::parse(ck.config_json);
  j["feed_forward_proj"] = "gated-silu";
  CHECK_THROWS_WITH_AS(hf_config(j.dump()), doctest::Contains("feed_forward_proj"), Error);
  j = json::parse(ck.config_json);
  j["is_encoder_decoder"] = false;
  CHECK_THROWS_WITH_AS(hf_config(j.dump()), doctest::Contains("is_encoder_decoder"), Error);
}

// The same model on the CUDA device (the simulated one in `make test-cuda-sim`; a GPU in tools/gpu_check.sh):
// the cross-attention, the biased attention blocks (the cuBLAS fallback: cuDNN takes no bias) and the ReLU
// and GeGLU kernels. f32: within 1e-4 of transformers (cuBLAS's f32 GEMMs sum in another order than
// OpenBLAS's; the CPU path is 1e-6 away); bf16: 8 significant bits through ~20 roundings per value, a 3%
// relative L2 error on the logits (as test_gpt_reference's bf16 bound).
TEST_CASE("T5 on CUDA: f32 logits, loss, gradients and greedy decoding equal transformers'; bf16 within its bounds") {
  if (!cuda_available()) {
    MESSAGE("SKIPPED cuda: ", cuda_unavailable_reason());
    return;
  }
  for (const std::string variant : {"gated", "relu"}) {
    CAPTURE(variant);
    const json ref = ref_json(variant);
    Loaded l = load(variant);
    for (const DType dt : {DType::F32, DType::BF16}) {
      GPTConfig cfg = l.cfg;
      cfg.compute_dtype = dt;
      T5 m(cfg, Device::cuda(0));
      m.params().values().copy_from(l.model->params().values().to(dt).to(Device::cuda(0)));
      const json& r = ref["batches"][0];
      const T5Batch batch = batch_of(r);
      const Tensor logits = m.logits(batch);
      if (dt == DType::BF16) {
        const std::vector<float> got = logits.to_floats();
        double d2 = 0, n2 = 0;
        int64_t row = 0;
        for (const auto& b : r["logits"])
          for (const auto& t : b) {
            for (size_t k = 0; k < t.size(); ++k) {
              const double w = t[k], g = got[static_cast<size_t>(row * logits.dim(1)) + k];
              d2 += (g - w) * (g - w), n2 += w * w;
            }
            ++row;
          }
        MESSAGE(variant, " bf16 on CUDA: relative L2 logit error ", std::sqrt(d2 / n2));
        CHECK(std::sqrt(d2 / n2) < 3e-2);
        continue;
      }
      const double el = max_err(logits, r["logits"]);
      MESSAGE(variant, " f32 on CUDA: max |logit - transformers f64| = ", el);
      CHECK(el < 1e-4);
      Tape tape;
      m.params().zero_grad();
      ForwardOptions o;
      o.train = false;
      Var loss = m.forward(tape, batch, o);
      CHECK(std::abs(loss.value().item() - r["loss"].get<double>()) <= 1e-4 * r["loss"].get<double>());
      tape.backward(loss);
      const Tensor grads = m.params().grads().to(Device::cpu()).to(DType::F32);
      HfExportOptions eo;
      eo.gradients = true;
      const io::Safetensors g = hf_from_gpt(l.model->core(), eo, &grads);  // the CPU model's layout, the device's values
      for (auto it = r["grads"].begin(); it != r["grads"].end(); ++it) {
        const std::vector<float> v = g.to_f32(it.key()).to_floats();
        double n2 = 0;
        for (float x : v) n2 += double(x) * x;
        const double want = it.value()["norm"];
        CHECK_MESSAGE(std::abs(std::sqrt(n2) - want) <= 1e-3 * want + 1e-6, it.key(), ": |grad| ", std::sqrt(n2), " vs ", want);
      }
      for (const json& gr : ref["greedy"]) {
        const Tensor enc = ints1(gr["input_ids"]).view({1, -1});
        std::vector<int64_t> want;
        for (const auto& x : gr["output"]) want.push_back(x.get<int64_t>());
        CHECK(m.greedy(enc, enc.dim(1), 0, 1, 8) == want);
      }
    }
  }
}
