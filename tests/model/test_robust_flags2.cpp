// What a hostile-input campaign found in the flags (issue 47, item 7), by class, each a test that
// failed before its fix:
//   * every float flag finite, in one place (model/flags/flag_given.h), naming flag and value; the
//     MoE floats in the range table (--moe-router-bias-update-rate inf, --moe-expert-capacity-factor inf);
//   * size flags bounded by the architecture table (model/arch_fields.cpp) before anything is built
//     from them (--num-experts 2^31 ran for minutes);
//   * two sources of one setting that disagree are refused naming both (a DeepSpeed JSON's stage and
//     --data-parallel-sharding-strategy, --zero-stage 0 with --use-distributed-optimizer, a JSON key
//     given twice);
//   * explicit values are refused, not silently replaced (--moe-layer-freq [], --num-layers beside
//     both T5 stacks, --inference-dynamic-batching-max-requests 0);
//   * an MNLI file without its header row is refused instead of losing its first example.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/app_main.h"
#include "core/error.h"
#include "core/json.h"
#include "model/arch_fields.h"
#include "model/flags/inference_flags.h"
#include "model/training/arguments.h"
#include "model/training/finetune.h"
#include "model/training/pretrain_flags.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

std::vector<std::string> base() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "24",
          "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3", "--data-path", "unused"};
}

// The parse error's message, or "" when the flags parse (base() with `extra`'s flags replaced).
std::string parse_error(std::vector<std::string> extra, bool t5 = false) {
  const std::vector<std::string> b = base();
  std::vector<std::string> flags;
  for (size_t i = 0; i < b.size(); i += 2)
    if (std::find(extra.begin(), extra.end(), b[i]) == extra.end()) flags.insert(flags.end(), {b[i], b[i + 1]});
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::vector<char*> argv{const_cast<char*>(t5 ? "pretrain_t5" : "pretrain_gpt")};
  for (auto& f : flags) argv.push_back(f.data());
  try {
    TrainArgs a;
    a.model.t5 = t5;
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void rejected(const std::vector<std::string>& extra, const std::vector<std::string>& needles, bool t5 = false) {
  const std::string m = parse_error(extra, t5);
  std::string flags;
  for (const auto& f : extra) flags += f + " ";
  CHECK_MESSAGE(!m.empty(), flags, "was accepted");
  for (const std::string& n : needles) CHECK_MESSAGE(m.find(n) != std::string::npos, flags, "-> ", m);
}

struct TempFile {
  std::string path;
  TempFile(const std::string& name, const std::string& text)
      : path((std::filesystem::temp_directory_path() / ("mpitron_flags2_" + name)).string()) {
    std::ofstream(path) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2"};
std::vector<std::string> moe(std::vector<std::string> more) {
  std::vector<std::string> v = kMoe;
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

}  // namespace

TEST_CASE("every float flag of pretrain_gpt: inf, nan and 1e999 refused naming the flag and the value") {
  int floats = 0;
  for (const auto& o : pretrain_flag_descriptions().options()) {
    const po::value_semantic* sem = o->semantic().get();
    if (!dynamic_cast<const po::typed_value<double>*>(sem) && !dynamic_cast<const po::typed_value<float>*>(sem)) continue;
    ++floats;
    for (const char* bad : {"inf", "nan", "1e999"}) {
      const std::string flag = "--" + o->long_name();
      const std::string m = parse_error({flag, bad});
      if (m.find("unrecognised option") != std::string::npos) break;  // BERT's or T5's own flag
      CHECK_MESSAGE(m.find(flag + " must be a finite number") != std::string::npos, flag, " ", bad, " -> ", m);
      CHECK_MESSAGE(m.find(bad) != std::string::npos, flag, " ", bad, " -> ", m);
    }
  }
  CHECK(floats >= 20);  // the table is not empty: lr, clip-grad, the MoE coefficients, ...
  // The campaign's two: accepted (inf), and an overflow that named neither flag nor value.
  const std::vector<std::string> bias = {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"};
  std::vector<std::string> with_bias = moe(bias);
  with_bias.insert(with_bias.end(), {"--moe-router-bias-update-rate", "inf"});
  rejected(with_bias, {"--moe-router-bias-update-rate must be a finite number", "inf"});
  rejected(moe({"--moe-expert-capacity-factor", "inf"}), {"--moe-expert-capacity-factor must be a finite number", "inf"});
  // Finite but out of range: the range table, naming flag and value.
  rejected(moe({"--moe-expert-capacity-factor", "1e300"}), {"--moe-expert-capacity-factor must be a finite number in (0, 65536]", "1e+300"});
  rejected(moe({"--moe-expert-capacity-factor", "0"}), {"--moe-expert-capacity-factor must be a finite number in (0"});
  with_bias.back() = "5";
  rejected(with_bias, {"--moe-router-bias-update-rate must be a finite number in (0, 1]", "got 5"});
  rejected(moe({"--moe-aux-loss-coeff", "-1"}), {"--moe-aux-loss-coeff", "-1"});
  with_bias.back() = "0.01";
  CHECK(parse_error(with_bias).empty());
  CHECK(parse_error(moe({"--moe-expert-capacity-factor", "1.25"})).empty());
}

TEST_CASE("the inference tools' and the single-process apps' float flags are checked finite too") {
  po::options_description d("t");
  double x = 0;
  d.add_options()("top-p-like", po::value(&x), "a float");
  po::variables_map vm;
  std::vector<std::string> args = {"tool", "--top-p-like", "inf"};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  CHECK_THROWS_WITH_AS(parse_app_flags(3, argv.data(), d, vm, "tool"), doctest::Contains("--top-p-like must be a finite number, got inf"),
                       Error);
}

TEST_CASE("size flags are bounded by the architecture table before anything is built from them") {
  const auto t0 = std::chrono::steady_clock::now();
  rejected({"--num-experts", "2147483648", "--moe-router-topk", "2"}, {"--num-experts must be in [1, 65536]", "2147483648"});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_MESSAGE(s < 5, "--num-experts 2^31 took ", s, " s to refuse");
  rejected({"--num-layers", "99999999999"}, {"--num-layers must be in [1, 65536]"});
  rejected({"--num-attention-heads", "1000000"}, {"--num-attention-heads must be in [1, 65536]"});
  rejected({"--seq-length", "100000000"}, {"--seq-length must be in [1, 16777216]"});
  rejected({"--hidden-size", "10000000"}, {"--hidden-size must be in [1, 1048576]"});
  rejected(moe({"--moe-ffn-hidden-size", "100000000"}), {"--moe-ffn-hidden-size must be in [1, 16777216]"});
  // The same rows check a checkpoint's model_config.
  TransformerConfig c;
  CHECK_THROWS_WITH_AS(arch_field("num_experts").set(c, nlohmann::json(int64_t{1} << 31), "model_config key num_experts"),
                       doctest::Contains("model_config key num_experts must be in [0, 65536]"), Error);
  CHECK_THROWS_WITH_AS(arch_field("padded_vocab_size").set(c, nlohmann::json(int64_t{1} << 33), "model_config key padded_vocab_size"),
                       doctest::Contains("padded_vocab_size"), Error);
  // T5's stacks, given apart (the decoder's is --num-layers').
  rejected({"--encoder-num-layers", "100000", "--decoder-seq-length", "8"}, {"--encoder-num-layers must be in [0, 65536]"},
           /*t5=*/true);
  // In range: the sizes a real model has pass.
  CHECK(parse_error(moe({"--num-layers", "61", "--num-experts", "256", "--moe-router-topk", "8"})).empty());
}

TEST_CASE("two sources of one setting that disagree are refused naming both") {
  rejected({"--zero-stage", "0", "--use-distributed-optimizer"}, {"--zero-stage 0", "--use-distributed-optimizer"});
  CHECK(parse_error({"--use-distributed-optimizer"}).empty());
  CHECK(parse_error({"--zero-stage", "2", "--use-distributed-optimizer"}).empty());
  // A DeepSpeed JSON's ZeRO stage against Megatron-FSDP's sharding strategy.
  const TempFile ds1("ds1.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}})");
  rejected({"--deepspeed", "--deepspeed_config", ds1.path, "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
            "optim_grads_params"},
           {"zero_optimization.stage = 1", "--data-parallel-sharding-strategy optim_grads_params"});
  CHECK(parse_error({"--deepspeed", "--deepspeed_config", ds1.path, "--use-megatron-fsdp",
                     "--data-parallel-sharding-strategy", "optim"}).empty());
  // A key given twice: nlohmann keeps one without a word; refused naming the key (nested too).
  const TempFile dup("dup.json", R"({"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4})");
  rejected({"--deepspeed", "--deepspeed_config", dup.path}, {"\"train_micro_batch_size_per_gpu\" twice", dup.path});
  const TempFile dup2("dup2.json", R"({"zero_optimization": {"stage": 1, "overlap_comm": true, "stage": 3}})");
  rejected({"--deepspeed", "--deepspeed_config", dup2.path}, {"\"zero_optimization.stage\" twice"});
  // The same key in different objects, or in objects of an array, is not a repeat.
  CHECK(parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]})", "test").size() == 3);
  CHECK_THROWS_WITH_AS(parse_json_text(R"([{"k": 1, "j": 2, "k": 3}])", "a request"),
                       doctest::Contains("a request gives the key \"k\" twice"), Error);
}

TEST_CASE("explicit values are refused, not silently replaced by a default") {
  rejected(moe({"--moe-layer-freq", "[]"}), {"--moe-layer-freq is an empty list"});
  rejected(moe({"--moe-layer-freq", "[ ]"}), {"--moe-layer-freq is an empty list"});
  rejected({"--num-layers", "2", "--encoder-num-layers", "1", "--decoder-num-layers", "1", "--decoder-seq-length", "8"},
           {"--num-layers 2 is given with both --encoder-num-layers and --decoder-num-layers"}, /*t5=*/true);
  // The inference tools: 0 stands for "the default" inside, so an explicit 0 is refused.
  for (const char* flag : {"--inference-dynamic-batching-max-requests", "--inference-dynamic-batching-buffer-size-gb"}) {
    po::options_description d("t");
    InferenceFlags f;
    add_inference_flags(d, f, true, pretrain_flag_descriptions());
    std::vector<std::string> args = {"tool", flag, "0"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    po::variables_map vm;
    po::store(po::command_line_parser(3, argv.data()).options(d).run(), vm);
    po::notify(vm);
    try {
      check_inference_flags(vm, f);
      FAIL(flag, " 0 was accepted");
    } catch (const Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(std::string(flag) + " must be") != std::string::npos, e.what());
    }
  }
}

TEST_CASE("an MNLI file without its header row is refused, not read without its first example") {
  const std::string header =
      "index\tpromptID\tpairID\tgenre\ts1b\ts2b\ts1p\ts2p\tsentence1\tsentence2\tlabel1\tgold_label\n";
  const std::string row0 = "0\tp\tq\tg\tx\ty\tX\tY\tthe cat sat\ta cat sat\tentailment\tentailment\n";
  const std::string row1 = "1\tp\tq\tg\tx\ty\tX\tY\tthe dog ran\tno dog ran\tcontradiction\tcontradiction\n";
  const TempFile with("with.tsv", header + row0 + row1), without("without.tsv", row0 + row1);
  CHECK(read_mnli_tsv(with.path).size() == 2);
  CHECK_THROWS_WITH_AS(read_mnli_tsv(without.path), doctest::Contains("has no header row"), Error);
  const TempFile other("other.tsv", "a\tb\tc\td\te\tf\tg\th\ti\tj\tk\tl\n" + row0);
  CHECK_THROWS_WITH_AS(read_mnli_tsv(other.path), doctest::Contains("not MNLI's header row"), Error);
}
