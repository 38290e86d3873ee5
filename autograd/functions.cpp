#include "autograd/functions.h"

#include <cmath>

#include "tensor/ops.h"

namespace mpitron::ag {

namespace {
Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }
bool any_grad(std::initializer_list<const Var*> vs) {
  for (const Var* v : vs)
    if (v->defined() && v->requires_grad()) return true;
  return false;
}
}  // namespace

// ---- linear -----------------------------------------------------------------------
namespace {
struct LinearNode final : Node {
  Var x, w, b, y;
  const char* name() const override { return "linear"; }
  void backward() override {
    const Tensor& dy = y.grad();
    if (!dy.defined()) return;
    GemmArgs g;
    g.trans_b = true;
    gemm_backward(dy, x.value(), w.value(), x.requires_grad() ? x.grad_or_zeros() : Tensor(),
                  w.requires_grad() ? w.grad_or_zeros() : Tensor(),
                  b.defined() && b.requires_grad() ? b.grad_or_zeros() : Tensor(), g, /*accumulate_a=*/true,
                  /*accumulate_b=*/true);
  }
};
}  // namespace

Var linear(Tape& tape, const Var& x, const Var& w, const Var& b) {
  const Tensor& xv = x.value();
  Tensor y = Tensor::empty({xv.dim(0), w.value().dim(0)}, xv.dtype(), xv.device());
  GemmArgs g;
  g.trans_b = true;
  gemm(xv, w.value(), y, g, b.defined() ? b.value() : Tensor());
  Var out(y, any_grad({&x, &w, &b}));
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<LinearNode>();
    n->x = x, n->w = w, n->b = b, n->y = out;
    tape.record(std::move(n));
  }
  return out;
}

// ---- layernorm ----------------------------------------------------------------------
namespace {
struct LayerNormNode final : Node {
  Var x, w, b, y;
  Tensor mean, rstd;
  const char* name() const override { return "layernorm"; }
  void backward() override {
    if (!y.grad().defined()) return;
    layernorm_backward(y.grad(), x.value(), w.value(), mean, rstd, x.requires_grad() ? x.grad_or_zeros() : Tensor(),
                       w.requires_grad() ? w.grad_or_zeros() : Tensor(),
                       b.requires_grad() ? b.grad_or_zeros() : Tensor(), /*accumulate_dx=*/true);
  }
};
}  // namespace

Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, float eps) {
  const Tensor& xv = x.value();
  const int64_t rows = xv.numel() / xv.dim(-1);
  Tensor y = empty_like(xv);
  Tensor mean = Tensor::empty({rows}, DType::F32, xv.device());
  Tensor rstd = Tensor::empty({rows}, DType::F32, xv.device());
  layernorm_forward(xv, weight.value(), bias.value(), y, mean, rstd, eps);
  Var out(y, any_grad({&x, &weight, &bias}));
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<LayerNormNode>();
    n->x = x, n->w = weight, n->b = bias, n->y = out, n->mean = mean, n->rstd = rstd;
    tape.record(std::move(n));
  }
  return out;
}

// ---- rmsnorm ------------------------------------------------------------------------
namespace {
struct RmsNormNode final : Node {
  Var x, w, y;
  Tensor rstd;
  const char* name() const override { return "rmsnorm"; }
  void backward() override {
    if (!y.grad().defined()) return;
    rmsnorm_backward(y.grad(), x.value(), w.value(), rstd, x.requires_grad() ? x.grad_or_zeros() : Tensor(),
                     w.requires_grad() ? w.grad_or_zeros() : Tensor(), /*accumulate_dx=*/true);
  }
};
}  // namespace

Var rmsnorm(Tape& tape, const Var& x, const Var& weight, float eps) {
  const Tensor& xv = x.value();
  Tensor y = empty_like(xv);
  Tensor rstd = Tensor::empty({xv.numel() / xv.dim(-1)}, DType::F32, xv.device());
  rmsnorm_forward(xv, weight.value(), y, rstd, eps);
  Var out(y, any_grad({&x, &weight}));
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<RmsNormNode>();
    n->x = x, n->w = weight, n->y = out, n->rstd = rstd;
    tape.record(std::move(n));
  }
  return out;
}

// ---- swiglu ---------------------------------------------------------------------------
namespace {
struct SwigluNode final : Node {
  Var x, y;
  const char* name() const override { return "swiglu"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor dx = empty_like(x.value());
    swiglu_backward(y.grad(), x.value(), dx);
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var swiglu(Tape& tape, const Var& x) {
  const Tensor& xv = x.value();
  Shape s = xv.shape();
  s.back() /= 2;
  Tensor y = Tensor::empty(s, xv.dtype(), xv.device());
  swiglu_forward(xv, y);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<SwigluNode>();
    n->x = x, n->y = out;
    tape.record(std::move(n));
  }
  return out;
}

// ---- rope -----------------------------------------------------------------------------
namespace {
struct RopeNode final : Node {
  Var x, y;
  Shape shape4;  // (B, T, H, D)
  int64_t rotate_heads = 0;
  RopeArgs args;
  const char* name() const override { return "rope"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor dx = Tensor::empty(shape4, x.value().dtype(), x.value().device());
    rope_backward(y.grad().view(shape4), dx, rotate_heads, args);
    axpby(1.0f, dx.view(x.value().shape()), 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var rope(Tape& tape, const Var& x, int64_t batch, int64_t seq, int64_t heads, int64_t rotate_heads,
         const RopeArgs& args) {
  const Tensor& xv = x.value();
  MPT_CHECK(heads > 0 && xv.numel() % (batch * seq * heads) == 0,
            str("rope: x ", xv.describe(), " is not (batch ", batch, ", seq ", seq, ", heads ", heads, ", ·)"), "");
  const Shape s4{batch, seq, heads, xv.numel() / (batch * seq * heads)};
  Tensor y = empty_like(xv);
  rope_forward(xv.view(s4), y.view(s4), rotate_heads, args);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<RopeNode>();
    n->x = x, n->y = out, n->shape4 = s4, n->rotate_heads = rotate_heads, n->args = args;
    tape.record(std::move(n));
  }
  return out;
}

// ---- gelu -------------------------------------------------------------------------
namespace {
struct GeluNode final : Node {
  Var x, y;
  bool exact = false;
  const char* name() const override { return exact ? "gelu_erf" : "gelu"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor dx = empty_like(x.value());
    gelu_backward(y.grad(), x.value(), dx, exact);
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var gelu(Tape& tape, const Var& x, bool exact) {
  Tensor y = empty_like(x.value());
  gelu_forward(x.value(), y, exact);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<GeluNode>();
    n->x = x, n->y = out, n->exact = exact;
    tape.record(std::move(n));
  }
  return out;
}

// ---- softcap ----------------------------------------------------------------------
namespace {
// The backward recomputes the output from x: a fused loss after it (cross_entropy) takes the output's
// buffer for its gradient.
struct SoftcapNode final : Node {
  Var x, y;
  float cap = 1.0f;
  const char* name() const override { return "softcap"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor out = empty_like(x.value()), dx = empty_like(x.value());
    softcap_forward(x.value(), out, cap);
    softcap_backward(y.grad(), out, dx, cap);
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var softcap(Tape& tape, const Var& x, float cap) {
  Tensor y = empty_like(x.value());
  softcap_forward(x.value(), y, cap);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<SoftcapNode>();
    n->x = x, n->y = out, n->cap = cap;
    tape.record(std::move(n));
  }
  return out;
}

// ---- add ----------------------------------------------------------------------------
namespace {
struct AddNode final : Node {
  Var a, b, y;
  const char* name() const override { return "add"; }
  void backward() override {
    if (!y.grad().defined()) return;
    if (a.same(b)) {  // y = a + a
      if (a.requires_grad()) axpby(2.0f, y.grad(), 1.0f, a.grad_or_zeros());
      return;
    }
    add_backward(y.grad(), a.requires_grad() ? a.grad_or_zeros() : Tensor(),
                 b.requires_grad() ? b.grad_or_zeros() : Tensor(), /*accumulate=*/true);
  }
};
}  // namespace

Var add(Tape& tape, const Var& a, const Var& b) {
  Tensor y = empty_like(a.value());
  add_forward(a.value(), b.value(), y);
  Var out(y, any_grad({&a, &b}));
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<AddNode>();
    n->a = a, n->b = b, n->y = out;
    tape.record(std::move(n));
  }
  return out;
}

// ---- concat_cols ----------------------------------------------------------------------
namespace {
struct ConcatColsNode final : Node {
  Var a, b, y;
  const char* name() const override { return "concat_cols"; }
  void backward() override {
    if (!y.grad().defined()) return;
    const int64_t ca = a.value().dim(1), cb = b.value().dim(1);
    if (a.requires_grad()) axpby(1.0f, y.grad().slice(1, 0, ca).contiguous(), 1.0f, a.grad_or_zeros());
    if (b.requires_grad()) axpby(1.0f, y.grad().slice(1, ca, ca + cb).contiguous(), 1.0f, b.grad_or_zeros());
  }
};
}  // namespace

Var concat_cols(Tape& tape, const Var& a, const Var& b) {
  const Tensor& av = a.value();
  const Tensor& bv = b.value();
  MPT_CHECK(av.ndim() == 2 && bv.ndim() == 2 && av.dim(0) == bv.dim(0) && av.dtype() == bv.dtype(),
            str("concat_cols: ", av.describe(), " and ", bv.describe(), " are not (N, Ca) and (N, Cb) of one dtype"), "");
  const int64_t ca = av.dim(1), cb = bv.dim(1);
  Tensor y = Tensor::empty({av.dim(0), ca + cb}, av.dtype(), av.device());
  y.slice(1, 0, ca).copy_from(av);
  y.slice(1, ca, ca + cb).copy_from(bv);
  Var out(y, any_grad({&a, &b}));
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<ConcatColsNode>();
    n->a = a, n->b = b, n->y = out;
    tape.record(std::move(n));
  }
  return out;
}

// ---- scale ----------------------------------------------------------------------------
namespace {
struct ScaleNode final : Node {
  Var x, y;
  float alpha = 1.0f;
  const char* name() const override { return "scale"; }
  void backward() override {
    if (y.grad().defined() && x.requires_grad()) axpby(alpha, y.grad(), 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var scale(Tape& tape, const Var& x, float alpha) {
  Tensor y = empty_like(x.value());
  axpby(alpha, x.value(), 0.0f, y);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<ScaleNode>();
    n->x = x, n->y = out, n->alpha = alpha;
    tape.record(std::move(n));
  }
  return out;
}

// ---- embedding ------------------------------------------------------------------------
namespace {
struct EmbeddingNode final : Node {
  Tensor ids;
  Var table, y;
  int64_t vocab_start = 0;
  const char* name() const override { return "embedding"; }
  void backward() override {
    if (!y.grad().defined() || !table.requires_grad()) return;
    embedding_backward(y.grad(), ids, table.grad_or_zeros(), vocab_start);
  }
};
}  // namespace

Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t vocab_start) {
  Tensor y = Tensor::empty({ids.dim(0), table.value().dim(1)}, table.value().dtype(), table.value().device());
  embedding_forward(ids, table.value(), y, false, vocab_start);
  Var out(y, table.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<EmbeddingNode>();
    n->ids = ids, n->table = table, n->y = out, n->vocab_start = vocab_start;
    tape.record(std::move(n));
  }
  return out;
}

// ---- linear in two nodes, and a backward hook -------------------------------------
namespace {
// dx = dy·w (reads w's value).
struct LinearInputGradNode final : Node {
  Var x, w, y;
  const char* name() const override { return "linear_input_grad"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    GemmArgs g;
    g.trans_b = true;
    gemm_backward(y.grad(), x.value(), w.value(), x.grad_or_zeros(), Tensor(), Tensor(), g, /*accumulate_a=*/true,
                  /*accumulate_b=*/true);
  }
};
// dw += dyᵀ·x, db += Σ dy. gemm_backward takes w for its shape and dtype only when da is not
// asked for: a view of dw's own storage in w's dtype stands in (w may be released by now).
struct LinearWeightGradNode final : Node {
  Var x, w, b, y;
  Shape w_shape;
  DType w_dtype = DType::F32;
  const char* name() const override { return "linear_weight_grad"; }
  void backward() override {
    const bool gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
    if (!y.grad().defined() || (!gw && !gb)) return;
    const Tensor dw = gw ? w.grad_or_zeros() : Tensor();
    Tensor stand_in;
    if (dw.defined() && dtype_size(w_dtype) <= dtype_size(dw.dtype()) && dw.is_contiguous())
      stand_in = Tensor::from_blob(dw.data_ptr(), w_shape, w_dtype, dw.device(), std::make_shared<Tensor>(dw));
    else
      stand_in = w.value();  // (only a bias to compute, or an unusual gradient dtype: w must be at hand)
    GemmArgs g;
    g.trans_b = true;
    gemm_backward(y.grad(), x.value(), stand_in, Tensor(), dw, gb ? b.grad_or_zeros() : Tensor(), g,
                  /*accumulate_a=*/true, /*accumulate_b=*/true);
  }
};
struct HookNode final : Node {
  std::function<void()> f;
  const char* name() const override { return "backward_hook"; }
  void backward() override { f(); }
};
}  // namespace

Var linear_split(Tape& tape, const Var& x, const Var& w, const Var& b, std::function<void()> between) {
  const Tensor& xv = x.value();
  Tensor y = Tensor::empty({xv.dim(0), w.value().dim(0)}, xv.dtype(), xv.device());
  GemmArgs g;
  g.trans_b = true;
  gemm(xv, w.value(), y, g, b.defined() ? b.value() : Tensor());
  Var out(y, any_grad({&x, &w, &b}));
  if (tape.recording() && out.requires_grad()) {  // recorded in reverse order of their backwards
    auto wg = std::make_unique<LinearWeightGradNode>();
    wg->x = x, wg->w = w, wg->b = b, wg->y = out, wg->w_shape = w.shape(), wg->w_dtype = w.value().dtype();
    tape.record(std::move(wg));
    if (between) on_backward(tape, std::move(between));
    auto ig = std::make_unique<LinearInputGradNode>();
    ig->x = x, ig->w = w, ig->y = out;
    tape.record(std::move(ig));
  }
  return out;
}

void on_backward(Tape& tape, std::function<void()> f) {
  if (!tape.recording()) return;
  auto n = std::make_unique<HookNode>();
  n->f = std::move(f);
  tape.record(std::move(n));
}

// ---- attention ------------------------------------------------------------------------
namespace {
struct AttentionNode final : Node {
  Var qkv, y;
  Tensor out, lse;
  Shape qkv_shape;  // (B, T, 3, NH, HD) or (B, T, NH + 2G, HD)
  int64_t b = 0, t = 0, nh = 0, hd = 0;
  float scale = 1.0f;
  AttentionMask mask;
  const char* name() const override { return mask.causal && !mask.kv_lengths.defined() ? "causal_attention" : "attention"; }
  void backward() override {
    if (!y.grad().defined() || !qkv.requires_grad()) return;
    const Tensor q = qkv.value().view(qkv_shape);
    Tensor dqkv = Tensor::empty(q.shape(), q.dtype(), q.device());
    attention_backward(y.grad().view({b, t, nh, hd}), q, out, lse, dqkv, scale, {}, mask);
    axpby(1.0f, dqkv.view(qkv.shape()), 1.0f, qkv.grad_or_zeros());
  }
};
}  // namespace

Var causal_attention(Tape& tape, const Var& qkv, int64_t batch, int64_t seq, int64_t heads, int64_t kv_groups) {
  return attention(tape, qkv, batch, seq, heads, kv_groups, AttentionMask{});
}

Var attention(Tape& tape, const Var& qkv, int64_t batch, int64_t seq, int64_t heads, int64_t kv_groups,
              const AttentionMask& mask) {
  const Tensor& v = qkv.value();
  const int64_t width = v.dim(-1), g = kv_groups > 0 ? kv_groups : heads;
  MPT_CHECK(width % (heads + 2 * g) == 0,
            str("attention: qkv width ", width, " is not (heads ", heads, " + 2 × kv groups ", g, ") × head dim"), "");
  const int64_t hd = width / (heads + 2 * g);
  const Shape qs = kv_groups > 0 ? Shape{batch, seq, heads + 2 * g, hd} : Shape{batch, seq, 3, heads, hd};
  Tensor out = Tensor::empty({batch, seq, heads, hd}, v.dtype(), v.device());
  Tensor lse = Tensor::empty({batch, heads, seq}, DType::F32, v.device());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  attention_forward(v.view(qs), out, lse, scale, {}, mask);
  Var y(out.view({batch * seq, heads * hd}), qkv.requires_grad());
  if (tape.recording() && y.requires_grad()) {
    auto n = std::make_unique<AttentionNode>();
    n->qkv = qkv, n->y = y, n->out = out, n->lse = lse, n->qkv_shape = qs, n->b = batch, n->t = seq, n->nh = heads;
    n->hd = hd, n->scale = scale, n->mask = mask;
    tape.record(std::move(n));
  }
  return y;
}

// ---- dropout --------------------------------------------------------------------------
namespace {
struct DropoutNode final : Node {
  Var x, y;
  float p = 0;
  uint64_t seed = 0, offset = 0;
  const char* name() const override { return "dropout"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor dx = empty_like(x.value());
    dropout_backward(y.grad(), dx, p, seed, offset);
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var dropout(Tape& tape, const Var& x, float p, uint64_t seed, uint64_t offset) {
  if (p == 0.0f) return x;
  Tensor y = empty_like(x.value());
  dropout_forward(x.value(), y, p, seed, offset);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<DropoutNode>();
    n->x = x, n->y = out, n->p = p, n->seed = seed, n->offset = offset;
    tape.record(std::move(n));
  }
  return out;
}

namespace {
struct DropoutRowsNode final : Node {
  Var x, y;
  float p = 0;
  uint64_t seed = 0;
  std::vector<DropoutRows> segments;
  const char* name() const override { return "dropout_rows"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor dx = empty_like(x.value());
    for (const DropoutRows& r : segments)
      dropout_backward(y.grad().slice(0, r.row, r.row + r.rows), dx.slice(0, r.row, r.row + r.rows), p, seed, r.offset);
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};
}  // namespace

Var dropout(Tape& tape, const Var& x, float p, uint64_t seed, const std::vector<DropoutRows>& segments) {
  if (p == 0.0f) return x;
  Tensor y = empty_like(x.value());
  for (const DropoutRows& r : segments)
    dropout_forward(x.value().slice(0, r.row, r.row + r.rows), y.slice(0, r.row, r.row + r.rows), p, seed, r.offset);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<DropoutRowsNode>();
    n->x = x, n->y = out, n->p = p, n->seed = seed, n->segments = segments;
    tape.record(std::move(n));
  }
  return out;
}

// ---- cross-entropy ---------------------------------------------------------------------
// Fused classifier: when the tape records, forward computes the losses AND the
// logits gradient of the mean loss in one pass (no second read of the logits
// in backward); backward only scales it by the incoming gradient.
namespace {
struct CrossEntropyNode final : Node {
  Var logits, loss;
  Tensor dlogits;  // d(mean loss)/d(logits), logits' dtype
  const char* name() const override { return "cross_entropy"; }
  void backward() override {
    if (!loss.grad().defined() || !logits.requires_grad()) return;
    const float seed = loss.grad().item();
    if (!logits.grad().defined()) {
      if (seed != 1.0f) scale(dlogits, seed);
      Var(logits).set_grad(dlogits);
    } else {
      axpby(seed, dlogits, 1.0f, logits.grad());
    }
    dlogits = Tensor();
  }
};
}  // namespace

Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets) {
  const Tensor& lv = logits.value();
  int64_t valid = 0;
  for (int64_t t : targets.to_ints()) valid += (t >= 0 && t < lv.dim(1));
  const float inv = 1.0f / static_cast<float>(std::max<int64_t>(valid, 1));
  const bool record = tape.recording() && logits.requires_grad();
  Tensor losses = Tensor::empty({lv.dim(0)}, DType::F32, lv.device());
  // In place: the logits are not needed after the loss (the head's backward
  // reads its input and weight), so their buffer receives the gradient.
  Tensor dlogits = record ? lv : Tensor();
  softmax_cross_entropy(lv, targets, losses, dlogits, inv);
  double sum = 0;
  for (float x : losses.to_floats()) sum += x;
  Tensor mean = Tensor::from_vector({static_cast<float>(sum * inv)}, {1});
  Var out(mean.to(lv.device()), logits.requires_grad());
  if (record) record_fused_loss(tape, logits, out, dlogits);
  return out;
}

void record_fused_loss(Tape& tape, const Var& logits, const Var& loss, const Tensor& dlogits) {
  if (!tape.recording() || !logits.requires_grad()) return;
  auto n = std::make_unique<CrossEntropyNode>();
  n->logits = logits, n->loss = loss, n->dlogits = dlogits;
  tape.record(std::move(n));
}

}  // namespace mpitron::ag
