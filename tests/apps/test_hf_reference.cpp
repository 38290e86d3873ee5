// Hugging Face GPT-2 import/export and the evaluation apps against PyTorch
// (tests/reference/hf_gpt2_ref.py, outputs in tests/apps/ref/):
//  * safetensors HF → mpitron checkpoint → HF is bitwise (random model written here);
//  * the reference model's logits match PyTorch (float64) to 1e-4 relative;
//  * apps/evaluate: WikiText perplexity (overlapping and disjoint windows) and LAMBADA
//    (strict and non-strict) match PyTorch; apps/generate_text greedy = full recomputation.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "core/philox.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "model/inference/generate.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
using apps_test::TempDir;
using apps_test::run_app;
using apps_test::slurp;

namespace {

const std::string kRef = apps_test::kSource + "/tests/apps/ref/";

nlohmann::json ref_json() { return nlohmann::json::parse(slurp(kRef + "hf_ref.json")); }

// A random GPT-2 (C=16, 2 heads, 2 layers, V=300, P=40) in HF layout, in the order our exporter writes.
io::Safetensors random_hf(const std::string& prefix, bool lm_head) {
  const int64_t V = 300, P = 40, C = 16, F = 64;
  io::Safetensors st;
  uint64_t off = 0;
  const auto add = [&](const std::string& name, const Shape& shape) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = philox_normal(77, off, i) * 0.1f;
    off += 1 << 20;
    st.add_f32(prefix + name, Tensor::from_vector(v, shape));
  };
  add("wte.weight", {V, C});
  add("wpe.weight", {P, C});
  for (int l = 0; l < 2; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {C, 3 * C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {C, F});
    add(h + "mlp.c_fc.bias", {F});
    add(h + "mlp.c_proj.weight", {F, C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  if (lm_head) st.tensors.push_back(io::SafeTensor{"lm_head.weight", "F32", {V, C}, st.at(prefix + "wte.weight").bytes});
  st.metadata["format"] = "pt";
  return st;
}

}  // namespace

TEST_CASE("safetensors: HF -> mpitron checkpoint -> HF is bitwise, file bytes included") {
  TempDir tmp("st");
  for (const std::string prefix : {"transformer.", ""}) {
    const io::Safetensors st = random_hf(prefix, prefix.empty() ? false : true);
    io::write_safetensors(tmp / "in.safetensors", st);
    const io::Safetensors in = io::read_safetensors(tmp / "in.safetensors");
    REQUIRE(in.tensors.size() == st.tensors.size());
    const GPTConfig cfg = hf_file_config(in, "", 2);
    CHECK(cfg.padded_vocab_size == 384);
    CHECK(cfg.ffn() == 64);
    auto model = gpt_from_hf(in, cfg);
    // Padding rows are zero; a transposed matrix lands transposed.
    const std::vector<float> wte = model->params().var("wte").value().to_floats();
    for (size_t i = 300 * 16; i < wte.size(); ++i) REQUIRE(wte[i] == 0.0f);
    const std::vector<float> qkv = model->params().var("layers.1.attn.qkv.weight").value().to_floats();
    const Tensor hf_qkv = in.to_f32(prefix + "h.1.attn.c_attn.weight");
    CHECK(qkv[5 * 16 + 3] == hf_qkv.to_floats()[3 * 48 + 5]);
    const std::string ckpt = tmp / ("ckpt" + prefix);
    save_model_checkpoint(ckpt, *model, "test");
    InferenceModel back = load_model_for_inference(ckpt);
    HfExportOptions o;
    o.prefix = prefix;
    o.lm_head = !prefix.empty();
    io::write_safetensors(tmp / "out.safetensors", hf_from_gpt(*back.model, o));
    CHECK(slurp(tmp / "out.safetensors") == slurp(tmp / "in.safetensors"));
  }
  // Buffers are skipped, an untied head or a stray tensor is refused, corrupt files are named.
  io::Safetensors st = random_hf("transformer.", false);
  st.add_f32("transformer.h.0.attn.bias", Tensor::zeros({1, 1, 4, 4}, DType::F32));
  CHECK_NOTHROW(gpt_from_hf(st, hf_file_config(st, "", 2)));
  st.add_f32("transformer.h.0.extra", Tensor::zeros({2}, DType::F32));
  CHECK_THROWS_AS(gpt_from_hf(st, hf_file_config(st, "", 2)), Error);
  io::Safetensors untied = random_hf("transformer.", false);
  untied.add_f32("lm_head.weight", Tensor::zeros({300, 16}, DType::F32));
  CHECK_THROWS_AS(gpt_from_hf(untied, hf_file_config(untied, "", 2)), Error);
  CHECK_THROWS_AS(hf_file_config(untied, "", 0), Error);  // heads unknown
  CHECK_THROWS_AS(hf_file_config(untied, R"({"n_head": 4, "n_embd": 32})", 0), Error);  // contradicts weights
  std::string bytes = slurp(tmp / "in.safetensors");
  std::ofstream(tmp / "trunc.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  CHECK_THROWS_AS(io::read_safetensors(tmp / "trunc.safetensors"), Error);
  std::ofstream(tmp / "huge.safetensors", std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
  CHECK_THROWS_AS(io::read_safetensors(tmp / "huge.safetensors"), Error);
}

TEST_CASE("reference GPT-2 (PyTorch): logits, bitwise F16 export, perplexity, LAMBADA, greedy generation") {
  const nlohmann::json ref = ref_json();
  TempDir tmp("hfref");
  const io::Safetensors st = io::read_safetensors(kRef + "gpt2_tiny.safetensors");
  const GPTConfig cfg = hf_file_config(st, slurp(kRef + "gpt2_tiny_config.json"), 0);
  CHECK(cfg.vocab_size == 50257);
  CHECK(cfg.padded_vocab_size == 50304);
  auto model = gpt_from_hf(st, cfg);

  SUBCASE("logits") {
    const int64_t stride = ref["sample_stride"];
    for (const auto& r : ref["logits"]) {
      const std::vector<int64_t> ids = r["ids"];
      const int64_t T = static_cast<int64_t>(ids.size());
      const std::vector<float> lg = model->logits(Tensor::from_ints(ids, {1, T})).to_floats();
      for (int64_t t = 0; t < T; ++t) {
        const float* row = lg.data() + t * cfg.padded_vocab_size;
        double mx = row[0], z = 0;
        int64_t am = 0;
        for (int64_t v = 0; v < 50257; ++v)
          if (row[v] > mx) mx = row[v], am = v;
        for (int64_t v = 0; v < 50257; ++v) z += std::exp(double(row[v]) - mx);
        const double lse = mx + std::log(z), ref_lse = r["lse"][static_cast<size_t>(t)];
        CHECK(std::abs(lse - ref_lse) <= 1e-4 * std::abs(ref_lse));
        CHECK(am == r["argmax"][static_cast<size_t>(t)].get<int64_t>());
        // Relative to the logit, or to 0.1 (the logits here are O(1)) when it nearly cancels.
        const auto& sample = r["sample"][static_cast<size_t>(t)];
        for (size_t k = 0; k < sample.size(); ++k) {
          const double want = sample[k], got = row[static_cast<int64_t>(k) * stride];
          CHECK_MESSAGE(std::abs(got - want) <= 1e-4 * std::max(std::abs(want), 0.1), "logit ", k * stride, " at ", t);
        }
      }
    }
  }

  SUBCASE("checkpoint round trip and F16 export are bitwise") {
    save_model_checkpoint(tmp / "ckpt", *model, "ref");
    InferenceModel back = load_model_for_inference(tmp / "ckpt");
    CHECK(back.model->params().values().to_floats() == model->params().values().to_floats());
    HfExportOptions o;
    o.dtype = "F16";
    const io::Safetensors out = hf_from_gpt(*back.model, o);
    CHECK(out.tensors.size() == st.tensors.size());
    for (const io::SafeTensor& t : st.tensors) {
      const io::SafeTensor& u = out.at(t.name);
      CHECK(u.dtype == t.dtype);
      CHECK(u.shape == t.shape);
      CHECK_MESSAGE(u.bytes == t.bytes, t.name);
    }
  }

  SUBCASE("apps: convert_checkpoint, evaluate, generate_text") {
    const std::string ckpt = tmp / "app_ckpt";
    REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + kRef + "gpt2_tiny.safetensors --hf-config " +
                                              kRef + "gpt2_tiny_config.json --output " + ckpt, tmp / "conv.log") == 0);
    REQUIRE(run_app("convert_checkpoint", "--direction mpitron-to-hf --dtype F16 --input " + ckpt + " --output " +
                                              tmp / "back.safetensors", tmp / "conv2.log") == 0);
    const io::Safetensors back = io::read_safetensors(tmp / "back.safetensors");
    for (const io::SafeTensor& t : st.tensors) CHECK_MESSAGE(back.at(t.name).bytes == t.bytes, t.name);
    CHECK(run_app("convert_checkpoint", "--direction sideways --input x --output y", tmp / "bad.log") != 0);
    // --tensor-model-parallel-size pads the vocabulary as Megatron does at that TP (multiple of 128 x 2).
    const std::string ckpt_tp2 = tmp / "app_ckpt_tp2";
    REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --tensor-model-parallel-size 2 --input " + kRef +
                                              "gpt2_tiny.safetensors --hf-config " + kRef + "gpt2_tiny_config.json --output " +
                                              ckpt_tp2, tmp / "conv_tp2.log") == 0);
    const int64_t v1 = read_checkpoint_config(ckpt).padded_vocab_size, v2 = read_checkpoint_config(ckpt_tp2).padded_vocab_size;
    CHECK(v2 % 256 == 0);
    CHECK(v2 >= v1);
    CHECK(v1 % 128 == 0);
    CHECK(run_app("evaluate", "--task WIKITEXT2 --valid-data x --load " + ckpt + " --no-such-flag", tmp / "bad.log") != 0);
    CHECK(slurp(tmp / "bad.log").find("no-such-flag") != std::string::npos);
    CHECK(run_app("evaluate", "--task LAMBADA --valid-data x --load " + ckpt + " --tensor-model-parallel-size 2",
                  tmp / "bad.log") != 0);

    // WikiText: the first N lines of the bundled test set.
    const int wiki_lines = ref["wikitext"]["lines"];
    {
      std::ifstream f(apps_test::kSource + "/assets/text/wikitext-2.test.txt", std::ios::binary);
      std::ofstream o(tmp / "wiki.txt", std::ios::binary);
      std::string line;
      for (int i = 0; i < wiki_lines && std::getline(f, line); ++i) o << line << "\n";
    }
    for (const auto& r : ref["wikitext"]["runs"]) {
      const int64_t seq = r["seq_length"], ov = r["overlapping_eval"];
      REQUIRE(run_app("evaluate", "--task WIKITEXT2 --valid-data " + tmp / "wiki.txt" + " --load " + ckpt +
                                      " --seq-length " + std::to_string(seq) + " --overlapping-eval " + std::to_string(ov) +
                                      " --micro-batch-size 4 --results-json " + tmp / "w.json", tmp / "w.log") == 0);
      const auto got = nlohmann::json::parse(slurp(tmp / "w.json"));
      CHECK(got["num_original_tokens"] == r["num_original_tokens"]);
      CHECK(got["num_tokenized_tokens"] == r["num_tokenized_tokens"]);
      CHECK(got["windows"] == r["windows"]);
      CHECK(got["scored_targets"] == r["scored_targets"]);
      for (const char* k : {"total_loss", "avg_loss", "ppl", "adjusted_ppl"})
        CHECK_MESSAGE(std::abs(got[k].get<double>() / r[k].get<double>() - 1) < 1e-5, k, " seq ", seq, " overlap ", ov,
                      ": ", got[k].get<double>(), " vs PyTorch ", r[k].get<double>());
      MESSAGE("WikiText seq ", seq, " overlap ", ov, ": adjusted ppl ", got["adjusted_ppl"].get<double>(), " (PyTorch ",
              r["adjusted_ppl"].get<double>(), ")");
    }

    // LAMBADA: the first N lines.
    {
      std::ifstream f(apps_test::kSource + "/assets/text/lambada_test.jsonl", std::ios::binary);
      std::ofstream o(tmp / "lambada.jsonl", std::ios::binary);
      std::string line;
      for (int i = 0; i < ref["lambada"]["lines"].get<int>() && std::getline(f, line); ++i) o << line << "\n";
    }
    for (const bool strict : {false, true}) {
      const auto& r = ref["lambada"][strict ? "strict" : "nonstrict"];
      REQUIRE(run_app("evaluate", "--task LAMBADA --valid-data " + tmp / "lambada.jsonl" + " --load " + ckpt +
                                      " --seq-length 256" + (strict ? " --strict-lambada" : "") + " --results-json " +
                                      tmp / "l.json", tmp / "l.log") == 0);
      const auto got = nlohmann::json::parse(slurp(tmp / "l.json"));
      CHECK(got["accuracy"] == r["accuracy"]);
      REQUIRE(got["examples"].size() == r["examples"].size());
      for (size_t i = 0; i < r["examples"].size(); ++i) {
        CHECK_MESSAGE(got["examples"][i]["context_len"] == r["examples"][i]["context_len"], "example ", i);
        CHECK_MESSAGE(got["examples"][i]["target"] == r["examples"][i]["target"], "example ", i);
        CHECK_MESSAGE(got["examples"][i]["pred"] == r["examples"][i]["pred"], "example ", i);
      }
    }

    // generate_text --greedy equals greedy full recomputation of the same model.
    std::ofstream(tmp / "prompts.txt") << "Hello, my dog is cute\nThe capital of France is\n";
    REQUIRE(run_app("generate_text", "--load " + ckpt + " --sample-input-file " + tmp / "prompts.txt" +
                                         " --greedy --out-seq-length 6 --genfile " + tmp / "gen.jsonl", tmp / "g.log") == 0);
    std::ifstream g(tmp / "gen.jsonl");
    std::string line;
    int n = 0;
    data::Tokenizer tok(data::Tokenizer::default_vocab_file(), data::Tokenizer::default_merges_file());
    while (std::getline(g, line)) {
      const auto j = nlohmann::json::parse(line);
      const std::vector<int32_t> want = generate_full_recompute(*model, tok.encode(j["prompt"].get<std::string>()), 6);
      CHECK(j["tokens"].get<std::vector<int32_t>>() == want);
      ++n;
    }
    CHECK(n == 2);
  }
}
