// mpitron-test: np=2
// tests/model/test_bert_mp.cpp — BERT (model/bert.h) under model parallelism equals one
// process: tensor parallelism 2 (the vocab-parallel tied decoder and its bias, the
// replicated MLM head, pooler and binary head) and pipeline parallelism 2 (stage 0:
// embeddings and layer 0; stage 1: layer 1 and the heads, with a copy of the tied
// wte whose gradient adds to stage 0's). Loss and every gradient element within 1e-5
// (relative to the largest gradient of its tensor).
//
// Attention is causal and the samples unpadded until the attention op's mask is
// merged (tests/model/test_bert.cpp, model/layers/attention_layer.cpp).
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "data/bert_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "model/bert.h"
#include "tests/data/data_test_util.h"
#include "tests/model/mpi_test_util.h"

using namespace mpitron;

namespace {

GPTConfig config(bool post_ln, bool binary_head = true) {
  GPTConfig c;
  c.bert = true;
  c.post_ln = post_ln;
  c.binary_head = binary_head;
  c.num_tokentypes = binary_head ? 2 : 0;
  c.causal = false;  // bidirectional, as BERT
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.max_position_embeddings = 32;
  c.vocab_size = 1000;
  c.padded_vocab_size = 1024;
  c.hidden_dropout = 0.1f;  // dropout masks are drawn by global element: TP/PP draw the one-process masks
  c.attention_dropout = 0.0f;
  return c;
}

BertBatch batch_of(const GPTConfig& c) {
  data::WordPieceTokenizer tok(testing::source_path("tests/data/ref/bert_uncased/vocab.txt"), true);
  auto d = std::make_shared<const data::IndexedDataset>(
      testing::source_path("tests/data/ref/bert_ds/wiki_text_sentence"));
  data::BertDatasetConfig cfg;
  cfg.seq_length = c.binary_head ? c.seq_length : c.seq_length + 1;  // one [SEP] less without B
  cfg.binary_head = c.binary_head;
  cfg.short_seq_prob = 0.0;
  cfg.num_samples = 100;
  data::BertDataset ds(d, {0, d->document_count()}, data::BertVocab::from(tok), cfg);
  std::vector<data::BertSample> v;
  for (int64_t i = 0; i < ds.size() && v.size() < 4; ++i) {
    data::BertSample s = ds.sample(i);
    if (s.length != c.seq_length) continue;
    for (auto* vec : {&s.tokens, &s.types, &s.labels}) vec->resize(static_cast<size_t>(c.seq_length));
    for (int32_t& t : s.tokens) t %= static_cast<int32_t>(c.vocab_size);
    for (int32_t& t : s.labels) t = t < 0 ? t : t % static_cast<int32_t>(c.vocab_size);
    v.push_back(std::move(s));
  }
  REQUIRE(v.size() == 4);
  return BertBatch::from(v);
}

// The one-process gradients, loss.
struct Reference {
  std::vector<float> grads;
  double loss = 0;
  std::unique_ptr<Bert> model;
};
Reference reference(const GPTConfig& c, const BertBatch& b, const ForwardOptions& o) {
  Reference r;
  r.model = std::make_unique<Bert>(c, Device::cpu());
  r.model->init_weights(5);
  Tape t;
  Var loss = r.model->forward(t, b, o);
  r.loss = loss.value().item();
  t.backward(loss);
  r.grads = r.model->params().grads().to_floats();
  return r;
}

// Every element of this rank's parameter `name` against the one-process gradient.
void compare(const ParamSet& ps, const std::vector<float>& g, const ParamSet& ref_ps, const std::vector<float>& rg,
             const std::string& name) {
  CAPTURE(name);
  const ParamInfo& p = ps.info(name);
  const ParamInfo& q = ref_ps.info(name);
  double num = 0, den = 1e-30;
  for (int64_t i = 0; i < p.numel(); ++i) {
    const double want = rg[static_cast<size_t>(q.offset + global_element(p, i))];
    num = std::max(num, std::fabs(g[static_cast<size_t>(p.offset + i)] - want));
    den = std::max(den, std::fabs(want));
  }
  CHECK(num / den < 1e-5);
}

}  // namespace

TEST_CASE("Bert: tensor parallel 2 (and sequence parallel) equals one process (loss and every gradient)") {
  REQUIRE(testing::world_size() == 2);
  const int rank = testing::world_rank();
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  for (const int variant : {0, 1, 2}) {  // post-LN; pre-LN; pre-LN, sequence parallel, no binary head
    CAPTURE(variant);
    const bool post_ln = variant == 0, sp = variant == 2;
    const GPTConfig c = config(post_ln, !sp);
    const BertBatch b = batch_of(c);
    ForwardOptions o;
    o.dropout_seed = 17;
    const Reference ref = reference(c, b, o);
    ModelParallel mp;
    mp.tp = TensorParallel{comm.get(), 2, rank, sp};
    Bert m(c, Device::cpu(), mp);
    m.init_weights(5);
    Tape t;
    Var loss = m.forward(t, b, o);
    CHECK(std::fabs(loss.value().item() - ref.loss) < 1e-5);
    t.backward(loss);
    const std::vector<float> g = m.params().grads().to_floats();
    for (const ParamInfo& p : m.params().infos()) compare(m.params(), g, ref.model->params(), ref.grads, p.name);
  }
}

TEST_CASE("Bert: sequence parallelism with the binary head is refused by name") {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  ModelParallel mp;
  mp.tp = TensorParallel{comm.get(), 2, testing::world_rank(), true};
  CHECK_THROWS_WITH(Bert(config(false), Device::cpu(), mp), doctest::Contains("--bert-no-binary-head"));
}

TEST_CASE("Bert: pipeline parallel 2 equals one process (loss and every gradient)") {
  REQUIRE(testing::world_size() == 2);
  const int rank = testing::world_rank();
  const GPTConfig c = config(true);
  const BertBatch b = batch_of(c);
  ForwardOptions o;
  o.dropout_seed = 23;
  const Reference ref = reference(c, b, o);
  ModelParallel mp;
  mp.pp_size = 2, mp.pp_rank = rank;
  Bert m(c, Device::cpu(), mp);
  m.init_weights(5);
  const Shape act = m.core().activation_shape(b.tokens.dim(0));
  const int n = static_cast<int>(shape_numel(act));
  Tape t;
  if (rank == 0) {
    Var out = m.chunk_forward(t, 0, b, Var(), o);
    std::vector<float> h = out.value().to_floats(), dh(h.size());
    MPI_Send(h.data(), n, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
    MPI_Recv(dh.data(), n, MPI_FLOAT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    t.backward(out, Tensor::from_vector(dh, act, DType::F32));
  } else {
    std::vector<float> h(static_cast<size_t>(n));
    MPI_Recv(h.data(), n, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    Var in(Tensor::from_vector(h, act, DType::F32), true);
    Var loss = m.chunk_forward(t, 0, b, in, o);
    CHECK(std::fabs(loss.value().item() - ref.loss) < 1e-5);
    t.backward(loss);
    const std::vector<float> dh = in.grad().to_floats();
    MPI_Send(dh.data(), n, MPI_FLOAT, 0, 1, MPI_COMM_WORLD);
  }
  std::vector<float> g = m.params().grads().to_floats();
  // The tied word embedding: stage 0's and stage 1's gradients add up (the embedding group).
  const ParamInfo& wte = m.params().info("wte");
  std::vector<float> sum(static_cast<size_t>(wte.numel()));
  MPI_Allreduce(g.data() + wte.offset, sum.data(), static_cast<int>(wte.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  std::copy(sum.begin(), sum.end(), g.begin() + wte.offset);
  int count = 0;
  for (const ParamInfo& p : m.params().infos()) {
    compare(m.params(), g, ref.model->params(), ref.grads, p.name);
    ++count;
  }
  // Stage 0: wte, wpe, tokentype, emb_ln (2), layer 0 (12); stage 1: layer 1, the heads (9), wte's copy.
  CHECK(count == (rank == 0 ? 17 : 22));
}
