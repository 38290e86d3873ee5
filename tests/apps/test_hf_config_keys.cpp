// Hugging Face config.json keys that change the maths are honoured or refused, never ignored
// (issue #26 item 3; model/families.h: each family's keys, each read through the architecture
// table's row with its type and bounds, model/inference/hf_convert.h):
//  * GPT-2 scale_attn_weights false and scale_attn_by_inverse_layer_idx true are refused
//    (transformers' logits differ from plain GPT-2's; mpitron computes plain GPT-2);
//  * Llama partial_rotary_factor != 1 is refused (transformers 4.40 rotates every dim, later
//    versions honour it), pretraining_tp is accepted when it divides every sliced size (the same
//    function) and refused when transformers would drop a slice;
//  * num_key_value_heads 2.5 is refused (not truncated to 2), max_position_embeddings 1e15 too;
//  * a directory holding both model.safetensors and model.safetensors.index.json imports the
//    single file, as transformers' from_pretrained does (checked against transformers when
//    /usr/bin/python3 has it).
// mpitron-test: label=reliability
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "tensor/ops.h"
#include "tests/error_of.h"

using namespace mpitron;
using apps_test::TempDir;
using apps_test::slurp;
using mpitron::testing_util::error_of;
using nlohmann::json;

namespace {

const std::string kLlama = apps_test::kSource + "/tests/apps/ref/hf_llama";
const std::string kGpt2Config = apps_test::kSource + "/tests/apps/ref/gpt2_tiny_config.json";

bool has(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

std::string import_error(const std::string& base_file, const std::string& key, const json& value) {
  json j = json::parse(slurp(base_file));
  j[key] = value;
  return error_of([&] { hf_config(j.dump()); });
}

}  // namespace

TEST_CASE("GPT-2 config.json: attention-scaling keys that change the logits are refused by name") {
  CHECK(import_error(kGpt2Config, "scale_attn_weights", true).empty());
  CHECK(has(import_error(kGpt2Config, "scale_attn_weights", false), "scale_attn_weights"));
  CHECK(import_error(kGpt2Config, "scale_attn_by_inverse_layer_idx", false).empty());
  CHECK(has(import_error(kGpt2Config, "scale_attn_by_inverse_layer_idx", true), "scale_attn_by_inverse_layer_idx"));
  CHECK(import_error(kGpt2Config, "reorder_and_upcast_attn", true).empty());  // f32 scores: mpitron's anyway
  CHECK(has(import_error(kGpt2Config, "activation_function", "relu"), "activation_function"));
  CHECK(has(import_error(kGpt2Config, "n_head", 2.5), "n_head"));
  CHECK(has(import_error(kGpt2Config, "some_new_key", 1), "some_new_key"));
  // The same through the app, as a user meets it.
  TempDir tmp("gpt2keys");
  json j = json::parse(slurp(kGpt2Config));
  j["scale_attn_by_inverse_layer_idx"] = true;
  std::ofstream(tmp / "config.json") << j.dump();
  CHECK(apps_test::run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + apps_test::kSource +
                                                     "/tests/apps/ref/gpt2_tiny.safetensors --hf-config " + tmp / "config.json" +
                                                     " --output " + tmp / "ck",
                           tmp / "log") != 0);
  CHECK(has(slurp(tmp / "log"), "scale_attn_by_inverse_layer_idx"));
  CHECK(!std::filesystem::exists(tmp / "ck"));
}

TEST_CASE("Llama config.json: partial_rotary_factor, pretraining_tp, fractional and huge values") {
  const std::string cfg = kLlama + "/config.json";
  CHECK(import_error(cfg, "partial_rotary_factor", 1.0).empty());
  CHECK(has(import_error(cfg, "partial_rotary_factor", 0.5), "partial_rotary_factor"));
  // pretraining_tp 2 divides intermediate 80, hidden 48, kv 2 x 12 and vocab 100: the same function.
  CHECK(import_error(cfg, "pretraining_tp", 2).empty());
  CHECK(has(import_error(cfg, "pretraining_tp", 3), "pretraining_tp = 3 does not divide"));
  CHECK(has(import_error(cfg, "pretraining_tp", 0), "pretraining_tp"));
  CHECK(has(import_error(cfg, "pretraining_tp", 1.5), "pretraining_tp"));
  // Never truncated: 2.5 key/value heads is not 2.
  const std::string frac = import_error(cfg, "num_key_value_heads", 2.5);
  CHECK(has(frac, "num_key_value_heads"));
  CHECK(has(frac, "2.5"));
  CHECK(has(import_error(cfg, "hidden_size", 48.0), "hidden_size"));
  CHECK(has(import_error(cfg, "max_position_embeddings", 1e15), "max_position_embeddings"));
  CHECK(has(import_error(cfg, "max_position_embeddings", int64_t{1000000000000000}), "max_position_embeddings"));
  CHECK(has(import_error(cfg, "rms_norm_eps", -1.0), "rms_norm_eps"));
  CHECK(has(import_error(cfg, "rope_theta", 0.0), "rope_theta"));
  CHECK(has(import_error(cfg, "tie_word_embeddings", "yes"), "tie_word_embeddings"));
  CHECK(has(import_error(cfg, "vocab_size", -5), "vocab_size"));
}

TEST_CASE("a directory with model.safetensors and model.safetensors.index.json imports what transformers loads") {
  TempDir tmp("bothfiles");
  const std::string d = tmp / "both";
  std::filesystem::create_directories(d);
  for (const auto& e : std::filesystem::directory_iterator(kLlama))
    std::filesystem::copy_file(e.path(), d + "/" + e.path().filename().string());
  // model.safetensors: the same tensors, every value doubled.
  const HfCheckpoint sharded = read_hf_checkpoint(kLlama);
  io::Safetensors doubled;
  for (const io::SafeTensor& t : sharded.tensors.tensors) {
    Tensor v = sharded.tensors.to_f32(t.name).clone();
    scale(v, 2.0f);
    doubled.add_f32(t.name, v, "F32");
  }
  doubled.metadata["format"] = "pt";
  io::write_safetensors(d + "/model.safetensors", doubled);
  const HfCheckpoint both = read_hf_checkpoint(d);
  for (const auto& [name, file] : both.file_of) CHECK_MESSAGE(file == d + "/model.safetensors", name);
  const TransformerConfig c = hf_config(both.config_json, 4);
  CHECK(gpt_from_hf(both, c)->params().values().to_floats() ==
        gpt_from_hf(hf_checkpoint_of_file(d + "/model.safetensors", both.config_json), c)->params().values().to_floats());
  // transformers agrees: it reads the single file.
  if (std::system("/usr/bin/python3 -c 'import torch, transformers' > /dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED the transformers side: /usr/bin/python3 has no torch + transformers "
            "(tests/reference/hf_llama_ref.py's header says how to install them)");
    return;
  }
  const std::string py =
      "import sys, torch\n"
      "from transformers import LlamaForCausalLM\n"
      "from safetensors.torch import load_file\n"
      "m = LlamaForCausalLM.from_pretrained(sys.argv[1])\n"
      "w = load_file(sys.argv[1] + '/model.safetensors')['model.norm.weight']\n"
      "print('single' if torch.equal(m.model.norm.weight.detach(), w) else 'sharded')\n";
  std::ofstream(tmp / "which.py") << py;
  const int rc = std::system(("/usr/bin/python3 " + tmp / "which.py" + " " + d + " > " + tmp / "py.log" + " 2>&1").c_str());
  CHECK_MESSAGE(rc == 0, slurp(tmp / "py.log"));
  CHECK_MESSAGE(has(slurp(tmp / "py.log"), "single"), slurp(tmp / "py.log"));
}
