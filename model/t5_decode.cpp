#include "model/t5_decode.h"

#include "autograd/functions.h"
#include "model/block.h"
#include "model/layers/attention_core.h"
#include "model/layers/cross_attention_layer.h"
#include "model/layers/model_ends.h"
#include "tensor/attention_block.h"

namespace mpitron {

namespace {

// The decoder's self-attention over one request's cache (model/layers/attention_core.h): the call's
// n rows are positions p0 … p0+n−1 of the one sequence (B = 1).
//   qkv (n, (NH + 2·G)·HD) → the rows' keys and values written into k, v (1, max_len, G, HD) at
//   p0 …; att (n, NH·HD) = softmax(scale·q·Kᵀ + bias) · V over cached positions [0, p0+n), causal.
class T5CachedAttention final : public AttentionCore {
 public:
  T5CachedAttention(Tensor k, Tensor v, int64_t p0, Tensor bias)
      : k_(std::move(k)), v_(std::move(v)), p0_(p0), bias_(std::move(bias)) {}

  void forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att, const Tensor& lse,
               uint64_t) const override {
    const int64_t n = s.seq, NH = a.local_heads(s.tp), G = a.local_groups(s.tp), HD = a.head_dim, L = p0_ + n;
    MPT_CHECK(s.batch == 1 && L <= k_.dim(1),
              str("T5's cached decoder: ", n, " rows at position ", p0_, " of a cache of ", k_.dim(1), " positions"),
              "");
    const Tensor h = qkv.view({1, n, NH + 2 * G, HD});
    k_.slice(1, p0_, L).copy_from(h.slice(2, NH, NH + G));
    v_.slice(1, p0_, L).copy_from(h.slice(2, NH + G, NH + 2 * G));
    AttentionBlock blk(p0_, 0, L, /*causal=*/true);
    blk.bias = bias_;
    blk.softcap = a.softcap;
    const Tensor l = lse.defined() ? lse : Tensor::empty({1, NH, n}, DType::F32, qkv.device());
    attention_block_forward(h.slice(2, 0, NH), k_.slice(1, 0, L), v_.slice(1, 0, L), att.view({1, n, NH, HD}), l,
                            a.scale, blk);
  }
  bool trains() const override { return false; }

 private:
  Tensor k_, v_;
  int64_t p0_;
  Tensor bias_;
};

}  // namespace

T5DecodeState::T5DecodeState(T5& model, const Tensor& enc, int64_t enc_length, int64_t max_len)
    : model_(model), max_len_(max_len) {
  const GPTConfig& c = model.config();
  const TensorParallel& tp = model.core().parallel().tp;
  MPT_CHECK(!tp.sequence_parallel, "T5's cached decoder runs without sequence parallelism (a step's rows are not split)",
            "decode with tensor parallelism alone, or on one rank");
  MPT_CHECK(enc.ndim() == 2 && enc.dim(0) == 1 && enc_length >= 1 && enc_length <= enc.dim(1) && max_len >= 1,
            str("T5's cached decoder: one sample (1, Te) with 1 <= length <= Te and max_len >= 1, got ",
                shape_str(enc.shape()), " length ", enc_length, ", max_len ", max_len),
            "");
  const Device dev = model.core().device();
  enc_seq_ = enc.dim(1);
  if (enc_length < enc_seq_) lengths_ = Tensor::from_ints({enc_length}, {1}, DType::I32).to(dev);
  mem_ = model.encode(enc, lengths_);
  const int64_t G = c.query_groups() / tp.size, HD = c.head_dim();  // this rank's key / value groups
  for (int64_t l = c.encoder_num_layers; l < c.num_layers; ++l) {
    BlockShape s = block_shape(c, 1, 1, tp, false, l);
    s.cross.memory = mem_;
    s.cross.seq = enc_seq_;
    xkv_.push_back(cross_attention_kv(s, model.core().block_params(l)));
    k_.push_back(Tensor::zeros({1, max_len, G, HD}, mem_.dtype(), dev));
    v_.push_back(Tensor::zeros({1, max_len, G, HD}, mem_.dtype(), dev));
  }
}

Tensor T5DecodeState::bias_rows(int64_t p0, int64_t n) const {
  const GPTConfig& c = model_.config();
  if (!c.relative_positions()) return Tensor();
  const int64_t L = p0 + n;
  std::vector<int64_t> ids(static_cast<size_t>(n * L));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < L; ++j)
      ids[static_cast<size_t>(i * L + j)] =
          relative_bucket(p0 + i, j, false, c.relative_attention_num_buckets, c.relative_attention_max_distance);
  const Var& table = model_.core().params().var(ParamRole::DecoderRelativeBias);  // (buckets, NH)
  Tape tape;
  tape.set_recording(false);
  const Tensor e = ag::embedding(tape, Tensor::from_ints(ids, {n * L}, DType::I32).to(mem_.device()), table).value();
  return e.to(DType::F32).contiguous().view({n, L, table.value().dim(1)});
}

std::vector<float> T5DecodeState::step(const std::vector<int64_t>& tokens) {
  const GPTConfig& c = model_.config();
  const GPT& core = model_.core();
  const TensorParallel& tp = core.parallel().tp;
  const int64_t n = static_cast<int64_t>(tokens.size()), p0 = len_;
  MPT_CHECK(n >= 1 && p0 + n <= max_len_,
            str("T5's cached decoder: ", n, " tokens after ", p0, " exceed its ", max_len_, " positions"), "");
  Tape tape;
  tape.set_recording(false);
  EmbedRows rows;
  rows.ids = Tensor::from_ints(tokens, {n}, DType::I32).to(core.device());
  for (int64_t i = 0; i < n; ++i) rows.positions.push_back(p0 + i);
  Tensor x = embed_tokens(tape, c, tp, core.params(), rows, 0.0f, 0).value();  // (n, C)
  const Tensor bias = bias_rows(p0, n);
  for (int64_t l = c.encoder_num_layers; l < c.num_layers; ++l) {
    const size_t j = static_cast<size_t>(l - c.encoder_num_layers);
    BlockShape s = block_shape(c, 1, n, tp, false, l);
    s.core = std::make_shared<T5CachedAttention>(k_[j], v_[j], p0, bias);
    s.cross.memory = mem_;
    s.cross.lengths = lengths_;
    s.cross.seq = enc_seq_;
    s.cross.kv = xkv_[j];
    Tensor y = Tensor::empty({n, c.hidden_size}, x.dtype(), x.device());
    BlockActs acts;
    block_forward(s, core.block_params(l), x, y, acts, 0, 0);
    x = y;
  }
  len_ += n;
  const Var h = final_norm(tape, c, tp, core.params(), Var(x.slice(0, n - 1, n)));
  const Tensor part = output_logits(tape, tp, h, output_weight(c, core.params()), Var()).value();  // (1, V/t)
  // (t, V/t): rank r's slice is vocabulary rows [r·V/t, (r+1)·V/t), so the rows in order are the whole row.
  return tp_all_gather_rows(tp, part).to(Device::cpu()).to(DType::F32).to_floats();
}

}  // namespace mpitron
