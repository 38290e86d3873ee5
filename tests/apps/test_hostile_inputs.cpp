// tests/apps/test_hostile_inputs.cpp — what a careless script or a damaged file
// hands the tools (issue 26), one TEST_CASE per class of failure, each with the
// inputs that crashed, hung, lost output or were read silently wrong before:
//   2  a checkpoint trained with another tokenizer is refused on --load
//   4  output writes are checked through close; nothing another run wrote is replaced
//   5  JSON depth, token ids, line lengths and schedule sizes are bounded
//   6  tokenizer.json files that `tokenizers` refuses or reads otherwise
//   7  task inputs: MNLI test files, invalid UTF-8, empty LAMBADA passages, flags
//   8  a FIFO where a file is expected does not block
// (class 1, a frozen rank, is tests/parallel/test_frozen_rank.cpp.)
// mpitron-test: label=reliability
// mpitron-test: timeout=600
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/files.h"
#include "core/json.h"
#include "data/blended_dataset.h"
#include "data/hf_tokenizer.h"
#include "data/indexed_dataset.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/checkpoint/checkpointing.h"
#include "model/training/deepspeed_config.h"
#include "model/training/finetune.h"
#include "parallel/schedule.h"
#include "tests/apps/apps_test_util.h"
#include "tests/error_of.h"

using namespace mpitron;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::TempDir;
namespace fs = std::filesystem;
using nlohmann::json;
using mpitron::testing_util::error_of;

namespace {

const std::string kRef = apps_test::kSource + "/tests/apps/ref/";
const std::string kLlama3Tok = apps_test::kSource + "/tests/data/ref/llama3_style/tokenizer.json";

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// A tiny GPT-2 checkpoint (the committed HF reference model, converted).
std::string tiny_checkpoint(const TempDir& tmp) {
  const std::string ckpt = tmp / "ckpt";
  REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + kRef + "gpt2_tiny.safetensors --hf-config " +
                                            kRef + "gpt2_tiny_config.json --output " + ckpt, tmp / "conv.log") == 0);
  return ckpt;
}

// `depth` nested arrays around 1: [[[...1...]]].
std::string deep_json(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// Small Megatron data whose ids stay below `vocab` (EOD = eod).
std::string small_dataset(const fs::path& dir, int32_t vocab, int32_t eod) {
  const std::string prefix = (dir / "small_text_document").string();
  data::IndexedDatasetWriter w(prefix, data::DType::U16);
  std::vector<int32_t> doc;
  for (int d = 0; d < 60; ++d) {
    doc.assign(static_cast<size_t>(20 + d % 30), 0);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((d * 31 + i * 7) % (vocab - 300) + 260);
    doc.back() = eod;
    w.add_tokens(doc.data(), static_cast<int64_t>(doc.size()));
    w.end_document();
  }
  w.finalize();
  return prefix;
}

std::string pretrain_flags(const std::string& data, int iters, const std::string& extra) {
  return "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 "
         "--micro-batch-size 2 --global-batch-size 2 --lr 1e-3 --split 1,0,0 --log-interval 1 --eval-iters 0 "
         "--device cpu --data-path " + data + " --train-iters " + std::to_string(iters) + " " + extra;
}

// Runs fn in a child process; the exit status, or -1 when it did not end within `seconds` (killed).
template <typename F>
int in_child(double seconds, const F& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own group: a timeout kills what it started too (a converter blocked on a FIFO)
    int rc = 1;
    try {
      rc = fn();
    } catch (...) {
      rc = 2;
    }
    _exit(rc);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// The committed llama3-style tokenizer.json with `edit` applied, written to path.
void write_tokenizer(const std::string& path, const std::function<void(json&)>& edit) {
  json j = json::parse(slurp(kLlama3Tok));
  edit(j);
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << j.dump();
}

}  // namespace

TEST_CASE("class 4: a full disk is an error through close (generate_text --genfile, evaluate --results-json)") {
  CHECK_THROWS_WITH_AS(write_file_checked("/dev/full", "x", "--results-json"), doctest::Contains("No space left"), Error);
  TempDir tmp("hostile_out");
  const std::string ckpt = tiny_checkpoint(tmp);
  CHECK(run_app("generate_text", "--load " + ckpt + " --num-samples 1 --out-seq-length 2 --greedy --genfile /dev/full",
                tmp / "g.log") == 1);
  CHECK(contains(slurp(tmp / "g.log"), "--genfile '/dev/full'"));
  CHECK(contains(slurp(tmp / "g.log"), "No space left"));
  // stdout on a full disk too.
  const int rc = std::system(("OMP_NUM_THREADS=1 apps/generate_text --load " + ckpt +
                              " --num-samples 1 --out-seq-length 2 --greedy 2> " + tmp / "g2.log" + " > /dev/full").c_str());
  CHECK((WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) == 1);
  CHECK(contains(slurp(tmp / "g2.log"), "writing the samples to stdout failed"));
  std::ofstream(tmp / "wiki.txt") << " = Title = \n\n The tower is 324 metres tall , about the same height as an "
                                     "81 @-@ storey building .\n";
  CHECK(run_app("evaluate", "--task WIKITEXT2 --valid-data " + tmp / "wiki.txt" + " --load " + ckpt +
                               " --seq-length 16 --results-json /dev/full", tmp / "e.log") == 1);
  CHECK(contains(slurp(tmp / "e.log"), "--results-json '/dev/full'"));
  // The same commands write their files when there is room.
  CHECK(run_app("evaluate", "--task WIKITEXT2 --valid-data " + tmp / "wiki.txt" + " --load " + ckpt +
                               " --seq-length 16 --results-json " + tmp / "r.json", tmp / "e2.log") == 0);
  CHECK(json::parse(slurp(tmp / "r.json")).contains("ppl"));
}

TEST_CASE("class 4: nothing another run wrote is deleted or replaced without a flag") {
  TempDir tmp("hostile_own");
  const std::string ckpt = tiny_checkpoint(tmp);

  SUBCASE("convert_checkpoint: export over existing files, import over a checkpoint directory") {
    REQUIRE(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf",
                    tmp / "x1.log") == 0);
    fs::create_directories(tmp / "hf2");
    std::ofstream(tmp / "hf2/config.json") << "{\"mine\": true}\n";
    const std::string before = slurp(tmp / "hf2/config.json");
    CHECK(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf2",
                  tmp / "x2.log") == 1);
    CHECK(contains(slurp(tmp / "x2.log"), "config.json' already exists"));
    CHECK(slurp(tmp / "hf2/config.json") == before);
    CHECK_FALSE(fs::exists(tmp / "hf2/model.safetensors"));  // nothing written before the refusal
    CHECK(run_app("convert_checkpoint", "--direction mpitron-to-hf --input " + ckpt + " --output " + tmp / "hf",
                  tmp / "x3.log") == 1);
    CHECK(run_app("convert_checkpoint", "--direction mpitron-to-hf --overwrite --input " + ckpt + " --output " + tmp / "hf",
                  tmp / "x4.log") == 0);
    // Import into a directory that holds a checkpoint (a training run's, here the first import's).
    const std::string tracker = slurp(ckpt + "/latest_checkpointed_iteration.txt");
    CHECK(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + kRef + "gpt2_tiny.safetensors --hf-config " +
                                            kRef + "gpt2_tiny_config.json --output " + ckpt, tmp / "x5.log") == 1);
    CHECK(contains(slurp(tmp / "x5.log"), "already holds checkpoints"));
    CHECK(slurp(ckpt + "/latest_checkpointed_iteration.txt") == tracker);
  }

  SUBCASE("pretrain_gpt: a reused --save is refused; with --overwrite-save, --keep-last deletes only this run's") {
    const std::string data = small_dataset(tmp.path, 50257, 50256);
    const std::string save = tmp / "save";
    REQUIRE(run_app("pretrain_gpt", pretrain_flags(data, 5, "--save " + save + " --save-interval 5"), tmp / "a.log") == 0);
    REQUIRE(fs::exists(save + "/iter_0000005"));
    // A fresh run (no --load) into the same directory.
    CHECK(run_app("pretrain_gpt", pretrain_flags(data, 7, "--save " + save + " --save-interval 3 --keep-last 1"),
                  tmp / "b.log") == 1);
    CHECK(contains(slurp(tmp / "b.log"), "holds checkpoints of another run (iter_0000005)"));
    CHECK(slurp(save + "/latest_checkpointed_iteration.txt") == "5\n");
    REQUIRE(run_app("pretrain_gpt",
                    pretrain_flags(data, 7, "--save " + save + " --save-interval 3 --keep-last 1 --overwrite-save"),
                    tmp / "c.log") == 0);
    CHECK(fs::exists(save + "/iter_0000005"));      // the other run's: kept
    CHECK_FALSE(fs::exists(save + "/iter_0000003"));  // this run's older one: pruned
    CHECK(fs::exists(save + "/iter_0000007"));
    // Resuming in place continues the lineage: its own checkpoints are its to prune.
    REQUIRE(run_app("pretrain_gpt",
                    pretrain_flags(data, 9, "--load " + save + " --save " + save + " --save-interval 1 --keep-last 1 "
                                            "--overwrite-save"), tmp / "d.log") == 0);
    CHECK_FALSE(fs::exists(save + "/iter_0000007"));
    CHECK(fs::exists(save + "/iter_0000009"));
    CHECK(fs::exists(save + "/iter_0000005"));
  }
}

TEST_CASE("class 2: --load of a checkpoint trained with another tokenizer is refused unless --allow-tokenizer-change") {
  TempDir tmp("hostile_tok");
  // ids below 2001, so the same data suits the GPT-2 tokenizer and the 2,001-token tokenizer.json.
  const std::string data = small_dataset(tmp.path, 2001, 1);
  const std::string save = tmp / "gpt2";
  REQUIRE(run_app("pretrain_gpt", pretrain_flags(data, 2, "--save " + save + " --save-interval 2"), tmp / "a.log") == 0);
  // The checkpoint records the tokenizer: type, size, and the sha256 of the bundled vocab and merges.
  {
    io::CheckpointReader r = io::CheckpointReader::open_latest(save, MPI_COMM_NULL, false);
    const json id = json::parse(r.attr_string("tokenizer_identity"));
    CHECK(id["type"] == "GPT2BPETokenizer");
    CHECK(id["vocab_size"] == 50257);
    REQUIRE(id["files"].size() == 2);
    CHECK(id["files"][0]["name"] == "gpt2-vocab.json");
    CHECK(id["files"][0]["sha256"].get<std::string>().size() == 64);
  }
  const std::string hf = " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + kLlama3Tok;
  CHECK(run_app("pretrain_gpt", pretrain_flags(data, 4, "--load " + save + " --save " + tmp / "b" + hf), tmp / "b.log") == 1);
  const std::string b = slurp(tmp / "b.log");
  CHECK(contains(b, "was trained with another tokenizer (type GPT2BPETokenizer -> HuggingFaceTokenizer, vocab_size 50257 -> 2001"));
  CHECK(contains(b, "--allow-tokenizer-change"));
  CHECK(run_app("pretrain_gpt", pretrain_flags(data, 4, "--load " + save + " --finetune --save " + tmp / "c" + hf),
                tmp / "c.log") == 1);
  CHECK(run_app("pretrain_gpt",
                pretrain_flags(data, 4, "--load " + save + " --save " + tmp / "d" + hf + " --allow-tokenizer-change"),
                tmp / "d.log") == 0);
  CHECK(contains(slurp(tmp / "d.log"), "going on as --allow-tokenizer-change asks"));
  // The same tokenizer (another path to the same bytes) resumes.
  fs::copy_file(apps_test::kSource + "/assets/gpt2/gpt2-vocab.json", tmp / "v.json");
  fs::copy_file(apps_test::kSource + "/assets/gpt2/gpt2-merges.txt", tmp / "m.txt");
  CHECK(run_app("pretrain_gpt", pretrain_flags(data, 4, "--load " + save + " --save " + tmp / "e" + " --vocab-file " +
                                                            tmp / "v.json" + " --merge-file " + tmp / "m.txt"),
                tmp / "e.log") == 0);
  // A checkpoint from before identities were recorded: its vocab_size is compared.
  CHECK(error_of([] { check_checkpoint_tokenizer("old", "", 50257, R"({"type":"X","vocab_size":2001,"files":[]})", 2001, false); })
            .find("vocab_size 50257 -> 2001") != std::string::npos);
  CHECK_NOTHROW(check_checkpoint_tokenizer("old", "", 2001, R"({"type":"X","vocab_size":2001,"files":[]})", 2001, false));
}

TEST_CASE("class 5: JSON depth, token ids, line lengths and schedule sizes are bounded") {
  TempDir tmp("hostile_bounds");
  const std::string deep = deep_json(100000);
  // JSON nested 100,000 deep where an error message prints the value.
  CHECK(error_of([&] { parse_json_text(deep, "x.json"); }) .find("x.json nests deeper than 128 levels (line 1)") != std::string::npos);
  write_tokenizer(tmp / "deep/tokenizer.json", [](json& j) { j["normalizer"] = nullptr; });
  {
    std::string t = slurp(tmp / "deep/tokenizer.json");
    t.replace(t.find("\"normalizer\":null"), 17, "\"normalizer\":" + deep);
    std::ofstream(tmp / "deep/tokenizer.json") << t;
  }
  CHECK(error_of([&] { data::HFTokenizer t(tmp / "deep/tokenizer.json"); }).find("nests deeper than") != std::string::npos);
  std::ofstream(tmp / "ds.json") << "{\"train_batch_size\": " << deep << "}";
  CHECK(error_of([&] { read_deepspeed_config(tmp / "ds.json"); }).find("--deepspeed_config '") != std::string::npos);
  CHECK(error_of([&] { hf_config("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"unknown\": " + deep + "}"); })
            .find("HF config.json nests deeper") != std::string::npos);
  // Ids of 2^31 and 10^9 in tokenizer.json: an error naming the field, not std::bad_alloc.
  for (const int64_t id : {int64_t{1} << 31, int64_t{1000000000}}) {
    CAPTURE(id);
    write_tokenizer(tmp / "ids/tokenizer.json", [&](json& j) { j["model"]["vocab"]["he"] = id; });
    const std::string e = error_of([&] { data::HFTokenizer t(tmp / "ids/tokenizer.json"); });
    CHECK(contains(e, str("model.vocab[\"he\"] = ", id, " is not an id in [0, ")));
    write_tokenizer(tmp / "ids/tokenizer.json", [&](json& j) { j["added_tokens"][2]["id"] = id; });
    CHECK(contains(error_of([&] { data::HFTokenizer t(tmp / "ids/tokenizer.json"); }), "added_tokens[\"<|eot_id|>\"].id"));
  }
  // A line without end: preprocess_data --input /dev/zero stops at the line bound.
  CHECK(run_app("preprocess_data", "--input /dev/zero --output-prefix " + tmp / "z --append-eod", tmp / "z.log") == 1);
  CHECK(contains(slurp(tmp / "z.log"), "--input '/dev/zero' line 1 is longer than 256 MiB"));
  // The tools' line reader has the same bound.
  std::ofstream(tmp / "long.txt") << std::string(5000, 'x') << "\nok\n";
  {
    LineReader r(tmp / "long.txt", "--valid-data", 4096);
    std::string line;
    CHECK(contains(error_of([&] { r.next(line); }), "line 1 is longer than 4096 bytes"));
  }
  // Schedules of 10^9 and 10^7 micro-batches: refused at once, naming the flag or the file line.
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* m : {"1000000000", "10000000"}) {
    CHECK(run_app("schedule_sim", std::string("--schedule 1f1b --pp 2 --micro-batches ") + m, tmp / "s.log") == 1);
    CHECK(contains(slurp(tmp / "s.log"), "micro-batches x pp 2 x virtual stages 1 exceed 1048576"));
  }
  std::ofstream(tmp / "big.sched") << "schedule big\npp 2\nmicro-batches 1000000000\nrank 0: F0.0\nrank 1: F0.0\n";
  CHECK(run_app("schedule_sim", "--schedule-file " + tmp / "big.sched", tmp / "f.log") == 1);
  CHECK(contains(slurp(tmp / "f.log"), "big.sched:3:15:"));
  std::ofstream(tmp / "rank.sched") << "pp 2\nmicro-batches 1\nrank 1000000: F0.0\n";
  CHECK(run_app("schedule_sim", "--schedule-file " + tmp / "rank.sched", tmp / "r.log") == 1);
  CHECK(contains(slurp(tmp / "r.log"), "rank.sched:3:6: rank 1000000 exceeds"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("class 6: tokenizer.json files that `tokenizers` refuses or reads otherwise") {
  TempDir tmp("hostile_tokfile");
  const json ref = json::parse(slurp(apps_test::kSource + "/tests/data/ref/hostile_tokenizer_ref.json"));
  const std::string p = tmp / "t/tokenizer.json";
  const auto load_error = [&] { return error_of([&] { data::HFTokenizer t(p); }); };

  // Duplicated merges: read as tokenizers reads them (the pair takes its last rank).
  write_tokenizer(p, [](json& j) {
    j["model"]["ignore_merges"] = false;
    j["model"]["merges"].push_back(j["model"]["merges"][0]);
  });
  {
    data::HFTokenizer t(p);
    auto enc = t.make_encoder(false);
    for (size_t i = 0; i < ref["texts"].size(); ++i) {
      CAPTURE(ref["texts"][i].get<std::string>());
      CHECK(enc->encode(ref["texts"][i].get<std::string>()) == ref["dup_merge0"][i].get<std::vector<int32_t>>());
    }
  }
  // Two tokens on one id (tokenizers decodes the id to either): refused, naming both.
  write_tokenizer(p, [](json& j) { j["model"]["vocab"]["he"] = j["model"]["vocab"]["the"]; });
  CHECK(ref["accepted"]["two_tokens_one_id"] == true);
  CHECK(contains(load_error(), "already has"));
  CHECK(contains(load_error(), "'he'"));
  // A fractional id: tokenizers refuses it (u32), so do we.
  CHECK(ref["accepted"]["id_3_5"] == false);
  write_tokenizer(p, [](json& j) { j["model"]["vocab"]["he"] = 259.5; });
  CHECK(contains(load_error(), "model.vocab[\"he\"] = 259.5 is not an integer id"));
  // A pre-tokenizer regex that matches the empty string (tokenizers splits every character apart).
  write_tokenizer(p, [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a*"; });
  CHECK(contains(load_error(), "Split regex 'a*' can match the empty string"));
  // An added token that is also a vocab token with another id (tokenizers uses the vocab's id).
  write_tokenizer(p, [](json& j) {
    j["added_tokens"].push_back({{"id", 2001}, {"content", "he"}, {"special", false}});
  });
  CHECK(contains(load_error(), "added token 'he' has id 2001 but model.vocab gives it id 259"));
  // A malformed tokenizer_config.json beside it: an error naming it (AutoTokenizer fails too), not ignored.
  write_tokenizer(p, [](json&) {});
  std::ofstream(tmp / "t/tokenizer_config.json") << "{\"eos_token\": \"<|end_of_text|>\",";
  CHECK(contains(load_error(), "tokenizer_config.json' is not valid JSON"));
  std::ofstream(tmp / "t/tokenizer_config.json") << "{\"eos_token\": 5}";
  CHECK(contains(load_error(), "eos_token = 5 is neither a token"));
  std::ofstream(tmp / "t/tokenizer_config.json") << "{\"eos_token\": \"<|end_of_text|>\"}";
  CHECK(load_error().empty());
}

TEST_CASE("class 7: task inputs and flags that did nothing or the wrong thing") {
  TempDir tmp("hostile_task");
  // A 10-column MNLI test file (no gold_label) as training data.
  std::ofstream(tmp / "test.tsv") << "index\tp\tq\tg\tx\ty\tX\tY\tsentence1\tsentence2\n3\tp\tq\tg\tx\ty\tX\tY\tone\ttwo\n";
  CHECK(contains(error_of([&] { read_mnli_tsv(tmp / "test.tsv"); }), "test.tsv:1: a 10-column MNLI file is a GLUE test file"));
  // Invalid UTF-8 in a sentence.
  std::ofstream(tmp / "bad.tsv") << "index\tp\tq\tg\tx\ty\tX\tY\tsentence1\tsentence2\tl1\tgold_label\n"
                                 << "1\tp\tq\tg\tx\ty\tX\tY\tca\xff" "fe\ttwo\tneutral\tneutral\n";
  CHECK(contains(error_of([&] { read_mnli_tsv(tmp / "bad.tsv"); }), "bad.tsv:2: invalid UTF-8 at byte"));
  // A hexadecimal --data-path weight.
  CHECK(contains(error_of([] { data::parse_data_path({"0x10", "a", "1", "b"}); }), "'0x10' is not a non-negative weight"));
  CHECK_NOTHROW(data::parse_data_path({"0.3", "a", "7e-1", "b"}));

  const std::string ckpt = tiny_checkpoint(tmp);
  // --strict-lambada with --task WIKITEXT2.
  CHECK(run_app("evaluate", "--task WIKITEXT2 --strict-lambada --valid-data x --load " + ckpt, tmp / "a.log") == 1);
  CHECK(contains(slurp(tmp / "a.log"), "--strict-lambada applies to --task LAMBADA, not WIKITEXT2"));
  // A whitespace-only LAMBADA passage, strict or not.
  std::ofstream(tmp / "l.jsonl") << "{\"text\": \"the cat sat on the mat\"}\n{\"text\": \"   \"}\n";
  for (const char* strict : {"", " --strict-lambada"}) {
    CHECK(run_app("evaluate", "--task LAMBADA --valid-data " + tmp / "l.jsonl" + " --load " + ckpt + strict,
                  tmp / "b.log") == 1);
    CHECK(contains(slurp(tmp / "b.log"), "l.jsonl:2: the passage has no word to predict (whitespace only)"));
  }
  // generate_text --top_k with --top_p (the server refuses the pair too), and --seed -1.
  CHECK(run_app("generate_text", "--load " + ckpt + " --num-samples 1 --top_k 5 --top_p 0.5", tmp / "c.log") == 1);
  CHECK(contains(slurp(tmp / "c.log"), "top_k 5 and top_p 0.5 are both set"));
  CHECK(run_app("generate_text", "--load " + ckpt + " --num-samples 1 --seed -1", tmp / "d.log") == 1);
  CHECK(contains(slurp(tmp / "d.log"), "--seed must be a non-negative integer, got -1"));
  CHECK(run_app("pretrain_gpt", "--seed -5 --train-iters 1", tmp / "e.log") == 1);
  CHECK(contains(slurp(tmp / "e.log"), "--seed must be a non-negative integer, got -5"));
}

TEST_CASE("class 8: a FIFO where a file is expected is refused at once, not read for ever") {
  TempDir tmp("hostile_fifo");
  REQUIRE(mkfifo((tmp / "model.safetensors").c_str(), 0644) == 0);
  const int rc = in_child(20, [&] {
    const std::string e = error_of([&] { io::read_safetensors(tmp / "model.safetensors"); });
    return contains(e, "is a FIFO (named pipe), not a regular file") ? 0 : 3;
  });
  CHECK(rc == 0);
  // The converter, with the FIFO as the shard of a model directory.
  fs::copy_file(kRef + "gpt2_tiny_config.json", tmp / "config.json");
  CHECK(in_child(60, [&] {
          return run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + tmp.path.string() + " --output " +
                                                   tmp / "out", tmp / "c.log");
        }) == 1);
  CHECK(contains(slurp(tmp / "c.log"), "is a FIFO"));
}
