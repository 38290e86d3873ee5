// The server and evaluate on T5 checkpoints: a pretrain_t5 checkpoint with a WordPiece tokenizer and
// --vocab-extra-ids 100 (tests/apps/test_generate_t5.cpp's tiny model).
// text_generation_server (model/inference/t5_engine.h behind model/inference/served_model.h):
//  * POST /v1/completions (text and token-id prompts) and PUT /api answer with the decoder's greedy
//    tokens, exactly generate_text's for the same prompts (T5::greedy on the cached decoder), ending at
//    [EOS] ("stop") or at max_tokens ("length"); a stream carries the same tokens; a sampled request
//    (temperature, seed) gives the same answer twice and ids inside the vocabulary;
//  * an empty prompt is a 400 and the server keeps serving;
//  * under mpirun -np 2 --tensor-model-parallel-size 2 the same answers, and both ranks exit after
//    --max-requests;
//  * --inference-dynamic-batching and mpirun without --tensor-model-parallel-size are refused naming the
//    flag / the layout.
// evaluate --task SEQ2SEQ (model/inference/t5_eval.h):
//  * its avg loss, token count, ppl and token accuracy equal the teacher-forced cross-entropy of
//    T5::logits on [BOS] + target → target + [EOS] over the unpadded vocabulary, computed here; the
//    training path's loss (T5::forward, whose softmax also has the padded vocabulary's rows) is >= it;
//  * WikiText / LAMBADA on a T5, SEQ2SEQ on a GPT and a bad line are refused by name.
// mpitron-test: timeout=900
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps_test_util.h"
#include "data/text_tokenizer.h"
#include "http_client.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "model/inference/t5_engine.h"
#include "server_util.h"

using namespace apps_test;
using http_test::http;
using http_test::Reply;
using nlohmann::json;

namespace {

std::string model_flags() {  // tests/apps/test_generate_t5.cpp's
  return "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --kv-channels 8 --ffn-hidden-size 64 "
         "--encoder-seq-length 32 --decoder-seq-length 16 --normalization RMSNorm --position-embedding-type relative "
         "--relative-attention-num-buckets 16 --relative-attention-max-distance 32 --disable-bias-linear --relu "
         "--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 2 --seed 5 --split 95,5,0 --device cpu "
         "--tokenizer-type BertWordPieceLowerCase --vocab-file " + kBertVocab;
}

// pretrain_t5 for 4 iterations into dir/ck.
void train_t5(const TempDir& dir) {
  const std::string data = wiki_sentence_data(dir, 80);
  const std::string train = model_flags() + " --vocab-extra-ids 100 --data-path " + data +
                            " --train-iters 4 --log-interval 1 --eval-iters 0 --save " + (dir / "ck") + " --save-interval 4";
  REQUIRE_MESSAGE(run_app("pretrain_t5", train, dir / "train.log") == 0, slurp(dir / "train.log"));
}

std::vector<json> json_lines(const std::string& path) {
  std::vector<json> v;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) v.push_back(json::parse(line));
  return v;
}

}  // namespace

TEST_CASE("text_generation_server serves a T5: completions and /api give generate_text's greedy tokens; refusals") {
  TempDir dir("serve_t5");
  train_t5(dir);
  const std::vector<std::string> prompts = {"The cat sat on the <extra_id_0> mat .", "Valkyria Chronicles <extra_id_0> game"};
  {
    std::ofstream f(dir / "prompts.txt");
    for (const std::string& p : prompts) f << p << "\n";
  }
  const std::string tok = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + kBertVocab + " --vocab-extra-ids 100";
  REQUIRE_MESSAGE(run_app("generate_text", "--load " + (dir / "ck") + " --sample-input-file " + (dir / "prompts.txt") + tok +
                                               " --out-seq-length 6 --greedy --genfile " + (dir / "gen.jsonl"),
                          dir / "gen.log") == 0,
                  slurp(dir / "gen.log"));
  const std::vector<json> want = json_lines(dir / "gen.jsonl");
  REQUIRE(want.size() == 2);

  mpitron::data::TokenizerSpec spec{"BertWordPieceLowerCase", "", kBertVocab, ""};
  spec.vocab_extra_ids = 100;
  const auto tk = mpitron::data::make_tokenizer(spec);
  const int32_t eos = tk->eod();

  Server srv({"--load", dir / "ck", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", kBertVocab,
              "--vocab-extra-ids", "100"},
             dir / "server.log");
  CHECK_MESSAGE(slurp(dir / "server.log").find("T5 (2 encoder + 2 decoder layers) on one process") != std::string::npos,
                slurp(dir / "server.log"));
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    std::vector<int32_t> toks = want[i]["tokens"].get<std::vector<int32_t>>();
    const bool stopped = !toks.empty() && toks.back() == eos;
    CHECK(want[i]["finished"] == stopped);
    std::vector<int32_t> shown = toks;  // /v1/completions leaves out the final end token
    if (stopped) shown.pop_back();
    // Text prompt, greedy (temperature 0).
    Reply r = http(srv.port, "POST", "/v1/completions",
                   json{{"prompt", prompts[i]}, {"max_tokens", 6}, {"temperature", 0}}.dump());
    REQUIRE_MESSAGE(r.status == 200, r.body);
    json j = json::parse(r.body);
    CHECK(j["choices"][0]["text"] == tk->decode(shown));
    CHECK(j["choices"][0]["finish_reason"] == (stopped ? "stop" : "length"));
    CHECK(j["usage"]["completion_tokens"] == toks.size());
    // The same prompt as token ids, with logprobs: the tokens one by one.
    const std::vector<int32_t> ids = tk->make_encoder()->encode(prompts[i]);
    r = http(srv.port, "POST", "/v1/completions",
             json{{"prompt", ids}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}}.dump());
    REQUIRE_MESSAGE(r.status == 200, r.body);
    j = json::parse(r.body);
    CHECK(j["choices"][0]["text"] == tk->decode(shown));
    CHECK(j["usage"]["prompt_tokens"] == ids.size());
    REQUIRE(j["choices"][0]["logprobs"]["tokens"].size() == toks.size());
    for (const json& lp : j["choices"][0]["logprobs"]["token_logprobs"]) CHECK(lp.get<double>() <= 0.0);
    // Streamed: the same text in chunks, then [DONE].
    r = http(srv.port, "POST", "/v1/completions",
             json{{"prompt", prompts[i]}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}}.dump());
    REQUIRE_MESSAGE(r.status == 200, r.body);
    std::string streamed;
    std::istringstream in(r.body);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("data: {", 0) == 0) streamed += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
    CHECK(streamed == tk->decode(shown));
    CHECK(r.body.find("data: [DONE]") != std::string::npos);
  }
  // Megatron's /api: the prompts (the encoders' inputs) followed by the answers.
  Reply r = http(srv.port, "PUT", "/api", json{{"prompts", prompts}, {"tokens_to_generate", 6}, {"top_k", 1}}.dump());
  REQUIRE_MESSAGE(r.status == 200, r.body);
  json j = json::parse(r.body);
  for (size_t i = 0; i < prompts.size(); ++i)
    CHECK(j["text"][i] == prompts[i] + tk->decode(want[i]["tokens"].get<std::vector<int32_t>>()));
  // Sampling: the same seed twice, the same answer.
  const std::string sampled = json{{"prompt", prompts[0]}, {"max_tokens", 6}, {"temperature", 0.9}, {"seed", 7}}.dump();
  const Reply s1 = http(srv.port, "POST", "/v1/completions", sampled), s2 = http(srv.port, "POST", "/v1/completions", sampled);
  REQUIRE_MESSAGE(s1.status == 200, s1.body);
  CHECK(json::parse(s1.body)["choices"] == json::parse(s2.body)["choices"]);
  // An empty prompt: a 400 naming it, and the server still answers.
  r = http(srv.port, "POST", "/v1/completions", json{{"prompt", ""}, {"max_tokens", 4}}.dump());
  CHECK(r.status == 400);
  CHECK_MESSAGE(r.body.find("encoder needs an input") != std::string::npos, r.body);
  r = http(srv.port, "POST", "/v1/completions", json{{"prompt", prompts[1]}, {"max_tokens", 2}, {"temperature", 0}}.dump());
  CHECK(r.status == 200);
  CHECK(srv.stop() == 0);
  CHECK(slurp(dir / "server.log").find("T5 engine: ") != std::string::npos);

  // Tensor parallelism (mpirun -np 2 --tensor-model-parallel-size 2): rank 0 serves and rank 1 repeats its
  // model calls; the same answer, then both exit after --max-requests.
  {
    Server tp({"--load", dir / "ck", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", kBertVocab,
               "--vocab-extra-ids", "100", "--tensor-model-parallel-size", "2", "--max-requests", "2"},
              dir / "tp2.log", 2);
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> toks = want[i]["tokens"].get<std::vector<int32_t>>();
      if (!toks.empty() && toks.back() == eos) toks.pop_back();
      const Reply t = http(tp.port, "POST", "/v1/completions",
                           json{{"prompt", prompts[i]}, {"max_tokens", 6}, {"temperature", 0}}.dump());
      REQUIRE_MESSAGE(t.status == 200, t.body);
      CHECK(json::parse(t.body)["choices"][0]["text"] == tk->decode(toks));
    }
    CHECK_MESSAGE(tp.wait_exit() == 0, slurp(dir / "tp2.log"));
    CHECK(slurp(dir / "tp2.log").find("on tp 2 ranks") != std::string::npos);
  }

  // Refusals: dynamic batching (named), more than one rank without tensor parallelism.
  const std::string base = "--load " + (dir / "ck") + tok + " --port 0";
  CHECK(run_app("text_generation_server", base + " --inference-dynamic-batching", dir / "dyn.log") != 0);
  CHECK_MESSAGE(slurp(dir / "dyn.log").find("--inference-dynamic-batching with the T5 checkpoint") != std::string::npos,
                slurp(dir / "dyn.log"));
  const std::string mpi = "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 apps/text_generation_server " +
                          base + " > " + (dir / "mpi.log") + " 2>&1";
  CHECK(std::system(mpi.c_str()) != 0);
  CHECK_MESSAGE(slurp(dir / "mpi.log").find("runs on one process") != std::string::npos, slurp(dir / "mpi.log"));
}

TEST_CASE("evaluate --task SEQ2SEQ on a T5: the teacher-forced loss of the training path; refusals by name") {
  TempDir dir("eval_t5");
  train_t5(dir);
  struct Pair {
    std::string input, target;
  };
  const std::vector<Pair> pairs = {{"The cat sat on the <extra_id_0> mat .", "<extra_id_0> red"},
                                   {"Valkyria Chronicles <extra_id_0> game", "<extra_id_0> is a video"},
                                   {"the game was released in japan", ""}};
  {
    std::ofstream f(dir / "pairs.jsonl");
    for (const Pair& p : pairs) f << json{{"input", p.input}, {"target", p.target}}.dump() << "\n";
  }
  const std::string tok = " --tokenizer-type BertWordPieceLowerCase --vocab-file " + kBertVocab + " --vocab-extra-ids 100";
  const std::string base = "--load " + (dir / "ck") + tok;
  const int rc = run_app("evaluate", base + " --task SEQ2SEQ --valid-data " + (dir / "pairs.jsonl") + " --results-json " +
                                         (dir / "r.json"),
                         dir / "eval.log");
  REQUIRE_MESSAGE(rc == 0, slurp(dir / "eval.log"));
  CHECK(slurp(dir / "eval.log").find("validation results on SEQ2SEQ") != std::string::npos);
  const json r = json::parse(slurp(dir / "r.json"));

  // The same pairs here: T5::logits on [BOS] + target, the cross-entropy against target + [EOS] over the
  // unpadded vocabulary (evaluate's convention, as its GPT tasks), summed in double. T5::forward's loss
  // (the training path's lm_loss) also counts the padded vocabulary's rows, so it can only be larger.
  mpitron::data::TokenizerSpec spec{"BertWordPieceLowerCase", "", kBertVocab, ""};
  spec.vocab_extra_ids = 100;
  const auto tk = mpitron::data::make_tokenizer(spec);
  std::unique_ptr<mpitron::T5> m = mpitron::load_t5_for_inference(dir / "ck", mpitron::Device::cpu(), mpitron::DType::F32);
  const int64_t V = m->config().vocab_size;
  double loss = 0, train_loss = 0;
  int64_t tokens = 0, correct = 0;
  for (const Pair& p : pairs) {
    const std::vector<int32_t> x = tk->make_encoder()->encode(p.input), y = tk->make_encoder(false)->encode(p.target);
    std::vector<int64_t> dec{tk->bos()}, lab;
    for (int32_t t : y) dec.push_back(t), lab.push_back(t);
    lab.push_back(tk->eod());
    const int64_t T = static_cast<int64_t>(dec.size()), Te = static_cast<int64_t>(x.size());
    mpitron::T5Batch b;
    b.enc = mpitron::Tensor::from_ints(std::vector<int64_t>(x.begin(), x.end()), {1, Te}, mpitron::DType::I32);
    b.dec = mpitron::Tensor::from_ints(dec, {1, T}, mpitron::DType::I32);
    b.labels = mpitron::Tensor::from_ints(lab, {1, T}, mpitron::DType::I32);
    b.enc_lengths = mpitron::Tensor::from_ints({Te}, {1}, mpitron::DType::I32);
    const std::vector<float> logits = m->logits(b).to_floats();
    const int64_t Vp = static_cast<int64_t>(logits.size()) / T;
    for (int64_t t = 0; t < T; ++t) {
      double mx = -1e30, sum = 0;
      int64_t arg = 0;
      for (int64_t v = 0; v < V; ++v)
        if (logits[t * Vp + v] > mx) mx = logits[t * Vp + v], arg = v;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[t * Vp + v] - mx);
      loss += mx + std::log(sum) - logits[t * Vp + lab[t]];
      correct += arg == lab[t];
    }
    mpitron::Tape tape;
    tape.set_recording(false);
    mpitron::ForwardOptions o;
    o.train = false;
    train_loss += m->forward(tape, b, o).value().item() * static_cast<double>(T);
    tokens += T;
  }
  CHECK(r["total"] == 3);
  CHECK(r["tokens"] == tokens);
  const double want = loss / static_cast<double>(tokens);
  CHECK_MESSAGE(std::abs(r["avg_loss"].get<double>() - want) <= 1e-9 * want, r.dump(), " vs ", want);
  CHECK(r["avg_loss"].get<double>() <= train_loss / static_cast<double>(tokens) * (1 + 1e-6));
  CHECK(r["token_accuracy"].get<double>() == doctest::Approx(static_cast<double>(correct) / static_cast<double>(tokens)));
  CHECK(std::abs(r["ppl"].get<double>() - std::exp(r["avg_loss"].get<double>())) <= 1e-9 * r["ppl"].get<double>());

  // Refusals: a decoder LM's tasks on a T5, SEQ2SEQ on a GPT, a line without a target.
  CHECK(run_app("evaluate", base + " --task LAMBADA --valid-data " + (dir / "pairs.jsonl"), dir / "bad.log") != 0);
  CHECK_MESSAGE(slurp(dir / "bad.log").find("--task LAMBADA with the T5 checkpoint") != std::string::npos,
                slurp(dir / "bad.log"));
  CHECK_MESSAGE(slurp(dir / "bad.log").find("--task SEQ2SEQ") != std::string::npos, slurp(dir / "bad.log"));
  std::ofstream(dir / "bad.jsonl") << json{{"input", "a b"}, {"target", "c"}}.dump() << "\n{\"input\": \"a\"}\n";
  CHECK(run_app("evaluate", base + " --task SEQ2SEQ --valid-data " + (dir / "bad.jsonl"), dir / "bad.log") != 0);
  CHECK_MESSAGE(slurp(dir / "bad.log").find("bad.jsonl:2: not a JSON object with \"input\" and \"target\"") !=
                    std::string::npos,
                slurp(dir / "bad.log"));
  const std::string ref = kSource + "/tests/apps/ref/";
  const mpitron::io::Safetensors st = mpitron::io::read_safetensors(ref + "gpt2_tiny.safetensors");
  auto gpt = mpitron::gpt_from_hf(st, mpitron::hf_file_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
  mpitron::save_model_checkpoint(dir / "gpt", *gpt, "test");
  CHECK(run_app("evaluate", "--load " + (dir / "gpt") + " --task SEQ2SEQ --valid-data " + (dir / "pairs.jsonl"),
                dir / "bad.log") != 0);
  CHECK_MESSAGE(slurp(dir / "bad.log").find("--task SEQ2SEQ needs an encoder-decoder (T5) checkpoint") != std::string::npos,
                slurp(dir / "bad.log"));
}
