// What a hostile-input campaign found in the apps (issue 47, item 7), each a test that failed before
// its fix:
//   * convert_checkpoint mpitron-to-hf into a directory holding an older sharded export (index +
//     shards) added model.safetensors beside them: refused naming the files and --overwrite, and
//     --overwrite removes the stale ones;
//   * generate_text: one prompt check for every model kind (a T5's prompts with invalid UTF-8 were
//     decoded where a GPT's were refused), naming the file and line; --decoder-start-token-id -1 and
//     --eos-token-id -1 were replaced by the defaults;
//   * text_generation_server --inference-dynamic-batching-max-requests 0 was replaced by the default.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "apps_test_util.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string gpt_checkpoint(const TempDir& tmp) {
  const std::string ref = apps_test::kSource + "/tests/apps/ref/";
  const io::Safetensors st = io::read_safetensors(ref + "gpt2_tiny.safetensors");
  auto model = gpt_from_hf(st, hf_file_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
  save_model_checkpoint(tmp / "ckpt", *model, "test");
  return tmp / "ckpt";
}

// Runs the app; checks it failed and its output holds every needle.
void fails_with(const std::string& app, const std::string& args, const std::vector<std::string>& needles,
                const TempDir& tmp) {
  const std::string log = tmp / "log.txt";
  const int rc = run_app(app, args, log);
  const std::string out = slurp(log);
  CHECK_MESSAGE(rc != 0, app, " ", args, " -> exit 0: ", out);
  for (const std::string& n : needles) CHECK_MESSAGE(out.find(n) != std::string::npos, app, " ", args, " -> ", out);
}

}  // namespace

TEST_CASE("convert_checkpoint mpitron-to-hf: an older export of either layout is refused, or replaced whole with --overwrite") {
  TempDir tmp("robust2_export");
  const std::string ck = gpt_checkpoint(tmp), out = tmp / "hf";
  fs::create_directories(out);
  std::ofstream(out + "/model.safetensors.index.json") << "{\"weight_map\": {}}\n";
  std::ofstream(out + "/model-00001-of-00002.safetensors") << "old";
  std::ofstream(out + "/model-00002-of-00002.safetensors") << "old";
  std::ofstream(out + "/README.md") << "kept\n";
  const std::string args = "--direction mpitron-to-hf --input " + ck + " --output " + out;
  fails_with("convert_checkpoint", args,
             {"already holds Hugging Face weights", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
              "--overwrite"},
             tmp);
  CHECK(!fs::exists(out + "/model.safetensors"));  // nothing added beside them
  REQUIRE_MESSAGE(run_app("convert_checkpoint", args + " --overwrite", tmp / "ow.log") == 0, slurp(tmp / "ow.log"));
  CHECK(fs::exists(out + "/model.safetensors"));
  CHECK(fs::exists(out + "/config.json"));
  CHECK(!fs::exists(out + "/model.safetensors.index.json"));  // transformers would read the stale index first
  CHECK(!fs::exists(out + "/model-00001-of-00002.safetensors"));
  CHECK(!fs::exists(out + "/model-00002-of-00002.safetensors"));
  CHECK(fs::exists(out + "/README.md"));  // not a weight file: left alone
  // The single-file layout is refused the same way.
  fails_with("convert_checkpoint", args, {"already holds Hugging Face weights (model.safetensors)", "--overwrite"}, tmp);
}

TEST_CASE("generate_text: a prompt that is not UTF-8 is refused naming the file and line, for a GPT and for a T5") {
  TempDir tmp("robust2_prompts");
  std::ofstream(tmp / "prompts.txt") << "hello there\nbad \xff\xfe bytes\n";
  // GPT-2 (BPE).
  fails_with("generate_text",
             "--load " + gpt_checkpoint(tmp) + " --sample-input-file " + (tmp / "prompts.txt") + " --out-seq-length 2",
             {"prompts.txt:2: the prompt is not valid UTF-8"}, tmp);
  // T5 (WordPiece): a HF T5 of 96 tokens, with a WordPiece vocabulary of 96 (94 lines and the 2 WordPiece adds).
  REQUIRE(run_app("convert_checkpoint",
                  "--direction hf-to-mpitron --input " + apps_test::kSource + "/tests/apps/ref/hf_t5_relu --output " +
                      (tmp / "t5"),
                  tmp / "convert.log") == 0);
  {
    std::ofstream v(tmp / "vocab.txt");
    v << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (int i = 0; i < 89; ++i) v << "w" << i << "\n";  // + the 5 specials: 94 lines; WordPiece adds 2
  }
  const std::string t5 = "--load " + (tmp / "t5") + " --tokenizer-type BertWordPieceLowerCase --vocab-file " +
                         (tmp / "vocab.txt") + " --out-seq-length 2 --sample-input-file ";
  std::ofstream(tmp / "ok.txt") << "w1 w2\n";
  REQUIRE_MESSAGE(run_app("generate_text", t5 + (tmp / "ok.txt"), tmp / "t5ok.log") == 0, slurp(tmp / "t5ok.log"));
  fails_with("generate_text", t5 + (tmp / "prompts.txt"), {"prompts.txt:2: the prompt is not valid UTF-8"}, tmp);
}

TEST_CASE("explicit values that mean 'the default' inside are refused, not replaced") {
  TempDir tmp("robust2_defaults");
  const std::string none = " --load " + (tmp / "nothing") + " --sample-input-file x";
  fails_with("generate_text", "--decoder-start-token-id -1" + none, {"--decoder-start-token-id must be a token id >= 0, got -1"},
             tmp);
  fails_with("generate_text", "--eos-token-id -1" + none, {"--eos-token-id must be a token id >= 0, got -1"}, tmp);
  fails_with("text_generation_server", "--load " + (tmp / "nothing") + " --inference-dynamic-batching-max-requests 0",
             {"--inference-dynamic-batching-max-requests must be >= 1, got 0"}, tmp);
}
