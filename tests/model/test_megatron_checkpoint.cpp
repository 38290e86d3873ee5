// Megatron-LM checkpoints (model/checkpoint/megatron_checkpoint.h) read into mpitron's parameter
// table: the committed megatron-core 0.16.1 runs of tests/io/ref/torch/ (torch_checkpoint_ref.py),
// each saved in both of Megatron's formats by the same process.
//   - the same run's legacy torch and torch_dist checkpoints load to the same values and moments
//     (two readers: per-TP/PP-rank files with stage-local layer numbers and a coalesced
//     distrib_optim.pt, against global layer-stacked tensors and dp_reshardable buckets);
//   - the optimizer's fp32 master weights, found through the rebuilt grad-buffer layout, equal the
//     model's weights (fp32 run) or round to them (bf16 run): a wrong offset in the layout would not;
//   - the config, iteration and consumed samples come from args; disagreements are refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <string>

#include "model/checkpoint/checkpoint_config.h"
#include "model/checkpoint/megatron_checkpoint.h"
#include "model/gpt.h"
#include "tests/error_of.h"

using namespace mpitron;
using mpitron::testing_util::error_of;

namespace {
std::string ref(const std::string& run, const std::string& fmt) {
  return std::string(MPITRON_SOURCE_DIR) + "/tests/io/ref/torch/" + run + "/" + fmt;
}

struct Loaded {
  std::vector<float> values, m, v;
  TrainState st;
  int64_t steps = 0;
};

Loaded load(const std::string& dir, bool optim, const std::string& fmt = "") {
  const GPTConfig c = read_checkpoint_config(dir);
  GPT model(c, Device::cpu());
  OptimState opt;
  LossScaler scaler;
  Loaded out;
  LoadOptions lo;
  lo.load_optim = optim;
  lo.ckpt_format = fmt;
  const int64_t n = model.params().numel();
  REQUIRE(load_checkpoint(dir, model, opt, 0, n, scaler, out.st, lo));
  out.values = opt.master.to_floats();
  if (optim) {
    out.m = opt.exp_avg.to_floats();
    out.v = opt.exp_avg_sq.to_floats();
  }
  out.steps = opt.steps;
  return out;
}

float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
}  // namespace

TEST_CASE("megatron: the format is detected, and --ckpt-format must match it") {
  CHECK(detect_megatron_checkpoint(ref("mcore_gpt2", "torch")).format == MegatronFormat::Torch);
  CHECK(detect_megatron_checkpoint(ref("mcore_gpt2", "torch_dist")).format == MegatronFormat::TorchDist);
  CHECK(detect_megatron_checkpoint(ref("mcore_gpt2", "torch_dist"), "torch_dist").iteration == 2);
  CHECK(error_of([] { detect_megatron_checkpoint(ref("mcore_gpt2", "torch_dist"), "torch"); })
            .find("--ckpt-format torch but") != std::string::npos);
  CHECK(error_of([] { detect_megatron_checkpoint(ref("mcore_gpt2", "torch"), "zarr"); }).find("zarr") !=
        std::string::npos);
  CHECK(error_of([] { detect_megatron_checkpoint(ref("ds_zero1", "")); }).find("DeepSpeed") != std::string::npos);
}

TEST_CASE("megatron: the model config comes from args") {
  const GPTConfig g = read_checkpoint_config(ref("mcore_gpt2", "torch_dist"));
  CHECK(g.num_layers == 2);
  CHECK(g.hidden_size == 16);
  CHECK(g.ffn() == 64);
  CHECK(g.padded_vocab_size == 32);
  CHECK(g.learned_positions());
  CHECK(!g.untie_embeddings);
  CHECK(g.normalization == Normalization::LayerNorm);
  const GPTConfig l = read_checkpoint_config(ref("mcore_llama", "torch"));
  CHECK(l.query_groups() == 2);
  CHECK(l.mlp == MlpKind::SwiGLU);
  CHECK(l.normalization == Normalization::RMSNorm);
  CHECK(l.position_embedding == PositionEmbedding::Rope);
  CHECK(l.untie_embeddings);
  CHECK(!l.add_bias_linear);
}

TEST_CASE("megatron: the grad-buffer layout is the one the checkpoint holds") {
  // TP2×PP2, tied embedding: each stage its own buffer; the stage's embedding (output_layer copy)
  // in a bucket of its own; buckets padded to 128, parameters to 64.
  const GPTConfig c = read_checkpoint_config(ref("mcore_gpt2_tp2pp2", "torch_dist"));
  MegatronLayoutArgs a;
  a.tp = 2, a.pp = 2, a.dp = 1;
  const MegatronBufferLayout s0 = megatron_buffer_layout(c, a, 0), s1 = megatron_buffer_layout(c, a, 1);
  REQUIRE(s0.bucket_numel_unpadded.size() == 2);
  CHECK(s0.bucket_numel_unpadded[0] == 2176);  // the committed metadata's bucket_idx_0 (ref.json)
  CHECK(s0.bucket_numel_unpadded[1] == 256);
  REQUIRE(s1.bucket_numel_unpadded.size() == 2);
  CHECK(s1.bucket_numel_unpadded[0] == 256);
  CHECK(s0.entries.front().name == "decoder.layers.0.mlp.linear_fc2.bias");
  CHECK(s0.entries.back().name == "embedding.word_embeddings.weight");
}

TEST_CASE("megatron: torch and torch_dist of one run load to the same state; masters match the weights") {
  for (const char* run : {"mcore_gpt2", "mcore_llama", "mcore_gpt2_tp2pp2"}) {
    CAPTURE(run);
    const Loaded a = load(ref(run, "torch"), true, "torch"), b = load(ref(run, "torch_dist"), true, "torch_dist");
    CHECK(a.values == b.values);
    CHECK(a.m == b.m);
    CHECK(a.v == b.v);
    CHECK(a.st.iteration == 2);
    CHECK(b.st.iteration == 2);
    CHECK(a.st.consumed_train_samples == b.st.consumed_train_samples);
    CHECK(b.st.consumed_train_samples > 0);
    CHECK(a.steps == 2);
    double norm = 0;
    int64_t nonzero = 0;
    for (float x : a.v) nonzero += x != 0.0f;
    for (float x : a.values) norm += static_cast<double>(x) * x;
    CHECK(norm > 1.0);
    CHECK(nonzero > static_cast<int64_t>(a.v.size()) / 2);  // every parameter had gradients (few exact zeros)
    // The model's weights, read without the optimizer.
    const Loaded w = load(ref(run, "torch_dist"), false), wl = load(ref(run, "torch"), false);
    CHECK(w.values == wl.values);
    const bool bf16 = std::string(run) == "mcore_llama";
    int64_t bad = 0;
    for (size_t i = 0; i < a.values.size(); ++i) bad += (bf16 ? bf16_round(a.values[i]) : a.values[i]) != w.values[i];
    CHECK(bad == 0);
  }
}

TEST_CASE("megatron: the DP2 llama run's optimizer (dp_reshardable over two ranks) loads") {
  const Loaded a = load(ref("mcore_llama_dp2", "torch_dist"), true), w = load(ref("mcore_llama_dp2", "torch_dist"), false);
  int64_t bad = 0;
  for (size_t i = 0; i < a.values.size(); ++i) bad += bf16_round(a.values[i]) != w.values[i];
  CHECK(bad == 0);
}

TEST_CASE("megatron: another architecture is refused naming the field") {
  GPTConfig c = read_checkpoint_config(ref("mcore_gpt2", "torch_dist"));
  c.hidden_size = 32;
  GPT model(c, Device::cpu());
  OptimState opt;
  LossScaler scaler;
  TrainState st;
  const std::string e = error_of([&] {
    load_checkpoint(ref("mcore_gpt2", "torch_dist"), model, opt, 0, model.params().numel(), scaler, st, LoadOptions{});
  });
  CHECK(e.find("hidden") != std::string::npos);
}

TEST_CASE("megatron: a checkpoint without its optimizer file, or with damaged files, gives clear errors") {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("mpitron_megatron_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::copy(ref("mcore_gpt2", "torch"), tmp, fs::copy_options::recursive);
  const fs::path optim = tmp / "iter_0000002" / "mp_rank_00" / "distrib_optim.pt";
  fs::remove(optim);
  const std::string dir = tmp.string();
  const auto try_load = [&](bool optim) {
    GPT model(read_checkpoint_config(dir), Device::cpu());
    OptimState opt;
    LossScaler scaler;
    TrainState st;
    LoadOptions lo;
    lo.load_optim = optim;
    load_checkpoint(dir, model, opt, 0, model.params().numel(), scaler, st, lo);
  };
  CHECK(error_of([&] { try_load(true); }).find("--no-load-optim") != std::string::npos);
  CHECK(load(dir, false).values == load(ref("mcore_gpt2", "torch"), false).values);  // the weights alone still load
  // A truncated model file: the reader's error, naming the file.
  const fs::path model = tmp / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt";
  fs::resize_file(model, fs::file_size(model) / 2);
  CHECK(error_of([&] { try_load(false); }).find("model_optim_rng.pt") != std::string::npos);
  fs::remove_all(tmp);
}
