// apps/pretrain_t5 end to end: WikiText-2 paragraphs preprocessed with --split-sentences and the test's
// uncased WordPiece vocab with 100 sentinels (Megatron's span corruption, data/t5_dataset.h), a small T5 in
// Hugging Face's layout (RMSNorm, relative positions, no biases, ReLU):
//  * the lm loss falls and is validated, with Megatron's log lines;
//  * a run stopped at iteration 6 and resumed logs the uninterrupted run's losses digit for digit;
//  * the trained checkpoint exported to Hugging Face (convert_checkpoint mpitron-to-hf) reads back to the
//    same logits, and transformers' T5ForConditionalGeneration greedy-decodes it to the same tokens as
//    mpitron (when /usr/bin/python3 has torch and transformers; else a SKIPPED message);
//  * under mpirun, TP2 with sequence parallelism, DP2 with ZeRO-1 (the distributed optimizer), DP2 with
//    ZeRO-3 and TP2 x DP2 with ZeRO-2 log the one-process losses within 1e-5 relative over 10 steps (with
//    hidden and attention dropout: the masks are named by the one-process positions);
//  * what T5 cannot take is refused by name (pipeline parallelism, no sentinels, a GPT tokenizer).
#include <doctest/doctest.h>

#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "model/t5.h"
#include "tests/apps/apps_test_util.h"

using namespace apps_test;
using namespace mpitron;

namespace {

const std::string& kVocab = kBertVocab;


// The "lm loss: X" of each iteration line, as printed.
std::vector<std::string> losses(const std::string& log) {
  std::vector<std::string> v;
  const std::regex re(" iteration .*\\| lm loss: ([0-9.E+-]+) \\|");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back((*it)[1]);
  return v;
}

int run_mpi(int np, const std::string& args, const std::string& log) {
  const std::string cmd = "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) +
                          " apps/pretrain_t5 " + args + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

std::string model_flags() {
  return "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --kv-channels 8 --ffn-hidden-size 64 "
         "--encoder-seq-length 32 --decoder-seq-length 16 --normalization RMSNorm --position-embedding-type relative "
         "--relative-attention-num-buckets 16 --relative-attention-max-distance 32 --disable-bias-linear --relu "
         "--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 2 --seed 5 --split 95,5,0 --device cpu "
         "--tokenizer-type BertWordPieceLowerCase --vocab-extra-ids 100 --vocab-file " + kVocab;
}


}  // namespace

TEST_CASE("pretrain_t5 trains on --split-sentences data: the lm loss falls, validation, a bitwise resume") {
  TempDir dir("pretrain_t5");
  const std::string data = wiki_sentence_data(dir, 200);
  const std::string run = model_flags() + " --data-path " + data + " --hidden-dropout 0.1 --attention-dropout 0.1 ";
  const int rc = run_app("pretrain_t5", run + "--train-iters 40 --log-interval 2 --eval-interval 20 --eval-iters 2 "
                                             "--make-vocab-size-divisible-by 256 --save " + (dir / "trained"),
                         dir / "train.log");
  const std::string log = slurp(dir / "train.log");
  REQUIRE_MESSAGE(rc == 0, log);
  CHECK(log.find("mpitron pretrain_t5: 2 encoder + 2 decoder layers") != std::string::npos);
  CHECK(log.find("lm loss value:") != std::string::npos);
  const std::vector<std::string> lm = losses(log);
  REQUIRE(lm.size() == 20);
  MESSAGE("lm loss ", lm.front(), " -> ", lm.back());
  CHECK(std::stod(lm.front()) > 7.0);                       // ln(2000 + 102) = 7.65 at the start
  CHECK(std::stod(lm.back()) < std::stod(lm.front()) - 1.5);  // the loss falls (measured 7.69 -> 5.81)

  // The trained model exported to Hugging Face: the same model, and transformers decodes it as mpitron does.
  REQUIRE(std::filesystem::exists(dir / "trained"));
  REQUIRE_MESSAGE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + (dir / "trained") + " --output " +
                                                    (dir / "hf"), dir / "export.log") == 0,
                  slurp(dir / "export.log"));
  InferenceModel saved = load_model_for_inference(dir / "trained");
  mpitron::T5 ours(saved.model->config(), mpitron::Device::cpu());
  ours.params().values().copy_from(saved.model->params().values());
  const HfCheckpoint hf = read_hf_checkpoint(dir / "hf");
  const auto theirs = t5_from_hf(hf, hf_config(hf.config_json, 256));  // 2102 rows padded as the run's
  const std::vector<std::vector<int64_t>> inputs = {{2, 1500, 1234, 103, 999, 1500, 1777, 3}, {2, 1037, 1047, 1086, 3}};
  // Megatron's T5 decoder starts with [BOS] and stops at [EOS]: the ids appended after the vocabulary.
  const int64_t bos = 2000, eos = 2001;
  const std::vector<std::vector<int64_t>> decoder = {{bos, 2002, 1500, 1234, 2003}, {bos, 2002, 1037, 2003, 1086}};
  nlohmann::json req = {{"start", bos}, {"eos", eos}, {"max_new", 8}, {"inputs", inputs}, {"decoder", decoder}};
  std::vector<std::vector<int64_t>> want;
  for (const auto& in : inputs) {
    const mpitron::Tensor enc = mpitron::Tensor::from_ints(in, {1, static_cast<int64_t>(in.size())}, mpitron::DType::I32);
    want.push_back(ours.greedy(enc, enc.dim(1), bos, eos, 8));
    CHECK(theirs->greedy(enc, enc.dim(1), bos, eos, 8) == want.back());
  }
  if (std::system("/usr/bin/python3 -c 'import torch, transformers' > /dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED transformers greedy decoding of the export: /usr/bin/python3 has no torch + transformers");
  } else {
    std::ofstream(dir / "ids.json") << req.dump();
    const int prc = std::system(("/usr/bin/python3 " + kSource + "/tests/reference/t5_export_greedy.py " + (dir / "hf") +
                                 " " + (dir / "ids.json") + " " + (dir / "hf_out.json") + " > " + (dir / "py.log") + " 2>&1")
                                    .c_str());
    REQUIRE_MESSAGE(prc == 0, slurp(dir / "py.log"));
    const nlohmann::json got = nlohmann::json::parse(slurp(dir / "hf_out.json"));
    for (size_t i = 0; i < inputs.size(); ++i) {  // the teacher-forced logits: the same function
      T5Batch b;
      const int64_t te = static_cast<int64_t>(inputs[i].size()), td = static_cast<int64_t>(decoder[i].size());
      b.enc = Tensor::from_ints(inputs[i], {1, te}, DType::I32);
      b.dec = Tensor::from_ints(decoder[i], {1, td}, DType::I32);
      b.labels = b.dec;
      b.enc_lengths = Tensor::from_ints({te}, {1}, DType::I32);
      const std::vector<float> lg = ours.logits(b).to_floats();
      const int64_t Vp = static_cast<int64_t>(lg.size()) / td;
      double worst = 0;
      for (int64_t t = 0; t < td; ++t)
        for (int64_t v = 0; v < 2102; ++v)
          worst = std::max(worst, std::abs(double(lg[static_cast<size_t>(t * Vp + v)]) -
                                           got["logits"][i][static_cast<size_t>(t)][static_cast<size_t>(v)].get<double>()));
      MESSAGE("prompt ", i, ": max |logit - transformers on the export| = ", worst);
      CHECK(worst < 1e-4);
    }
    for (size_t i = 0; i < want.size(); ++i) {
      const std::vector<int64_t> hf_ids = got["outputs"][i].get<std::vector<int64_t>>();
      MESSAGE("prompt ", i, ": mpitron and transformers greedy ", nlohmann::json(want[i]).dump(), " / ",
              nlohmann::json(hf_ids).dump());
      CHECK(hf_ids == want[i]);
    }
  }

  // Stopped at iteration 6 with a checkpoint, then resumed to 12: the last 6 losses as printed.
  const std::string short_run = run + "--train-iters 12 --log-interval 1 --eval-iters 0 ";
  REQUIRE(run_app("pretrain_t5", short_run, dir / "whole.log") == 0);
  REQUIRE(run_app("pretrain_t5", short_run + "--exit-interval 6 --save " + (dir / "ck") + " --save-interval 6",
                  dir / "first.log") == 0);
  const int rc2 = run_app("pretrain_t5", short_run + "--load " + (dir / "ck"), dir / "resume.log");
  const std::string resumed = slurp(dir / "resume.log");
  REQUIRE_MESSAGE(rc2 == 0, resumed);
  const std::vector<std::string> whole = losses(slurp(dir / "whole.log")), second = losses(resumed);
  REQUIRE(whole.size() == 12);
  REQUIRE(second.size() == 6);
  CHECK(std::vector<std::string>(whole.begin() + 6, whole.end()) == second);
}

TEST_CASE("pretrain_t5 under TP2 + SP, DP2 ZeRO-1, DP2 ZeRO-3 and TP2 x DP2 ZeRO-2 logs the one-process losses") {
  TempDir dir("pretrain_t5_mp");
  const std::string data = wiki_sentence_data(dir, 200);
  const std::string run = model_flags() + " --data-path " + data +
                          " --hidden-dropout 0.1 --attention-dropout 0.1 --train-iters 10 --log-interval 1 --eval-iters 0 ";
  // The one-process padded vocabulary equals TP2's (2102 rounded up to 256 = 128 x 2): the same parameters.
  REQUIRE(run_app("pretrain_t5", run + "--make-vocab-size-divisible-by 256", dir / "one.log") == 0);
  const std::vector<std::string> one = losses(slurp(dir / "one.log"));
  REQUIRE(one.size() == 10);
  struct Layout {
    int np;
    std::string flags;
  };
  for (const Layout& l : {Layout{2, "--tensor-model-parallel-size 2 --sequence-parallel"},
                          Layout{2, "--use-distributed-optimizer --make-vocab-size-divisible-by 256"},
                          Layout{2, "--zero-stage 3 --make-vocab-size-divisible-by 256"},
                          Layout{4, "--tensor-model-parallel-size 2 --zero-stage 2"}}) {
    CAPTURE(l.flags);
    const std::string log = dir / "mp.log";
    const int rc = run_mpi(l.np, run + l.flags, log);
    REQUIRE_MESSAGE(rc == 0, slurp(log));
    const std::vector<std::string> got = losses(slurp(log));
    REQUIRE(got.size() == one.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(std::stod(got[i]) - std::stod(one[i])) / std::stod(one[i]));
    MESSAGE(l.np, " ranks, ", l.flags, ": worst relative loss difference over 10 steps ", worst);
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("pretrain_t5 refuses what it cannot train, naming the flag") {
  TempDir dir("pretrain_t5_bad");
  const std::string data = wiki_sentence_data(dir, 200);
  const std::string base = model_flags() + " --data-path " + data + " --train-iters 2 ";
  struct Bad {
    std::string flags, message;
  };
  for (const Bad& b : {Bad{"--vocab-extra-ids 0", "--vocab-extra-ids"},
                       Bad{"--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size"},
                       Bad{"--tokenizer-type GPT2BPETokenizer", "is not a WordPiece tokenizer"},
                       Bad{"--num-experts 4", "num-experts"},
                       Bad{"--position-embedding-type rope", "learned_absolute or relative"}}) {
    CAPTURE(b.flags);
    const int rc = run_app("pretrain_t5", base + b.flags, dir / "bad.log");
    const std::string log = slurp(dir / "bad.log");
    CHECK(rc != 0);
    CHECK_MESSAGE(log.find(b.message) != std::string::npos, log);
  }
}
