#include "model/bert.h"

#include <cmath>

#include "autograd/functions.h"
#include "data/bert_dataset.h"
#include "model/layers/model_ends.h"
#include "tensor/ops.h"

namespace mpitron {

BertBatch BertBatch::from(const std::vector<data::BertSample>& samples) {
  MPT_CHECK(!samples.empty(), "BertBatch::from: no samples", "");
  const int64_t B = static_cast<int64_t>(samples.size()), T = static_cast<int64_t>(samples[0].tokens.size());
  std::vector<int64_t> tok, typ, lab, len, rnd;
  for (const data::BertSample& s : samples) {
    MPT_CHECK(static_cast<int64_t>(s.tokens.size()) == T, "BertBatch::from: samples of different lengths", "");
    tok.insert(tok.end(), s.tokens.begin(), s.tokens.end());
    typ.insert(typ.end(), s.types.begin(), s.types.end());
    lab.insert(lab.end(), s.labels.begin(), s.labels.end());
    len.push_back(s.length);
    rnd.push_back(s.is_random);
  }
  BertBatch b;
  b.tokens = Tensor::from_ints(tok, {B, T}, DType::I32);
  b.types = Tensor::from_ints(typ, {B, T}, DType::I32);
  b.labels = Tensor::from_ints(lab, {B, T}, DType::I32);
  b.lengths = Tensor::from_ints(len, {B}, DType::I32);
  b.is_random = Tensor::from_ints(rnd, {B}, DType::I32);
  return b;
}

bool BertBatch::padded() const {
  const std::vector<float> l = lengths.to(Device::cpu()).to_floats();
  for (float v : l)
    if (static_cast<int64_t>(v) < tokens.dim(1)) return true;
  return false;
}

namespace {

// tanh for the pooler: (B, C) rows, computed on the host (no tensor op for it yet;
// the pooler is B·C elements, one per sample and hidden unit).
struct TanhNode final : Node {
  Var x, y;
  const char* name() const override { return "pooler_tanh"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    const std::vector<float> g = y.grad().to(Device::cpu()).to_floats(), v = y.value().to(Device::cpu()).to_floats();
    std::vector<float> d(g.size());
    for (size_t i = 0; i < g.size(); ++i) d[i] = g[i] * (1.0f - v[i] * v[i]);
    const Tensor dx = Tensor::from_vector(d, x.value().shape(), x.value().dtype()).to(x.value().device());
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};

Var tanh_op(Tape& tape, const Var& x) {
  std::vector<float> v = x.value().to(Device::cpu()).to_floats();
  for (float& e : v) e = std::tanh(e);
  Var y(Tensor::from_vector(v, x.value().shape(), x.value().dtype()).to(x.value().device()), x.requires_grad());
  if (tape.recording() && y.requires_grad()) {
    auto n = std::make_unique<TanhNode>();
    n->x = x, n->y = y;
    tape.record(std::move(n));
  }
  return y;
}

}  // namespace

Bert::Bert(const GPTConfig& cfg, Device device, const ModelParallel& mp) : core_(cfg, device, mp) {
  const GPTConfig& c = core_.config();
  MPT_CHECK(c.bert, "Bert needs a BERT configuration (GPTConfig::bert)", "");
  MPT_CHECK(c.learned_positions(), "BERT uses learned absolute positions: --position-embedding-type learned_absolute",
            "");
  MPT_CHECK(!mp.tp.sequence_parallel || c.num_classes == 0,
            "--sequence-parallel with a classification head is not supported (the pooler reads [CLS] rows of every "
            "sequence part)",
            "drop --sequence-parallel");
  MPT_CHECK(!mp.tp.sequence_parallel || !c.binary_head,
            "--sequence-parallel with BERT's binary head is not supported (the pooler reads [CLS] rows of every "
            "sequence part)",
            "drop --sequence-parallel, or train with --bert-no-binary-head");
}

Var Bert::embed(Tape& tape, const BertBatch& batch, const ForwardOptions& opt) {
  const GPTConfig& c = core_.config();
  const TensorParallel& tp = core_.parallel().tp;
  const Device dev = core_.device();
  const int64_t B = batch.tokens.dim(0), T = batch.tokens.dim(1), N = B * T;
  MPT_CHECK(T <= c.max_position_embeddings,
            str("sequence of ", T, " tokens exceeds --max-position-embeddings ", c.max_position_embeddings), "");
  EmbedRows rows;
  rows.ids = batch.tokens.to(dev).contiguous().view({N});
  const int64_t row0 = tp.first_row(N), Nl = tp.local_rows(N);
  for (int64_t i = 0; i < Nl; ++i) rows.positions.push_back((row0 + i) % T);
  if (c.num_tokentypes > 0) rows.types = batch.types.contiguous().view({N}).slice(0, row0, row0 + Nl).contiguous().to(dev);
  return embed_tokens(tape, c, tp, core_.params(), rows, opt.train ? c.hidden_dropout : 0.0f, opt.dropout_seed);
}

Var Bert::pooled(Tape& tape, const Var& h, int64_t B, int64_t T) {
  // [CLS] rows of h (every row on every TP rank: no sequence parallelism here), computed
  // identically on every TP rank.
  const ParamSet& ps = core_.params();
  std::vector<int64_t> cls(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) cls[static_cast<size_t>(b)] = b * T;
  Var first = ag::embedding(tape, Tensor::from_ints(cls, {B}, DType::I32).to(core_.device()), h);  // (B, C)
  return tanh_op(tape, ag::linear(tape, first, ps.var(ParamRole::PoolerWeight), ps.var(ParamRole::PoolerBias)));
}

Var Bert::mlm_logits(Tape& tape, const Var& h) {
  // The MLM transform on this rank's rows (replicated parameters), then the tied decoder
  // (the one output layer, model/layers/model_ends.h) with its own bias.
  const GPTConfig& c = core_.config();
  const TensorParallel& tp = core_.parallel().tp;
  const ParamSet& ps = core_.params();
  auto spp = [&](ParamRole r) { return ag::sequence_parallel_param(tape, ps.var(r), tp); };
  Var d = ag::gelu(tape, ag::linear(tape, h, spp(ParamRole::LmHeadDenseWeight), spp(ParamRole::LmHeadDenseBias)),
                   c.gelu_erf());
  d = ag::layernorm(tape, d, spp(ParamRole::LmHeadNormWeight), spp(ParamRole::LmHeadNormBias), c.layernorm_epsilon);
  return output_logits(tape, tp, d, output_weight(c, ps), ps.var(ParamRole::LmHeadBias));  // (N, V/t)
}

Var Bert::classification_head(Tape& tape, const Var& x, const BertBatch& batch, const ForwardOptions& opt) {
  const GPTConfig& c = core_.config();
  const ParamSet& ps = core_.params();
  const Device dev = core_.device();
  const int64_t B = batch.tokens.dim(0), T = batch.tokens.dim(1);
  MPT_CHECK(batch.class_labels.defined() && batch.class_labels.numel() == B,
            "Bert: a classification model needs the batch's class_labels (B)", "");
  Var p = pooled(tape, final_norm(tape, c, core_.parallel().tp, ps, x), B, T);
  // The mask after the blocks' (offsets N·C·(1 + 2l) and N·C·(2 + 2l)): N·C·(1 + 2L).
  const uint64_t nc = static_cast<uint64_t>(B * T * c.hidden_size);
  p = ag::dropout(tape, p, opt.train ? c.hidden_dropout : 0.0f, opt.dropout_seed,
                  nc * (1 + 2 * static_cast<uint64_t>(c.num_layers)));
  Var logits = ag::linear(tape, p, ps.var(ParamRole::ClassificationHeadWeight), ps.var(ParamRole::ClassificationHeadBias));
  Var loss = ag::cross_entropy(tape, logits, batch.class_labels.to(dev).contiguous());
  losses_ = BertLosses{};
  losses_.cls = loss.value().item();
  losses_.class_logits = logits.value().to(Device::cpu()).to(DType::F32);
  return loss;
}

Var Bert::heads(Tape& tape, const Var& x, const BertBatch& batch) {
  const GPTConfig& c = core_.config();
  const TensorParallel& tp = core_.parallel().tp;
  const ParamSet& ps = core_.params();
  const int64_t B = batch.tokens.dim(0), T = batch.tokens.dim(1);
  const Var h = final_norm(tape, c, tp, ps, x);  // (Nl, C)
  const Var lm = lm_loss(tape, c, tp, mlm_logits(tape, h), batch.labels);
  losses_.lm = lm.value().item();
  losses_.sop = 0;
  if (!c.binary_head) return lm;
  Var logits = ag::linear(tape, pooled(tape, h, B, T), ps.var(ParamRole::BinaryHeadWeight),
                          ps.var(ParamRole::BinaryHeadBias));  // (B, 2)
  Var sop = ag::cross_entropy(tape, logits, batch.is_random.to(core_.device()).contiguous());
  losses_.sop = sop.value().item();
  return ag::add(tape, lm, sop);
}

Var Bert::chunk_forward(Tape& tape, int c, const BertBatch& batch, const Var& input, const ForwardOptions& opt) {
  const ChunkInfo& ch = core_.chunk(c);
  const int64_t B = batch.tokens.dim(0), T = batch.tokens.dim(1);
  ForwardOptions o = opt;
  // Padded samples mask their padding keys (model/layers/attention_layer.cpp).
  if (batch.padded()) o.kv_lengths = batch.lengths.to(core_.device());
  core_.need_params_outside_blocks(o);
  Var x;
  if (ch.first_stage) {
    x = embed(tape, batch, o);
  } else {
    MPT_CHECK(input.defined() && input.shape() == core_.activation_shape(B),
              str("stage ", ch.stage, " received ", input.defined() ? input.value().describe() : "nothing",
                  ", expected an activation of shape ", shape_str(core_.activation_shape(B))),
              "");
    x = input;
  }
  x = core_.layers(tape, ch, x, B, T, o);
  if (!ch.last_stage) return x;
  return config().num_classes > 0 ? classification_head(tape, x, batch, o) : heads(tape, x, batch);
}

BertLogits Bert::logits(const BertBatch& batch) {
  const ModelParallel& mp = core_.parallel();
  MPT_CHECK(mp.tp.size == 1 && mp.pp_size == 1 && core_.num_chunks() == 1, "Bert::logits needs the whole model on one rank",
            "load the checkpoint into a single process (it loads under any layout)");
  const GPTConfig& c = core_.config();
  const ParamSet& ps = core_.params();
  const int64_t B = batch.tokens.dim(0), T = batch.tokens.dim(1);
  Tape tape;
  tape.set_recording(false);
  ForwardOptions o;
  o.train = false;
  if (batch.padded()) o.kv_lengths = batch.lengths.to(core_.device());
  const Var h = final_norm(tape, c, mp.tp, ps, core_.layers(tape, core_.chunk(0), embed(tape, batch, o), B, T, o));
  BertLogits out;
  out.mlm = mlm_logits(tape, h).value();  // the same head math as heads()
  if (!c.binary_head) return out;
  out.binary = ag::linear(tape, pooled(tape, h, B, T), ps.var(ParamRole::BinaryHeadWeight),
                          ps.var(ParamRole::BinaryHeadBias)).value();
  return out;
}

Var Bert::forward(Tape& tape, const BertBatch& batch, const ForwardOptions& opt) {
  MPT_CHECK(core_.num_chunks() == 1 && core_.chunk(0).first_stage && core_.chunk(0).last_stage,
            "Bert::forward runs the whole model; with pipeline parallelism run chunk_forward per stage", "");
  return chunk_forward(tape, 0, batch, Var(), opt);
}

}  // namespace mpitron
