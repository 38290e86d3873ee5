// tests/model/test_bert.cpp — BERT (model/bert.h) on the bundled sentence-level data
// (tests/data/ref/bert_ds, the uncased WordPiece vocab): the MLM and sentence-order
// losses start where an untrained model must (ln V, ln 2) and fall when the model
// fits a batch; every BERT-specific parameter's gradient equals central finite
// differences of the loss (post-LN and pre-LN, with and without the binary head).
//
// Attention is bidirectional (cfg.causal = false), as BERT's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "data/bert_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "model/bert.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using data::BertDataset;
using data::BertDatasetConfig;
using data::BertSample;
using data::BertVocab;
using data::IndexedDataset;
using data::WordPieceTokenizer;

namespace {

const WordPieceTokenizer& tok() {
  static WordPieceTokenizer t(mpitron::testing::source_path("tests/data/ref/bert_uncased/vocab.txt"), true);
  return t;
}

// B unpadded samples of T tokens (length == T). Without the binary head a full
// sample is one token shorter than the dataset's sequence (one [SEP]): cut there.
std::vector<BertSample> unpadded_samples(int64_t B, int64_t T, bool binary_head) {
  auto ds_data = std::make_shared<const IndexedDataset>(
      mpitron::testing::source_path("tests/data/ref/bert_ds/wiki_text_sentence"));
  BertDatasetConfig cfg;
  cfg.seq_length = binary_head ? T : T + 1;
  cfg.binary_head = binary_head;
  cfg.short_seq_prob = 0.0;
  cfg.num_samples = 200;
  BertDataset ds(ds_data, {0, ds_data->document_count()}, BertVocab::from(tok()), cfg);
  std::vector<BertSample> v;
  for (int64_t i = 0; i < ds.size() && static_cast<int64_t>(v.size()) < B; ++i) {
    BertSample s = ds.sample(i);
    if (s.length != T) continue;
    for (auto* vec : {&s.tokens, &s.types, &s.labels}) vec->resize(static_cast<size_t>(T));
    v.push_back(std::move(s));
  }
  REQUIRE(static_cast<int64_t>(v.size()) == B);
  return v;
}

GPTConfig bert_config(bool post_ln, bool binary_head) {
  GPTConfig c;
  c.bert = true;
  c.post_ln = post_ln;
  c.binary_head = binary_head;
  c.num_tokentypes = binary_head ? 2 : 0;  // pretrain_bert.py: 2 with the binary head
  c.causal = false;                        // bidirectional, as BERT
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.max_position_embeddings = 32;
  c.vocab_size = tok().vocab_size();
  c.padded_vocab_size = (c.vocab_size + 127) / 128 * 128;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

double loss_of(Bert& m, const BertBatch& b) {
  Tape t;
  t.set_recording(false);
  ForwardOptions o;
  o.train = false;
  return m.forward(t, b, o).value().item();
}

}  // namespace

TEST_CASE("Bert: MLM and sentence-order losses start at ln V and ln 2 and fall when fitting a batch") {
  const GPTConfig c = bert_config(true, true);
  Bert m(c, Device::cpu());
  m.init_weights(1234);
  const BertBatch batch = BertBatch::from(unpadded_samples(8, c.seq_length, true));
  CHECK(!batch.padded());
  const ParamSet& ps = m.params();
  const int64_t n = ps.numel();
  std::vector<float> w = ps.values().to_floats(), mom(static_cast<size_t>(n)), var(static_cast<size_t>(n));
  std::vector<double> lm, sop;
  const float lr = 6e-3f, b1 = 0.9f, b2 = 0.999f;
  for (int step = 1; step <= 80; ++step) {
    ps.zero_grad();
    Tape t;
    ForwardOptions o;
    o.train = false;
    Var loss = m.forward(t, batch, o);
    lm.push_back(m.last_losses().lm);
    sop.push_back(m.last_losses().sop);
    CHECK(std::fabs(loss.value().item() - (lm.back() + sop.back())) < 1e-5);
    t.backward(loss);
    const std::vector<float> g = ps.grads().to_floats();
    for (size_t i = 0; i < w.size(); ++i) {  // Adam
      mom[i] = b1 * mom[i] + (1 - b1) * g[i];
      var[i] = b2 * var[i] + (1 - b2) * g[i] * g[i];
      const float mh = mom[i] / (1 - std::pow(b1, step)), vh = var[i] / (1 - std::pow(b2, step));
      w[i] -= lr * mh / (std::sqrt(vh) + 1e-8f);
    }
    ps.values().copy_from(Tensor::from_vector(w, {n}, DType::F32));
  }
  MESSAGE("lm loss ", lm.front(), " -> ", lm.back(), ", sop loss ", sop.front(), " -> ", sop.back());
  CHECK(std::fabs(lm.front() - std::log(static_cast<double>(c.padded_vocab_size))) < 0.3);
  CHECK(std::fabs(sop.front() - std::log(2.0)) < 0.1);
  CHECK(lm.back() < lm.front() - 2.0);
  // With bidirectional attention [CLS] sees both segments: the binary head fits the
  // batch's labels, below the entropy of the labels alone (what a causal [CLS] reaches).
  double ones = 0;
  for (float v : batch.is_random.to_floats()) ones += v;
  const double q = ones / 8, prior = -(q * std::log(q) + (1 - q) * std::log(1 - q));
  MESSAGE("sop loss ", sop.back(), " vs the labels' entropy ", prior);
  CHECK(sop.back() < 0.5 * std::log(2.0));
  CHECK(sop.back() < prior - 0.05);
}

TEST_CASE("Bert: BERT parameters' gradients equal central finite differences of the loss") {
  for (const bool post_ln : {true, false})
    for (const bool binary : {true, false}) {
      CAPTURE(post_ln);
      CAPTURE(binary);
      const GPTConfig c = bert_config(post_ln, binary);
      Bert m(c, Device::cpu());
      m.init_weights(7);
      const BertBatch batch = BertBatch::from(unpadded_samples(3, c.seq_length, binary));
      const ParamSet& ps = m.params();
      ps.zero_grad();
      Tape t;
      ForwardOptions o;
      o.train = false;
      Var loss = m.forward(t, batch, o);
      t.backward(loss);
      const std::vector<float> g = ps.grads().to_floats(), w0 = ps.values().to_floats();
      int checked = 0;
      for (const ParamSpec& spec : outer_param_table(c)) {
        CAPTURE(spec.name);
        const ParamInfo& info = ps.info(spec.name);
        // The element with the largest gradient (a well-conditioned difference).
        int64_t best = info.offset;
        for (int64_t i = info.offset; i < info.offset + info.numel(); ++i)
          if (std::fabs(g[static_cast<size_t>(i)]) > std::fabs(g[static_cast<size_t>(best)])) best = i;
        const float eps = 1e-2f;
        auto at = [&](float d) {
          std::vector<float> w = w0;
          w[static_cast<size_t>(best)] += d;
          ps.values().copy_from(Tensor::from_vector(w, {ps.numel()}, DType::F32));
          return loss_of(m, batch);
        };
        const double fd = (at(eps) - at(-eps)) / (2 * eps), an = g[static_cast<size_t>(best)];
        CHECK(std::fabs(an) > 1e-4);
        CHECK(std::fabs(fd - an) < 2e-3 + 0.03 * std::fabs(an));
        ++checked;
      }
      ps.values().copy_from(Tensor::from_vector(w0, {ps.numel()}, DType::F32));
      CHECK(checked == static_cast<int>(outer_param_table(c).size()));
    }
}

TEST_CASE("Bert: the family's parameter table, its validation and FLOP count") {
  GPTConfig c = bert_config(true, true);
  CHECK(c.family() == "bert");
  std::vector<std::string> names;
  for (const ParamSpec& s : outer_param_table(c)) names.push_back(s.name);
  CHECK(names == std::vector<std::string>{"wte", "wpe", "tokentype_embeddings", "emb_ln.weight", "emb_ln.bias",
                                          "lm_head.dense.weight", "lm_head.dense.bias", "lm_head.ln.weight",
                                          "lm_head.ln.bias", "lm_head.bias", "pooler.dense.weight",
                                          "pooler.dense.bias", "binary_head.weight", "binary_head.bias"});
  for (const ParamSpec& s : outer_param_table(c)) {
    CAPTURE(s.name);
    const bool vocab = s.name == "wte" || s.name == "lm_head.bias";
    CHECK(s.tp_axis == (vocab ? 0 : -1));  // the decoder is vocab-parallel, the rest replicated
  }
  const GPTConfig pre = bert_config(false, false);  // pre-LN: lnf, no emb_ln; no binary head: no token types
  names.clear();
  for (const ParamSpec& s : outer_param_table(pre)) names.push_back(s.name);
  CHECK(names == std::vector<std::string>{"wte", "wpe", "lnf.weight", "lnf.bias", "lm_head.dense.weight",
                                          "lm_head.dense.bias", "lm_head.ln.weight", "lm_head.ln.bias",
                                          "lm_head.bias"});
  // Bidirectional attention counts the whole score square.
  GPTConfig bi = c, causal = c;
  bi.causal = false;
  causal.causal = true;
  CHECK(bi.flops_per_token() - causal.flops_per_token() ==
        doctest::Approx(6.0 * c.num_layers * c.seq_length * c.hidden_size));
  GPTConfig bad = c;
  bad.normalization = Normalization::RMSNorm;
  CHECK_THROWS_WITH(bad.validate(), doctest::Contains("post-LN"));
  bad = c;
  bad.untie_embeddings = true;
  CHECK_THROWS_WITH(bad.validate(), doctest::Contains("--untie-embeddings-and-output-weights"));
  GPTConfig gpt;
  gpt.causal = false;
  CHECK_THROWS_WITH(gpt.validate(), doctest::Contains("BERT's"));
}
