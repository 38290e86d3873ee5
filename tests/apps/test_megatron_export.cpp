// convert_checkpoint --direction mpitron-to-megatron writes Megatron-LM's legacy torch format, and
// megatron-core loads it (issue 43). tests/reference/megatron_export_ref.py ran the same two
// conversions of a committed megatron-core checkpoint (megatron-to-mpitron, then
// mpitron-to-megatron at TP x PP), then megatron-core 0.16.1 built a GPTModel from the written
// file's args, load_state_dict(strict=True) of it, and computed logits on fixed tokens; it
// committed those logits and the size and CRC-32 of every file mpitron wrote
// (tests/io/ref/megatron_export/<case>.json). Here:
//   - the files mpitron writes now are byte for byte the ones megatron-core loaded (size + CRC-32);
//   - they read back through mpitron's own Megatron reader to exactly the values written;
//   - mpitron's logits from them equal megatron-core's (fp32: both sides compute in f32 with other
//     reduction orders, ~1e-7 relative; a permuted qkv row, swapped gate/up or a wrong TP split
//     moves logits by 1e-3 or more);
//   - a TP2 x PP2 layout (mp_rank_TT_PPP, the tied embedding's copy on the last stage) reads back to
//     the same values and megatron-core's TP1 logits;
//   - layouts that do not divide the model are refused naming the flag.
//
// mpitron-test: timeout=600
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "apps_test_util.h"
#include "io/torch_zip.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/checkpoint/checkpointing.h"
#include "model/gpt.h"

using namespace mpitron;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::TempDir;
using nlohmann::json;

namespace {

const std::string kRef = apps_test::kSource + "/tests/io/ref/";

json ref(const std::string& c) { return json::parse(slurp(kRef + "megatron_export/" + c + ".json")); }

struct Model {
  std::unique_ptr<GPT> gpt;
  std::vector<float> values;
};

Model load(const std::string& dir, const std::string& fmt) {
  Model m;
  m.gpt = std::make_unique<GPT>(read_checkpoint_config(dir), Device::cpu());
  LoadOptions lo;
  lo.ckpt_format = fmt;
  REQUIRE(load_weights(dir, *m.gpt, lo));
  m.values = m.gpt->params().values().to_floats();
  return m;
}

// mpitron's checkpoint of the committed megatron-core run `source` (.../torch_dist), and its
// Megatron legacy export with `flags`.
void convert(const TempDir& tmp, const std::string& source, const std::string& flags) {
  const std::string log = tmp / "conv.log";
  int rc = run_app("convert_checkpoint", "--direction megatron-to-mpitron --input " + kRef + "megatron_resume/" + source +
                                              " --output " + tmp / "mpitron", log);
  if (rc != 0) MESSAGE(slurp(log));
  REQUIRE(rc == 0);
  rc = run_app("convert_checkpoint", "--direction mpitron-to-megatron --input " + tmp / "mpitron" + " --output " +
                                         tmp / "megatron " + flags, log);
  if (rc != 0) MESSAGE(slurp(log));
  REQUIRE(rc == 0);
}

// Every file under dir: relative path -> (size, CRC-32).
std::map<std::string, std::pair<uint64_t, uint32_t>> files(const std::string& dir) {
  std::map<std::string, std::pair<uint64_t, uint32_t>> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string b = slurp(e.path().string());
    out[std::filesystem::relative(e.path(), dir).string()] = {b.size(), io::zip_crc32(b.data(), b.size())};
  }
  return out;
}

// Worst |mpitron − megatron-core| over the (B, T, Vp) logits, relative to max(1, |reference|).
double logits_err(GPT& gpt, const json& r) {
  const Tensor lg = gpt.logits(apps_test::ints(r.at("tokens")));
  const std::vector<float> got = lg.to_floats();
  const int64_t vp = lg.dim(1);
  double worst = 0;
  int64_t row = 0;
  for (const auto& b : r.at("logits"))
    for (const auto& t : b) {
      REQUIRE(static_cast<int64_t>(t.size()) == vp);
      for (int64_t v = 0; v < vp; ++v) {
        const double want = t[static_cast<size_t>(v)].get<double>();
        worst = std::max(worst, std::fabs(got[static_cast<size_t>(row * vp + v)] - want) / std::max(1.0, std::fabs(want)));
      }
      ++row;
    }
  return worst;
}

void check_case(const std::string& name) {
  const json r = ref(name);
  TempDir tmp("megexport");
  convert(tmp, r.at("source").get<std::string>(), r.at("convert_flags").get<std::string>());
  // The bytes megatron-core loaded.
  const auto got = files(tmp / "megatron");
  REQUIRE(got.size() == r.at("files").size());
  for (const auto& [path, want] : r.at("files").items()) {
    REQUIRE_MESSAGE(got.count(path), "mpitron did not write ", path);
    CHECK_MESSAGE(got.at(path).first == want.at("size").get<uint64_t>(), path, ": size differs");
    CHECK_MESSAGE(got.at(path).second == want.at("crc32").get<uint32_t>(), path, ": bytes differ");
  }
  // Read back by mpitron's own Megatron reader: the values written, exactly.
  const Model a = load(tmp / "mpitron", ""), b = load(tmp / "megatron", "torch");
  REQUIRE(a.values.size() == b.values.size());
  CHECK(a.values == b.values);
  const double err = logits_err(*b.gpt, r);
  MESSAGE(name, ": worst logit difference from megatron-core ", err);
  CHECK(err < 1e-5);
}

bool has(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

}  // namespace

TEST_CASE("mpitron-to-megatron GPT-2 style at TP1: megatron-core's strict load and logits") { check_case("gpt2_tp1"); }

TEST_CASE("mpitron-to-megatron Llama style (GQA, SwiGLU, RMSNorm, rope, untied) at TP2: megatron-core's logits") {
  check_case("llama_tp2");
}

TEST_CASE("mpitron-to-megatron at TP2 x PP2 reads back to the same values and megatron-core's logits") {
  const json r = ref("gpt2_tp1");
  TempDir tmp("megexport_pp");
  convert(tmp, "gpt2/torch_dist",
          "--target-tensor-parallel-size 2 --target-pipeline-model-parallel-size 2");
  for (const char* f : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"})
    CHECK(std::filesystem::exists(tmp / (std::string("megatron/iter_0000000/") + f + "/model_optim_rng.pt")));
  const Model a = load(tmp / "mpitron", ""), b = load(tmp / "megatron", "torch");
  CHECK(a.values == b.values);
  CHECK(logits_err(*b.gpt, r) < 1e-5);
}

TEST_CASE("mpitron-to-megatron refuses layouts that do not divide the model, and existing output") {
  TempDir tmp("megexport_bad");
  const std::string log = tmp / "bad.log";
  REQUIRE(run_app("convert_checkpoint", "--direction megatron-to-mpitron --input " + kRef +
                                             "megatron_resume/llama/torch_dist --output " + tmp / "mpitron",
                  log) == 0);
  const std::string base = "--direction mpitron-to-megatron --input " + tmp / "mpitron" + " --output " + tmp / "m ";
  CHECK(run_app("convert_checkpoint", base + "--target-tensor-parallel-size 3", log) != 0);
  CHECK(has(slurp(log), "--target-tensor-parallel-size 3 does not divide"));
  CHECK(run_app("convert_checkpoint", base + "--target-pipeline-model-parallel-size 3", log) != 0);
  CHECK(has(slurp(log), "--target-pipeline-model-parallel-size 3 does not divide the 2 layers"));
  REQUIRE(run_app("convert_checkpoint", base, log) == 0);
  CHECK(run_app("convert_checkpoint", base, log) != 0);
  CHECK(has(slurp(log), "already holds a checkpoint"));
  CHECK(run_app("convert_checkpoint", base + "--overwrite", log) == 0);
}

TEST_CASE("pretrain_gpt --save --ckpt-format torch writes Megatron's files beside its own, at every save") {
  TempDir tmp("megexport_train");
  const std::string src = kRef + "megatron_resume/";
  const json r = json::parse(slurp(src + "gpt2/ref.json"));
  const std::string flags = r.at("flags").get<std::string>() + " --data-path " + src + "data/tokens --tokenizer-model " +
                            src + "data/tokenizer.json --data-cache-path " + tmp / "cache" + " --device cpu --load " +
                            src + "gpt2/torch --ckpt-format torch --save " + tmp / "run" + " --save-interval 5";
  const std::string log = tmp / "train.log";
  int rc = run_app("pretrain_gpt", flags, log);
  if (rc != 0) MESSAGE(slurp(log));
  REQUIRE(rc == 0);
  // iterations 4 … 8 after the Megatron checkpoint of 3: saves at 5 and at the end (8)
  for (const char* it : {"iter_0000005", "iter_0000008"}) {
    CHECK(std::filesystem::exists(tmp / ("run/" + std::string(it) + "/model_optim_rng.h5")));
    CHECK(std::filesystem::exists(tmp / ("run/" + std::string(it) + "/mp_rank_00/model_optim_rng.pt")));
  }
  // mpitron resumes the directory from its own file; Megatron's files alone hold the same weights.
  const Model own = load(tmp / "run", "");
  std::filesystem::create_directories(tmp / "meg/iter_0000008");
  std::filesystem::copy(tmp / "run/iter_0000008/mp_rank_00", tmp / "meg/iter_0000008/mp_rank_00",
                        std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(tmp / "run/latest_checkpointed_iteration.txt", tmp / "meg/latest_checkpointed_iteration.txt");
  const Model meg = load(tmp / "meg", "torch");
  CHECK(own.values == meg.values);
  // Not with --async-save (the files are written after a synchronous save).
  CHECK(run_app("pretrain_gpt", flags + " --async-save", log) != 0);
  CHECK(has(slurp(log), "--ckpt-format torch with --async-save"));
}
