// apps/pretrain_bert end to end: WikiText-2 paragraphs preprocessed with
// --split-sentences and the test's uncased WordPiece vocab, a small BERT trained
// with Megatron's log lines (lm loss and sop loss, both falling), validation,
// a checkpoint that resumes, and the refusals a user meets (a GPT tokenizer, GPT
// family flags, document-level data, --mock-data).
#include <doctest/doctest.h>

#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apps/apps_test_util.h"

using namespace apps_test;

namespace {

const std::string kVocab = kSource + "/tests/data/ref/bert_uncased/vocab.txt";

// WikiText-2 validation paragraphs (lines of more than 200 characters) as JSON lines.
void write_corpus(const std::string& path, size_t docs) {
  std::istringstream in(slurp(kSource + "/assets/text/wikitext-2.valid.txt"));
  std::ofstream out(path);
  std::string line;
  size_t n = 0;
  while (n < docs && std::getline(in, line))
    if (line.size() > 200) {
      out << nlohmann::json({{"text", line}}).dump() << "\n";
      ++n;
    }
}

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
  write_corpus(dir / "wiki.jsonl", 400);
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
  write_corpus(dir / "wiki.jsonl", 40);
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
