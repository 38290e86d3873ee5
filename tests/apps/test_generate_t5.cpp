// generate_text with T5 checkpoints (each prompt is the encoder's input, the output T5::greedy's decoder tokens):
//  * a random Hugging Face T5 imported with convert_checkpoint, prompts given as ids (--sample-input-ids-file):
//    exactly transformers' greedy tokens (tests/apps/ref/hf_t5_relu/ref.json "greedy", from 0 to eos 1), and
//    the same under mpirun -np 2 --tensor-model-parallel-size 2;
//  * a pretrain_t5 checkpoint with a WordPiece tokenizer and --vocab-extra-ids 100: text prompts (with a
//    sentinel in them) decode from [BOS] to [EOS], JSON lines, ids in the vocabulary, the same output twice
//    (and from --interactive's stdin without --greedy: T5 decodes greedily);
//  * what T5 cannot take is refused by name (--num-samples, sampling, another --vocab-extra-ids, mpirun without
//    --tensor-model-parallel-size),
//    and pretrain_t5 --load with another --vocab-extra-ids is refused by the tokenizer identity;
//  * --sample-input-ids-file with a GPT: the ids of a text prompt give that prompt's tokens, with or
//    without a tokenizer ("text" null without), and --eos-token-id stops a sample.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "tests/apps/apps_test_util.h"

using namespace apps_test;
using nlohmann::json;

namespace {

const std::string& kVocab = kBertVocab;

std::vector<json> json_lines(const std::string& path) {
  std::vector<json> v;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) v.push_back(json::parse(line));
  return v;
}

// pretrain_t5's tiny model (tests/apps/test_pretrain_t5.cpp's flags).
std::string model_flags() {
  return "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --kv-channels 8 --ffn-hidden-size 64 "
         "--encoder-seq-length 32 --decoder-seq-length 16 --normalization RMSNorm --position-embedding-type relative "
         "--relative-attention-num-buckets 16 --relative-attention-max-distance 32 --disable-bias-linear --relu "
         "--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 2 --seed 5 --split 95,5,0 --device cpu "
         "--tokenizer-type BertWordPieceLowerCase --vocab-file " + kVocab;
}


}  // namespace

TEST_CASE("generate_text on an imported HF T5: --sample-input-ids-file prompts give transformers' greedy tokens") {
  TempDir dir("generate_t5_hf");
  const std::string hf = kSource + "/tests/apps/ref/hf_t5_relu";
  REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + hf + " --output " + (dir / "ck"),
                  dir / "convert.log") == 0);
  const json ref = json::parse(slurp(hf + "/ref.json"));
  {
    std::ofstream ids(dir / "ids.txt");
    for (const json& g : ref["greedy"]) {
      std::string line;
      for (const json& id : g["input_ids"]) line += (line.empty() ? "" : " ") + std::to_string(id.get<int>());
      ids << line << "\n";
    }
  }
  const int rc = run_app("generate_text", "--load " + (dir / "ck") + " --sample-input-ids-file " + (dir / "ids.txt") +
                                              " --greedy --out-seq-length 8 --genfile " + (dir / "out.jsonl"),
                         dir / "gen.log");
  REQUIRE_MESSAGE(rc == 0, slurp(dir / "gen.log"));
  CHECK(slurp(dir / "gen.log").find("start token 0, eos 1") != std::string::npos);
  const std::vector<json> out = json_lines(dir / "out.jsonl");
  REQUIRE(out.size() == ref["greedy"].size());
  for (size_t i = 0; i < out.size(); ++i) {
    CAPTURE(i);
    std::vector<int> want = ref["greedy"][i]["output"].get<std::vector<int>>();
    REQUIRE(want.front() == 0);  // transformers' decoder_start_token_id
    want.erase(want.begin());
    CHECK(out[i]["tokens"].get<std::vector<int>>() == want);
    CHECK(out[i]["finished"] == (want.back() == 1));
    CHECK(out[i]["text"].is_null());  // no tokenizer for this vocabulary of 96
  }
  // Tensor parallelism: two ranks (--tensor-model-parallel-size 2, each half the heads and the vocabulary)
  // write the same tokens.
  const std::string tp2 = "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 apps/generate_text --load " +
                          (dir / "ck") + " --sample-input-ids-file " + (dir / "ids.txt") +
                          " --greedy --out-seq-length 8 --tensor-model-parallel-size 2 --genfile " + (dir / "tp2.jsonl") +
                          " > " + (dir / "tp2.log") + " 2>&1";
  REQUIRE_MESSAGE(std::system(tp2.c_str()) == 0, slurp(dir / "tp2.log"));
  CHECK(slurp(dir / "tp2.log").find("tp 2") != std::string::npos);
  CHECK(slurp(dir / "tp2.jsonl") == slurp(dir / "out.jsonl"));
  // A bad id names the file and line.
  std::ofstream(dir / "bad.txt") << "3 4\n5 96\n";
  CHECK(run_app("generate_text", "--load " + (dir / "ck") + " --sample-input-ids-file " + (dir / "bad.txt"),
                dir / "bad.log") != 0);
  CHECK_MESSAGE(slurp(dir / "bad.log").find("bad.txt:2: '96' is not a token id in [0, 96)") != std::string::npos,
                slurp(dir / "bad.log"));
}

TEST_CASE("generate_text on a pretrain_t5 checkpoint: text prompts, [BOS] to [EOS], deterministic; refusals by name") {
  TempDir dir("generate_t5");
  const std::string data = wiki_sentence_data(dir, 80);
  const std::string train = model_flags() + " --vocab-extra-ids 100 --data-path " + data +
                            " --train-iters 4 --log-interval 1 --eval-iters 0 --save " + (dir / "ck") + " --save-interval 4";
  REQUIRE_MESSAGE(run_app("pretrain_t5", train, dir / "train.log") == 0, slurp(dir / "train.log"));

  std::ofstream(dir / "prompts.txt") << "The cat sat on the <extra_id_0> mat .\nValkyria Chronicles <extra_id_0> game\n";
  const std::string tok = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + kVocab;
  const std::string gen = "--load " + (dir / "ck") + " --sample-input-file " + (dir / "prompts.txt") + tok +
                          " --out-seq-length 6 --greedy --genfile ";
  for (const char* f : {"a.jsonl", "b.jsonl"}) {
    const int rc = run_app("generate_text", gen + (dir / f) + " --vocab-extra-ids 100", dir / "gen.log");
    REQUIRE_MESSAGE(rc == 0, slurp(dir / "gen.log"));
  }
  CHECK(slurp(dir / "gen.log").find("start token 2000, eos 2001") != std::string::npos);  // [BOS], [EOS]
  const std::vector<json> a = json_lines(dir / "a.jsonl");
  REQUIRE(a.size() == 2);
  CHECK(a[0]["prompt"] == "The cat sat on the <extra_id_0> mat .");
  for (const json& j : a) {
    const std::vector<int> t = j["tokens"].get<std::vector<int>>();
    CHECK(!t.empty());
    CHECK(t.size() <= 6);
    for (int id : t) CHECK((id >= 0 && id < 2102));
    CHECK(j["finished"] == (t.back() == 2001));
    CHECK(j["text"].is_string());
  }
  CHECK(slurp(dir / "a.jsonl") == slurp(dir / "b.jsonl"));
  // --interactive with the prompts on stdin (not a terminal: one prompt per line) decodes the same.
  REQUIRE(run_app("generate_text", "--load " + (dir / "ck") + tok + " --vocab-extra-ids 100 --out-seq-length 6 "
                                       "--interactive --genfile " + (dir / "c.jsonl") + " < " + (dir / "prompts.txt"),
                  dir / "gen.log") == 0);
  CHECK(slurp(dir / "c.jsonl") == slurp(dir / "a.jsonl"));

  struct Bad {
    std::string flags, message;
  };
  const std::string base = "--load " + (dir / "ck") + tok;
  const std::string prompts = " --sample-input-file " + (dir / "prompts.txt");
  for (const Bad& b : {Bad{" --vocab-extra-ids 100 --num-samples 2", "--num-samples with the T5 checkpoint"},
                       Bad{" --vocab-extra-ids 100 --top_k 5" + prompts, "--top_k with the T5 checkpoint"},
                       Bad{" --vocab-extra-ids 100 --temperature 0.7" + prompts, "--temperature with the T5 checkpoint"},
                       Bad{" --vocab-extra-ids 50" + prompts, "--vocab-extra-ids 100 -> 50"},
                       Bad{prompts, "--vocab-extra-ids 100 -> 0"}}) {
    CAPTURE(b.flags);
    CHECK(run_app("generate_text", base + b.flags, dir / "bad.log") != 0);
    CHECK_MESSAGE(slurp(dir / "bad.log").find(b.message) != std::string::npos, slurp(dir / "bad.log"));
  }
  // One process only.
  const std::string mpi = "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 apps/generate_text " + base +
                          " --vocab-extra-ids 100" + prompts + " > " + (dir / "mpi.log") + " 2>&1";
  CHECK(std::system(mpi.c_str()) != 0);
  CHECK_MESSAGE(slurp(dir / "mpi.log").find("runs on one process") != std::string::npos, slurp(dir / "mpi.log"));
  // pretrain_t5 --load with another --vocab-extra-ids: refused by the checkpoint's tokenizer identity.
  const std::string other = model_flags() + " --vocab-extra-ids 50 --data-path " + data +
                            " --train-iters 6 --eval-iters 0 --load " + (dir / "ck");
  CHECK(run_app("pretrain_t5", other, dir / "load.log") != 0);
  CHECK_MESSAGE(slurp(dir / "load.log").find("--vocab-extra-ids 100 -> 50") != std::string::npos, slurp(dir / "load.log"));
}

TEST_CASE("generate_text --sample-input-ids-file with a GPT: the text prompt's tokens; without a tokenizer text is null") {
  TempDir dir("generate_ids_gpt");
  const std::string ref = kSource + "/tests/apps/ref/";
  {
    const mpitron::io::Safetensors st = mpitron::io::read_safetensors(ref + "gpt2_tiny.safetensors");
    auto model = mpitron::gpt_from_hf(st, mpitron::hf_file_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
    mpitron::save_model_checkpoint(dir / "ck", *model, "test");
  }
  std::ofstream(dir / "p.txt") << "Hello, world\n";
  std::ofstream(dir / "ids.txt") << "15496 11 995\n";  // GPT-2's ids of "Hello, world"
  const std::string gen = "--load " + (dir / "ck") + " --greedy --out-seq-length 5 --genfile ";
  REQUIRE(run_app("generate_text", gen + (dir / "a.jsonl") + " --sample-input-file " + (dir / "p.txt"), dir / "a.log") == 0);
  REQUIRE(run_app("generate_text", gen + (dir / "b.jsonl") + " --sample-input-ids-file " + (dir / "ids.txt"),
                  dir / "b.log") == 0);
  REQUIRE(run_app("generate_text", gen + (dir / "c.jsonl") + " --sample-input-ids-file " + (dir / "ids.txt") +
                                       " --tokenizer-type GPT2BPETokenizer",
                  dir / "c.log") == 0);
  const json a = json_lines(dir / "a.jsonl").at(0), b = json_lines(dir / "b.jsonl").at(0), c = json_lines(dir / "c.jsonl").at(0);
  CHECK(a["tokens"].size() == 5);
  CHECK(b["tokens"] == a["tokens"]);
  CHECK(b["text"].is_null());
  CHECK(b["prompt"] == "15496 11 995");
  CHECK(c["tokens"] == a["tokens"]);
  CHECK(c["text"] == a["text"]);
  // --eos-token-id: the second generated token ends the sample.
  const int second = a["tokens"][1].get<int>();
  if (second != a["tokens"][0].get<int>()) {
    REQUIRE(run_app("generate_text", gen + (dir / "d.jsonl") + " --sample-input-ids-file " + (dir / "ids.txt") +
                                         " --eos-token-id " + std::to_string(second),
                    dir / "d.log") == 0);
    const json d = json_lines(dir / "d.jsonl").at(0);
    CHECK(d["tokens"].size() == 2);
    CHECK(d["finished"] == true);
  }
  CHECK(run_app("generate_text", gen + (dir / "e.jsonl") + " --sample-input-ids-file " + (dir / "ids.txt") +
                                     " --decoder-start-token-id 0",
                dir / "e.log") != 0);
  CHECK(slurp(dir / "e.log").find("--decoder-start-token-id") != std::string::npos);
}
