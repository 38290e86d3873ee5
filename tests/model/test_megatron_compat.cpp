// Megatron-LM / Megatron-DeepSpeed flags: no-op switches accepted with a note,
// repeated flags (last wins), DeepSpeed JSON mapped onto the options with
// conflicts named, recompute flags, per-split data paths, mock data and the
// index-cache directory.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/training/gpt_data.h"
#include "model/flags/megatron_compat.h"
#include "model/training/trainer.h"
#include "tests/model/model_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> model_flags() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "24",
          "--micro-batch-size", "2", "--train-iters", "6", "--lr", "3e-3", "--log-interval", "1",
          "--eval-interval", "3", "--eval-iters", "1", "--seed", "5", "--device", "cpu"};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TrainArgs parse(std::vector<std::string> flags, int world = 1) {
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& f : flags) argv.push_back(f.data());
  TrainArgs a;
  a.world_size = world;
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  return a;
}

std::string error_of(std::vector<std::string> flags, int world = 1) {
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& f : flags) argv.push_back(f.data());
  try {
    TrainArgs a;
    a.world_size = world;
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has_note(const TrainArgs& a, const std::string& needle) {
  for (const auto& n : a.startup_notes)
    if (n.find(needle) != std::string::npos) return true;
  return false;
}

std::string write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST_CASE("every no-op flag Megatron scripts pass is accepted and says what mpitron does instead") {
  std::vector<std::string> flags = with(model_flags(), {"--mock-data"});
  for (const NoOpFlag& f : megatron_noop_flags()) {
    flags.push_back(std::string("--") + f.name);
    const std::string v = f.values;
    if (v == "*") flags.push_back("2");
    else if (!v.empty()) flags.push_back(v.substr(0, v.find('|')));
  }
  const TrainArgs a = parse(flags);
  for (const NoOpFlag& f : megatron_noop_flags()) {
    CAPTURE(f.name);
    CHECK(has_note(a, std::string("--") + f.name + ": "));
  }
  // A value the sentence is not true for is rejected naming the flag.
  CHECK(error_of(with(model_flags(), {"--mock-data", "--data-impl", "lazy"})).find("--data-impl lazy is not supported") !=
        std::string::npos);
  CHECK(error_of(with(model_flags(), {"--mock-data", "--transformer-impl", "te"})).find("--transformer-impl te") !=
        std::string::npos);
  // Flags mpitron does not know are still rejected by name.
  CHECK(error_of(with(model_flags(), {"--mock-data", "--no-such-flag"})).find("no-such-flag") != std::string::npos);
}

TEST_CASE("a repeated flag: the last value wins, as with argparse; --data-path still composes") {
  const TrainArgs a = parse(with(model_flags(), {"--mock-data", "--lr", "1e-2", "--lr", "2e-4", "--seed", "9"}));
  CHECK(a.lr == doctest::Approx(2e-4));
  CHECK(a.seed == 9);
  // Python ints as Megatron scripts write them.
  const TrainArgs u = parse(with(model_flags(), {"--mock-data", "--lr-decay-iters", "1_000", "--seed", "12_345"}));
  CHECK(u.lr_decay_iters == 1000);
  CHECK(u.seed == 12345);
  CHECK(parse(with(model_flags(), {"--mock-data", "--optimizer", "sgd"})).optim.optimizer == "sgd");  // issue 44
  CHECK(error_of(with(model_flags(), {"--mock-data", "--optimizer", "lion"})).find("--optimizer lion") !=
        std::string::npos);
  const TrainArgs b = parse(with(model_flags(), {"--data-path", "0.5", "a", "--data-path", "0.5", "b"}));
  CHECK(b.data_path == std::vector<std::string>{"0.5", "a", "0.5", "b"});
}

TEST_CASE("DeepSpeed JSON (BigScience style) maps onto the options; conflicts and unsupported keys are errors") {
  const fs::path dir = testing::fresh_temp_dir("ds_config");
  const std::string ds = write_file(dir / "ds.json", R"({
    "train_micro_batch_size_per_gpu": 2,
    "train_batch_size": 8,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 1},
    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
             "min_loss_scale": 1, "initial_scale_power": 12},
    "steps_per_print": 2000,
    "wall_clock_breakdown": false
  })");
  const auto base = with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", ds});
  const TrainArgs a = parse(base, 2);
  CHECK(a.micro_batch_size == 2);
  CHECK(a.global_batch_size == 8);
  CHECK(a.optim.clip_grad == doctest::Approx(0.5));
  CHECK(a.zero_stage == 1);
  CHECK(a.fp16);
  CHECK(a.scaler.initial_scale == doctest::Approx(4096));
  CHECK(a.scaler.window == 500);
  CHECK(a.scaler.hysteresis == 2);
  CHECK(a.scaler.min_scale == doctest::Approx(1));
  CHECK(a.scaler.constant == 0);  // loss_scale 0: dynamic
  CHECK(has_note(a, "steps_per_print"));
  // The same value on the command line is fine; another one names both.
  CHECK(parse(with(base, {"--zero-stage", "1", "--fp16"}), 2).zero_stage == 1);
  const std::string conflict = error_of(with(base, {"--clip-grad", "1.0"}), 2);
  CHECK(conflict.find("gradient_clipping") != std::string::npos);
  CHECK(conflict.find("--clip-grad") != std::string::npos);
  CHECK(error_of(with(base, {"--bf16"}), 2).find("--bf16") != std::string::npos);
  CHECK(error_of(with(base, {"--loss-scale", "12"}), 2).find("fp16.loss_scale = 0 (dynamic)") != std::string::npos);
  // gradient_accumulation_steps must agree with the batch sizes and dp.
  const std::string ga = write_file(dir / "ga.json", R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 3})");
  CHECK(parse(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", ga}), 2).global_batch_size == 12);
  const std::string ga_bad = write_file(dir / "ga_bad.json", R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 3, "train_batch_size": 8})");
  CHECK(error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", ga_bad}), 2)
            .find("gradient_accumulation_steps 3") != std::string::npos);
  // Keys mpitron cannot honour are listed together.
  const std::string unk = write_file(dir / "unk.json", R"({"optimizer": {"type": "Lamb"},
      "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, "fp16": {"enabled": true, "auto_cast": true}})");
  const std::string e = error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", unk}));
  CHECK(e.find("optimizer.type \"Lamb\"") != std::string::npos);
  CHECK(e.find("zero_optimization.offload_param") != std::string::npos);
  CHECK(e.find("fp16.auto_cast") != std::string::npos);
  // The optimizer block: its type and the params that have flags.
  const std::string sgd = write_file(dir / "sgd.json", R"({"optimizer": {"type": "SGD",
      "params": {"lr": 0.003, "momentum": 0.8, "weight_decay": 0.001}}})");
  const TrainArgs as = parse(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", sgd}));
  CHECK(as.optim.optimizer == "sgd");
  CHECK(as.optim.sgd_momentum == doctest::Approx(0.8));
  CHECK(as.optim.weight_decay == doctest::Approx(0.001));
  CHECK(as.lr == doctest::Approx(0.003));  // the same as model_flags' --lr: agreeing is fine
  const std::string mix = error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", sgd,
                                                        "--optimizer", "adam"}));
  CHECK(mix.find("optimizer.type") != std::string::npos);
  CHECK(mix.find("--optimizer adam") != std::string::npos);
  const std::string adamw = write_file(dir / "adamw.json", R"({"optimizer": {"type": "AdamW",
      "params": {"betas": [0.9, 0.95], "eps": 1e-6, "adam_w_mode": true}}})");
  const TrainArgs aa = parse(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", adamw}));
  CHECK(aa.optim.optimizer == "adam");
  CHECK(aa.optim.beta2 == doctest::Approx(0.95));
  CHECK(aa.optim.eps == doctest::Approx(1e-6));
  const std::string l2 = write_file(dir / "l2.json", R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  CHECK(error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", l2}))
            .find("optimizer.params.adam_w_mode false") != std::string::npos);
  // Stage 3 and its keys (tests/model/test_trainer_zero3.cpp trains with them).
  const std::string z3 = write_file(dir / "z3.json", R"({"zero_optimization": {"stage": 3,
      "stage3_param_persistence_threshold": 10, "offload_optimizer": {"device": "cpu"}}})");
  const TrainArgs a3 = parse(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", z3}), 2);
  CHECK(a3.zero_stage == 3);
  CHECK(a3.zero3.persistence_threshold == 10);
  CHECK(a3.optim.cpu_offload);
  const std::string z2p = write_file(dir / "z2p.json", R"({"zero_optimization": {"stage": 2,
      "stage3_prefetch_bucket_size": 0}})");
  CHECK(error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", z2p}), 2)
            .find("stage3_prefetch_bucket_size but not stage 3") != std::string::npos);
  CHECK(error_of(with(model_flags(), {"--mock-data", "--deepspeed"})).find("--deepspeed needs --deepspeed_config") !=
        std::string::npos);
  CHECK(error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", (dir / "nope.json").string()}))
            .find("cannot open") != std::string::npos);
  const std::string broken = write_file(dir / "broken.json", "{\"train_batch_size\": ");
  CHECK(error_of(with(model_flags(), {"--mock-data", "--deepspeed", "--deepspeed_config", broken}))
            .find("not valid JSON") != std::string::npos);
}

TEST_CASE("recompute flags: Megatron's granularity and method names") {
  const auto base = with(model_flags(), {"--mock-data"});
  CHECK(parse(with(base, {"--checkpoint-activations"})).recompute_activations);
  CHECK(parse(with(base, {"--recompute-granularity", "full"})).recompute_activations);
  const TrainArgs sel = parse(with(base, {"--recompute-granularity", "selective"}));
  CHECK_FALSE(sel.recompute_activations);
  CHECK(has_note(sel, "selective"));
  const TrainArgs blk = parse(with(base, {"--recompute-granularity", "full", "--recompute-method", "block",
                                          "--recompute-num-layers", "1"}));
  CHECK(blk.recompute_activations);
  CHECK(blk.recompute_num_layers == 1);
  CHECK(parse(with(base, {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers",
                          "1"})).recompute_num_layers == 0);
  CHECK(error_of(with(base, {"--recompute-granularity", "full", "--recompute-method", "uniform",
                             "--recompute-num-layers", "2"})).find("--recompute-num-layers 2") != std::string::npos);
  CHECK(error_of(with(base, {"--recompute-method", "block"})).find("apply to full recompute") != std::string::npos);
  CHECK(error_of(with(base, {"--recompute-granularity", "some"})).find("--recompute-granularity some") !=
        std::string::npos);
}

TEST_CASE("recompute of the first N blocks (--recompute-method block) trains to the same losses as none") {
  const fs::path dir = testing::fresh_temp_dir("recompute_block");
  const std::string data = testing::write_toy_dataset(dir, 3, 200);
  const auto base = with(model_flags(), {"--data-path", data, "--split", "90,10,0", "--hidden-dropout", "0.1"});
  auto run = [](const TrainArgs& a) { return Trainer(a, make_gpt_data(a, 50257)).run().losses; };
  const auto plain = run(parse(base));
  const auto block = run(parse(with(base, {"--recompute-granularity", "full", "--recompute-method", "block",
                                           "--recompute-num-layers", "1"})));
  REQUIRE(plain.size() == block.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(block[i] == doctest::Approx(plain[i]).epsilon(1e-6));
}

TEST_CASE("--train-data-path/--valid-data-path, --mock-data and --data-cache-path") {
  const fs::path dir = testing::fresh_temp_dir("split_paths");
  fs::create_directories(dir / "train");
  fs::create_directories(dir / "valid");
  const std::string train = testing::write_toy_dataset(dir / "train", 11, 150);
  const std::string valid = testing::write_toy_dataset(dir / "valid", 12, 40);
  const fs::path cache = dir / "cache";
  // The data directories are read-only: the index caches must go to --data-cache-path.
  ::chmod((dir / "train").c_str(), 0555);
  ::chmod((dir / "valid").c_str(), 0555);
  const TrainArgs a = parse(with(model_flags(), {"--train-data-path", train, "--valid-data-path", valid,
                                                 "--data-cache-path", cache.string()}));
  auto src = make_gpt_data(a, 50257);
  CHECK(src->num_samples(0) >= 6 * 2);
  CHECK(src->num_samples(1) > 0);
  CHECK(src->num_samples(2) == 0);  // no --test-data-path
  size_t cached = 0;
  for (const auto& e : fs::directory_iterator(cache)) cached += e.is_regular_file();
  CHECK(cached > 0);
  // The validation samples come from the validation files (seed 12), not from a cut of the training ones.
  const TrainSummary s = Trainer(a, src).run();
  CHECK(s.valid_loss > 0);
  ::chmod((dir / "train").c_str(), 0755);
  ::chmod((dir / "valid").c_str(), 0755);

  CHECK(error_of(with(model_flags(), {"--train-data-path", train, "--data-path", train})).find("give one of") !=
        std::string::npos);
  CHECK(error_of(with(model_flags(), {"--valid-data-path", valid})).find("need --train-data-path") != std::string::npos);
  CHECK(error_of(with(model_flags(), {"--train-data-path", train, "--split", "1,1,1"})).find("--split") !=
        std::string::npos);
  CHECK(error_of(model_flags()).find("--data-path is required") != std::string::npos);

  // Mock data: reproducible, a learnable count-up with end-of-document tokens, and the loss falls.
  const TrainArgs m = parse(with(model_flags(), {"--mock-data", "--train-iters", "30", "--eval-interval", "100"}));
  auto mock = make_gpt_data(m, 50257);
  std::vector<int32_t> x(25), y(25);
  mock->sample(0, 3, x.data());
  mock->sample(0, 3, y.data());
  CHECK(x == y);
  int eods = 0, steps = 0;
  for (size_t k = 1; k < x.size(); ++k) {
    eods += x[k] == 50256;
    steps += x[k] == x[k - 1] + 1;
  }
  CHECK(steps + 2 * eods >= 23);
  const auto losses = Trainer(m, mock).run().losses;
  CHECK(losses.back() < losses.front() - 1.0);
}

TEST_CASE("--use-distributed-optimizer with one data-parallel rank trains exactly like the plain optimizer") {
  const fs::path dir = testing::fresh_temp_dir("zero_dp1");
  const std::string data = testing::write_toy_dataset(dir, 4, 150);
  const auto base = with(model_flags(), {"--data-path", data, "--split", "90,10,0"});
  auto run = [](const TrainArgs& a) { return Trainer(a, make_gpt_data(a, 50257)).run().losses; };
  const auto plain = run(parse(base));
  const TrainArgs z = parse(with(base, {"--use-distributed-optimizer"}));
  CHECK(has_note(z, "nothing to shard"));
  CHECK(run(z) == plain);
}

TEST_CASE("--use-checkpoint-args takes the model flags from --load; a given flag that disagrees is named") {
  const fs::path dir = testing::fresh_temp_dir("ckpt_args");
  const std::string data = testing::write_toy_dataset(dir, 6, 150);
  const std::string ckpt = (dir / "ckpt").string();
  const auto data_flags = std::vector<std::string>{"--data-path", data, "--split", "90,10,0"};
  {
    const TrainArgs a = parse(with(with(model_flags(), data_flags), {"--ffn-hidden-size", "48", "--save", ckpt}));
    Trainer(a, make_gpt_data(a, 50257)).run();
  }
  const std::vector<std::string> no_model = {"--micro-batch-size", "2", "--train-iters", "8", "--lr", "3e-3",
                                             "--eval-iters", "0", "--device", "cpu", "--load", ckpt};
  const TrainArgs a = parse(with(with(no_model, data_flags), {"--use-checkpoint-args"}));
  CHECK(a.model.num_layers == 2);
  CHECK(a.model.hidden_size == 32);
  CHECK(a.model.num_attention_heads == 2);
  CHECK(a.model.seq_length == 24);
  CHECK(a.model.ffn() == 48);
  const std::string e = error_of(with(with(no_model, data_flags), {"--use-checkpoint-args", "--hidden-size", "64",
                                                                    "--num-layers", "2"}));
  CHECK(e.find("--hidden-size 64 (checkpoint: 32)") != std::string::npos);
  CHECK(e.find("--num-layers") == std::string::npos);  // it agrees
  // A flag that does not change the weights wins, as in Megatron: fine-tuning at a shorter
  // --seq-length than the checkpoint's positions; past them it is refused.
  // (--train-iters 8 after 6 moves the decay's end: Megatron's --override-opt_param-scheduler.)
  const TrainArgs shorter = parse(with(with(no_model, data_flags), {"--use-checkpoint-args", "--seq-length", "12",
                                                                     "--override-opt_param-scheduler"}));
  CHECK(shorter.model.seq_length == 12);
  CHECK(shorter.model.max_position_embeddings == 24);
  CHECK(shorter.model.ffn() == 48);
  Trainer(shorter, make_gpt_data(shorter, 50257)).run();
  CHECK(error_of(with(with(no_model, data_flags), {"--use-checkpoint-args", "--seq-length", "48"}))
            .find("--max-position-embeddings") != std::string::npos);
  CHECK(error_of(with(no_model, data_flags)).find("'--num-layers' is required") != std::string::npos);
  CHECK(error_of(with(with(model_flags(), data_flags), {"--use-checkpoint-args"})).find("needs --load") !=
        std::string::npos);
}

TEST_CASE("--log-params-norm, --log-num-zeros-in-grad and --log-timers-to-tensorboard reach TensorBoard") {
  const fs::path dir = testing::fresh_temp_dir("log_extras");
  const std::string data = testing::write_toy_dataset(dir, 8, 150);
  const std::string tb = (dir / "tb").string();
  const TrainArgs a = parse(with(model_flags(), {"--data-path", data, "--split", "90,10,0", "--tensorboard-dir", tb,
                                                 "--log-params-norm", "--log-num-zeros-in-grad",
                                                 "--log-timers-to-tensorboard"}));
  Trainer t(a, make_gpt_data(a, 50257));
  t.run();
  // The weights' norm after the last step, computed here in double.
  double sq = 0;
  for (float w : t.model().params().values().to_floats()) sq += static_cast<double>(w) * w;
  const std::string cmd = "/usr/bin/python3 -c \"import sys\n"
                          "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E\n"
                          "a=E(sys.argv[1],size_guidance={'scalars':0}); a.Reload(); t=a.Tags()['scalars']\n"
                          "need=['params-norm','num-zeros','forward-backward-time','optimizer-time','iteration-time']\n"
                          "assert all(n in t for n in need), t\n"
                          "print(a.Scalars('params-norm')[-1].value, a.Scalars('num-zeros')[-1].value,"
                          " a.Scalars('optimizer-time')[-1].value)\" " + tb + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
  const int rc = ::pclose(p);
  const std::string out(buf, n);
  if (WEXITSTATUS(rc) == 1 && out.find("No module named 'tensorboard'") != std::string::npos) {
    MESSAGE("SKIPPED: tensorboard is not importable");
    return;
  }
  REQUIRE_MESSAGE(rc == 0, out);
  double norm = 0, zeros = -1, optim_ms = -1;
  REQUIRE(std::sscanf(out.c_str(), "%lf %lf %lf", &norm, &zeros, &optim_ms) == 3);
  CHECK(norm == doctest::Approx(std::sqrt(sq)).epsilon(1e-5));
  // The gradients of the last step are still in the buffer: count their zeros here.
  int64_t want_zeros = 0;
  for (float g : t.model().params().grads().to_floats()) want_zeros += g == 0.0f;
  CHECK(zeros == static_cast<double>(want_zeros));
  CHECK(optim_ms > 0);
}

TEST_CASE("TensorBoard tags: Megatron-LM's by default, Megatron-DeepSpeed's with --deepspeed") {
  const fs::path dir = testing::fresh_temp_dir("tb_tags");
  const std::string ds = write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10})");
  auto tags_of = [&](const std::string& tb, std::vector<std::string> extra) {
    auto flags = with(model_flags(), {"--mock-data", "--tensorboard-dir", tb});
    flags.insert(flags.end(), extra.begin(), extra.end());
    const TrainArgs a = parse(flags);
    Trainer(a, make_gpt_data(a, 50257)).run();
    const std::string cmd = "/usr/bin/python3 -c \"import sys\n"
                            "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E\n"
                            "a=E(sys.argv[1]); a.Reload(); print('|'.join(sorted(a.Tags()['scalars'])))\" " + tb + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[8192] = {0};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
    ::pclose(p);
    return std::string(buf, n);
  };
  const std::string lm = tags_of((dir / "lm").string(), {});
  if (lm.find("No module named") != std::string::npos) {
    MESSAGE("SKIPPED: tensorboard is not importable");
    return;
  }
  for (const char* t : {"|lm loss|", "|lm loss vs samples|", "|learning-rate|", "|grad-norm|", "|lm loss validation|",
                        "|lm loss validation ppl|"})
    CHECK_MESSAGE(("|" + lm).find(t) != std::string::npos, t, " in ", lm);
  const std::string dsp = tags_of((dir / "ds").string(), {"--deepspeed", "--deepspeed_config", ds});
  for (const char* t : {"|lm-loss-training/lm loss|", "|learning-rate/learning-rate|", "|grad-norm/grad-norm|",
                        "|lm-loss-validation/lm loss validation|"})
    CHECK_MESSAGE(("|" + dsp).find(t) != std::string::npos, t, " in ", dsp);
}
