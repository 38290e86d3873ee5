// tensor/cuda/attention.cpp — self-attention on CUDA (causal, or bidirectional
// with a key padding mask: attention.h's AttentionMask): cuDNN fused flash
// attention (graph API through the header-only cudnn-frontend), with the
// cuBLAS + softmax path of attention_fallback.cu behind it.
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
//   Mask: causal → set_causal_mask (top-left diagonal); kv_lengths → cuDNN's
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
//   would disagree (docs/cuda.md). Such calls count as `.fallback`.
// Built graphs are cached by (device, B, T, NH, G, HD, dtype, scale, fwd/bwd, causal,
// padded); the
// cuDNN workspace comes from the caching allocator. Compiled by the host
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

using GraphKey = std::tuple<int, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t, bool, bool>;

// Builds (or finds) the fwd/bwd SDPA graph for this shape. Never throws for an
// unsupported configuration: returns an entry with ok = false instead.
// causal: the causal mask; padded: the padding mask (seq_len_q/seq_len_kv inputs kSeqQ/kSeqKV).
std::shared_ptr<GraphEntry> sdpa_graph(int device, cudnnHandle_t h, bool forward, int64_t B, int64_t T, int64_t NH,
                                       int64_t G, int64_t HD, DType dt, float scale, bool causal, bool padded) {
  static std::mutex mu;
  static auto* cache = new std::map<GraphKey, std::shared_ptr<GraphEntry>>();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, 4);
  const GraphKey key{device, forward, B, T, NH, G, HD, static_cast<int>(dt), scale_bits, causal, padded};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;

  auto e = std::make_shared<GraphEntry>();
  const int64_t C = NH * HD, W = (NH + 2 * G) * HD;
  const std::vector<int64_t> dims{B, NH, T, HD}, kv_dims{B, G, T, HD};
  const std::vector<int64_t> qkv_strides{T * W, HD, W, 1}, o_strides{T * C, HD, C, 1};
  const std::vector<int64_t> stat_dims{B, NH, T, 1}, stat_strides{NH * T, T, 1, 1};
  try {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(dt == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, int64_t uid, const std::vector<int64_t>& d, const std::vector<int64_t>& st) {
      return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(st));
    };
    auto Q = tensor("Q", kQ, dims, qkv_strides);
    auto K = tensor("K", kK, kv_dims, qkv_strides);
    auto V = tensor("V", kV, kv_dims, qkv_strides);
    // Padding mask: per-sample lengths (B, 1, 1, 1) i32.
    auto seq_len = [&](const char* name, int64_t uid) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({B, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::INT32));
    };
    if (forward) {
      auto opts = fe::graph::SDPA_attributes()
                      .set_name("sdpa")
                      .set_generate_stats(true)
                      .set_causal_mask(causal)
                      .set_attn_scale(scale);
      if (padded)
        opts.set_padding_mask(true).set_seq_len_q(seq_len("seq_len_q", kSeqQ)).set_seq_len_kv(seq_len("seq_len_kv", kSeqKV));
      auto [O, Stats] = g->sdpa(Q, K, V, opts);
      O->set_output(true).set_dim(dims).set_stride(o_strides).set_uid(kO);
      Stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim(stat_dims).set_stride(stat_strides).set_uid(
          kStats);
    } else {
      auto O = tensor("O", kO, dims, o_strides);
      auto dO = tensor("dO", kDO, dims, o_strides);
      auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim(stat_dims)
                                 .set_stride(stat_strides)
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opts =
          fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_causal_mask(causal).set_attn_scale(scale);
      if (padded)
        opts.set_padding_mask(true).set_seq_len_q(seq_len("seq_len_q", kSeqQ)).set_seq_len_kv(seq_len("seq_len_kv", kSeqKV));
      auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
      dQ->set_output(true).set_dim(dims).set_stride(qkv_strides).set_uid(kDQ);
      dK->set_output(true).set_dim(kv_dims).set_stride(qkv_strides).set_uid(kDK);
      dV->set_output(true).set_dim(kv_dims).set_stride(qkv_strides).set_uid(kDV);
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
  if (!e->ok)
    log_warn(str("attention: cuDNN ", forward ? "forward" : "backward", " unavailable for B=", B, " T=", T,
                 " NH=", NH, " G=", G, " HD=", HD, " ", dtype_name(dt), causal ? " causal" : " bidirectional",
                 padded ? " padded" : "", " (", e->why, "); using the cuBLAS path"));
  cache->emplace(key, e);
  return e;
}

bool cudnn_eligible(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dqkv) {
  if (g_force_fallback.load() || qkv.dtype() == DType::F32) return false;
  return attention_cudnn_aligned(qkv, out, lse, dout, dqkv);
}

void execute(const GraphEntry& e, cudnnHandle_t h, int device, std::unordered_map<int64_t, void*>& pack, Stream s) {
  Scratch ws(device, static_cast<size_t>(e.workspace), s);
  MPT_CUDNN_CHECK(cudnnSetStream(h, stream_of(s)));
  fe::error_t st = e.graph->execute(h, pack, ws.get());
  if (st.is_bad())
    MPT_THROW(str("cuDNN attention failed to execute: ", st.get_message()),
              "cuda_attention_force_fallback(true) uses the cuBLAS path");
}
}  // namespace
#endif  // MPITRON_WITH_CUDNN

// out = softmax(Q·Kᵀ·scale, mask)·V, lse = its row statistics (attention.h)
void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       const AttentionDropout& drop, const AttentionMask& mask, Stream s) {
#ifdef MPITRON_WITH_CUDNN
  const AttnShape d = attn_shape(qkv, out);
  const int64_t B = d.B, T = d.T, NH = d.NH, HD = d.HD;
  const size_t es = dtype_size(qkv.dtype());
  char* q = static_cast<char*>(qkv.data_ptr());
  if (B * T * NH > 0 && drop.p == 0.0f && cudnn_eligible(qkv, out, lse, Tensor(), Tensor())) {
    DeviceGuard g(qkv);
    const int dev = qkv.device().index;
    const cudnnHandle_t h = cudnn_handle(dev);
    const bool padded = mask.kv_lengths.defined();
    const auto e = sdpa_graph(dev, h, true, B, T, NH, d.G, HD, qkv.dtype(), scale, mask.causal, padded);
    if (e->ok) {
      std::unordered_map<int64_t, void*> pack{{kQ, q},
                                              {kK, q + d.k_off * es},
                                              {kV, q + d.v_off * es},
                                              {kO, out.data_ptr()},
                                              {kStats, lse.data_ptr()}};
      if (padded) {
        pack[kSeqQ] = full_seq_lens(dev, B, T).data_ptr();
        pack[kSeqKV] = mask.kv_lengths.data_ptr();
      }
      execute(*e, h, dev, pack, s);
      path_count_add("attention_forward", "cudnn");
      return;
    }
  }
#endif
  path_count_add("attention_forward", "fallback");
  attention_forward_fallback(qkv, out, lse, scale, drop, mask, s);
}

// dqkv (qkv's shape) = gradients of Q, K, V (overwritten; dK/dV summed over each group's heads)
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, const AttentionDropout& drop, const AttentionMask& mask,
                        Stream s) {
#ifdef MPITRON_WITH_CUDNN
  const AttnShape d = attn_shape(qkv, out);
  const int64_t B = d.B, T = d.T, NH = d.NH, HD = d.HD;
  const size_t es = dtype_size(qkv.dtype());
  char* q = static_cast<char*>(qkv.data_ptr());
  char* dq = static_cast<char*>(dqkv.data_ptr());
  // T = 1: cuDNN 9's SDPA backward refuses s_q = s_kv = 1 (seen on an H200), so the fallback
  // runs without asking (the lse of either path serves the other).
  if (B * T * NH > 0 && T > 1 && drop.p == 0.0f && cudnn_eligible(qkv, out, lse, dout, dqkv)) {
    DeviceGuard g(qkv);
    const int dev = qkv.device().index;
    const cudnnHandle_t h = cudnn_handle(dev);
    const bool padded = mask.kv_lengths.defined();
    const auto e = sdpa_graph(dev, h, false, B, T, NH, d.G, HD, qkv.dtype(), scale, mask.causal, padded);
    if (e->ok) {
      std::unordered_map<int64_t, void*> pack{{kQ, q},
                                              {kK, q + d.k_off * es},
                                              {kV, q + d.v_off * es},
                                              {kO, out.data_ptr()},
                                              {kDO, dout.data_ptr()},
                                              {kStats, lse.data_ptr()},
                                              {kDQ, dq},
                                              {kDK, dq + d.k_off * es},
                                              {kDV, dq + d.v_off * es}};
      if (padded) {
        pack[kSeqQ] = full_seq_lens(dev, B, T).data_ptr();
        pack[kSeqKV] = mask.kv_lengths.data_ptr();
        // Padded keys' dK/dV rows: 0, whether or not cuDNN writes them.
        MPT_CUDA_CHECK(cudaMemsetAsync(dq, 0, dqkv.nbytes(), stream_of(s)));
      }
      execute(*e, h, dev, pack, s);
      path_count_add("attention_backward", "cudnn");
      return;
    }
  }
#endif
  path_count_add("attention_backward", "fallback");
  attention_backward_fallback(dout, qkv, out, lse, dqkv, scale, drop, mask, s);
}

}  // namespace mpitron::cuda
