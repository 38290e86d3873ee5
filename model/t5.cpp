#include "model/t5.h"

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "data/t5_dataset.h"
#include "model/layers/model_ends.h"
#include "model/t5_decode.h"
#include "tensor/ops.h"

namespace mpitron {

T5Batch T5Batch::from(const std::vector<data::T5Sample>& samples) {
  MPT_CHECK(!samples.empty(), "T5Batch::from: no samples", "");
  const int64_t B = static_cast<int64_t>(samples.size());
  const int64_t Te = static_cast<int64_t>(samples[0].text_enc.size()), Td = static_cast<int64_t>(samples[0].text_dec.size());
  std::vector<int64_t> enc, dec, lab, len;
  for (const data::T5Sample& s : samples) {
    MPT_CHECK(static_cast<int64_t>(s.text_enc.size()) == Te && static_cast<int64_t>(s.text_dec.size()) == Td &&
                  s.labels.size() == s.text_dec.size() && s.loss_mask.size() == s.text_dec.size() &&
                  s.enc_mask.size() == s.text_enc.size(),
              "T5Batch::from: samples of different lengths", "");
    enc.insert(enc.end(), s.text_enc.begin(), s.text_enc.end());
    dec.insert(dec.end(), s.text_dec.begin(), s.text_dec.end());
    for (size_t t = 0; t < s.labels.size(); ++t) lab.push_back(s.loss_mask[t] ? s.labels[t] : -1);
    int64_t n = 0;
    for (uint8_t m : s.enc_mask) n += m != 0;
    len.push_back(n);
  }
  T5Batch b;
  b.enc = Tensor::from_ints(enc, {B, Te}, DType::I32);
  b.dec = Tensor::from_ints(dec, {B, Td}, DType::I32);
  b.labels = Tensor::from_ints(lab, {B, Td}, DType::I32);
  b.enc_lengths = Tensor::from_ints(len, {B}, DType::I32);
  return b;
}

bool T5Batch::padded() const {
  for (float v : enc_lengths.to(Device::cpu()).to_floats())
    if (static_cast<int64_t>(v) < enc.dim(1)) return true;
  return false;
}

int64_t relative_bucket(int64_t i, int64_t j, bool bidirectional, int64_t buckets, int64_t max_distance) {
  const int64_t rel = j - i;
  int64_t base = 0, n = 0, nb = buckets;
  if (bidirectional) {
    nb /= 2;
    if (rel > 0) base = nb;
    n = rel < 0 ? -rel : rel;
  } else {
    n = rel < 0 ? -rel : 0;
  }
  const int64_t exact = nb / 2;
  if (n < exact) return base + n;
  // float32 throughout, as transformers computes it (the truncation then agrees at the boundaries).
  const float large = std::log(static_cast<float>(n) / static_cast<float>(exact)) /
                      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(exact))) *
                      static_cast<float>(nb - exact);
  return base + std::min<int64_t>(exact + static_cast<int64_t>(large), nb - 1);
}

namespace {

// Moves a gradient the blocks accumulated in a buffer (the relative bias's, f32; the encoder output's
// share from every cross-attention) into a Var of the tape, which then runs its own backward.
struct BufferGradNode final : Node {
  Var to;
  Tensor grad;
  const char* name() const override { return "t5_buffer_grad"; }
  void backward() override {
    if (!to.requires_grad()) return;
    const Tensor g = grad.dtype() == to.value().dtype() ? grad : grad.to(to.value().dtype());
    axpby(1.0f, g.view(to.value().shape()), 1.0f, to.grad_or_zeros());
  }
};

void record_buffer_grad(Tape& tape, const Var& to, const Tensor& grad) {
  auto n = std::make_unique<BufferGradNode>();
  n->to = to, n->grad = grad;
  tape.record(std::move(n));
}

}  // namespace

T5::T5(const GPTConfig& cfg, Device device, const ModelParallel& mp) : core_(cfg, device, mp) {
  const GPTConfig& c = core_.config();
  MPT_CHECK(c.t5, "T5 needs a T5 configuration (GPTConfig::t5)", "");
  MPT_CHECK(mp.pp_size == 1 && mp.virtual_stages == 1,
            "--pipeline-model-parallel-size > 1 with T5: the encoder-decoder is not pipelined (Megatron-Core refuses "
            "pipeline parallelism for T5 too)",
            "train T5 with tensor, sequence and data parallelism");
  MPT_CHECK(!mp.cp.active(), "--context-parallel-size > 1 with T5 is not supported",
            "train T5 with tensor, sequence and data parallelism");
}

Var T5::embed(Tape& tape, const Tensor& tokens, float dropout, uint64_t seed) {
  const TensorParallel& tp = core_.parallel().tp;
  const int64_t B = tokens.dim(0), T = tokens.dim(1), N = B * T;
  EmbedRows rows;
  rows.ids = tokens.to(core_.device()).contiguous().view({N});
  const int64_t row0 = tp.first_row(N);
  for (int64_t i = 0; i < tp.local_rows(N); ++i) rows.positions.push_back((row0 + i) % T);
  return embed_tokens(tape, config(), tp, core_.params(), rows, dropout, seed);
}

void T5::relative_bias(Tape& tape, StackInputs& st, int64_t T, bool encoder) {
  const GPTConfig& c = config();
  const Var& table = core_.params().var(encoder ? ParamRole::EncoderRelativeBias : ParamRole::DecoderRelativeBias);
  const int64_t NHl = table.value().dim(1);  // (buckets, NH/t): this rank's heads
  Tensor& ids = bucket_ids_[{T, encoder}];    // the (T·T) buckets of a length, computed once
  if (!ids.defined()) {
    std::vector<int64_t> v(static_cast<size_t>(T * T));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        v[static_cast<size_t>(i * T + j)] =
            relative_bucket(i, j, encoder, c.relative_attention_num_buckets, c.relative_attention_max_distance);
    ids = Tensor::from_ints(v, {T * T}, DType::I32).to(core_.device());
  }
  const Var e = ag::embedding(tape, ids, table);  // (T·T, NHl)
  st.attn_bias = e.value().to(DType::F32).contiguous().view({T, T, NHl});
  if (!tape.recording()) return;
  st.attn_bias_grad = Tensor::zeros({T, T, NHl}, DType::F32, core_.device());
  record_buffer_grad(tape, e, st.attn_bias_grad);
}

Var T5::encoder(Tape& tape, const Tensor& enc, const Tensor& enc_lengths, const ForwardOptions& opt) {
  const GPTConfig& c = config();
  const int64_t B = enc.dim(0), Te = enc.dim(1);
  ForwardOptions o = opt;
  o.kv_lengths = enc_lengths.defined() ? enc_lengths.to(core_.device()) : Tensor();
  Var x = embed(tape, enc, opt.train ? c.hidden_dropout : 0.0f, opt.dropout_seed);
  StackInputs st;
  st.first_layer = 0, st.end_layer = c.encoder_num_layers, st.seed = opt.dropout_seed;
  const uint64_t nc = static_cast<uint64_t>(B * Te * c.hidden_size), blk = static_cast<uint64_t>((Te * Te + 3) / 4);
  st.offset = [nc](int64_t l) { return nc * (1 + 2 * static_cast<uint64_t>(l)); };
  st.attention_offset = [blk](int64_t l) { return static_cast<uint64_t>(l) * blk; };
  if (c.relative_positions()) relative_bias(tape, st, Te, true);
  x = core_.layers(tape, core_.chunk(0), x, B, Te, o, &st);
  return final_norm(tape, c, core_.parallel().tp, core_.params(), x, ParamRole::EncoderFinalNormWeight,
                    ParamRole::EncoderFinalNormBias);
}

Var T5::decoder_logits(Tape& tape, const Var& mem, int64_t Te, const Tensor& enc_lengths, const Tensor& dec,
                       const ForwardOptions& opt) {
  const GPTConfig& c = config();
  const TensorParallel& tp = core_.parallel().tp;
  const int64_t B = dec.dim(0), Td = dec.dim(1);
  const int64_t Le = c.encoder_num_layers, Ld = c.decoder_num_layers();
  const uint64_t seed = decoder_seed(opt.dropout_seed);
  StackInputs st;
  st.first_layer = Le, st.end_layer = c.num_layers, st.seed = seed;
  st.cross.memory = mem.value();
  st.cross.lengths = enc_lengths.defined() ? enc_lengths.to(core_.device()) : Tensor();
  st.cross.seq = Te;
  if (tape.recording()) {
    st.cross.memory_grad = Tensor::zeros(mem.value().shape(), mem.value().dtype(), core_.device());
    record_buffer_grad(tape, mem, st.cross.memory_grad);
  }
  Var y = embed(tape, dec, opt.train ? c.hidden_dropout : 0.0f, seed);
  const uint64_t nc = static_cast<uint64_t>(B * Td * c.hidden_size);
  const int64_t S = std::max(Te, Td);
  const uint64_t blk = static_cast<uint64_t>((S * S + 3) / 4);
  st.offset = [nc, Le](int64_t l) { return nc * (1 + 3 * static_cast<uint64_t>(l - Le)); };
  st.attention_offset = [blk, Le](int64_t l) { return static_cast<uint64_t>(l - Le) * blk; };
  st.cross_attention_offset = [blk, Le, Ld](int64_t l) { return static_cast<uint64_t>(Ld + l - Le) * blk; };
  if (c.relative_positions()) relative_bias(tape, st, Td, false);
  ForwardOptions o = opt;
  o.kv_lengths = Tensor();  // the decoder's self-attention is causal; its padding is only ever a later key
  y = core_.layers(tape, core_.chunk(0), y, B, Td, o, &st);
  const ParamSet& ps = core_.params();
  return output_logits(tape, tp, final_norm(tape, c, tp, ps, y), output_weight(c, ps), Var());  // (Nd, V/t)
}

Var T5::forward(Tape& tape, const T5Batch& batch, const ForwardOptions& opt) {
  const GPTConfig& c = config();
  MPT_CHECK(batch.enc.defined() && batch.dec.defined() && batch.labels.defined() && batch.enc_lengths.defined(),
            "T5::forward: the batch lacks encoder or decoder tokens, labels or encoder lengths", "");
  MPT_CHECK(batch.labels.shape() == batch.dec.shape() && batch.enc_lengths.numel() == batch.enc.dim(0) &&
                batch.dec.dim(0) == batch.enc.dim(0),
            str("T5::forward: encoder ", shape_str(batch.enc.shape()), ", decoder ", shape_str(batch.dec.shape()),
                ", labels ", shape_str(batch.labels.shape()), " and lengths ", shape_str(batch.enc_lengths.shape()),
                " do not fit together"),
            "");
  core_.need_params_outside_blocks(opt);
  const Tensor lengths = batch.padded() ? batch.enc_lengths : Tensor();
  const Var mem = encoder(tape, batch.enc, lengths, opt);
  const Var logits = decoder_logits(tape, mem, batch.enc.dim(1), lengths, batch.dec, opt);
  return lm_loss(tape, c, core_.parallel().tp, logits, batch.labels);
}

ForwardOptions T5::inference(const char* what, bool tensor_parallel_ok) const {
  const TensorParallel& tp = core_.parallel().tp;
  MPT_CHECK(tp.size == 1 || (tensor_parallel_ok && !tp.sequence_parallel),
            str("T5::", what, tensor_parallel_ok ? " runs without sequence parallelism" : " needs the whole model on one rank"),
            "load the checkpoint into a single process (it loads under any layout)");
  ForwardOptions o;
  o.train = false;
  return o;
}

Tensor T5::encode(const Tensor& enc, const Tensor& enc_lengths) {
  const ForwardOptions o = inference("encode", /*tensor_parallel_ok=*/true);
  Tape tape;
  tape.set_recording(false);
  return encoder(tape, enc, enc_lengths, o).value();
}

Tensor T5::logits(const T5Batch& batch) {
  const ForwardOptions o = inference("logits");
  Tape tape;
  tape.set_recording(false);
  const Tensor lengths = batch.padded() ? batch.enc_lengths : Tensor();
  const Var mem = encoder(tape, batch.enc, lengths, o);
  return decoder_logits(tape, mem, batch.enc.dim(1), lengths, batch.dec, o).value().to(Device::cpu()).to(DType::F32);
}

namespace {
// The argmax over the unpadded vocabulary of a row of logits (first of equals, as torch.argmax).
int64_t argmax(const std::vector<float>& row, int64_t vocab) {
  return std::max_element(row.begin(), row.begin() + vocab) - row.begin();
}
}  // namespace

std::vector<int64_t> T5::greedy(const Tensor& enc, int64_t enc_length, int64_t start, int64_t eos, int64_t max_new) {
  (void)inference("greedy", /*tensor_parallel_ok=*/true);
  std::vector<int64_t> out{start};
  if (max_new <= 0) return out;
  T5DecodeState state(*this, enc, enc_length, max_new);
  for (int64_t step = 0; step < max_new; ++step) {
    const int64_t next = argmax(state.step({out.back()}), config().vocab_size);
    out.push_back(next);
    if (next == eos) break;
  }
  return out;
}

std::vector<int64_t> T5::greedy_recompute(const Tensor& enc, int64_t enc_length, int64_t start, int64_t eos,
                                          int64_t max_new) {
  const ForwardOptions o = inference("greedy_recompute");
  MPT_CHECK(enc.ndim() == 2 && enc.dim(0) == 1 && enc_length >= 1 && enc_length <= enc.dim(1),
            str("T5::greedy: one sample (1, Te) with 1 <= length <= Te, got ", shape_str(enc.shape()), " length ",
                enc_length),
            "");
  const GPTConfig& c = config();
  Tape tape;
  tape.set_recording(false);
  const Tensor lengths = enc_length < enc.dim(1) ? Tensor::from_ints({enc_length}, {1}, DType::I32) : Tensor();
  const Var mem = encoder(tape, enc, lengths, o);
  std::vector<int64_t> out{start};
  for (int64_t step = 0; step < max_new; ++step) {
    const int64_t T = static_cast<int64_t>(out.size());
    const Tensor dec = Tensor::from_ints(out, {1, T}, DType::I32);
    const std::vector<float> row =
        decoder_logits(tape, mem, enc.dim(1), lengths, dec, o).value().slice(0, T - 1, T).to(Device::cpu()).to(DType::F32).to_floats();
    const int64_t next = argmax(row, c.vocab_size);
    out.push_back(next);
    if (next == eos) break;
  }
  return out;
}

}  // namespace mpitron
