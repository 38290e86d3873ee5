// generate_text, evaluate and text_generation_server under mpirun with
// --tensor-model-parallel-size / --pipeline-model-parallel-size equal one process (samples
// byte for byte, greedy and seeded; WikiText perplexity within 1e-5 relative), on a checkpoint
// written by one process; evaluate prints progress at --log-interval; Megatron's GPT_ARGS
// (examples/pretrain_gpt.sh) are accepted with one note, a bad value of a training flag and an
// unknown flag are refused by name. The model is the PyTorch reference GPT-2 (tests/apps/ref/).
// mpitron-test: label=long
// mpitron-test: timeout=300
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "http_client.h"
#include "server_util.h"

using apps_test::run_app;
using apps_test::slurp;
using apps_test::TempDir;
using json = nlohmann::json;

namespace {

const char* const kMpirun = "mpirun --allow-run-as-root --oversubscribe -np ";

// Runs an app under `np` ranks (np 0: no mpirun).
int run_mpi(int np, const std::string& name, const std::string& args, const std::string& log) {
  if (np == 0) return run_app(name, args, log);
  const std::string cmd = "OMP_NUM_THREADS=1 " + std::string(kMpirun) + std::to_string(np) + " apps/" + name + " " +
                          args + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

struct Layout {
  int np, tp, pp;
  std::string flags() const {
    return " --tensor-model-parallel-size " + std::to_string(tp) + " --pipeline-model-parallel-size " + std::to_string(pp);
  }
};
const Layout kLayouts[] = {{2, 2, 1}, {2, 1, 2}, {4, 2, 2}};

std::string make_checkpoint(const TempDir& tmp) {
  const std::string ref = apps_test::kSource + "/tests/apps/ref/";
  REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + ref + "gpt2_tiny.safetensors --hf-config " +
                                            ref + "gpt2_tiny_config.json --output " + tmp / "ckpt", tmp / "conv.log") == 0);
  return tmp / "ckpt";
}

}  // namespace

TEST_CASE("generate_text and evaluate under TP2, PP2 and TP2 x PP2 equal one process; Megatron's GPT_ARGS accepted") {
  TempDir tmp("infer_tools");
  const std::string ckpt = make_checkpoint(tmp);
  std::ofstream(tmp / "prompts.txt") << "Hello, my dog is cute\nThe capital of France is\n\nOnce upon a time\n";
  // examples/pretrain_gpt.sh's GPT_ARGS (Megatron-LM), the model flags of this checkpoint.
  const std::string gpt_args =
      " --num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 256 --max-position-embeddings 256"
      " --micro-batch-size 4 --global-batch-size 8 --lr 0.00015 --train-iters 500000 --lr-decay-iters 320000"
      " --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 1e-2 --lr-warmup-fraction .01 --clip-grad 1.0";
  const std::string gen = " --sample-input-file " + tmp / "prompts.txt" + " --out-seq-length 12 --micro-batch-size 2";
  for (const char* mode : {" --greedy", " --top_p 0.9 --seed 7"}) {
    REQUIRE_MESSAGE(run_app("generate_text", "--load " + ckpt + gen + mode + gpt_args + " --genfile " + tmp / "one.jsonl",
                            tmp / "one.log") == 0, slurp(tmp / "one.log"));
    const std::string one = slurp(tmp / "one.jsonl");
    CHECK(std::count(one.begin(), one.end(), '\n') == 4);
    CHECK_MESSAGE(slurp(tmp / "one.log").find("--lr, ") != std::string::npos, slurp(tmp / "one.log"));
    CHECK(slurp(tmp / "one.log").find("pretraining flags, accepted from the script; no effect here") != std::string::npos);
    for (const Layout& l : kLayouts) {
      REQUIRE_MESSAGE(run_mpi(l.np, "generate_text", "--load " + ckpt + gen + mode + l.flags() + " --genfile " +
                                                         tmp / "mp.jsonl", tmp / "mp.log") == 0, slurp(tmp / "mp.log"));
      CHECK_MESSAGE(slurp(tmp / "mp.jsonl") == one, mode, l.flags());
    }
  }
  // Refusals: a training flag's bad value, a flag no tool knows, a layout that does not fit the ranks.
  CHECK(run_app("generate_text", "--load " + ckpt + gen + " --lr abc", tmp / "bad.log") == 1);
  CHECK_MESSAGE(slurp(tmp / "bad.log").find("--lr abc") != std::string::npos, slurp(tmp / "bad.log"));
  CHECK(run_app("evaluate", "--task WIKITEXT2 --valid-data x --load " + ckpt + " --no-such-flag", tmp / "bad.log") == 1);
  CHECK(slurp(tmp / "bad.log").find("no-such-flag") != std::string::npos);
  CHECK(run_app("generate_text", "--load " + ckpt + gen + " --tensor-model-parallel-size 2", tmp / "bad.log") == 1);
  CHECK_MESSAGE(slurp(tmp / "bad.log").find("mpirun -np 2") != std::string::npos, slurp(tmp / "bad.log"));

  // evaluate: WikiText perplexity under every layout, progress every 10 windows. The first 8
  // lines are 395 tokens: 394 targets, windows of 64 every 16 tokens: 25 windows, 0..20 full
  // (batched by 3: 3, 6, 9, 12 crosses 10, ..., 21 crosses 20), 21..24 each of its own length
  // (batches of one: 22, 23, 24, 25 the last).
  {
    std::ifstream f(apps_test::kSource + "/assets/text/wikitext-2.test.txt", std::ios::binary);
    std::ofstream o(tmp / "wiki.txt", std::ios::binary);
    std::string line;
    for (int i = 0; i < 8 && std::getline(f, line); ++i) o << line << "\n";
  }
  const std::string ev = "--task WIKITEXT2 --valid-data " + tmp / "wiki.txt" + " --load " + ckpt +
                         " --seq-length 64 --overlapping-eval 16 --micro-batch-size 3 --log-interval 10 --results-json ";
  // GPT_ARGS first: the window flags after them win (a repeated flag's last value, as argparse).
  REQUIRE_MESSAGE(run_app("evaluate", gpt_args + " " + ev + tmp / "one.json", tmp / "one.log") == 0, slurp(tmp / "one.log"));
  const json one = json::parse(slurp(tmp / "one.json"));
  const std::string log = slurp(tmp / "one.log");
  for (const char* p : {"windows 12/25 |", "windows 21/25 |", "windows 25/25 |"})
    CHECK_MESSAGE(log.find(p) != std::string::npos, p, "\n", log);
  CHECK(log.find("tokens/s") != std::string::npos);
  size_t lines = 0;  // one line per crossing of 10 and the last: no other
  for (size_t at = log.find("/25 |"); at != std::string::npos; at = log.find("/25 |", at + 1)) ++lines;
  CHECK_MESSAGE(lines == 3, log);
  for (const Layout& l : kLayouts) {
    REQUIRE_MESSAGE(run_mpi(l.np, "evaluate", ev + tmp / "mp.json" + l.flags(), tmp / "mp.log") == 0, slurp(tmp / "mp.log"));
    const json mp = json::parse(slurp(tmp / "mp.json"));
    for (const char* k : {"avg_loss", "ppl", "adjusted_ppl"})
      CHECK_MESSAGE(std::abs(mp[k].get<double>() / one[k].get<double>() - 1) < 1e-5, k, l.flags());
    CHECK(mp["scored_targets"] == one["scored_targets"]);
  }
}

TEST_CASE("text_generation_server under TP2 x PP2 (rank 0 serves HTTP) answers as one process") {
  TempDir tmp("infer_srv");
  const std::string ckpt = make_checkpoint(tmp);
  const std::string api = R"({"prompts": ["Hello, my dog", ""], "tokens_to_generate": 6, "top_k": 1, "logprobs": true})";
  const std::string v1 = R"({"prompt": "Once upon", "max_tokens": 6, "temperature": 0.7, "seed": 3})";
  // The chat template is parsed on every rank; rank 0 renders and serves.
  const std::string chat = R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "n": 2, "seed": 9,
                               "stop": "zzz"})";
  const std::string chat_template = apps_test::kSource + "/tests/apps/ref/gpt2_tiny_tokenizer_config.json";
  std::string want_api, want_v1, want_chat;
  {
    apps_test::Server one({"--load", ckpt, "--inference-dynamic-batching", "--chat-template", chat_template},
                          tmp / "one.log");
    want_api = http_test::http(one.port, "PUT", "/api", api).body;
    want_v1 = json::parse(http_test::http(one.port, "POST", "/v1/completions", v1).body)["choices"].dump();
    want_chat = json::parse(http_test::http(one.port, "POST", "/v1/chat/completions", chat).body)["choices"].dump();
    REQUIRE_MESSAGE(json::parse(want_chat).size() == 2, want_chat);
    CHECK(one.stop() == 0);
  }
  apps_test::Server mp({"--load", ckpt, "--inference-dynamic-batching", "--tensor-model-parallel-size", "2",
                        "--pipeline-model-parallel-size", "2", "--max-requests", "3", "--chat-template", chat_template},
                       tmp / "mp.log", 4);
  CHECK(slurp(tmp / "mp.log").find("tp 2 x pp 2 (world 4)") != std::string::npos);
  const http_test::Reply r = http_test::http(mp.port, "PUT", "/api", api);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  const json got = json::parse(r.body), want = json::parse(want_api);
  CHECK(got["text"] == want["text"]);
  CHECK(got["segments"] == want["segments"]);
  for (size_t i = 0; i < 2; ++i)
    for (size_t k = 0; k < 6; ++k)
      CHECK(std::abs(got["logprobs"][i][k].get<double>() - want["logprobs"][i][k].get<double>()) < 1e-4);
  CHECK(json::parse(http_test::http(mp.port, "POST", "/v1/completions", v1).body)["choices"].dump() == want_v1);
  CHECK(json::parse(http_test::http(mp.port, "POST", "/v1/chat/completions", chat).body)["choices"].dump() == want_chat);
  CHECK_MESSAGE(mp.wait_exit() == 0, slurp(tmp / "mp.log"));  // rank 0 stops the workers after 3 requests
}
