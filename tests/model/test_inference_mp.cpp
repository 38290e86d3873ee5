// Model-parallel inference equals one process: the dynamic engine's greedy (and seeded
// sampled) tokens under TP2 and PP2 (2 ranks) and TP2×PP2, TP4, PP4 (4 ranks) are the
// one-process tokens, and evaluate's per-token losses (perplexity) agree within 1e-5
// relative with the same argmax, for GPT-2, Llama (grouped key/value heads) and Gemma. The
// checkpoint is written by one process and read under every layout.
// mpitron-test: np=2,4
#include <doctest/doctest.h>

#include <cmath>

#include "model/inference/dynamic_engine.h"
#include "tests/model/inference_test_util.h"

using namespace mpitron;
using namespace mpitron::testing;

namespace {

std::vector<GenRequest> requests() {
  std::vector<GenRequest> out;
  for (int i = 0; i < 6; ++i) {
    GenRequest r;
    for (int j = 0; j < 2 + 3 * i; ++j) r.prompt.push_back((i * 17 + j * 5 + 3) % 89);
    r.max_new_tokens = 12;
    r.eod = 89;
    r.stop_at_eod = false;
    r.sampling.greedy = i % 2 == 0;
    r.sampling.top_k = i % 2 == 0 ? 0 : 20;
    r.sampling.seed = 1234;
    r.stream = static_cast<uint64_t>(i);
    out.push_back(r);
  }
  return out;
}

struct Layout {
  int tp, pp;
};

}  // namespace

TEST_CASE("TP and PP inference equal one process: tokens, losses and argmax (GPT-2, Llama)") {
  const int world = world_size();
  const auto dir = shared_dir("infer_mp");
  const std::vector<Layout> layouts =
      world == 2 ? std::vector<Layout>{{2, 1}, {1, 2}} : std::vector<Layout>{{2, 2}, {4, 1}, {1, 4}};
  const int64_t B = 3, T = 20, bs = 4;
  std::vector<int32_t> tokens, targets;
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 90));
    targets.push_back(static_cast<int32_t>((i * 53 + 7) % 90));
  }
  for (const GPTConfig& cfg : {tiny_gpt2(), tiny_llama(), tiny_gemma()}) {
    write_checkpoint(dir / "ckpt", cfg, 21);
    std::vector<GenResult> ref;
    ScoreOutput ref_score;
    if (world_rank() == 0) {  // one process
      ModelRunner one(MPI_COMM_SELF, (dir / "ckpt").string(), RunnerOptions{});
      one.init_kv_cache(64, bs);
      DynamicEngine e(one, EngineConfig{});
      ref = e.run(requests());
      ref_score = one.score(tokens, targets, B, T);
    }
    for (const Layout& l : layouts) {
      RunnerOptions o;
      o.tp = l.tp;
      o.pp = l.pp;
      o.force_mpi_for_device = cuda_available() && cuda_device_count() < world_size();  // NCCL: one GPU per rank
      ModelRunner mp(MPI_COMM_WORLD, (dir / "ckpt").string(), o);
      mp.init_kv_cache(64, bs);
      const std::string what = str(cfg.family(), " tp ", l.tp, " pp ", l.pp);
      if (mp.is_driver()) {
        DynamicEngine e(mp, EngineConfig{4, 16, true});  // batched, chunked: numerics as alone
        const std::vector<GenResult> got = e.run(requests());
        mp.stop_workers();
        for (size_t i = 0; i < ref.size(); ++i) {
          CHECK_MESSAGE(got[i].generated == ref[i].generated, what, " request ", i);
          for (size_t j = 0; j < got[i].logprobs.size() && j < ref[i].logprobs.size(); ++j)
            CHECK_MESSAGE(std::abs(got[i].logprobs[j] - ref[i].logprobs[j]) < 1e-4, what, " request ", i);
        }
      } else {
        mp.serve();
      }
      const ScoreOutput s = mp.score(tokens, targets, B, T);
      if (mp.is_driver()) {
        REQUIRE(s.loss.size() == ref_score.loss.size());
        double sum = 0, ref_sum = 0;
        for (size_t i = 0; i < s.loss.size(); ++i) {
          sum += s.loss[i];
          ref_sum += ref_score.loss[i];
          CHECK_MESSAGE(std::abs(s.loss[i] - ref_score.loss[i]) <= 1e-5 * std::abs(ref_score.loss[i]), what, " token ", i);
        }
        CHECK_MESSAGE(std::abs(std::exp(sum / B / T) / std::exp(ref_sum / B / T) - 1) < 1e-5, what, " perplexity");
        CHECK_MESSAGE(s.argmax == ref_score.argmax, what);
      } else {
        CHECK(s.loss.empty());
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
