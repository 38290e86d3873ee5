// apps/pretrain_bert end to end: WikiText-2 paragraphs preprocessed with
// --split-sentences and the test's uncased WordPiece vocab, a small BERT trained
// with Megatron's log lines (lm loss and sop loss, both falling), validation,
// a checkpoint that resumes, and the refusals a user meets (a GPT tokenizer, GPT
// family flags, document-level data, --mock-data); and the BERT workflow's end: a
// pretrain_bert checkpoint fine-tuned with `finetune --task MNLI` on the synthetic
// MNLI files (tests/data/finetune) above a stated dev accuracy.
#include <doctest/doctest.h>

#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apps/apps_test_util.h"

using namespace apps_test;

namespace {

const std::string& kVocab = kBertVocab;


// The values after `key: ` on the iteration log lines.
std::vector<double> logged(const std::string& log, const std::string& key) {
  std::vector<double> v;
  const std::regex re(" iteration .*\\| " + key + ": ([0-9.E+-]+) \\|");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

std::string model_flags() {
  return "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 "
         "--micro-batch-size 8 --global-batch-size 16 --lr 2e-3 --lr-warmup-iters 5 --hidden-dropout 0.0 "
         "--attention-dropout 0.0 --log-interval 10 --eval-interval 20 --eval-iters 2 --seed 5 --split 95,5,0 "
         "--tokenizer-type BertWordPieceLowerCase --vocab-file " + kVocab;
}

}  // namespace

TEST_CASE("pretrain_bert trains on --split-sentences data: lm and sop losses fall, validation, resume") {
  TempDir dir("pretrain_bert");
  write_wiki_corpus(dir / "wiki.jsonl", 400);
  REQUIRE(run_app("preprocess_data", "--input " + (dir / "wiki.jsonl") + " --output-prefix " + (dir / "wiki") +
                                         " --split-sentences --tokenizer-type BertWordPieceLowerCase --vocab-file " +
                                         kVocab + " --workers 1",
                  dir / "pp.log") == 0);
  const std::string data = dir / "wiki_text_sentence";
  const int rc = run_app("pretrain_bert", model_flags() + " --train-iters 60 --data-path " + data + " --save " +
                                              (dir / "ckpt") + " --save-interval 30",
                         dir / "train.log");
  const std::string log = slurp(dir / "train.log");
  REQUIRE_MESSAGE(rc == 0, log);
  CHECK(log.find("mpitron pretrain_bert:") != std::string::npos);
  const std::vector<double> lm = logged(log, "lm loss"), sop = logged(log, "sop loss");
  REQUIRE(lm.size() == 6);
  REQUIRE(sop.size() == 6);
  MESSAGE("lm loss ", lm.front(), " -> ", lm.back(), ", sop loss ", sop.front(), " -> ", sop.back());
  CHECK(lm.front() > 6.0);             // ln 2000 = 7.6 at the start, within the first 10 steps' fall
  CHECK(lm.back() < lm.front() - 1.0);  // the MLM loss falls
  CHECK(sop.back() < 0.75);             // ln 2 = 0.693: the sentence-order head learns, or at least does not diverge
  CHECK(log.find("lm loss value:") != std::string::npos);
  CHECK(log.find("sop loss value:") != std::string::npos);
  CHECK(std::filesystem::exists(dir / "ckpt/iter_0000060"));

  // Resume from the checkpoint and go on to iteration 70.
  const int rc2 = run_app("pretrain_bert", model_flags() + " --train-iters 70 --data-path " + data + " --load " +
                                               (dir / "ckpt") + " --save " + (dir / "ckpt"),
                          dir / "resume.log");
  const std::string log2 = slurp(dir / "resume.log");
  REQUIRE_MESSAGE(rc2 == 0, log2);
  CHECK(log2.find("loaded checkpoint") != std::string::npos);
  CHECK(log2.find("iteration       70/      70") != std::string::npos);
  const std::vector<double> lm2 = logged(log2, "lm loss");
  REQUIRE(!lm2.empty());
  CHECK(lm2.back() < lm.front() - 1.0);  // it went on from the trained weights
}

TEST_CASE("pretrain_bert refuses what it cannot train, naming the flag or file") {
  TempDir dir("pretrain_bert_bad");
  write_wiki_corpus(dir / "wiki.jsonl", 40);
  REQUIRE(run_app("preprocess_data", "--input " + (dir / "wiki.jsonl") + " --output-prefix " + (dir / "doc") +
                                         " --tokenizer-type BertWordPieceLowerCase --vocab-file " + kVocab +
                                         " --workers 1",
                  dir / "pp.log") == 0);
  const std::string base = model_flags() + " --train-iters 2 --data-path " + (dir / "doc_text_document");
  struct Case {
    std::string extra, expect;
  };
  const std::vector<Case> cases = {
      {"--tokenizer-type GPT2BPETokenizer", "--tokenizer-type GPT2BPETokenizer is not a BERT tokenizer"},
      {"--swiglu", "GPT-family flags"},
      {"--untie-embeddings-and-output-weights", "GPT-family flags"},
      {"--mock-data", "--mock-data is not implemented for pretrain_bert"},
      {"--mask-prob 1.5", "--mask-prob must be in (0, 1)"},
      {"", "--split-sentences"},  // one sequence per document: no two-sentence samples
  };
  for (const Case& c : cases) {
    CAPTURE(c.extra);
    std::string args = base + " " + c.extra;
    if (c.extra == "--mock-data") args = model_flags() + " --train-iters 2 --mock-data";
    const int rc = run_app("pretrain_bert", args, dir / "bad.log");
    const std::string log = slurp(dir / "bad.log");
    CHECK(rc != 0);
    CHECK_MESSAGE(log.find(c.expect) != std::string::npos, log);
  }
}

// From a pretrain_bert checkpoint to MNLI: the pretrained encoder (2 layers, hidden 64,
// seq 32) fine-tuned on tests/data/finetune's synthetic MNLI (1200 train, 300 dev rows;
// chance 33 %, the negation rule alone about 67 %, docs/finetune.md). Measured on the
// 2-core VM with these settings: 300 / 300 after 10 epochs. The run is deterministic, but
// such a small model is sensitive to its start: from another pretraining run (same flags
// on slightly different paragraphs) fine-tuning seeds 7, 1 and 5 reached 93.3, 93.3 and
// 73.3 %, and pretraining on 400 paragraphs only left seed 7 on the 67 % plateau. If a
// numerical change moves this run below the bound, look at those numbers before the code.
TEST_CASE("a pretrain_bert checkpoint fine-tunes on MNLI above the stated accuracy") {
  TempDir dir("bert_to_mnli");
  write_wiki_corpus(dir / "wiki.jsonl", 4000);  // all of them
  REQUIRE(run_app("preprocess_data", "--input " + (dir / "wiki.jsonl") + " --output-prefix " + (dir / "wiki") +
                                         " --split-sentences --tokenizer-type BertWordPieceLowerCase --vocab-file " +
                                         kVocab + " --workers 1",
                  dir / "pp.log") == 0);
  const std::string shape = " --num-layers 2 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 32"
                            " --init-method-std 0.1 --tokenizer-type BertWordPieceLowerCase --vocab-file " + kVocab;
  const int rc = run_app("pretrain_bert", shape + " --seq-length 32 --micro-batch-size 16 --global-batch-size 32"
                                                  " --train-iters 200 --lr 2e-3 --lr-warmup-iters 20 --split 98,2,0"
                                                  " --log-interval 50 --eval-iters 0 --seed 3 --data-path " +
                                                  (dir / "wiki_text_sentence") + " --save " + (dir / "pre"),
                         dir / "pre.log");
  REQUIRE_MESSAGE(rc == 0, slurp(dir / "pre.log"));
  const std::string ft = kSource + "/tests/data/finetune/";
  const int rc2 = run_app("finetune", "--task MNLI --train-data " + ft + "train.tsv --valid-data " + ft +
                                          "dev_matched.tsv --pretrained-checkpoint " + (dir / "pre") + shape +
                                          " --seq-length 24 --epochs 10 --micro-batch-size 8 --global-batch-size 16"
                                          " --lr 3e-4 --lr-warmup-fraction 0.1 --weight-decay 0.01 --hidden-dropout 0.05"
                                          " --attention-dropout 0 --log-interval 75 --seed 7 --device cpu",
                          dir / "ft.log");
  const std::string log = slurp(dir / "ft.log");
  REQUIRE_MESSAGE(rc2 == 0, log);
  CHECK(log.find("loaded the encoder from") != std::string::npos);  // the load is reported
  const std::regex re("overall: correct / total = ([0-9]+) / ([0-9]+)");
  double acc = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    acc = std::stod((*it)[1]) / std::stod((*it)[2]);
  MESSAGE("MNLI dev accuracy after 10 epochs from the pretrain_bert checkpoint: ", acc);
  CHECK(acc > 0.80);
}
