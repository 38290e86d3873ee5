// tests/model/test_block_families.cpp — the hand-written block (model/block.h) of
// each family against the same block composed from fine-grained differentiable
// ops (autograd/functions.h, each conformance-tested against float64 in tests/):
// output, input gradient and every parameter gradient. And the split backward:
// with deferred weight gradients the input part alone leaves the parameter
// gradients untouched, and running the deferred work gives exactly the unsplit ones.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "autograd/functions.h"
#include "model/block.h"
#include "model/layers/attention_layer.h"
#include "model/layers/mlp_layer.h"
#include "model/gpt.h"
#include "tensor/ops.h"

using namespace mpitron;

namespace {

GPTConfig family(const std::string& name) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.max_position_embeddings = 8;
  c.vocab_size = 50;
  c.padded_vocab_size = 64;
  c.hidden_dropout = 0.1f;
  c.attention_dropout = 0.0f;  // the composed ag::causal_attention has none
  if (name == "llama") {
    c.normalization = Normalization::RMSNorm;
    c.mlp = MlpKind::SwiGLU;
    c.ffn_hidden_size = 48;
    c.position_embedding = PositionEmbedding::Rope;
    c.rotary_base = 500.0;
    c.num_query_groups = 2;
    c.untie_embeddings = true;
    c.add_bias_linear = false;
  } else if (name == "bert" || name == "bert-pre-ln") {
    c.bert = true;
    c.post_ln = name == "bert";
    if (name == "bert") c.mlp = MlpKind::GeluErf;  // HF BERT's erf GELU in the post-LN block (pre-LN keeps tanh)
    c.num_tokentypes = 2;
    c.causal = false;  // bidirectional attention
  } else if (name == "partial-rope-mqa") {
    c.normalization = Normalization::RMSNorm;
    c.position_embedding = PositionEmbedding::Rope;
    c.rotary_percent = 0.5;
    c.num_query_groups = 1;
  }
  return c;
}

Tensor random_tensor(const Shape& s, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (float& x : v) x = d(rng);
  return Tensor::from_vector(v, s, DType::F32);
}

// The block of layer l written with fine-grained ops.
Var composed_block(Tape& tape, const GPTConfig& c, const BlockParams& p, const Var& x, int64_t B, int64_t T,
                   uint64_t seed, uint64_t offset) {
  const int64_t N = B * T, C = c.hidden_size, NH = c.num_attention_heads, G = c.query_groups();
  auto norm = [&](const Var& in, const NormParams& n) {
    return c.normalization == Normalization::RMSNorm ? ag::rmsnorm(tape, in, n.w, c.layernorm_epsilon)
                                                     : ag::layernorm(tape, in, n.w, n.b, c.layernorm_epsilon);
  };
  if (c.post_ln) {  // x2 = LN1(x + drop(attn(x))), y = LN2(x2 + drop(mlp(x2)))
    Var qkv = ag::linear(tape, x, p[ParamRole::QkvWeight], p[ParamRole::QkvBias]);
    Var att = ag::attention(tape, qkv, B, T, NH, G, AttentionMask{c.causal, Tensor()});
    Var a = ag::dropout(tape, ag::linear(tape, att, p[ParamRole::ProjWeight], p[ParamRole::ProjBias]), c.hidden_dropout, seed, offset);
    Var x2 = norm(ag::add(tape, x, a), NormParams{p[ParamRole::Norm1Weight], p[ParamRole::Norm1Bias]});
    Var g = ag::gelu(tape, ag::linear(tape, x2, p[ParamRole::FcWeight], p[ParamRole::FcBias]), c.gelu_erf());
    Var m = ag::dropout(tape, ag::linear(tape, g, p[ParamRole::MlpProjWeight], p[ParamRole::MlpProjBias]), c.hidden_dropout, seed,
                        offset + static_cast<uint64_t>(N * C));
    return norm(ag::add(tape, x2, m), NormParams{p[ParamRole::Norm2Weight], p[ParamRole::Norm2Bias]});
  }
  Var qkv = ag::linear(tape, norm(x, NormParams{p[ParamRole::Norm1Weight], p[ParamRole::Norm1Bias]}), p[ParamRole::QkvWeight], p[ParamRole::QkvBias]);
  if (c.position_embedding == PositionEmbedding::Rope) {
    RopeArgs r;
    r.base = c.rotary_base;
    r.percent = c.rotary_percent;
    qkv = ag::rope(tape, qkv, B, T, NH + 2 * G, NH + G, r);
  }
  Var att = ag::attention(tape, qkv, B, T, NH, G, AttentionMask{c.causal, Tensor()});
  Var a = ag::dropout(tape, ag::linear(tape, att, p[ParamRole::ProjWeight], p[ParamRole::ProjBias]), c.hidden_dropout, seed, offset);
  Var x2 = ag::add(tape, x, a);
  Var fc = ag::linear(tape, norm(x2, NormParams{p[ParamRole::Norm2Weight], p[ParamRole::Norm2Bias]}), p[ParamRole::FcWeight], p[ParamRole::FcBias]);
  Var g = c.mlp == MlpKind::SwiGLU ? ag::swiglu(tape, fc) : ag::gelu(tape, fc, c.gelu_erf());
  Var m = ag::dropout(tape, ag::linear(tape, g, p[ParamRole::MlpProjWeight], p[ParamRole::MlpProjBias]), c.hidden_dropout, seed,
                      offset + static_cast<uint64_t>(N * C));
  return ag::add(tape, x2, m);
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  REQUIRE(x.size() == y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(x[i]) - y[i]));
    den = std::max(den, std::fabs(static_cast<double>(y[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace

TEST_CASE("block: the hand-written backward equals the block composed from fine-grained ops, per family") {
  for (const std::string name : {"gpt2", "llama", "partial-rope-mqa", "bert", "bert-pre-ln"}) {
    CAPTURE(name);
    const GPTConfig c = family(name);
    GPT model(c, Device::cpu());
    model.init_weights(7);
    const int64_t B = 2, T = c.seq_length, C = c.hidden_size, l = 1;
    const BlockParams& p = model.block_params(l);
    CHECK(p.count() == static_cast<int64_t>(block_param_table(c, l).size()));
    const Tensor xv = random_tensor({B * T, C}, 11), dy = random_tensor({B * T, C}, 12);
    const uint64_t seed = 99, offset = 1000;
    const BlockShape s = block_shape(c, B, T, TensorParallel{}, true, l);
    CHECK((p.spec->branches[0].place == NormPlace::AfterResidual) == (name == "bert"));
    CHECK((static_cast<const DenseMlp*>(p.spec->find("mlp"))->spec().kind == MlpKind::GeluErf) == (name == "bert"));
    const ParamSet& ps = model.params();

    // Hand-written.
    ps.zero_grad();
    Var x1(xv.clone(), true);
    Tape t1;
    Var y1 = block(t1, s, p, x1, seed, offset, false);
    t1.backward(y1, dy);
    const Tensor g1 = ps.grads().clone(), dx1 = x1.grad().clone();

    // Composed.
    ps.zero_grad();
    Var x2(xv.clone(), true);
    Tape t2;
    Var y2 = composed_block(t2, c, p, x2, B, T, seed, offset);
    t2.backward(y2, dy);
    CHECK(max_rel(y1.value(), y2.value()) < 1e-6);
    CHECK(max_rel(dx1, x2.grad()) < 2e-5);
    for (const ParamSpec& spec : block_param_table(c, l)) {
      const ParamInfo& info = ps.info(spec.name);
      CAPTURE(spec.name);
      const Tensor a = g1.flat_range(info.offset, info.numel()), b = ps.grads().flat_range(info.offset, info.numel());
      CHECK(max_rel(a, b) < 2e-5);
    }
  }
}

TEST_CASE("block: BERT's attention is bidirectional — a later token changes an earlier one's output") {
  GPTConfig c = family("bert");
  c.hidden_dropout = 0.0f;
  GPT model(c, Device::cpu());
  model.init_weights(1);
  const BlockShape s = block_shape(c, 1, c.seq_length, TensorParallel{}, false, 0);
  CHECK(static_cast<const SelfAttention*>(model.block_params(0).spec->find("self_attention"))->spec().mask ==
        AttentionMaskKind::Padding);
  Tensor x = random_tensor({c.seq_length, c.hidden_size}, 2), x2 = x.clone();
  x2.flat_range((c.seq_length - 1) * c.hidden_size, c.hidden_size).fill(1.0f);  // change the last token only
  Tape t;
  NoGradGuard g(t);
  const std::vector<float> y1 = block(t, s, model.block_params(0), Var(x), 1, 0, false).value().to_floats();
  const std::vector<float> y2 = block(t, s, model.block_params(0), Var(x2), 1, 0, false).value().to_floats();
  CHECK(y1[0] != y2[0]);  // token 0 attends to the last token
}

TEST_CASE("block: split backward — input part defers exactly the weight gradients") {
  for (const std::string name : {"gpt2", "llama", "bert"}) {
    CAPTURE(name);
    const GPTConfig c = family(name);
    GPT model(c, Device::cpu());
    model.init_weights(3);
    const int64_t B = 2, T = c.seq_length, C = c.hidden_size;
    const Tensor xv = random_tensor({B * T, C}, 5), dy = random_tensor({B * T, C}, 6);
    const BlockShape s = block_shape(c, B, T, TensorParallel{}, true, 0);
    const ParamSet& ps = model.params();
    for (const bool recompute : {false, true}) {
      CAPTURE(recompute);
      ps.zero_grad();
      Var x1(xv.clone(), true);
      Tape t1;
      Var y1 = block(t1, s, model.block_params(0), x1, 1, 0, recompute);
      t1.backward(y1, dy);
      const Tensor whole = ps.grads().clone();

      ps.zero_grad();
      Var x2(xv.clone(), true);
      Tape t2;
      WeightGradWork w;
      t2.set_defer_weight_grads(&w);
      int ready = 0;
      Var y2 = block(t2, s, model.block_params(0), x2, 1, 0, recompute, [&] { ++ready; });
      t2.backward(y2, dy);
      CHECK(ready == 0);  // the block's gradients are not final before W
      CHECK(max_rel(x1.grad(), x2.grad()) == 0.0);
      const std::vector<float> before = ps.grads().to_floats();
      CHECK(std::count(before.begin(), before.end(), 0.0f) == static_cast<std::ptrdiff_t>(before.size()));
      CHECK(w.size() >= 5);  // four linears' weight parts, the norms, grads_ready
      w.run();
      CHECK(ready == 1);
      CHECK(max_rel(whole, ps.grads()) == 0.0);
    }
  }
}
