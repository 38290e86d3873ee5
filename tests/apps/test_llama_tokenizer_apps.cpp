// The apps with --tokenizer-type HuggingFaceTokenizer / SentencePieceTokenizer: a corpus
// preprocessed with the small Llama-3-style tokenizer.json trains (vocab 2001, padded 2048),
// generate_text decodes with it, evaluate runs LAMBADA with it; a GPT-2 tokenizer is refused
// for that checkpoint, and unknown types are refused by name.
#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "tests/apps/apps_test_util.h"

using namespace apps_test;

TEST_CASE("HuggingFaceTokenizer through preprocess_data, pretrain_gpt, generate_text and evaluate") {
  TempDir tmp("llama_tok_apps");
  const std::string tj = kSource + "/tests/data/ref/llama3_style/tokenizer.json";
  const std::string T = " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + tj;
  {
    std::ifstream in(kSource + "/assets/text/lambada_test.jsonl");
    std::ofstream out(tmp / "in.jsonl");
    std::string line;
    for (int i = 0; i < 60 && std::getline(in, line); ++i) out << line << "\n";
  }
  REQUIRE(run_app("preprocess_data", "--input " + tmp / "in.jsonl" + " --output-prefix " + tmp / "c --append-eod" + T,
                  tmp / "pre.log") == 0);
  const std::string model = " --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 ";
  REQUIRE_MESSAGE(run_app("pretrain_gpt", model + "--micro-batch-size 2 --eval-iters 0 --log-interval 1 --device cpu --lr 1e-3 "
                          "--train-iters 2 --save " + tmp / "ck" + " --save-interval 2 --data-path " + tmp / "c_text_document" + T,
                          tmp / "train.log") == 0,
                  slurp(tmp / "train.log"));
  std::ofstream(tmp / "p.txt") << "Hello world\n";
  REQUIRE_MESSAGE(run_app("generate_text", "--load " + tmp / "ck" + " --sample-input-file " + tmp / "p.txt" +
                          " --out-seq-length 6 --genfile " + tmp / "gen.jsonl" + T, tmp / "gen.log") == 0,
                  slurp(tmp / "gen.log"));
  auto j = nlohmann::json::parse(slurp(tmp / "gen.jsonl"));
  mpitron::data::HFTokenizer tok(tj);
  auto ids = j["tokens"].get<std::vector<int32_t>>();
  REQUIRE(ids.size() >= 1);
  for (int32_t id : ids) CHECK(id < 2001);  // the model's vocab_size is the tokenizer's (padded rows never sampled)
  if (j["finished"].get<bool>()) ids.pop_back();
  // generate_text writes JSON with invalid UTF-8 (a sample cut inside a character)
  // replaced by U+FFFD: compare with the decoded bytes passed through the same writer.
  const std::string decoded = nlohmann::json::parse(nlohmann::json(tok.decode(ids)).dump(
                                                        -1, ' ', false, nlohmann::json::error_handler_t::replace))
                                  .get<std::string>();
  CHECK(j["text"].get<std::string>() == decoded);
  CHECK(run_app("evaluate", "--task LAMBADA --valid-data " + tmp / "in.jsonl" + " --load " + tmp / "ck" + " --strict-lambada" + T,
                tmp / "eval.log") == 0);
  CHECK(slurp(tmp / "eval.log").find("total: 60") != std::string::npos);
  // The GPT-2 default tokenizer does not fit this checkpoint.
  CHECK(run_app("generate_text", "--load " + tmp / "ck" + " --sample-input-file " + tmp / "p.txt", tmp / "gpt2.log") == 1);
  CHECK(slurp(tmp / "gpt2.log").find("vocab_size 2001 differs from the tokenizer's 50257") != std::string::npos);
  CHECK(run_app("pretrain_gpt", model + "--lr 1e-3 --micro-batch-size 2 --device cpu --train-iters 1 --tokenizer-type BertWordPieceLowerCase --data-path " + tmp / "c_text_document",
                tmp / "bad.log") != 0);
  CHECK(slurp(tmp / "bad.log").find("--tokenizer-type BertWordPieceLowerCase is not supported") != std::string::npos);
  CHECK(run_app("pretrain_gpt", model + "--lr 1e-3 --micro-batch-size 2 --device cpu --train-iters 1 --tokenizer-type SentencePieceTokenizer --data-path " + tmp / "c_text_document",
                tmp / "nomodel.log") != 0);
  CHECK(slurp(tmp / "nomodel.log").find("needs --tokenizer-model") != std::string::npos);
}
