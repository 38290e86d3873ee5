// Every numeric flag of pretrain_gpt validated (issue #18): floats finite and
// in range, 0 meaning 0 or rejected (never "not set"), --split weights finite
// and >= 0, integer overflow and impossible sizes refused before anything is
// allocated (the memory check, with the numbers).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/training/trainer.h"

using namespace mpitron;

namespace {

std::vector<std::string> base() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "24",
          "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3", "--data-path", "unused"};
}

// The parse error's message, or "" when the flags parse.
std::string parse_error(std::vector<std::string> extra, TrainArgs* out = nullptr) {
  // base() with the flags of `extra` replaced (boost refuses a flag given twice).
  const std::vector<std::string> b = base();
  std::vector<std::string> flags;
  for (size_t i = 0; i < b.size(); i += 2)
    if (std::find(extra.begin(), extra.end(), b[i]) == extra.end()) flags.insert(flags.end(), {b[i], b[i + 1]});
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& f : flags) argv.push_back(f.data());
  try {
    TrainArgs a;
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
    if (out) *out = a;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void rejected(std::vector<std::string> extra, const std::string& needle) {
  const std::string m = parse_error(extra);
  std::string flags;
  for (const auto& f : extra) flags += f + " ";
  CHECK_MESSAGE(!m.empty(), flags, "was accepted");
  CHECK_MESSAGE(m.find(needle) != std::string::npos, flags, "-> ", m);
}

struct NoData final : SampleSource {
  int64_t num_samples(int) const override { return 1000; }
  void sample(int, int64_t, int32_t* t) const override { t[0] = 0; }
};

}  // namespace

TEST_CASE("float flags: nan, inf and out-of-range values are rejected naming the flag") {
  rejected({"--lr", "inf"}, "--lr must be a finite number");
  rejected({"--lr", "nan"}, "--lr must be a finite number");
  rejected({"--lr", "-1e-3"}, "--lr");
  rejected({"--clip-grad", "nan"}, "--clip-grad must be a finite number");
  rejected({"--adam-beta1", "1.5"}, "--adam-beta1 must be a finite number in [0, 1)");
  rejected({"--adam-beta2", "1"}, "--adam-beta2");
  rejected({"--adam-eps", "-1"}, "--adam-eps");
  rejected({"--adam-eps", "0"}, "--adam-eps");
  rejected({"--weight-decay", "-1"}, "--weight-decay");
  rejected({"--layernorm-epsilon", "-1"}, "--layernorm-epsilon");
  rejected({"--init-method-std", "inf"}, "--init-method-std");
  rejected({"--hidden-dropout", "nan"}, "--hidden-dropout");
  rejected({"--min-lr", "1"}, "--min-lr");
  rejected({"--lr-warmup-fraction", "nan"}, "--lr-warmup-fraction");
  rejected({"--fp16", "--loss-scale", "-8"}, "--loss-scale");
  rejected({"--fp16", "--loss-scale", "0"}, "--loss-scale");
  rejected({"--fp16", "--initial-loss-scale", "0"}, "--initial-loss-scale");
  rejected({"--fp16", "--initial-loss-scale", "inf"}, "--initial-loss-scale");
  rejected({"--fp16", "--min-loss-scale", "0"}, "--min-loss-scale");
  rejected({"--fp16", "--hysteresis", "0"}, "--hysteresis");
  rejected({"--fp16", "--loss-scale-window", "0"}, "--loss-scale-window");
  rejected({"--exit-duration-in-mins", "nan"}, "--exit-duration-in-mins");
  rejected({"--skip-spike-zscore", "0"}, "--skip-spike-zscore");
  rejected({"--skip-spike-zscore", "inf"}, "--skip-spike-zscore");
  // In range: accepted, and the values arrive.
  TrainArgs a;
  CHECK(parse_error({"--lr", "0", "--clip-grad", "0", "--weight-decay", "0", "--adam-beta1", "0"}, &a) == "");
  CHECK(a.lr == 0.0f);
  CHECK(a.optim.clip_grad == 0.0f);
}

TEST_CASE("0 means 0 or is rejected, never 'not set'") {
  rejected({"--ffn-hidden-size", "0"}, "--ffn-hidden-size must be in [1,");
  rejected({"--global-batch-size", "0"}, "--global-batch-size must be in [1,");
  rejected({"--lr-decay-iters", "0"}, "--lr-decay-iters must be in [1,");
  rejected({"--save-interval", "0", "--save", "x"}, "--save-interval");
  rejected({"--exit-interval", "0"}, "--exit-interval");
  rejected({"--num-layers-per-virtual-pipeline-stage", "0"}, "--num-layers-per-virtual-pipeline-stage");
  rejected({"--micro-batch-size", "0"}, "--micro-batch-size");
  rejected({"--log-interval", "0"}, "--log-interval");
  rejected({"--tensor-model-parallel-size", "-1"}, "--tensor-model-parallel-size");
  rejected({"--rampup-batch-size", "2", "x", "100"}, "--rampup-batch-size");
  // 0 that means 0: no evaluation, no warmup, keep every checkpoint.
  CHECK(parse_error({"--eval-iters", "0", "--lr-warmup-iters", "0"}) == "");
}

TEST_CASE("--split: weights finite and >= 0; Megatron's spellings still parse") {
  rejected({"--split", "90,-5,15"}, "must be finite and >= 0");
  rejected({"--split", "nan,5,5"}, "--split");
  rejected({"--split", "inf,1,1"}, "--split");
  rejected({"--split", "90,,10"}, "--split");
  rejected({"--split", "1,2,3,4"}, "1 to 3 weights");
  rejected({"--split", "0,0,0"}, "sums to 0");
  for (const char* ok : {"969, 30, 1", "969,30,1", "98/2/0", "0.8 0.1 0.1", "100"})
    CHECK_MESSAGE(parse_error({"--split", ok}) == "", ok);
}

TEST_CASE("NaN-check and spike flags") {
  TrainArgs a;
  REQUIRE(parse_error({}, &a) == "");
  CHECK(a.check_for_nan);
  REQUIRE(parse_error({"--no-check-for-nan-in-loss-and-grad"}, &a) == "");
  CHECK(!a.check_for_nan);
  REQUIRE(parse_error({"--check-for-nan-in-loss-and-grad"}, &a) == "");
  CHECK(a.check_for_nan);
  rejected({"--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad"}, "both given");
  rejected({"--spike-rerun", "--save", "x"}, "--spike-rerun needs --skip-spike-zscore");
  rejected({"--spike-rerun", "--skip-spike-zscore", "4"}, "--save");
  rejected({"--skip-spike-zscore", "4", "--spike-window", "1"}, "--spike-window");
}

TEST_CASE("impossible sizes: integer overflow and models that cannot fit are refused before allocating") {
  rejected({"--micro-batch-size", "4611686018427387904"}, "--micro-batch-size");
  rejected({"--train-iters", "1000000000000", "--global-batch-size", "1000000000", "--micro-batch-size", "1"},
           "overflows");
  rejected({"--eval-iters", "1000000000000", "--global-batch-size", "100000000", "--micro-batch-size", "1",
            "--eval-interval", "1"}, "overflows");
  // --num-layers 65536 of width 4096 (the largest the architecture table takes): the memory check
  // refuses it with the numbers, before the model exists.
  TrainArgs a;
  REQUIRE(parse_error({"--num-layers", "65536", "--hidden-size", "4096", "--num-attention-heads", "32", "--device", "cpu"}, &a) == "");
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  try {
    Trainer t(a, std::make_shared<NoData>());
    FAIL("a 65536-layer model of width 4096 was accepted");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("cannot fit") != std::string::npos, m);
    CHECK_MESSAGE(m.find("GB") != std::string::npos, m);
  }
  // Also a model too wide for this machine.
  REQUIRE(parse_error({"--hidden-size", "1000000", "--num-attention-heads", "2", "--device", "cpu"}, &a) == "");
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  CHECK_THROWS_WITH_AS(Trainer(a, std::make_shared<NoData>()), doctest::Contains("cannot fit"), Error);
}

// Mixture of Experts (docs/model-families.md "Mixture of Experts"): what cannot be, and what is
// not built, refused naming the flags; the accepted spellings parse.
TEST_CASE("MoE flags: impossible and unbuilt combinations are refused by name") {
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> f = moe;
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  CHECK(parse_error(moe).empty());
  rejected({"--num-experts", "4", "--moe-router-topk", "5"}, "--moe-router-topk 5 must be in [1, --num-experts 4]");
  rejected({"--num-experts", "0"}, "--num-experts");
  rejected({"--moe-router-topk", "2"}, "--moe-router-topk is given without --num-experts");
  rejected({"--moe-aux-loss-coeff", "0.01"}, "--moe-aux-loss-coeff is given without --num-experts");
  rejected(with({"--expert-model-parallel-size", "3"}), "--expert-model-parallel-size 3 does not divide --num-experts 4");
  rejected(with({"--moe-token-dispatcher-type", "flex"}), "--moe-token-dispatcher-type flex is not supported");
  rejected(with({"--moe-router-pre-softmax", "--moe-router-score-function", "sigmoid"}), "--moe-router-pre-softmax");
  rejected(with({"--moe-router-score-function", "sinkhorn"}), "--moe-router-score-function sinkhorn is not known");
  rejected(with({"--moe-layer-freq", "[1,0,1]"}), "--moe-layer-freq gives a pattern of 3 layers for --num-layers 2");
  rejected(with({"--moe-layer-freq", "([1]*3+[0])*2"}), "--moe-layer-freq");
  rejected(with({"--moe-router-load-balancing-type", "sinkhorn"}), "--moe-router-load-balancing-type sinkhorn");
  rejected(with({"--moe-token-drop-policy", "position"}), "--moe-token-drop-policy without --moe-expert-capacity-factor");
  rejected(with({"--moe-expert-capacity-factor", "0"}), "--moe-expert-capacity-factor must be a finite number in (0");
  rejected(with({"--moe-pad-expert-input-to-capacity"}), "--moe-pad-expert-input-to-capacity");
  rejected(with({"--moe-router-enable-expert-bias"}), "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid");
  rejected(with({"--moe-router-bias-update-rate", "0.01"}), "--moe-router-bias-update-rate without --moe-router-enable-expert-bias");
  rejected(with({"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0"}),
           "--moe-router-bias-update-rate must be a finite number in (0");
  CHECK(parse_error(with({"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"})).empty());
  rejected(with({"--moe-shared-expert-gate"}), "--moe-shared-expert-gate without --moe-shared-expert-intermediate-size");
  rejected(with({"--moe-shared-expert-intermediate-size", "64"}), "--disable-bias-linear");
  rejected(with({"--context-parallel-size", "2"}), "--context-parallel-size");
  rejected(with({"--expert-tensor-parallel-size", "2"}), "--expert-tensor-parallel-size 2");
  TrainArgs a;
  CHECK(parse_error(with({"--moe-layer-freq", "[1, 0]", "--moe-expert-capacity-factor", "1.5", "--moe-token-drop-policy",
                          "position", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm",
                          "--moe-token-dispatcher-type", "alltoall"}),
                    &a)
            .empty());
  CHECK(a.model.is_moe_layer(0));
  CHECK(!a.model.is_moe_layer(1));
  CHECK(a.moe.capacity_factor == 1.5);
  CHECK(!a.moe.drop_by_probs);
  CHECK(a.moe.aux_loss_coeff == doctest::Approx(0.01));
}

TEST_CASE("DeepSeek-V3's flags: bad shapes and combinations are refused naming the flag") {
  const std::vector<std::string> mla = {"--multi-latent-attention", "--normalization", "RMSNorm", "--position-embedding-type",
                                        "rope", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
                                        "--v-head-dim", "8"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> f = mla;
    f.insert(f.end(), more.begin(), more.end());
    return f;
  };
  CHECK(parse_error(mla).empty());
  rejected(with({"--q-lora-rank", "64"}), "--q-lora-rank 64 is wider than --hidden-size 32");
  rejected(with({"--qk-pos-emb-head-dim", "3"}), "--qk-pos-emb-head-dim 3 must be even");
  rejected(with({"--group-query-attention", "--num-query-groups", "1"}), "--num-query-groups");
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-router-score-function",
                                        "sigmoid"};
  const auto moe_with = [&](std::vector<std::string> more) {
    std::vector<std::string> f = with(moe);
    f.insert(f.end(), more.begin(), more.end());
    return f;
  };
  CHECK(parse_error(moe_with({"--moe-router-num-groups", "2", "--moe-router-group-topk", "1"})).empty());
  rejected(moe_with({"--moe-router-num-groups", "3", "--moe-router-group-topk", "1"}),
           "--moe-router-num-groups 3 does not divide --num-experts 4");
  rejected(moe_with({"--moe-router-num-groups", "2", "--moe-router-group-topk", "3"}), "exceeds --moe-router-num-groups 2");
  rejected(moe_with({"--moe-router-num-groups", "2"}), "group-limited routing takes both");
  rejected(moe_with({"--moe-router-num-groups", "4", "--moe-router-group-topk", "1"}), "--moe-router-topk 2 is more than");
  rejected(with({"--mtp-num-layers", "-1"}), "--mtp-num-layers must be in [0");
  rejected(with({"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "nan"}), "--mtp-loss-scaling-factor");
  rejected({"--mtp-num-layers", "1"}, "learned absolute positions");
}
