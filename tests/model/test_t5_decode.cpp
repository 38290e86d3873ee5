// T5's cached decoder (model/t5_decode.h) against transformers and against the full recompute, on the
// committed random T5s of tests/reference/hf_t5_ref.py (tests/apps/ref/hf_t5_{gated,relu}/: a 2-layer
// encoder, a 3-layer decoder, 8 relative buckets):
//  * teacher-forced through the cache one token at a time, every position's logits equal transformers'
//    float64 logits of ref.json (padded encoder inputs: the cross-attention's padding mask) to 2e-5, as
//    test_t5's full forward, and T5::logits' to 1e-5; the same when the decoder's first tokens come in
//    one call of several rows;
//  * T5::greedy (cached) gives transformers' greedy tokens and T5::greedy_recompute's;
//  * 40 decoder positions (past the relative buckets' max_distance, into their clipped range, on the relu model)
//    give the same logits as T5::logits over the whole sequence at every step;
//  * a step past the cache's positions, an empty step and a bad encoder length are refused by name.
// Tolerances: the cache changes only the summation order (a 1-row GEMM instead of a T-row one, the
// softmax over the same keys), f32 throughout on O(1) logits.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/families.h"
#include "model/inference/hf_convert.h"
#include "model/t5.h"
#include "model/t5_decode.h"
#include "tests/error_of.h"
#include "tests/model/t5_ref.h"

using namespace mpitron;
using nlohmann::json;
using mpitron::testing_util::error_of;

namespace {

using t5_test::kRef;
using t5_test::ref_json;

std::unique_ptr<T5> load(const std::string& variant) {
  const HfCheckpoint ck = read_hf_checkpoint(kRef + variant);
  return t5_from_hf(ck, hf_config(ck.config_json, 8));  // 96 divides by 8: no padding
}

Tensor row_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_ints(v, {1, static_cast<int64_t>(v.size())}, DType::I32);
}

// Logits (T, V) of T5::logits for one sample: encoder ids (its first len real), decoder ids.
std::vector<float> full_logits(T5& m, const std::vector<int64_t>& enc, int64_t len, const std::vector<int64_t>& dec) {
  T5Batch b;
  b.enc = row_tensor(enc);
  b.dec = row_tensor(dec);
  b.labels = Tensor::from_ints(std::vector<int64_t>(dec.size(), -1), {1, static_cast<int64_t>(dec.size())}, DType::I32);
  b.enc_lengths = Tensor::from_ints({len}, {1}, DType::I32);
  return m.logits(b).to_floats();
}

double max_diff(const float* a, const float* b, int64_t n) {
  double w = 0;
  for (int64_t i = 0; i < n; ++i) w = std::max(w, std::abs(double(a[i]) - double(b[i])));
  return w;
}

std::vector<int64_t> ints(const json& j) {
  std::vector<int64_t> v;
  for (const json& x : j) v.push_back(x.get<int64_t>());
  return v;
}

}  // namespace

TEST_CASE("T5 cached decoder: teacher-forced logits equal transformers' and the full forward's, token by token") {
  for (const std::string variant : {"gated", "relu"}) {
    CAPTURE(variant);
    const json ref = ref_json(variant);
    std::unique_ptr<T5> m = load(variant);
    const int64_t V = m->config().vocab_size;
    double worst_hf = 0, worst_full = 0;
    for (const json& r : ref["batches"])
      for (size_t b = 0; b < r["enc_ids"].size(); ++b) {
        CAPTURE(b);
        const std::vector<int64_t> enc = ints(r["enc_ids"][b]), dec = ints(r["dec_ids"][b]);
        const int64_t len = r["enc_lengths"][b].get<int64_t>(), T = static_cast<int64_t>(dec.size());
        const std::vector<float> full = full_logits(*m, enc, len, dec);
        for (const int64_t chunk : {int64_t{1}, int64_t{3}}) {  // the first `chunk` tokens in one call
          CAPTURE(chunk);
          T5DecodeState st(*m, row_tensor(enc), len, T);
          std::vector<float> got;
          for (int64_t t = 0; t < T; ++t) {
            if (t + 1 < chunk) continue;
            const std::vector<int64_t> in(dec.begin() + (t + 1 == chunk ? 0 : t), dec.begin() + t + 1);
            got = st.step(in);
            REQUIRE(static_cast<int64_t>(got.size()) == V);
            std::vector<float> hf;
            for (const json& x : r["logits"][b][static_cast<size_t>(t)]) hf.push_back(x.get<float>());
            worst_hf = std::max(worst_hf, max_diff(got.data(), hf.data(), V));
            worst_full = std::max(worst_full, max_diff(got.data(), full.data() + t * V, V));
          }
          CHECK(st.length() == T);
        }
      }
    MESSAGE(variant, ": cached logits vs transformers f64 ", worst_hf, ", vs the full forward ", worst_full);
    CHECK(worst_hf < 2e-5);
    CHECK(worst_full < 1e-5);
  }
}

TEST_CASE("T5 cached greedy decoding equals transformers' tokens and the full recompute's") {
  for (const std::string variant : {"gated", "relu"}) {
    CAPTURE(variant);
    const json ref = ref_json(variant);
    std::unique_ptr<T5> m = load(variant);
    for (const json& gr : ref["greedy"]) {
      const Tensor enc = row_tensor(ints(gr["input_ids"]));
      const std::vector<int64_t> want = ints(gr["output"]);
      CHECK(m->greedy(enc, enc.dim(1), 0, 1, 8) == want);
      CHECK(m->greedy_recompute(enc, enc.dim(1), 0, 1, 8) == want);
    }
    // Padded encoder input (its last 3 ids are padding the cross-attention must not see).
    const std::vector<int64_t> ids = ints(ref["greedy"][0]["input_ids"]);
    const Tensor enc = row_tensor(ids);
    const int64_t len = enc.dim(1) - 3;
    const std::vector<int64_t> a = m->greedy(enc, len, 0, 1, 12), b = m->greedy_recompute(enc, len, 0, 1, 12);
    CHECK(a == b);
    CHECK(a == m->greedy(row_tensor(std::vector<int64_t>(ids.begin(), ids.begin() + len)), len, 0, 1, 12));
  }
}

TEST_CASE("T5 cached decoder: 40 positions (past the buckets' max_distance) match the full forward at every step") {
  std::unique_ptr<T5> m = load("relu");
  const GPTConfig& c = m->config();
  REQUIRE(c.relative_attention_max_distance < 40);
  const std::vector<int64_t> enc = {17, 58, 37, 45, 16, 77, 21, 47, 84, 58, 12, 1};
  const std::vector<int64_t> toks = m->greedy_recompute(row_tensor(enc), 12, 0, -1, 39);  // no eos: 40 positions
  REQUIRE(toks.size() == 40);
  CHECK(m->greedy(row_tensor(enc), 12, 0, -1, 39) == toks);
  const std::vector<float> full = full_logits(*m, enc, 12, toks);
  T5DecodeState st(*m, row_tensor(enc), 12, 40);
  double worst = 0;
  for (int64_t t = 0; t < 40; ++t) {
    const std::vector<float> got = st.step({toks[static_cast<size_t>(t)]});
    worst = std::max(worst, max_diff(got.data(), full.data() + t * c.vocab_size, c.vocab_size));
  }
  MESSAGE("40 positions: cached vs full forward max |Δlogit| ", worst);
  CHECK(worst < 1e-5);
}

TEST_CASE("T5 cached decoder refuses steps past its positions and empty steps") {
  std::unique_ptr<T5> m = load("relu");
  T5DecodeState st(*m, row_tensor({5, 28, 56}), 3, 2);
  st.step({0, 8});
  CHECK(error_of([&] { st.step({1}); }).find("exceed its 2 positions") != std::string::npos);
  T5DecodeState st2(*m, row_tensor({5, 28, 56}), 3, 2);
  CHECK(error_of([&] { st2.step({}); }).find("0 tokens after 0") != std::string::npos);
  CHECK(error_of([&] { T5DecodeState(*m, row_tensor({5, 28, 56}), 4, 2); }).find("1 <= length <= Te") !=
        std::string::npos);
}
