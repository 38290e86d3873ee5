// tensor/cuda/attention.cpp — self-attention on CUDA (causal, or bidirectional
// with a key padding mask: attention.h's AttentionMask; or one block of a longer
// sequence: attention_block.h): cuDNN fused flash attention (graph API through the
// header-only cudnn-frontend), with the cuBLAS + softmax path of
// attention_fallback.cu behind it. Both take one AttnProblem (internal.h).
//
//   qkv (B, T, NH + 2G, HD) (or the 5-D MHA form, G = NH), out (B, T, NH, HD),
//   lse (B, NH, T) f32, C = NH·HD, W = (NH + 2G)·HD
//   cuDNN sees Q as a strided (B, NH, T, HD) view of the packed qkv and K, V as
//     (B, G, T, HD) views (cuDNN's SDPA takes GQA/MQA directly: head h uses kv head
//     h / (NH/G)), all with strides (T·W, HD, W, 1), K at +NH·HD elements, V at
//     +(NH + G)·HD;
//   O and dO as (B, NH, T, HD) with strides (T·C, HD, C, 1); dQ/dK/dV like Q/K/V
//   inside dqkv; the softmax statistics (B, NH, T, 1) f32 are our lse
//   (natural-log logsumexp of the scaled, masked scores — the fallback's too,
//   so a cuDNN forward and a fallback backward, or the reverse, agree).
//   Mask: causal → set_causal_mask (top-left diagonal); a sliding window W →
//   also set_diagonal_band_left_bound(W + 1) (cuDNN keeps key j of row i iff
//   j + bound > i: W + 1 keys, attention.h's window); kv_lengths → cuDNN's
//   padding mask with seq_len_kv = kv_lengths and seq_len_q = T for every sample
//   (a (B) i32 device tensor of T's, made once per (device, B, T) and kept): every
//   query row is computed, as attention.h defines, only keys are cut. Backward with
//   the padding mask first zeroes dqkv (cudaMemsetAsync), so the dK/dV rows of
//   padded keys, which cuDNN may leave unwritten, are their true gradient 0.
//
// Which path runs (per call):
//   cuDNN when the build has it (MPITRON_WITH_CUDNN), the dtype is bf16/f16,
//   cuda_attention_force_fallback(false) (initially true when the environment
//   has MPITRON_ATTENTION=cublas), the pointers are 16-byte aligned, and
//   cuDNN accepts the graph for this shape (checked once per shape and cached:
//   e.g. HD must be a multiple of 8 and ≤ 128/256 depending on the GPU/cuDNN).
//   Otherwise the fallback — and always the fallback with attention dropout
//   (drop.p > 0): cuDNN's SDPA dropout draws its own Philox mask, which cannot
//   equal attention_keep's (attention.h), so CPU, CUDA, TP ranks and recompute
//   would disagree (docs/cuda.md); and with logit soft-capping (mask.softcap > 0,
//   Gemma 2), which cuDNN's SDPA graph has no option for. Such calls count as `.fallback`.
// Blocks (attention_block.h): cuDNN takes a block whose mask is one of its forms —
// the diagonal block (q_start = k_start, Tq = Tk: top-left causal), a block every
// query sees whole (k_start + Tk − 1 <= q_start, or not causal: no mask), or
// bottom-right causal (q_start + Tq = k_start + Tk, Tq <= Tk) — with its operands'
// own strides; any other block, and every block with a score bias, kv_lengths or a
// softcap (attention_block.h), runs the fallback. A block whose v is Dv != HD wide (MLA)
// asks cuDNN with V, O, dO, dV of width Dv (cuDNN's d_v; the frontend takes d_qk != d_v,
// e.g. 192/128 on Hopper with cuDNN 9.x; its check_support decides per shape and a
// rejection falls back like any other).
// Built graphs are cached by the problem's sizes, strides, dtype, scale, direction and
// mask form; the cuDNN workspace comes from the caching allocator. Compiled by the host
// compiler (the frontend is plain C++), so kernels live in the .cu files.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/log.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/internal.h"
#include "tensor/cuda/ops.h"

#ifdef MPITRON_WITH_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace mpitron::cuda {

namespace {
// MPITRON_ATTENTION=cublas starts with the fallback forced (e.g. to rule cuDNN out).
bool env_forces_fallback() {
  const char* e = std::getenv("MPITRON_ATTENTION");
  return e && std::strcmp(e, "cublas") == 0;
}
std::atomic<bool> g_force_fallback{env_forces_fallback()};
}  // namespace

std::string attention_backend_name() {
#ifdef MPITRON_WITH_CUDNN
  return g_force_fallback.load() ? "cublas" : "cudnn";
#else
  return "cublas";
#endif
}

void attention_force_fallback(bool on) { g_force_fallback.store(on); }

// Every pointer cuDNN reads or writes, Q/K/V (and dQ/dK/dV) at their offsets in
// the packed qkv, must be 16-byte aligned: O, dO and the f32 statistics too.
namespace {
// qkv (B, T, 3, NH, HD) or (B, T, NH + 2G, HD), out (B, T, NH, HD): the head counts and
// the element offsets of K and V inside a token's row.
struct AttnShape {
  int64_t B, T, NH, G, HD, k_off, v_off;
};
AttnShape attn_shape(const Tensor& qkv, const Tensor& out) {
  const int64_t nh = out.dim(2), hd = out.dim(3);
  const int64_t heads = qkv.ndim() == 5 ? 3 * qkv.dim(3) : qkv.dim(2), g = (heads - nh) / 2;
  return {out.dim(0), out.dim(1), nh, g, hd, nh * hd, (nh + g) * hd};
}
}  // namespace

bool attention_cudnn_aligned(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                             const Tensor& dqkv) {
  const AttnShape d = attn_shape(qkv, out);  // K and V sit at k_off / v_off in each token's row
  const size_t es = dtype_size(qkv.dtype());
  auto packed_ok = [&](const Tensor& t) {
    const char* p = static_cast<const char*>(t.data_ptr());
    return aligned16(p) && aligned16(p + d.k_off * es) && aligned16(p + d.v_off * es);
  };
  if (!packed_ok(qkv) || !aligned16(out.data_ptr()) || !aligned16(lse.data_ptr())) return false;
  if (dout.defined() && !aligned16(dout.data_ptr())) return false;
  if (dqkv.defined() && !packed_ok(dqkv)) return false;
  return true;
}

#ifdef MPITRON_WITH_CUDNN
namespace {
namespace fe = cudnn_frontend;

#define MPT_CUDNN_CHECK(expr)                                                                  \
  do {                                                                                         \
    const cudnnStatus_t st_ = (expr);                                                          \
    if (st_ != CUDNN_STATUS_SUCCESS)                                                           \
      MPT_THROW(::mpitron::str("cuDNN error ", cudnnGetErrorString(st_), " in ", #expr),       \
                "check that libcudnn.so.9 matches the headers; MPITRON_ATTENTION=cublas avoids cuDNN"); \
  } while (0)

// Tensor uids in the variant packs.
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqQ, kSeqKV };

// seq_len_q of the padding mask: (B) i32 on `device`, every entry T (made once, kept).
const Tensor& full_seq_lens(int device, int64_t B, int64_t T) {
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<int, int64_t, int64_t>, Tensor>();
  std::lock_guard<std::mutex> lock(mu);
  Tensor& t = (*cache)[{device, B, T}];
  if (!t.defined()) t = Tensor::from_ints(std::vector<int64_t>(static_cast<size_t>(B), T), {B}, DType::I32).to(Device::cuda(device));
  return t;
}

cudnnHandle_t cudnn_handle(int device) {
  static std::mutex mu;
  static std::map<int, cudnnHandle_t> handles;  // process lifetime (no teardown-order issues)
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  MPT_CUDNN_CHECK(cudnnCreate(&h));
  handles[device] = h;
  return h;
}

struct GraphEntry {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  bool ok = false;
  std::string why;  // when !ok: what cuDNN said
};

// The mask forms cuDNN's SDPA takes.
enum class MaskForm { None, TopLeft, BottomRight };

// Builds (or finds) the fwd/bwd SDPA graph for this problem's sizes and strides.
// Never throws for an unsupported configuration: returns an entry with ok = false instead.
// padded: the padding mask (seq_len_q/seq_len_kv inputs kSeqQ/kSeqKV).
std::shared_ptr<GraphEntry> sdpa_graph(cudnnHandle_t h, bool forward, const AttnProblem& d, float scale,
                                       MaskForm mask, bool padded) {
  static std::mutex mu;
  static auto* cache = new std::map<std::vector<int64_t>, std::shared_ptr<GraphEntry>>();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, 4);
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, NH = d.NH, G = d.G, HD = d.HD, Dv = d.Dv;
  std::vector<int64_t> key{d.device, forward, B, Tq, Tk, NH, G, HD, Dv, static_cast<int64_t>(d.dt), scale_bits,
                           static_cast<int64_t>(mask), padded, d.window, d.q.sb, d.q.st, d.k.sb, d.k.st, d.v.sb, d.v.st,
                           d.out.sb, d.out.st, d.lse_sb, d.lse_sh};
  if (!forward)
    for (const AttnRows* r : {&d.dout, &d.dq, &d.dk, &d.dv}) key.insert(key.end(), {r->sb, r->st});
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;

  auto e = std::make_shared<GraphEntry>();
  // q, k (and dq, dk) HD wide; v, o, do (and dv) Dv wide (MLA: cuDNN's d_qk != d_v).
  const std::vector<int64_t> q_dims{B, NH, Tq, HD}, k_dims{B, G, Tk, HD}, v_dims{B, G, Tk, Dv}, o_dims{B, NH, Tq, Dv};
  auto strides = [&](const AttnRows& r, int64_t w = -1) { return std::vector<int64_t>{r.sb, w < 0 ? HD : w, r.st, 1}; };
  const std::vector<int64_t> stat_dims{B, NH, Tq, 1}, stat_strides{d.lse_sb, d.lse_sh, 1, 1};
  try {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(d.dt == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, int64_t uid, const std::vector<int64_t>& dm, const std::vector<int64_t>& st) {
      return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dm).set_stride(st));
    };
    auto Q = tensor("Q", kQ, q_dims, strides(d.q));
    auto K = tensor("K", kK, k_dims, strides(d.k));
    auto V = tensor("V", kV, v_dims, strides(d.v, Dv));
    // Padding mask: per-sample lengths (B, 1, 1, 1) i32.
    auto seq_len = [&](const char* name, int64_t uid) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({B, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::INT32));
    };
    auto with_mask = [&](auto& opts) {
      if (mask == MaskForm::TopLeft) opts.set_causal_mask(true);
      if (mask == MaskForm::TopLeft && d.window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(d.window + 1));
      if (mask == MaskForm::BottomRight) opts.set_causal_mask_bottom_right(true);
      if (padded)
        opts.set_padding_mask(true).set_seq_len_q(seq_len("seq_len_q", kSeqQ)).set_seq_len_kv(seq_len("seq_len_kv", kSeqKV));
    };
    if (forward) {
      auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale);
      with_mask(opts);
      auto [O, Stats] = g->sdpa(Q, K, V, opts);
      O->set_output(true).set_dim(o_dims).set_stride(strides(d.out, Dv)).set_uid(kO);
      Stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim(stat_dims).set_stride(stat_strides).set_uid(
          kStats);
    } else {
      auto O = tensor("O", kO, o_dims, strides(d.out, Dv));
      auto dO = tensor("dO", kDO, o_dims, strides(d.dout, Dv));
      auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim(stat_dims)
                                 .set_stride(stat_strides)
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(scale);
      with_mask(opts);
      auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
      dQ->set_output(true).set_dim(q_dims).set_stride(strides(d.dq)).set_uid(kDQ);
      dK->set_output(true).set_dim(k_dims).set_stride(strides(d.dk)).set_uid(kDK);
      dV->set_output(true).set_dim(v_dims).set_stride(strides(d.dv, Dv)).set_uid(kDV);
    }
    fe::error_t st = g->validate();
    if (st.is_good()) st = g->build_operation_graph(h);
    if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
    if (st.is_good()) st = g->check_support(h);
    if (st.is_good()) st = g->build_plans(h);
    if (st.is_good()) st = g->get_workspace_size(e->workspace);
    if (st.is_good()) {
      e->graph = std::move(g);
      e->ok = true;
    } else {
      e->why = st.get_message();
    }
  } catch (const std::exception& ex) {
    e->ok = false;
    e->why = ex.what();
  }
  static const char* mask_names[] = {" no mask", " causal", " causal bottom-right"};
  if (!e->ok)
    log_warn(str("attention: cuDNN ", forward ? "forward" : "backward", " unavailable for B=", B, " Tq=", Tq,
                 " Tk=", Tk, " NH=", NH, " G=", G, " HD=", HD, Dv != HD ? str(" Dv=", Dv) : std::string(), " ",
                 dtype_name(d.dt),
                 mask_names[static_cast<int>(mask)], padded ? " padded" : "",
                 d.window > 0 ? str(" window ", d.window) : std::string(), " (", e->why, "); using the cuBLAS path"));
  cache->emplace(std::move(key), e);
  return e;
}

// Every pointer cuDNN reads or writes is 16-byte aligned.
bool problem_aligned(const AttnProblem& d, bool forward) {
  for (const AttnRows* r : {&d.q, &d.k, &d.v, &d.out})
    if (!aligned16(r->p)) return false;
  if (!aligned16(d.lse)) return false;
  if (!forward)
    for (const AttnRows* r : {&d.dout, &d.dq, &d.dk, &d.dv})
      if (!aligned16(r->p)) return false;
  return true;
}

void execute(const GraphEntry& e, cudnnHandle_t h, int device, std::unordered_map<int64_t, void*>& pack, Stream s) {
  Scratch ws(device, static_cast<size_t>(e.workspace), s);
  MPT_CUDNN_CHECK(cudnnSetStream(h, stream_of(s)));
  fe::error_t st = e.graph->execute(h, pack, ws.get());
  if (st.is_bad())
    MPT_THROW(str("cuDNN attention failed to execute: ", st.get_message()),
              "cuda_attention_force_fallback(true) uses the cuBLAS path");
}

// Attention dropout (our Philox mask, not cuDNN's) and logit soft-capping (no SDPA option)
// are the fallback's alone.
bool cudnn_may_take(const AttentionDropout& drop, const AttentionMask& mask) {
  return drop.p == 0.0f && mask.softcap == 0.0f;
}

// Runs the problem on cuDNN when it can (true), else returns false and the caller
// runs the fallback. padded: the whole call's padding mask (kv_len).
bool try_cudnn(const AttnProblem& d, bool forward, float scale, MaskForm mask, Stream s) {
  if (g_force_fallback.load() || d.dt == DType::F32 || d.B * d.Tq * d.NH == 0) return false;
  // T = 1: cuDNN 9's SDPA backward refuses s_q = s_kv = 1 (seen on an H200), so the
  // fallback runs without asking (the lse of either path serves the other).
  if (!forward && d.Tq == 1 && d.Tk == 1) return false;
  if (!problem_aligned(d, forward)) return false;
  DeviceGuard g(d.device);
  const cudnnHandle_t h = cudnn_handle(d.device);
  const bool padded = d.kv_len != nullptr;
  const auto e = sdpa_graph(h, forward, d, scale, mask, padded);
  if (!e->ok) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, d.q.p}, {kK, d.k.p}, {kV, d.v.p}, {kO, d.out.p}, {kStats, d.lse}};
  if (!forward) {
    pack[kDO] = d.dout.p;
    pack[kDQ] = d.dq.p;
    pack[kDK] = d.dk.p;
    pack[kDV] = d.dv.p;
  }
  if (padded) {
    pack[kSeqQ] = full_seq_lens(d.device, d.B, d.Tq).data_ptr();
    pack[kSeqKV] = const_cast<int32_t*>(d.kv_len);
  }
  execute(*e, h, d.device, pack, s);
  return true;
}
}  // namespace
#endif  // MPITRON_WITH_CUDNN

// out = softmax(Q·Kᵀ·scale, mask)·V, lse = its row statistics (attention.h)
void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       const AttentionDropout& drop, const AttentionMask& mask, Stream s) {
  const AttnProblem d = attention_problem(qkv, out, lse, mask);
#ifdef MPITRON_WITH_CUDNN
  if (cudnn_may_take(drop, mask) && try_cudnn(d, true, scale, mask.causal ? MaskForm::TopLeft : MaskForm::None, s)) {
    path_count_add("attention_forward", "cudnn");
    return;
  }
#endif
  path_count_add("attention_forward", "fallback");
  attention_fallback_forward(d, scale, drop, s);
}

// dqkv (qkv's shape) = gradients of Q, K, V (overwritten; dK/dV summed over each group's heads)
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, const AttentionDropout& drop, const AttentionMask& mask,
                        Stream s) {
  const AttnProblem d = attention_problem(qkv, out, lse, mask, dout, dqkv);
#ifdef MPITRON_WITH_CUDNN
  if (cudnn_may_take(drop, mask) && d.kv_len) {
    // Padded keys' dK/dV rows: 0, whether or not cuDNN writes them (the fallback writes every row).
    DeviceGuard g(qkv);
    MPT_CUDA_CHECK(cudaMemsetAsync(dqkv.data_ptr(), 0, dqkv.nbytes(), stream_of(s)));
  }
  if (cudnn_may_take(drop, mask) && try_cudnn(d, false, scale, mask.causal ? MaskForm::TopLeft : MaskForm::None, s)) {
    path_count_add("attention_backward", "cudnn");
    return;
  }
#endif
  path_count_add("attention_backward", "fallback");
  attention_fallback_backward(d, scale, drop, s);
}

// ---- the block form (attention_block.h) ---------------------------------------------------
namespace {
AttnRows rows_of(const Tensor& t) {
  return {t.defined() ? t.data_ptr() : nullptr, t.defined() ? t.strides()[0] : 0, t.defined() ? t.strides()[1] : 0};
}
AttnProblem block_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const AttentionBlock& blk) {
  AttnProblem d;
  d.device = q.device().index;
  d.B = q.dim(0), d.Tq = q.dim(1), d.Tk = k.dim(1), d.NH = q.dim(2), d.G = k.dim(2), d.HD = q.dim(3), d.Dv = v.dim(3);
  d.dt = q.dtype();
  d.q = rows_of(q), d.k = rows_of(k), d.v = rows_of(v), d.out = rows_of(out);
  d.lse = static_cast<float*>(lse.data_ptr()), d.lse_sb = lse.strides()[0], d.lse_sh = lse.strides()[1];
  d.q_start = blk.q_start, d.k_start = blk.k_start, d.seq = blk.seq > 0 ? blk.seq : d.Tq;
  d.causal = blk.causal;
  d.kv_len = blk.kv_lengths.defined() ? static_cast<const int32_t*>(blk.kv_lengths.data_ptr()) : nullptr;
  d.bias = blk.bias.defined() ? static_cast<const float*>(blk.bias.data_ptr()) : nullptr;
  d.softcap = blk.softcap;
  return d;
}
#ifdef MPITRON_WITH_CUDNN
// The cuDNN mask form that is exactly this block's mask; false when there is none.
bool block_mask_form(const AttnProblem& d, MaskForm* form) {
  if (d.kv_len || d.bias || d.bias_grad || d.softcap > 0.0f) return false;  // the fallback's alone (attention_block.h)
  const int64_t q_last = d.q_start + d.Tq - 1, k_last = d.k_start + d.Tk - 1;
  if (!d.causal || k_last <= d.q_start) *form = MaskForm::None;  // every query sees every key
  else if (d.q_start == d.k_start && d.Tq == d.Tk) *form = MaskForm::TopLeft;
  else if (q_last == k_last && d.Tq <= d.Tk) *form = MaskForm::BottomRight;
  else return false;
  return true;
}
#endif
}  // namespace

void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, float scale, const AttentionBlock& blk, const AttentionDropout& drop,
                             Stream s) {
  const AttnProblem d = block_problem(q, k, v, out, lse, blk);
#ifdef MPITRON_WITH_CUDNN
  MaskForm form;
  if (drop.p == 0.0f && block_mask_form(d, &form) && try_cudnn(d, true, scale, form, s)) {
    path_count_add("attention_block_forward", "cudnn");
    return;
  }
#endif
  path_count_add("attention_block_forward", "fallback");
  attention_fallback_forward(d, scale, drop, s);
}

void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, float scale, const AttentionBlock& blk, const AttentionDropout& drop,
                              Stream s) {
  AttnProblem d = block_problem(q, k, v, out, lse, blk);
  d.dout = rows_of(dout), d.dq = rows_of(dq), d.dk = rows_of(dk), d.dv = rows_of(dv);
  d.bias_grad = blk.bias_grad.defined() ? static_cast<float*>(blk.bias_grad.data_ptr()) : nullptr;
#ifdef MPITRON_WITH_CUDNN
  MaskForm form;
  if (drop.p == 0.0f && block_mask_form(d, &form) && try_cudnn(d, false, scale, form, s)) {
    path_count_add("attention_block_backward", "cudnn");
    return;
  }
#endif
  path_count_add("attention_block_backward", "fallback");
  attention_fallback_backward(d, scale, drop, s);
}

}  // namespace mpitron::cuda
