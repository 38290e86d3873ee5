// model/generate: KV-cache decoding against full recomputation, the two cache
// attention paths against each other, sampling rules and reproducibility.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <set>

#include "model/inference/generate.h"

using namespace mpitron;

namespace {

GPTConfig small_config() {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 48;
  c.max_position_embeddings = 48;
  c.vocab_size = 90;  // padded rows [90, 128) are never sampled
  c.padded_vocab_size = 128;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.init_method_std = 0.3f;  // peaked distributions: greedy decisions far from ties
  return c;
}

std::vector<std::vector<int32_t>> prompts() { return {{5, 17, 3, 60, 2, 8, 9}, {44}, {1, 2, 3, 4}}; }

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]) / (std::abs(double(b[i])) + 1e-2));
  return m;
}

}  // namespace

TEST_CASE("KV-cache logits equal full recomputation at every step (loop and tensor-op attention)") {
  GPT model(small_config(), Device::cpu());
  model.init_weights(7);
  for (bool ops : {false, true}) {
    DecodeSession dec(model, 2, 20, ops);
    std::vector<int32_t> a = {3, 9, 27, 81 % 90, 15}, b = {70, 1};
    std::vector<float> la = dec.prefill(0, a), lb = dec.prefill(1, b);
    for (int step = 0; step < 8; ++step) {
      for (auto* pr : {&a, &b}) {
        const std::vector<float>& got = pr == &a ? la : lb;
        const int64_t T = static_cast<int64_t>(pr->size());
        const Tensor full = model.logits(Tensor::from_ints(std::vector<int64_t>(pr->begin(), pr->end()), {1, T}));
        const std::vector<float> last = full.slice(0, T - 1, T).slice(1, 0, 90).contiguous().to_floats();
        REQUIRE(got.size() == last.size());
        CHECK_MESSAGE(max_rel(got, last) < 1e-4, "ops=", ops, " step ", step, " rel ", max_rel(got, last));
      }
      // Next tokens: a deterministic function of the step, fed to both rows at once
      // (row 1 only every other step: rows of a step need not be all sequences).
      a.push_back((step * 7 + 1) % 90);
      if (step % 2 == 0) {
        b.push_back((step * 11 + 5) % 90);
        const std::vector<float> l = dec.step({1, 0}, {b.back(), a.back()});
        lb.assign(l.begin(), l.begin() + 90);
        la.assign(l.begin() + 90, l.end());
      } else {
        la = dec.step({0}, {a.back()});
      }
      CHECK(dec.length(0) == static_cast<int64_t>(a.size()));
      CHECK(dec.length(1) == static_cast<int64_t>(b.size()));
    }
  }
}

TEST_CASE("greedy generation with the KV cache equals greedy full recomputation") {
  GPT model(small_config(), Device::cpu());
  model.init_weights(11);
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling.greedy = true;
  o.eod = 89;
  for (bool ops : {false, true}) {
    o.force_ops_attention = ops;
    const GenerateOutput g = generate(model, prompts(), o);
    REQUIRE(g.generated.size() == 3);
    for (size_t b = 0; b < 3; ++b) {
      const std::vector<int32_t> ref = generate_full_recompute(model, prompts()[b], 12, 89);
      CHECK_MESSAGE(g.generated[b] == ref, "sequence ", b, " ops=", ops);
      CHECK(g.tokens[b].size() == prompts()[b].size() + g.generated[b].size());
      CHECK(g.logprobs[b].size() == g.generated[b].size());
      for (float lp : g.logprobs[b]) CHECK(lp <= 0.0f);
    }
  }
  // Alone or in a batch: the same tokens (no padding, per-sequence prefill).
  const GenerateOutput single = generate(model, {prompts()[1]}, o);
  CHECK(single.generated[0] == generate(model, prompts(), o).generated[1]);
}

TEST_CASE("generation stops at EOD and at max_position_embeddings") {
  GPT model(small_config(), Device::cpu());
  model.init_weights(11);
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling.greedy = true;
  const std::vector<int32_t> ref = generate_full_recompute(model, prompts()[0], 12, -1, false);
  o.eod = ref[2];  // the third greedy token is "EOD": generation ends there, EOD kept
  const GenerateOutput g = generate(model, {prompts()[0]}, o);
  const size_t first = static_cast<size_t>(std::find(ref.begin(), ref.end(), ref[2]) - ref.begin());
  CHECK(g.generated[0] == std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(first + 1)));
  o.eod = -1;
  o.max_new_tokens = 100;
  const GenerateOutput full = generate(model, {prompts()[0]}, o);
  CHECK(full.tokens[0].size() == 48);  // capped by the 48 positions
  CHECK_THROWS_AS(generate(model, {std::vector<int32_t>(48, 1)}, o), Error);
  CHECK_THROWS_AS(generate(model, {{95}}, o), Error);  // outside the (unpadded) vocabulary
}

TEST_CASE("seeded sampling is reproducible; top-k, top-p and temperature do what they say") {
  GPT model(small_config(), Device::cpu());
  model.init_weights(5);
  GenerateOptions o;
  o.max_new_tokens = 10;
  o.eod = -1;
  o.sampling.seed = 42;
  o.sampling.temperature = 1.5f;
  const GenerateOutput a = generate(model, prompts(), o), b = generate(model, prompts(), o);
  CHECK(a.generated == b.generated);
  o.force_ops_attention = true;
  CHECK(generate(model, prompts(), o).generated == a.generated);
  o.sampling.seed = 43;
  CHECK(generate(model, prompts(), o).generated != a.generated);

  // sample_token on fixed logits.
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[static_cast<size_t>(i)] = std::sin(i * 1.7f) * 3.0f;
  std::vector<int> order(50);
  for (int i = 0; i < 50; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int x, int y) { return logits[static_cast<size_t>(x)] > logits[static_cast<size_t>(y)]; });
  SamplingParams p;
  p.seed = 9;
  p.top_k = 3;
  std::set<int32_t> seen;
  for (uint64_t s = 0; s < 400; ++s) seen.insert(sample_token(logits.data(), 50, p, 0, s));
  CHECK(seen == std::set<int32_t>{order[0], order[1], order[2]});
  p.top_k = 0;
  p.top_p = 1e-6f;  // only the most likely token survives
  for (uint64_t s = 0; s < 50; ++s) CHECK(sample_token(logits.data(), 50, p, 3, s) == order[0]);
  p.top_p = 0.0f;
  p.temperature = 0.0f;  // greedy
  float lp = 1;
  CHECK(sample_token(logits.data(), 50, p, 0, 0, &lp) == order[0]);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  CHECK(lp == doctest::Approx(logits[static_cast<size_t>(order[0])] - std::log(z)).epsilon(1e-5));
  // Without filtering, the empirical frequencies follow softmax(logits / T).
  p.temperature = 2.0f;
  std::vector<int> count(50, 0);
  const int n = 20000;
  for (uint64_t s = 0; s < static_cast<uint64_t>(n); ++s) ++count[static_cast<size_t>(sample_token(logits.data(), 50, p, 1, s))];
  double zt = 0;
  for (float l : logits) zt += std::exp(double(l) / 2.0);
  const double p0 = std::exp(double(logits[static_cast<size_t>(order[0])]) / 2.0) / zt;
  CHECK(std::abs(count[static_cast<size_t>(order[0])] / double(n) - p0) < 4 * std::sqrt(p0 * (1 - p0) / n));
  p.temperature = -1.0f;
  CHECK_THROWS_AS(p.validate(), Error);
}
