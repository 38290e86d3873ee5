// Bad inputs to the apps (issue #18): each is a clear error (exit code != 0
// and a message naming the flag or file) or a correct result; no crash, no hang.
//   preprocess_data: a directory as --input, --chunk-mb 0 / -1 / nan, one 50 MB
//     line read in 1 KB chunks (linear), empty or truncated vocab/merges files;
//   generate_text: no input mode, --num-samples -3, --out-seq-length beyond the context;
//   pretrain_gpt: numeric flags, and resuming past --train-iters says so.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "apps_test_util.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
using apps_test::run_app;
using apps_test::slurp;
using apps_test::TempDir;

namespace {

const std::string kVocab = apps_test::kSource + "/assets/gpt2/gpt2-vocab.json";
const std::string kMerges = apps_test::kSource + "/assets/gpt2/gpt2-merges.txt";

// Runs the app; checks it failed with exit code `rc` and a message containing `needle`.
void fails_with(const std::string& app, const std::string& args, const std::string& needle, const TempDir& tmp,
                int rc = 1) {
  const std::string log = tmp / "log.txt";
  const int got = run_app(app, args, log);
  const std::string out = slurp(log);
  CHECK_MESSAGE(got == rc, app, " ", args, " -> exit ", got, ": ", out);
  CHECK_MESSAGE(out.find(needle) != std::string::npos, app, " ", args, " -> ", out);
}

}  // namespace

TEST_CASE("preprocess_data: a directory, bad --chunk-mb, empty or truncated tokenizer files are refused") {
  TempDir tmp("robust_pre");
  std::ofstream(tmp / "in.jsonl") << "{\"text\": \"hello world\"}\n";
  const std::string out = " --output-prefix " + tmp / "out";
  fails_with("preprocess_data", "--input " + tmp.path.string() + out, "is a directory", tmp);
  for (const char* bad : {"0", "-1", "nan", "inf", "1e9"})
    fails_with("preprocess_data", "--input " + tmp / "in.jsonl" + out + " --chunk-mb " + bad, "--chunk-mb", tmp);
  fails_with("preprocess_data", "--input " + tmp / "in.jsonl" + out + " --log-interval -1", "--log-interval", tmp);
  // Tokenizer files: empty vocab, empty merges, a merges file cut in half.
  std::ofstream(tmp / "empty.txt").close();
  fails_with("preprocess_data", "--input " + tmp / "in.jsonl" + out + " --vocab-file " + tmp / "empty.txt",
             "empty.txt", tmp);
  fails_with("preprocess_data", "--input " + tmp / "in.jsonl" + out + " --merge-file " + tmp / "empty.txt",
             "0 merges", tmp);
  const std::string merges = slurp(kMerges);
  std::ofstream(tmp / "half-merges.txt") << merges.substr(0, merges.rfind('\n', merges.size() / 2) + 1);
  fails_with("preprocess_data", "--input " + tmp / "in.jsonl" + out + " --merge-file " + tmp / "half-merges.txt",
             "truncated", tmp);
  // The real pair is fine.
  CHECK(run_app("preprocess_data", "--input " + tmp / "in.jsonl" + out, tmp / "ok.log") == 0);
}

TEST_CASE("preprocess_data: one 50 MB line in 1 KB chunks is read in linear time") {
  TempDir tmp("robust_longline");
  {
    std::ofstream f(tmp / "long.jsonl");
    f << "{\"text\": \"short one\"}\n{\"other\": \"" << std::string(50u << 20, 'a') << "\", \"text\": \"tail\"}\n"
      << "{\"text\": \"after\"}\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run_app("preprocess_data", "--input " + tmp / "long.jsonl" + " --output-prefix " + tmp / "out" +
                                                " --chunk-mb 0.001",
                         tmp / "log.txt");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("50 MB line with --chunk-mb 0.001: ", secs, " s");
  // Linear: ~2 s on a loaded 2-core VM. The old quadratic rescan of the growing
  // buffer (50 K reads x 25 MB average) takes minutes: a generous bound tells them apart.
  CHECK(secs < 60);
  REQUIRE_MESSAGE(rc == 0, slurp(tmp / "log.txt"));
  CHECK(slurp(tmp / "log.txt").find("done: 3 documents") != std::string::npos);
}

TEST_CASE("generate_text: an input mode is required; --num-samples and --out-seq-length are checked") {
  TempDir tmp("robust_gen");
  const std::string ref = apps_test::kSource + "/tests/apps/ref/";
  {
    const io::Safetensors st = io::read_safetensors(ref + "gpt2_tiny.safetensors");
    auto model = gpt_from_hf(st, hf_file_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
    save_model_checkpoint(tmp / "ckpt", *model, "test");
  }
  const std::string load = "--load " + tmp / "ckpt";
  fails_with("generate_text", load + " < /dev/null", "needs an input mode", tmp);
  fails_with("generate_text", load + " --num-samples -3", "--num-samples must be >= 1", tmp);
  fails_with("generate_text", load + " --num-samples 0", "--num-samples must be >= 1", tmp);
  fails_with("generate_text", load + " --num-samples 1 --interactive", "exclude each other", tmp);
  fails_with("generate_text", load + " --num-samples 1 --out-seq-length 100000", "exceeds the model's context", tmp);
  // Within the context: one sample of exactly 3 new tokens (or fewer at <|endoftext|>).
  const std::string log = tmp / "ok.log";
  REQUIRE_MESSAGE(run_app("generate_text", load + " --num-samples 1 --out-seq-length 3 --greedy --genfile " +
                                               tmp / "gen.jsonl", log) == 0, slurp(log));
  CHECK(slurp(tmp / "gen.jsonl").find("\"tokens\"") != std::string::npos);
  // Prompts from stdin with --interactive (a pipe: one per line).
  REQUIRE_MESSAGE(run_app("generate_text", load + " --interactive --out-seq-length 2 --greedy < " + tmp / "gen.jsonl",
                          log) == 0, slurp(log));
}

TEST_CASE("evaluate, convert_checkpoint and text_generation_server: numeric flags") {
  TempDir tmp("robust_eval");
  fails_with("evaluate", "--task LAMBADA --valid-data x --load y --seq-length 0", "--seq-length must be >= 1", tmp);
  fails_with("evaluate", "--task LAMBADA --valid-data x --load y --overlapping-eval -1", "--overlapping-eval", tmp);
  fails_with("text_generation_server", "--load y --max-requests -1", "--max-requests", tmp);
  fails_with("text_generation_server", "--load y --port 70000", "--port", tmp);
  fails_with("convert_checkpoint", "--direction hf-to-mpitron --input x --output y --num-attention-heads 0",
             "--num-attention-heads must be >= 1", tmp);
  fails_with("convert_checkpoint", "--direction hf-to-mpitron --input x --output y --make-vocab-size-divisible-by 0",
             "--make-vocab-size-divisible-by", tmp);
}

TEST_CASE("pretrain_gpt: numeric flags refused with exit 1; resuming past --train-iters says so") {
  TempDir tmp("robust_pretrain");
  {
    std::ofstream f(tmp / "in.jsonl");
    for (int i = 0; i < 200; ++i) f << "{\"text\": \"line " << i << " of a tiny corpus, repeated to fill samples\"}\n";
  }
  REQUIRE(run_app("preprocess_data", "--input " + tmp / "in.jsonl" + " --output-prefix " + tmp / "c --append-eod",
                  tmp / "pre.log") == 0);
  const std::string common = " --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "
                             "--eval-iters 0 --log-interval 1 --device cpu --data-path " + tmp / "c_text_document";
  const std::string base = "--num-layers 1 --lr 1e-3" + common;
  fails_with("pretrain_gpt", "--num-layers 1 --train-iters 2 --lr inf" + common, "--lr must be a finite number", tmp);
  fails_with("pretrain_gpt", base + " --train-iters 2 --fp16 --initial-loss-scale 0", "--initial-loss-scale", tmp);
  fails_with("pretrain_gpt", base + " --train-iters 2 --split 90,-5,15", "--split", tmp);
  fails_with("pretrain_gpt", "--lr 1e-3 --train-iters 2 --num-layers 99999999999" + common, "--num-layers must be in [1, 65536]",
             tmp);
  fails_with("pretrain_gpt", "--lr 1e-3 --train-iters 2 --num-layers 65536" + common + " --hidden-size 4096 --num-attention-heads 32",
             "cannot fit", tmp);
  // A run length whose sample index alone cannot fit: refused before building it.
  fails_with("pretrain_gpt", base + " --train-iters 1000000000000 --global-batch-size 1000000", "indices need", tmp);
  // A diverging run exits 1 naming the iteration, and leaves no checkpoint (issue: it exited 0 with a NaN one).
  fails_with("pretrain_gpt", "--num-layers 1 --train-iters 30 --lr 1e6" + common + " --save " + tmp / "diverged",
             "not finite", tmp);
  CHECK(!std::filesystem::exists(tmp / "diverged/latest_checkpointed_iteration.txt"));
  // The fp16 case as given: the scale falls from 2^32 to its minimum, then the run stops (exit 1).
  fails_with("pretrain_gpt", base + " --train-iters 200 --fp16 --init-method-std 100 --save " + tmp / "fp16",
             "at the minimum loss scale 1", tmp);
  CHECK(!std::filesystem::exists(tmp / "fp16/latest_checkpointed_iteration.txt"));
  const std::string save = " --save " + tmp / "ckpt";
  REQUIRE(run_app("pretrain_gpt", base + " --train-iters 3" + save, tmp / "a.log") == 0);
  const std::string log = tmp / "b.log";
  REQUIRE(run_app("pretrain_gpt", base + " --train-iters 2 --load " + tmp / "ckpt" + save, log) == 0);
  const std::string out = slurp(log);
  CHECK_MESSAGE(out.find("nothing to train") != std::string::npos, out);
  CHECK_MESSAGE(out.find("done: nothing trained") != std::string::npos, out);
  CHECK_MESSAGE(out.find("train loss 0 -> 0") == std::string::npos, out);
}
