// Prefix caching under tensor and pipeline parallelism: the driver's scheduler decides which
// blocks are shared and ships the block tables in each step's plan, so every rank's cache makes
// the same decisions. TP2 and PP2 (2 ranks), TP2xPP2 (4 ranks), for GPT-2, Llama and multi-latent
// attention (its latent blocks shared alike): requests sharing a long prompt
// prefix, at once and staggered, give bitwise the tokens and log-probabilities of the same layout
// without prefix caching, and the one-process greedy tokens; the hit counters show the sharing.
// mpitron-test: np=2,4
#include <doctest/doctest.h>

#include "model/inference/dynamic_engine.h"
#include "tests/model/inference_test_util.h"

using namespace mpitron;
using namespace mpitron::testing;

namespace {

std::vector<GenRequest> requests() {
  std::vector<GenRequest> out;
  for (int i = 0; i < 8; ++i) {
    GenRequest r;
    for (int j = 0; j < 26; ++j) r.prompt.push_back((j * 11 + 3) % 89);  // 6 full blocks of 4 shared
    for (int j = 0; j < 1 + i % 4; ++j) r.prompt.push_back((i * 17 + j * 5 + 1) % 89);
    r.max_new_tokens = 8;
    r.eod = 89;
    r.stop_at_eod = false;
    r.sampling.greedy = i % 2 == 0;
    r.sampling.top_k = i % 2 == 0 ? 0 : 20;
    r.sampling.seed = 99;
    r.stream = static_cast<uint64_t>(i);
    out.push_back(r);
  }
  return out;
}

// All at once, or half first and the rest after `steps` steps.
std::vector<GenResult> drive(DynamicEngine& e, const std::vector<GenRequest>& rs, int steps) {
  if (steps < 0) return e.run(rs);
  std::vector<std::shared_ptr<RequestState>> st;
  for (size_t i = 0; i < rs.size() / 2; ++i) st.push_back(e.submit(rs[i]));
  for (int k = 0; k < steps; ++k) e.step();
  for (size_t i = rs.size() / 2; i < rs.size(); ++i) st.push_back(e.submit(rs[i]));
  while (e.step()) {
  }
  std::vector<GenResult> out;
  for (auto& s : st) out.push_back(s->result());
  return out;
}

struct Layout {
  int tp, pp;
};

}  // namespace

TEST_CASE("prefix caching under TP and PP: bitwise the same layout without it, the one-process greedy tokens") {
  const int world = world_size();
  const auto dir = shared_dir("prefix_mp");
  const std::vector<Layout> layouts = world == 2 ? std::vector<Layout>{{2, 1}, {1, 2}} : std::vector<Layout>{{2, 2}};
  const int64_t bs = 4;
  for (const GPTConfig& cfg : {tiny_gpt2(), tiny_llama(), tiny_mla()}) {
    write_checkpoint(dir / "ckpt", cfg, 31);
    std::vector<GenResult> one;
    if (world_rank() == 0) {
      ModelRunner r(MPI_COMM_SELF, (dir / "ckpt").string(), RunnerOptions{});
      r.init_kv_cache(128, bs);
      DynamicEngine e(r, EngineConfig{});
      one = e.run(requests());
    }
    for (const Layout& l : layouts) {
      RunnerOptions o;
      o.tp = l.tp;
      o.pp = l.pp;
      o.force_mpi_for_device = cuda_available() && cuda_device_count() < world_size();
      ModelRunner mp(MPI_COMM_WORLD, (dir / "ckpt").string(), o);
      mp.init_kv_cache(128, bs);
      if (!mp.is_driver()) {
        mp.serve();
        continue;
      }
      const std::string what = str(cfg.family(), cfg.multi_latent_attention ? " (MLA)" : "", " tp ", l.tp, " pp ", l.pp);
      for (int steps : {-1, 2}) {
        DynamicEngine plain(mp, EngineConfig{16, 512, false});
        const std::vector<GenResult> want = drive(plain, requests(), steps);
        for (PrefixEviction p : {PrefixEviction::RefZero, PrefixEviction::Lru}) {
          EngineConfig c{16, 512, false};
          c.prefix_caching.enabled = true;
          c.prefix_caching.eviction = p;
          DynamicEngine e(mp, c);
          const std::vector<GenResult> got = drive(e, requests(), steps);
          const std::string w = str(what, ", ", row_of(p).name, steps < 0 ? ", at once" : ", staggered");
          REQUIRE(got.size() == want.size());
          for (size_t i = 0; i < got.size(); ++i) {
            CHECK_MESSAGE(got[i].generated == want[i].generated, w, " request ", i);
            CHECK_MESSAGE(got[i].logprobs == want[i].logprobs, w, " request ", i, " logprobs differ (bitwise)");
            if (i % 2 == 0) CHECK_MESSAGE(got[i].generated == one[i].generated, w, " request ", i, " vs one process");
          }
          CHECK_MESSAGE(e.stats().prefix_cache_hits >= 7 * 6, w, ": ", e.stats().line());
        }
      }
      mp.stop_workers();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
