// mpitron-test: np=2,4
// tests/model/test_t5_mp.cpp — T5 (model/t5.h) under model parallelism equals the same model in one
// process (computed redundantly on every rank; tests/model/test_t5.cpp checks that one against
// transformers). A 2-layer encoder and a 3-layer decoder, hidden 32, 4 heads, ffn 48, vocabulary 96,
// encoder 12 and decoder 8 tokens, f32, B = 4 with encoder lengths {12, 9, 12, 5} and some labels −1;
// two variants: T5 v1.1 (gated GELU, RMSNorm, relative position bias, no biases, untied head) and
// the original-with-extras (ReLU, LayerNorm, biases on every linear, learned positions, tied head).
//  * TP = world (2, 4: one head, 12 MLP columns, 24 vocabulary rows per rank): the loss within 1e-6
//    relative and every gradient (this rank's slice against the one-process gradient's matching
//    slice, ParamInfo::tp) within 1e-5 of that tensor's norm (+1e-7), without dropout and with hidden
//    and attention dropout 0.1 (the masks are named by global element / head, so TP draws the
//    one-process masks);
//  * the same with sequence parallelism (B·Te = 48 and B·Td = 32 rows split over the ranks);
//  * recompute (ForwardOptions::recompute) gives the loss and every gradient bit for bit, in one process
//    and under TP + SP, with dropout;
//  * DP = world: each rank the batch's B/world samples in one process, gradients summed and divided
//    by world equal the full batch's (no dropout: DP ranks draw their own masks);
//  * the cached decoder (model/t5_decode.h) under TP = world (each rank its heads' caches and its
//    vocabulary slice, gathered): every step's logits within 1e-5 of one process's, greedy tokens equal
//    one process's full recompute (a padded encoder input, 12 tokens, no end token); with sequence
//    parallelism it is refused by name;
//  * pipeline parallelism is refused by name.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "autograd/tape.h"
#include "model/t5.h"
#include "model/t5_decode.h"
#include "tests/model/mpi_test_util.h"

using namespace mpitron;

namespace {

using testing::world_rank;
using testing::world_size;

constexpr int64_t kB = 4, kTe = 12, kTd = 8, kV = 96;
constexpr uint64_t kInitSeed = 7, kDropoutSeed = 31;

GPTConfig config(bool v11) {
  GPTConfig c;
  c.t5 = true;
  c.encoder_num_layers = 2;
  c.num_layers = 5;  // 3 decoder layers
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 48;
  c.vocab_size = kV;
  c.padded_vocab_size = kV;
  c.seq_length = kTe;
  c.decoder_seq_length = kTd;
  c.compute_dtype = DType::F32;
  c.hidden_dropout = 0.1f;  // used only with ForwardOptions::train
  c.attention_dropout = 0.1f;
  if (v11) {
    c.normalization = Normalization::RMSNorm;
    c.position_embedding = PositionEmbedding::Relative;
    c.relative_attention_num_buckets = 8;
    c.relative_attention_max_distance = 16;
    c.add_bias_linear = false;
    c.mlp = MlpKind::GeGLU;
    c.untie_embeddings = true;
  } else {
    c.normalization = Normalization::LayerNorm;
    c.position_embedding = PositionEmbedding::Learned;
    c.max_position_embeddings = 16;
    c.add_bias_linear = true;
    c.mlp = MlpKind::ReLU;
    c.untie_embeddings = false;
  }
  return c;
}

// Samples [first, first + n) of the batch below.
// Every sample has exactly 6 counted labels (two −1 each, at different places): the loss is the mean
// over a micro-batch's counted labels, so the DP ranks' mean of their micro-batch means equals the
// full batch's mean only when every rank counts the same number of labels.
T5Batch batch(int64_t first = 0, int64_t n = kB) {
  const std::vector<int64_t> lengths{12, 9, 12, 5};
  std::mt19937 rng(2024);
  std::vector<int64_t> enc, dec, lab, len;
  for (int64_t b = 0; b < kB; ++b) {
    std::vector<int64_t> e(kTe), d(kTd), l(kTd);
    for (int64_t t = 0; t < kTe; ++t) e[t] = t < lengths[b] ? static_cast<int64_t>(rng() % kV) : 0;
    for (int64_t t = 0; t < kTd; ++t) d[t] = static_cast<int64_t>(rng() % kV), l[t] = static_cast<int64_t>(rng() % kV);
    l[static_cast<size_t>(b)] = l[static_cast<size_t>(kTd - 1 - b)] = -1;  // two distinct places for b < 4
    if (b < first || b >= first + n) continue;
    enc.insert(enc.end(), e.begin(), e.end());
    dec.insert(dec.end(), d.begin(), d.end());
    lab.insert(lab.end(), l.begin(), l.end());
    len.push_back(lengths[b]);
  }
  T5Batch out;
  out.enc = Tensor::from_ints(enc, {n, kTe}, DType::I32);
  out.dec = Tensor::from_ints(dec, {n, kTd}, DType::I32);
  out.labels = Tensor::from_ints(lab, {n, kTd}, DType::I32);
  out.enc_lengths = Tensor::from_ints(len, {n}, DType::I32);
  return out;
}

std::string variant(bool v11) { return v11 ? "v1.1 (GeGLU, RMSNorm, relative)" : "ReLU, LayerNorm, biases, learned"; }

ForwardOptions options(bool train, bool recompute = false) {
  ForwardOptions o;
  o.train = train;
  o.recompute = recompute;
  o.dropout_seed = kDropoutSeed;
  return o;
}

struct Run {
  double loss = 0;
  std::vector<float> grads;
};

Run run(T5& m, const T5Batch& b, const ForwardOptions& o) {
  m.params().zero_grad();
  Tape tape;
  Var loss = m.forward(tape, b, o);
  Run r;
  r.loss = loss.value().item();
  tape.backward(loss);
  r.grads = m.params().grads().to(Device::cpu()).to_floats();
  return r;
}

std::unique_ptr<T5> model(const GPTConfig& c, const ModelParallel& mp = {}) {
  auto m = std::make_unique<T5>(c, Device::cpu(), mp);
  m->init_weights(kInitSeed);
  return m;
}

// This rank's gradient of every parameter against the matching slice of the one-process gradient:
// ‖slice difference‖₂ <= 1e-5·‖one-process tensor‖₂ + 1e-7. Returns the worst difference / norm.
double compare_grads(const ParamSet& ps, const std::vector<float>& g, const ParamSet& ref_ps,
                     const std::vector<float>& rg) {
  REQUIRE(ps.infos().size() == ref_ps.infos().size());
  double worst = 0;
  for (const ParamInfo& p : ps.infos()) {
    CAPTURE(p.name);
    const ParamInfo& q = ref_ps.info(p.name);
    REQUIRE(p.global_shape == q.shape);
    double n2 = 0, d2 = 0;
    for (int64_t i = 0; i < q.numel(); ++i) n2 += double(rg[static_cast<size_t>(q.offset + i)]) * rg[static_cast<size_t>(q.offset + i)];
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double d = double(g[static_cast<size_t>(p.offset + i)]) - rg[static_cast<size_t>(q.offset + global_element(p, i))];
      d2 += d * d;
    }
    const double norm = std::sqrt(n2), diff = std::sqrt(d2);
    CHECK_MESSAGE(diff <= 1e-5 * norm + 1e-7, p.name, ": |grad − one process| ", diff, " vs |grad| ", norm);
    if (norm > 0) worst = std::max(worst, diff / norm);
  }
  return worst;
}

double max_over_ranks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// The one-process model's run, which must have a gradient in every tensor that the batch reaches.
Run reference(const GPTConfig& c, const T5Batch& b, const ForwardOptions& o, std::unique_ptr<T5>& m) {
  m = model(c);
  Run r = run(*m, b, o);
  double total = 0;
  for (float x : r.grads) total += double(x) * x;
  REQUIRE(std::isfinite(r.loss));
  REQUIRE(total > 0);
  return r;
}

}  // namespace

TEST_CASE("T5: tensor parallelism (with and without sequence parallelism and dropout) equals one process") {
  const int world = world_size(), rank = world_rank();
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  const T5Batch b = batch();
  for (const bool v11 : {true, false}) {
    const GPTConfig c = config(v11);
    double no_dropout_loss = 0;
    for (const bool train : {false, true}) {
      std::unique_ptr<T5> ref;
      const Run want = reference(c, b, options(train), ref);
      if (!train) no_dropout_loss = want.loss;
      else CHECK(std::abs(want.loss - no_dropout_loss) > 1e-4);  // the dropout masks do something
      for (const bool sp : {false, true}) {
        CAPTURE(v11);
        CAPTURE(train);
        CAPTURE(sp);
        ModelParallel mp;
        mp.tp = TensorParallel{comm.get(), world, rank, sp};
        auto m = model(c, mp);
        const Run got = run(*m, b, options(train));
        const double dl = std::abs(got.loss - want.loss) / std::abs(want.loss);
        CHECK_MESSAGE(dl <= 1e-6, "loss ", got.loss, " vs one process ", want.loss);
        const double dg = compare_grads(m->params(), got.grads, ref->params(), want.grads);
        const double wl = max_over_ranks(dl), wg = max_over_ranks(dg);
        if (rank == 0)
          MESSAGE(variant(v11), " TP", world, std::string(sp ? "+SP" : ""), std::string(train ? " dropout" : ""), ": loss rel diff ", wl, ", worst |dgrad|/|grad| ", wg);
      }
    }
  }
}

TEST_CASE("T5: recompute gives the same loss and gradients bit for bit (one process and TP + SP, dropout)") {
  const int world = world_size(), rank = world_rank();
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  const T5Batch b = batch();
  for (const bool v11 : {true, false}) {
    CAPTURE(v11);
    const GPTConfig c = config(v11);
    for (const int tp : {1, world}) {
      CAPTURE(tp);
      ModelParallel mp;
      if (tp > 1) mp.tp = TensorParallel{comm.get(), world, rank, true};
      auto m = model(c, mp);
      const Run plain = run(*m, b, options(true, false));
      const Run again = run(*m, b, options(true, true));
      CHECK(plain.loss == again.loss);
      REQUIRE(plain.grads.size() == again.grads.size());
      size_t differ = 0;
      for (size_t i = 0; i < plain.grads.size(); ++i) differ += std::memcmp(&plain.grads[i], &again.grads[i], sizeof(float)) != 0;
      CHECK_MESSAGE(differ == 0, differ, " of ", plain.grads.size(), " gradient elements differ with recompute");
    }
  }
}

TEST_CASE("T5: data parallelism (the batch split over the ranks, gradients averaged) equals the full batch") {
  const int world = world_size(), rank = world_rank();
  REQUIRE(kB % world == 0);
  const int64_t per = kB / world;
  for (const bool v11 : {true, false}) {
    CAPTURE(v11);
    const GPTConfig c = config(v11);
    std::unique_ptr<T5> ref;
    const Run want = reference(c, batch(), options(false), ref);
    const T5Batch mine = batch(rank * per, per);
    int counted = 0, lo = 0, hi = 0;  // the equal-count premise of the comparison (batch() above)
    for (float v : mine.labels.to_floats()) counted += v >= 0;
    MPI_Allreduce(&counted, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&counted, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    REQUIRE(lo == hi);
    auto m = model(c);
    Run got = run(*m, mine, options(false));
    double loss = 0;
    MPI_Allreduce(&got.loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    loss /= world;
    std::vector<float> sum(got.grads.size());
    MPI_Allreduce(got.grads.data(), sum.data(), static_cast<int>(sum.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (float& x : sum) x /= static_cast<float>(world);
    const double dl = std::abs(loss - want.loss) / std::abs(want.loss);
    CHECK_MESSAGE(dl <= 1e-6, "mean loss ", loss, " vs full batch ", want.loss);
    const double dg = max_over_ranks(compare_grads(m->params(), sum, ref->params(), want.grads));
    if (rank == 0) MESSAGE(variant(v11), " DP", world, ": loss rel diff ", dl, ", worst |dgrad|/|grad| ", dg);
  }
}

TEST_CASE("T5: pipeline parallelism is refused by name") {
  ModelParallel mp;
  mp.pp_size = 2, mp.pp_rank = world_rank() % 2;
  CHECK_THROWS_WITH_AS(T5(config(true), Device::cpu(), mp), doctest::Contains("--pipeline-model-parallel-size"), Error);
}

TEST_CASE("T5: the cached decoder under tensor parallelism equals one process (logits per step, greedy tokens)") {
  const int world = world_size(), rank = world_rank();
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  const std::vector<int64_t> ids{5, 17, 33, 2, 90, 41, 8, 63, 12, 70, 3, 1};
  const Tensor enc = Tensor::from_ints(ids, {1, 12}, DType::I32);
  for (const bool v11 : {true, false}) {
    CAPTURE(v11);
    const GPTConfig c = config(v11);
    auto one = model(c);
    const std::vector<int64_t> want = one->greedy_recompute(enc, 9, 0, -1, 12);  // keys 9 … 11: padding
    REQUIRE(want.size() == 13);
    ModelParallel mp;
    mp.tp = TensorParallel{comm.get(), world, rank, false};
    auto m = model(c, mp);
    CHECK(m->greedy(enc, 9, 0, -1, 12) == want);
    T5DecodeState a(*one, enc, 9, 12), b(*m, enc, 9, 12);
    double worst = 0;
    for (size_t t = 0; t + 1 < want.size(); ++t) {
      const std::vector<float> x = a.step({want[t]}), y = b.step({want[t]});
      REQUIRE(x.size() == y.size());
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - double(y[i])));
    }
    CHECK_MESSAGE(worst <= 1e-5, "max |logit TP", world, " − one process| ", worst);
    const double w = max_over_ranks(worst);
    if (rank == 0) MESSAGE(variant(v11), " cached decoder TP", world, ": max |Δlogit| ", w);
    ModelParallel sp = mp;
    sp.tp.sequence_parallel = true;
    auto s = model(c, sp);
    bool refused = false;
    try {
      T5DecodeState bad(*s, enc, 9, 12);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("without sequence parallelism") != std::string::npos;
    }
    CHECK(refused);
  }
}
