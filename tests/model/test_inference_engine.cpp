// The dynamic engine on one process: the block allocator, the paged-cache forward
// against full recomputation, and batch invariance — a request's tokens and
// log-probabilities are bitwise those it gets alone, whatever is batched with it,
// with chunked prefill, a tiny token budget, and a KV pool too small for all
// requests at once (pauses and evictions), for GPT-2 and Llama (grouped KV heads).
// mpitron-test: np=1
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "model/inference/dynamic_engine.h"
#include "model/inference/generate.h"
#include "tests/error_of.h"
#include "tests/model/inference_test_util.h"

using namespace mpitron;
using namespace mpitron::testing;
using mpitron::testing_util::error_of;

namespace {

std::vector<std::vector<int32_t>> some_prompts(int n) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t;
    for (int j = 0; j < 1 + (i * 7) % 19; ++j) t.push_back((i * 31 + j * 13 + 5) % 89);
    p.push_back(t);
  }
  return p;
}

std::vector<GenRequest> requests(const std::vector<std::vector<int32_t>>& prompts, bool greedy, int64_t new_tokens) {
  std::vector<GenRequest> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenRequest r;
    r.prompt = prompts[i];
    r.max_new_tokens = new_tokens + static_cast<int64_t>(i % 5);
    r.eod = 89;
    r.stop_at_eod = false;
    r.sampling.greedy = greedy;
    r.sampling.top_p = greedy ? 0.0f : 0.9f;
    r.sampling.seed = 77;
    r.stream = i;
    r.top_logprobs = i % 3 == 0 ? 2 : 0;
    out.push_back(r);
  }
  return out;
}

// Blocks for `seqs` sequences of `len` tokens.
int64_t blocks(int64_t seqs, int64_t len, int64_t bs) { return seqs * blocks_for(len, bs); }

void same_results(const std::vector<GenResult>& a, const std::vector<GenResult>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK_MESSAGE(a[i].generated == b[i].generated, what, ": request ", i);
    CHECK_MESSAGE(a[i].logprobs == b[i].logprobs, what, ": request ", i, " logprobs differ (bitwise)");
    CHECK_MESSAGE(a[i].finish_reason == b[i].finish_reason, what, ": request ", i);
    CHECK(a[i].top.size() == b[i].top.size());
  }
}

}  // namespace

TEST_CASE("KV block allocator: allocate, release, refuse when short, peak") {
  KVBlockAllocator a(5);
  std::vector<int32_t> t1, t2;
  CHECK(a.allocate(3, t1));
  CHECK(!a.allocate(3, t2));  // only 2 left: nothing taken
  CHECK(t2.empty());
  CHECK(a.allocate(2, t2));
  CHECK(a.free_blocks() == 0);
  std::vector<int32_t> all(t1);
  all.insert(all.end(), t2.begin(), t2.end());
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<int32_t>{0, 1, 2, 3, 4});
  a.release(t1);
  CHECK(t1.empty());
  CHECK(a.free_blocks() == 3);
  CHECK(a.peak_used() == 5);
  std::vector<int32_t> bogus{t2[0]};
  a.release(t2);
  CHECK(error_of([&] { a.release(bogus); }).find("not allocated") != std::string::npos);
  CHECK(blocks_for(0, 4) == 0);
  CHECK(blocks_for(4, 4) == 1);
  CHECK(blocks_for(5, 4) == 2);
}

TEST_CASE("paged-cache engine: logits and greedy tokens equal full recomputation (GPT-2, Llama, Qwen2, Mistral, Gemma; loop and ops attention)") {
  const auto dir = fresh_temp_dir("engine_ref");
  for (const GPTConfig& cfg : {tiny_gpt2(), tiny_llama(), tiny_qwen2(), tiny_mistral(), tiny_gemma()}) {
    write_checkpoint(dir / "ckpt", cfg, 5);
    GPT ref(cfg, Device::cpu());
    ref.init_weights(5);
    for (bool ops : {false, true}) {
      RunnerOptions ro;
      ro.force_ops_attention = ops;
      ModelRunner runner(MPI_COMM_WORLD, (dir / "ckpt").string(), ro);
      runner.init_kv_cache(blocks(4, 64, 8), 8);
      DynamicEngine engine(runner, EngineConfig{});
      const auto prompts = some_prompts(4);
      std::vector<GenRequest> rs = requests(prompts, true, 10);
      const std::vector<GenResult> got = engine.run(rs);
      for (size_t i = 0; i < prompts.size(); ++i) {
        const std::vector<int32_t> want =
            generate_full_recompute(ref, prompts[i], rs[i].max_new_tokens, 89, false);
        CHECK_MESSAGE(got[i].generated == want, cfg.family(), " ops=", ops, " prompt ", i);
        // The log-probability of each chosen token against the full forward's.
        std::vector<int32_t> seq = prompts[i];
        for (size_t j = 0; j < want.size(); ++j) {
          const int64_t T = static_cast<int64_t>(seq.size());
          const std::vector<float> last =
              ref.logits(Tensor::from_ints(std::vector<int64_t>(seq.begin(), seq.end()), {1, T}))
                  .slice(0, T - 1, T).slice(1, 0, 90).contiguous().to_floats();
          double mx = -INFINITY, sum = 0;
          for (float v : last) mx = std::max(mx, double(v));
          for (float v : last) sum += std::exp(double(v) - mx);
          const double lp = last[static_cast<size_t>(want[j])] - mx - std::log(sum);
          CHECK_MESSAGE(std::abs(got[i].logprobs[j] - lp) < 1e-4 * (1 + std::abs(lp)), "prompt ", i, " token ", j);
          seq.push_back(want[j]);
        }
      }
    }
  }
}

TEST_CASE("batch invariance: alone, together, chunked prefill, a tiny token budget and a KV pool too small") {
  const auto dir = fresh_temp_dir("engine_inv");
  for (const GPTConfig& cfg : {tiny_gpt2(), tiny_llama()}) {
    write_checkpoint(dir / "ckpt", cfg, 9);
    ModelRunner runner(MPI_COMM_WORLD, (dir / "ckpt").string(), RunnerOptions{});
    const int64_t bs = 4;
    runner.init_kv_cache(blocks(36, 64, bs), bs);
    const auto prompts = some_prompts(12);
    for (bool greedy : {true, false}) {
      const std::vector<GenRequest> rs = requests(prompts, greedy, 14);
      // Alone: one request at a time.
      std::vector<GenResult> alone;
      {
        DynamicEngine e(runner, EngineConfig{1, 512, false});
        for (const GenRequest& r : rs) alone.push_back(e.run({r})[0]);
      }
      for (const GenResult& r : alone) CHECK(static_cast<int64_t>(r.generated.size()) >= 14);
      // All at once, default limits.
      {
        DynamicEngine e(runner, EngineConfig{64, 512, false});
        same_results(alone, e.run(rs), "together");
        CHECK(e.stats().max_running == 12);
        CHECK(e.stats().pauses == 0);
      }
      // Each request three times: 36 at once, more rows than one output-layer tile
      // (kHeadRowTile), each copy at another place of another tile.
      {
        static_assert(kHeadRowTile < 36, "36 rows must span several output-layer tiles");
        std::vector<GenRequest> triple;
        std::vector<GenResult> want;
        for (int k = 0; k < 3; ++k) {
          triple.insert(triple.end(), rs.begin(), rs.end());
          want.insert(want.end(), alone.begin(), alone.end());
        }
        DynamicEngine e(runner, EngineConfig{64, 512, false});
        same_results(want, e.run(triple), "36 together");
        CHECK(e.stats().max_running == 36);
      }
      // Chunked prefill with a budget of 5 tokens per step: prompts cut into chunks.
      {
        DynamicEngine e(runner, EngineConfig{64, 5, true});
        same_results(alone, e.run(rs), "chunked, 5 tokens per step");
      }
      // Without chunking a prompt longer than the budget still runs (whole, alone in its step).
      {
        DynamicEngine e(runner, EngineConfig{64, 3, false});
        same_results(alone, e.run(rs), "unchunked, 3 tokens per step");
      }
    }
    // A pool for ~2.5 sequences of 64 tokens: 12 requests cannot all hold their blocks,
    // so requests pause (and the newest is evicted and recomputed); tokens stay the same.
    ModelRunner small(MPI_COMM_WORLD, (dir / "ckpt").string(), RunnerOptions{});
    small.init_kv_cache(blocks(1, 64, bs) + 8, bs);
    for (bool chunked : {false, true}) {
      const std::vector<GenRequest> rs = requests(prompts, false, 30);
      std::vector<GenResult> alone;
      {
        DynamicEngine e(runner, EngineConfig{1, 512, false});
        for (const GenRequest& r : rs) alone.push_back(e.run({r})[0]);
      }
      DynamicEngine e(small, EngineConfig{64, 512, chunked});
      same_results(alone, e.run(rs), chunked ? "small pool, chunked" : "small pool");
      const EngineStats st = e.stats();
      MESSAGE(st.line());
      CHECK(st.pauses > 0);
      CHECK(st.resumes > 0);
      CHECK(st.peak_blocks <= st.kv_blocks);
      CHECK(st.requests_done == 12);
    }
  }
}

TEST_CASE("engine refusals: token ids, lengths, a pool smaller than one sequence") {
  const auto dir = fresh_temp_dir("engine_bad");
  write_checkpoint(dir / "ckpt", tiny_gpt2(), 3);
  ModelRunner runner(MPI_COMM_WORLD, (dir / "ckpt").string(), RunnerOptions{});
  runner.init_kv_cache(3, 8);
  CHECK(error_of([&] { DynamicEngine e(runner, EngineConfig{}); }).find("buffer-size-gb") != std::string::npos);
  runner.init_kv_cache(8, 8);
  DynamicEngine e(runner, EngineConfig{});
  GenRequest r;
  r.eod = 89;
  r.prompt = {5, 90};
  CHECK(error_of([&] { e.submit(r); }).find("outside the vocabulary") != std::string::npos);
  r.prompt.assign(64, 3);
  CHECK(error_of([&] { e.submit(r); }).find("max_position_embeddings") != std::string::npos);
  r.prompt = {1};
  r.sampling.temperature = -1;
  CHECK(error_of([&] { e.submit(r); }).find("temperature") != std::string::npos);
  // A request running into max_position_embeddings ends there ("length"), not cut silently.
  r.sampling = SamplingParams{};
  r.sampling.greedy = true;
  r.prompt.assign(60, 3);
  r.max_new_tokens = 10;
  r.stop_at_eod = false;
  const GenResult g = e.run({r})[0];
  CHECK(g.generated.size() == 4);
  CHECK(g.finish_reason == "length");
}
