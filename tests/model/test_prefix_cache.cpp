// Prefix caching (--inference-dynamic-batching-prefix-caching) on one process: the block
// allocator's reference counts and eviction policies (ref_zero frees, lru keeps and evicts the
// oldest, a referenced block is never evicted, running out of blocks as before), the prefix keys,
// and the engine: requests sharing a long prompt prefix give bitwise the tokens and
// log-probabilities they give without prefix caching — arriving at once, staggered, with chunked
// prefill, with a KV pool too small for all (pauses and request evictions), whole prompts cached —
// for GPT-2, Llama (grouped KV heads) and multi-latent attention (the latent cache), while the
// hit counters show the blocks were shared. The refusals name their flags.
// mpitron-test: np=1
#include <doctest/doctest.h>

#include <algorithm>

#include "model/flags/inference_flags.h"
#include "model/inference/dynamic_engine.h"
#include "model/inference/prefix_cache.h"
#include "model/inference/runner_flags.h"
#include "model/training/pretrain_flags.h"
#include "tests/error_of.h"
#include "tests/model/inference_test_util.h"

using namespace mpitron;
using namespace mpitron::testing;
using mpitron::testing_util::error_of;
namespace po = boost::program_options;

namespace {

// n prompts: a common prefix of `shared` tokens, then a short suffix of its own (some none).
std::vector<GenRequest> shared_prefix_requests(int n, int shared, bool greedy) {
  std::vector<GenRequest> out;
  for (int i = 0; i < n; ++i) {
    GenRequest r;
    for (int j = 0; j < shared; ++j) r.prompt.push_back((j * 13 + 5) % 89);
    for (int j = 0; j < (i * 5) % 7; ++j) r.prompt.push_back((i * 31 + j * 7 + 2) % 89);
    r.max_new_tokens = 6 + i % 4;
    r.eod = 89;
    r.stop_at_eod = false;
    r.sampling.greedy = greedy;
    r.sampling.top_p = greedy ? 0.0f : 0.9f;
    r.sampling.seed = 5;
    r.stream = static_cast<uint64_t>(i);
    r.top_logprobs = i % 3 == 0 ? 2 : 0;
    out.push_back(r);
  }
  return out;
}

void same_results(const std::vector<GenResult>& a, const std::vector<GenResult>& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK_MESSAGE(a[i].generated == b[i].generated, what, ": request ", i);
    CHECK_MESSAGE(a[i].logprobs == b[i].logprobs, what, ": request ", i, " logprobs differ (bitwise)");
    CHECK_MESSAGE(a[i].top == b[i].top, what, ": request ", i, " top logprobs differ");
    CHECK_MESSAGE(a[i].finish_reason == b[i].finish_reason, what, ": request ", i);
  }
}

EngineConfig with_prefix(EngineConfig e, PrefixEviction p) {
  e.prefix_caching.enabled = true;
  e.prefix_caching.eviction = p;
  return e;
}

// Submits requests [0, n/2), runs `steps` steps, submits the rest, runs to the end.
std::vector<GenResult> staggered(DynamicEngine& e, const std::vector<GenRequest>& rs, int steps) {
  std::vector<std::shared_ptr<RequestState>> st;
  const size_t half = rs.size() / 2;
  for (size_t i = 0; i < half; ++i) st.push_back(e.submit(rs[i]));
  for (int k = 0; k < steps; ++k) e.step();
  for (size_t i = half; i < rs.size(); ++i) st.push_back(e.submit(rs[i]));
  while (e.step()) {
  }
  std::vector<GenResult> out;
  for (auto& s : st) {
    REQUIRE(s->finished());
    out.push_back(s->result());
  }
  return out;
}

}  // namespace

TEST_CASE("prefix keys: equal exactly for equal prefixes, full blocks only") {
  const std::vector<int32_t> a{1, 2, 3, 4, 5, 6, 7, 8, 9}, b{1, 2, 3, 4, 5, 6, 7, 9, 9}, c{2, 1, 3, 4, 5, 6, 7, 8};
  std::vector<uint64_t> ka, kb, kc;
  extend_block_keys(ka, a, 9, 4);
  extend_block_keys(kb, b, 9, 4);
  extend_block_keys(kc, c, 8, 4);
  REQUIRE(ka.size() == 2);  // the ninth token's block is not full
  CHECK(ka[0] == kb[0]);
  CHECK(ka[1] != kb[1]);  // block 1 differs in its last token
  CHECK(ka[0] != kc[0]);
  CHECK(ka[1] != kc[1]);  // same tokens in block 1, another prefix before it
  std::vector<uint64_t> more(ka.begin(), ka.begin() + 1);
  extend_block_keys(more, a, 9, 4);  // extends, never recomputes
  CHECK(more == ka);
  CHECK(parse_prefix_eviction("lru") == PrefixEviction::Lru);
  CHECK(parse_prefix_eviction("ref_zero") == PrefixEviction::RefZero);
  const std::string e = error_of([] { parse_prefix_eviction("LRU"); });
  CHECK(e.find("--inference-dynamic-batching-prefix-caching-eviction-policy") != std::string::npos);
  CHECK(e.find("ref_zero | lru") != std::string::npos);
}

TEST_CASE("KV block allocator with prefix caching: ref_zero frees a block with its last reference") {
  KVBlockAllocator a(4, PrefixEviction::RefZero);
  std::vector<int32_t> t1, t2;
  REQUIRE(a.allocate(2, t1));
  CHECK(a.register_block(t1[0], 11));
  CHECK(a.register_block(t1[1], 12));
  CHECK(!a.register_block(t1[1], 12));  // already cached
  const std::vector<uint64_t> keys{11, 12, 13};
  CHECK(a.match(keys, 3) == 2);
  a.share(keys, 2, t2);  // a second request holds the same two blocks
  CHECK(t2 == t1);
  CHECK(a.refs(t1[0]) == 2);
  CHECK(a.shared_references() == 2);
  CHECK(a.peak_shared_references() == 2);
  CHECK(a.used() == 2);
  a.release(t1);
  CHECK(a.cached_blocks() == 2);  // still held by t2
  CHECK(a.match(keys, 3) == 2);
  CHECK(a.free_blocks() == 2);
  a.release(t2);
  CHECK(a.cached_blocks() == 0);  // ref_zero: gone with the last reference
  CHECK(a.match(keys, 3) == 0);
  CHECK(a.free_blocks() == 4);
  CHECK(a.evicted_blocks() == 0);
  CHECK(error_of([&] { a.share(keys, 1, t2); }).find("cached") != std::string::npos);
}

TEST_CASE("KV block allocator with prefix caching: lru keeps unreferenced blocks and evicts the oldest, never a held one") {
  KVBlockAllocator a(4, PrefixEviction::Lru);
  std::vector<int32_t> t1, t2, t3;
  REQUIRE(a.allocate(1, t1));
  REQUIRE(a.allocate(1, t2));
  REQUIRE(a.allocate(1, t3));
  const int32_t b1 = t1[0], b2 = t2[0], b3 = t3[0];
  CHECK(a.register_block(b1, 1));
  CHECK(a.register_block(b2, 2));
  CHECK(a.register_block(b3, 3));
  a.release(t2);  // released first: the oldest unreferenced block
  a.release(t1);
  CHECK(a.cached_blocks() == 3);  // kept, unreferenced
  CHECK(a.free_blocks() == 3);    // one free + two evictable
  // Key 1 shared again: held, so never evicted.
  std::vector<int32_t> h;
  a.share({1}, 1, h);
  CHECK(h == std::vector<int32_t>{b1});
  CHECK(a.free_blocks() == 2);
  std::vector<int32_t> n;
  REQUIRE(a.allocate(1, n));  // the never-cached free block first: nothing evicted
  CHECK(a.evicted_blocks() == 0);
  CHECK(a.cached_blocks() == 3);
  REQUIRE(a.allocate(1, n));  // now the oldest unreferenced cached block: b2
  CHECK(n.back() == b2);
  CHECK(a.evicted_blocks() == 1);
  CHECK(!a.cached(2));
  CHECK(a.cached(1));
  CHECK(a.cached(3));
  CHECK(!a.allocate(1, n));  // b1 held, b3 held: out of blocks, nothing taken
  CHECK(n.size() == 2);
  CHECK(a.cached(1));
  a.release(h);
  REQUIRE(a.allocate(1, n));  // b1 is the only unreferenced one
  CHECK(n.back() == b1);
  CHECK(a.evicted_blocks() == 2);
  CHECK(a.free_blocks() == 0);
  CHECK(a.peak_used() == 4);
  // Out of blocks behaves as without prefix caching: false, nothing taken, release of a stray table refused.
  std::vector<int32_t> none;
  CHECK(!a.allocate(1, none));
  CHECK(none.empty());
  std::vector<int32_t> bogus{b2};
  a.release(n);
  CHECK(error_of([&] { a.release(bogus); }).find("not allocated") != std::string::npos);
}

TEST_CASE("prefix caching: the same tokens and log-probabilities as without it (GPT-2, Llama, MLA; at once, staggered, chunked, small pool)") {
  const auto dir = fresh_temp_dir("prefix_engine");
  const int64_t bs = 4;
  for (const GPTConfig& cfg : {tiny_gpt2(), tiny_llama(), tiny_mla()}) {
    write_checkpoint(dir / "ckpt", cfg, 13);
    ModelRunner runner(MPI_COMM_WORLD, (dir / "ckpt").string(), RunnerOptions{});
    runner.init_kv_cache(12 * blocks_for(64, bs), bs);
    for (bool greedy : {true, false}) {
      // 30 shared tokens: 7 full blocks of 4 and two tokens of the eighth (a partial block shared by none).
      const std::vector<GenRequest> rs = shared_prefix_requests(10, 30, greedy);
      const std::string fam = str(cfg.family(), cfg.multi_latent_attention ? " (MLA)" : "", greedy ? " greedy" : " sampled");
      std::vector<GenResult> want;
      {
        DynamicEngine e(runner, EngineConfig{64, 512, false});
        want = e.run(rs);
      }
      for (PrefixEviction p : {PrefixEviction::RefZero, PrefixEviction::Lru}) {
        const std::string what = str(fam, ", ", row_of(p).name);
        {  // all at once: the first computes the prefix, the others wait one step and share it
          DynamicEngine e(runner, with_prefix(EngineConfig{64, 512, false}, p));
          same_results(want, e.run(rs), what + ", at once");
          const EngineStats st = e.stats();
          MESSAGE(st.line());
          CHECK(st.prefix_cache_queries >= 10 * 7);
          CHECK(st.prefix_cache_hits >= 9 * 7);
          CHECK(st.prefix_cache_tokens_saved == st.prefix_cache_hits * bs);
          CHECK(st.prefix_cache_deferred >= 1);
          CHECK(st.prefix_cache_blocks_saved == 0);  // every request ended
          CHECK(st.prefix_cache_blocks_saved_peak >= 9 * 7);  // nine requests held the first one's 7 blocks at once
          CHECK(st.prefix_cache_policy == row_of(p).name);
          CHECK(st.line().find("prompt blocks hit") != std::string::npos);
          if (p == PrefixEviction::Lru) CHECK(st.prefix_cache_blocks_resident >= 7);
          else CHECK(st.prefix_cache_blocks_resident == 0);  // every request ended: ref_zero drops them all
        }
        {  // staggered: half arrive, three steps later the rest
          DynamicEngine e(runner, with_prefix(EngineConfig{64, 512, false}, p));
          same_results(want, staggered(e, rs, 3), what + ", staggered");
          CHECK(e.stats().prefix_cache_hits >= 9 * 7);
        }
        {  // chunked prefill, 6 tokens a step: the prefix is filled over several steps
          DynamicEngine e(runner, with_prefix(EngineConfig{64, 6, true}, p));
          same_results(want, e.run(rs), what + ", chunked 6 tokens a step");
          CHECK(e.stats().prefix_cache_hits > 0);
        }
        {  // one request at a time: ref_zero shares nothing (each ends before the next), lru everything
          DynamicEngine e(runner, with_prefix(EngineConfig{1, 512, false}, p));
          same_results(want, e.run(rs), what + ", one at a time");
          const EngineStats st = e.stats();
          if (p == PrefixEviction::Lru) CHECK(st.prefix_cache_hits >= 9 * 7);
          else CHECK(st.prefix_cache_hits == 0);
        }
      }
    }
    // A pool for one sequence and a few blocks more: requests pause and the newest is evicted and
    // recomputed (sharing the cached blocks again); lru also evicts cached blocks to make room.
    ModelRunner small(MPI_COMM_WORLD, (dir / "ckpt").string(), RunnerOptions{});
    small.init_kv_cache(blocks_for(64, bs) + 3, bs);
    std::vector<GenRequest> rs = shared_prefix_requests(8, 30, false);
    for (GenRequest& r : rs) r.max_new_tokens += 14;  // ~50 tokens each: 13 blocks, 7 of them shared
    std::vector<GenResult> want;
    {
      DynamicEngine e(runner, EngineConfig{1, 512, false});
      for (const GenRequest& r : rs) want.push_back(e.run({r})[0]);
    }
    for (PrefixEviction p : {PrefixEviction::RefZero, PrefixEviction::Lru})
      for (bool chunked : {false, true}) {
        DynamicEngine e(small, with_prefix(EngineConfig{64, 512, chunked}, p));
        same_results(want, e.run(rs), str(cfg.family(), " small pool, ", row_of(p).name, chunked ? ", chunked" : ""));
        const EngineStats st = e.stats();
        MESSAGE(st.line());
        CHECK(st.requests_done == 8);
        CHECK(st.evictions > 0);  // requests evicted, recomputed sharing the cached blocks again
        CHECK(st.prefix_cache_hits > 8 * 7);
        if (p == PrefixEviction::Lru) CHECK(st.prefix_cache_evictions > 0);  // cached blocks taken for others
        CHECK(st.peak_blocks <= st.kv_blocks);
      }
  }
}

TEST_CASE("prefix caching: a prompt wholly cached recomputes its last token; a cached block is never written") {
  const auto dir = fresh_temp_dir("prefix_whole");
  write_checkpoint(dir / "ckpt", tiny_gpt2(), 4);
  ModelRunner runner(MPI_COMM_WORLD, (dir / "ckpt").string(), RunnerOptions{});
  runner.init_kv_cache(40, 4);
  GenRequest r;
  for (int j = 0; j < 16; ++j) r.prompt.push_back((j * 7 + 1) % 89);  // four full blocks
  r.max_new_tokens = 5;
  r.eod = 89;
  r.stop_at_eod = false;
  r.sampling.greedy = true;
  DynamicEngine plain(runner, EngineConfig{});
  const GenResult want = plain.run({r})[0];
  DynamicEngine e(runner, with_prefix(EngineConfig{}, PrefixEviction::Lru));
  const GenResult first = e.run({r})[0];
  const GenResult again = e.run({r})[0];  // the same prompt: 3 blocks shared, the 4th (the last token's) computed
  same_results({want, want}, {first, again}, "the same prompt twice");
  const EngineStats st = e.stats();
  CHECK(st.prefix_cache_queries == 6);  // 3 blocks before the last token, twice
  CHECK(st.prefix_cache_hits == 3);
  CHECK(st.prefill_tokens == 16 + 4);
  // The plan check every rank runs: a row may not write a block another sequence of the step holds.
  StepPlan bad;
  bad.tokens = {1, 2};
  bad.rows.pos = {3, 4};
  bad.rows.seq = {0, 1};
  bad.rows.tables = {{5}, {5, 6}};  // sequence 0 writes block 5 (position 3), which sequence 1 reads
  bad.logits_rows = {1};
  const std::string err = error_of([&] { bad.validate(90, 64, 40, 4); });
  CHECK_MESSAGE(err.find("is written by a row of sequence 0 and read by sequence 1") != std::string::npos, err);
  bad.rows.pos = {2, 4};
  bad.rows.tables = {{5}, {7, 6}};
  CHECK_NOTHROW(bad.validate(90, 64, 40, 4));
}

TEST_CASE("prefix caching refusals: with MTP speculative decoding, with dynamic NTK rope") {
  const auto dir = fresh_temp_dir("prefix_bad");
  GPTConfig mtp = tiny_llama();
  mtp.mtp_num_layers = 1;
  write_checkpoint(dir / "mtp", mtp, 3);
  RunnerOptions ro;
  ro.num_speculative_tokens = 1;
  ModelRunner runner(MPI_COMM_WORLD, (dir / "mtp").string(), ro);
  runner.init_kv_cache(16, 8);
  EngineConfig c = with_prefix(EngineConfig{}, PrefixEviction::RefZero);
  c.num_speculative_tokens = 1;
  const std::string e = error_of([&] { DynamicEngine d(runner, c); });
  CHECK(e.find("--inference-dynamic-batching-prefix-caching") != std::string::npos);
  CHECK(e.find("--num-speculative-tokens") != std::string::npos);
  GPTConfig ntk = tiny_llama();
  ntk.rope_scaling.type = RopeScalingType::Dynamic;
  ntk.rope_scaling.factor = 2.0;
  ntk.rope_scaling.original_max_position_embeddings = 32;
  write_checkpoint(dir / "ntk", ntk, 3);
  ModelRunner r2(MPI_COMM_WORLD, (dir / "ntk").string(), RunnerOptions{});
  r2.init_kv_cache(16, 8);
  CHECK(error_of([&] { DynamicEngine d(r2, with_prefix(EngineConfig{}, PrefixEviction::Lru)); }).find("dynamic NTK") !=
        std::string::npos);
  CHECK_NOTHROW(DynamicEngine(r2, EngineConfig{}));
}

namespace {

// check_inference_flags' error for the inference tools' flags `args` ("" when accepted).
std::string flags_error(std::vector<std::string> args) {
  po::options_description d("t");
  InferenceFlags f;
  add_inference_flags(d, f, true, pretrain_flag_descriptions());
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  po::variables_map vm;
  po::store(po::command_line_parser(static_cast<int>(argv.size()), argv.data()).options(d).run(), vm);
  po::notify(vm);
  return error_of([&] { check_inference_flags(vm, f); });
}

}  // namespace

TEST_CASE("prefix caching flags: Megatron's names, values checked, refused without dynamic batching") {
  const std::string on = "--inference-dynamic-batching-prefix-caching";
  const std::string policy = "--inference-dynamic-batching-prefix-caching-eviction-policy";
  CHECK(flags_error({"--inference-dynamic-batching", on}) == "");
  CHECK(flags_error({"--inference-dynamic-batching", on, policy, "lru"}) == "");
  CHECK(flags_error({"--inference-dynamic-batching", on, policy, "ref_zero"}) == "");
  const std::string bad = flags_error({"--inference-dynamic-batching", on, policy, "fifo"});
  CHECK_MESSAGE(bad.find(policy + " 'fifo' is not one of ref_zero | lru") != std::string::npos, bad);
  const std::string alone = flags_error({on});
  CHECK_MESSAGE(alone.find(on + " without --inference-dynamic-batching") != std::string::npos, alone);
  const std::string orphan = flags_error({"--inference-dynamic-batching", policy, "lru"});
  CHECK_MESSAGE(orphan.find(policy + " without " + on) != std::string::npos, orphan);
  // What the flags give the engine.
  DynamicBatchingFlags b;
  b.prefix_caching = true;
  b.prefix_caching_eviction_policy = "lru";
  const EngineConfig c = engine_config(b, 7);
  CHECK(c.prefix_caching.enabled);
  CHECK(c.prefix_caching.eviction == PrefixEviction::Lru);
  CHECK(c.max_requests == 7);
}
