// parallel/context_parallel.cpp — ring (p2p), all-gather and all-to-all attention
// over the cp group (context_parallel.h).
//
// Buffers are laid out chunk-major so every piece one call reads or adds to is a
// contiguous tensor: kv (2 [K, V], 2 [local chunk], B, Tc, G, HD) in the compute
// dtype travels the ring; the f32 accumulators (output and lse per local query chunk,
// dQ per query chunk, dK/dV per key chunk) have the same shape. The model's tensors
// (qkv, out, lse, dqkv) are read and written through strided views of their chunks.
#include "parallel/context_parallel.h"

#include <cmath>
#include <utility>

#include "core/error.h"
#include "tensor/ops.h"

namespace mpitron {

const char* cp_comm_type_name(CpCommType t) {
  switch (t) {
    case CpCommType::P2P: return "p2p";
    case CpCommType::AllGather: return "all_gather";
    case CpCommType::AllToAll: return "a2a";
  }
  return "?";
}

CpCommType parse_cp_comm_type(const std::string& s) {
  if (s == "p2p") return CpCommType::P2P;
  if (s == "all_gather") return CpCommType::AllGather;
  if (s == "a2a") return CpCommType::AllToAll;
  MPT_THROW(str("--cp-comm-type ", s, " is not one of p2p, all_gather, a2a"),
            "p2p: ring attention (default); all_gather: K/V gathered first; a2a: DeepSpeed Ulysses all-to-all");
}

int64_t ContextParallel::global_position(int64_t t, int64_t T) const {
  const int64_t tc = chunk_len(T);
  return t < tc ? chunk_id(0) * tc + t : chunk_id(1) * tc + (t - tc);
}

std::vector<ContextParallel::Run> ContextParallel::runs(int64_t T) const {
  if (size == 1) return {{0, 0, T}};
  const int64_t tc = chunk_len(T);
  return {{0, chunk_id(0) * tc, tc}, {tc, chunk_id(1) * tc, tc}};
}

std::string ContextParallel::describe(int64_t T) const {
  const int64_t tc = chunk_len(T);
  return str("cp ", size, " (", cp_comm_type_name(type), "): rank ", rank, " holds chunks ", chunk_id(0), " and ",
             chunk_id(1), " of ", 2 * size, " (", tc, " tokens each, positions ", chunk_id(0) * tc, "-",
             chunk_id(0) * tc + tc - 1, " and ", chunk_id(1) * tc, "-", chunk_id(1) * tc + tc - 1, ")");
}

void check_context_parallel(const ContextParallel& cp, int64_t T, int64_t heads, int64_t groups) {
  if (!cp.active()) return;
  MPT_CHECK(cp.comm && cp.comm->size() == cp.size, str("context parallelism of size ", cp.size, " needs its cp communicator"),
            "this is a bug in the caller");
  MPT_CHECK(T % (2 * cp.size) == 0,
            str("--seq-length ", T, " is not divisible by 2 x --context-parallel-size = ", 2 * cp.size,
                " (each sequence is cut into 2·CP equal chunks)"),
            str("choose --seq-length a multiple of ", 2 * cp.size));
  MPT_CHECK(cp.type != CpCommType::AllToAll || (heads % cp.size == 0 && groups % cp.size == 0),
            str("--cp-comm-type a2a splits the ", heads, " query heads and ", groups,
                " key/value groups of each tensor-parallel rank (--num-attention-heads / --num-query-groups divided by "
                "--tensor-model-parallel-size) over --context-parallel-size ",
                cp.size, ": not divisible"),
            "use --cp-comm-type p2p or all_gather, or a context-parallel size that divides the heads and groups");
}

namespace {

// The sizes of one call: qkv (B, Tl, NH + 2G, HD), Tc = Tl/2.
struct Dims {
  int64_t B, Tl, Tc, NH, G, HD, T;
  DType dt;
  Device dev;
};
Dims dims_of(const ContextParallel& cp, const Tensor& qkv, const Tensor& out) {
  const int64_t nh = out.dim(2), heads = qkv.dim(2);
  MPT_CHECK(qkv.ndim() == 4 && out.ndim() == 4 && (heads - nh) % 2 == 0 && heads > nh && qkv.dim(1) % 2 == 0,
            str("context-parallel attention: qkv ", qkv.describe(), " and out ", out.describe(),
                " must be (B, Tl, NH + 2G, HD) and (B, Tl, NH, HD) with Tl even"),
            "");
  return {qkv.dim(0), qkv.dim(1), qkv.dim(1) / 2, nh, (heads - nh) / 2, qkv.dim(3), qkv.dim(1) * cp.size,
          qkv.dtype(), qkv.device()};
}

// Rows of local chunk l of a (B, Tl, …) tensor; heads [h0, h1) of a (B, T, H, HD) one.
Tensor chunk_rows(const Tensor& t, int l, int64_t tc) { return t.slice(1, l * tc, (l + 1) * tc); }
Tensor heads(const Tensor& t, int64_t h0, int64_t h1) { return t.slice(2, h0, h1); }
// Chunk (l) of the lse (B, NH, Tl).
Tensor lse_chunk(const Tensor& lse, int l, int64_t tc) { return lse.slice(2, l * tc, (l + 1) * tc); }

Tensor empty(const Shape& s, DType dt, Device dev) { return Tensor::empty(s, dt, dev); }

// dst (+)= src for views of any strides: through contiguous copies where needed.
void add_into(const Tensor& dst, const Tensor& src) {
  const Tensor s = src.is_contiguous() ? src : src.contiguous();
  if (dst.is_contiguous()) {
    axpby(1.0f, s, 1.0f, dst);
    return;
  }
  const Tensor d = dst.contiguous();
  axpby(1.0f, s, 1.0f, d);
  dst.copy_from(d);
}
// dst (a view of any dtype) = src (f32, contiguous), rounded.
void store(const Tensor& dst, const Tensor& src) { dst.copy_from(src.dtype() == dst.dtype() ? src : src.to(dst.dtype())); }

// This rank's K and V, chunk-major: (2 [K, V], 2 [chunk], B, Tc, G, HD).
Tensor pack_kv(const Dims& d, const Tensor& qkv) {
  const Tensor kv = empty({2, 2, d.B, d.Tc, d.G, d.HD}, d.dt, d.dev);
  for (int w = 0; w < 2; ++w)
    for (int l = 0; l < 2; ++l) {
      const int64_t h0 = d.NH + w * d.G;
      kv.select(0, w).select(0, l).copy_from(heads(chunk_rows(qkv, l, d.Tc), h0, h0 + d.G));
    }
  return kv;
}
Tensor kv_part(const Tensor& kv, int w, int m) { return kv.select(0, w).select(0, m); }

// ---- p2p: ring attention ------------------------------------------------------------------
// The ring's tags: K/V and the travelling dK/dV.
constexpr int kTagKV = 7301, kTagDKV = 7302;

void ring_forward(const ContextParallel& cp, const Dims& d, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                  float scale, const AttentionDropout& drop) {
  const int P = cp.size, r = cp.rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  Tensor cur = pack_kv(d, qkv), nxt = empty(cur.shape(), d.dt, d.dev);
  const Tensor acc = Tensor::zeros({2, d.B, d.Tc, d.NH, d.HD}, DType::F32, d.dev);
  const Tensor acc_lse = empty({2, d.B, d.NH, d.Tc}, DType::F32, d.dev);
  acc_lse.fill(-INFINITY);
  const Tensor part = empty({d.B, d.Tc, d.NH, d.HD}, d.dt, d.dev), part_lse = empty({d.B, d.NH, d.Tc}, DType::F32, d.dev);
  for (int s = 0; s < P; ++s) {
    const int src = (r + P - s) % P;  // whose K/V this rank holds at step s
    ContextParallel from = cp;
    from.rank = src;
    WorkPtr w;  // the next K/V is on its way while this one is attended to
    if (s + 1 < P) w = cp.comm->batch_p2p_async({{true, cur, next, kTagKV}, {false, nxt, prev, kTagKV}});
    for (int l = 0; l < 2; ++l)
      for (int m = 0; m < 2; ++m) {
        const int cq = cp.chunk_id(l), ck = from.chunk_id(m);
        if (ck > cq) continue;  // every key after every query: fully masked
        const AttentionBlock blk{cq * d.Tc, ck * d.Tc, d.T, true};
        attention_block_forward(heads(chunk_rows(qkv, l, d.Tc), 0, d.NH), kv_part(cur, 0, m), kv_part(cur, 1, m), part,
                                part_lse, scale, blk, drop);
        attention_merge(acc.select(0, l), acc_lse.select(0, l), part, part_lse);
      }
    if (w) {
      w->wait();
      std::swap(cur, nxt);
    }
  }
  for (int l = 0; l < 2; ++l) {
    store(chunk_rows(out, l, d.Tc), acc.select(0, l));
    lse_chunk(lse, l, d.Tc).copy_from(acc_lse.select(0, l));
  }
}

void ring_backward(const ContextParallel& cp, const Dims& d, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse, const Tensor& dqkv, float scale, const AttentionDropout& drop) {
  const int P = cp.size, r = cp.rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  Tensor cur = pack_kv(d, qkv), nxt = empty(cur.shape(), d.dt, d.dev);
  const Shape kv_shape = cur.shape();
  // dK/dV of the K/V at hand: this step's share (contrib), the accumulator that
  // travels with them (send), and the one arriving from the previous rank (recv).
  const Tensor contrib = empty(kv_shape, DType::F32, d.dev);
  Tensor send = empty(kv_shape, DType::F32, d.dev), recv = empty(kv_shape, DType::F32, d.dev);
  const Tensor dq = Tensor::zeros({2, d.B, d.Tc, d.NH, d.HD}, DType::F32, d.dev);
  const Tensor tq = empty({d.B, d.Tc, d.NH, d.HD}, d.dt, d.dev), tk = empty({d.B, d.Tc, d.G, d.HD}, d.dt, d.dev),
               tv = empty(tk.shape(), d.dt, d.dev);
  WorkPtr wd;  // the dK/dV accumulator in flight
  for (int s = 0; s < P; ++s) {
    const int src = (r + P - s) % P;
    ContextParallel from = cp;
    from.rank = src;
    WorkPtr wkv;
    if (s + 1 < P) wkv = cp.comm->batch_p2p_async({{true, cur, next, kTagKV}, {false, nxt, prev, kTagKV}});
    contrib.zero();
    for (int l = 0; l < 2; ++l)
      for (int m = 0; m < 2; ++m) {
        const int cq = cp.chunk_id(l), ck = from.chunk_id(m);
        if (ck > cq) continue;
        const AttentionBlock blk{cq * d.Tc, ck * d.Tc, d.T, true};
        attention_block_backward(chunk_rows(dout, l, d.Tc), heads(chunk_rows(qkv, l, d.Tc), 0, d.NH),
                                 kv_part(cur, 0, m), kv_part(cur, 1, m), chunk_rows(out, l, d.Tc),
                                 lse_chunk(lse, l, d.Tc), tq, tk, tv, scale, blk, drop);
        axpby(1.0f, tq, 1.0f, dq.select(0, l));
        axpby(1.0f, tk, 1.0f, kv_part(contrib, 0, m));
        axpby(1.0f, tv, 1.0f, kv_part(contrib, 1, m));
      }
    // The accumulator of this K/V: this rank's own (s = 0) or the one that came with it.
    if (s == 0) {
      send.copy_from(contrib);
    } else {
      wd->wait();
      std::swap(send, recv);  // recv now holds the arrived accumulator; the old send buffer is free
      axpby(1.0f, contrib, 1.0f, send);
    }
    // On to the next rank; after P hops every accumulator is back with its owner.
    wd = cp.comm->batch_p2p_async({{true, send, next, kTagDKV}, {false, recv, prev, kTagDKV}});
    if (wkv) {
      wkv->wait();
      std::swap(cur, nxt);
    }
  }
  wd->wait();  // recv: this rank's own K/V's dK/dV, summed over every rank's queries
  for (int l = 0; l < 2; ++l) {
    const Tensor rows = chunk_rows(dqkv, l, d.Tc);
    store(heads(rows, 0, d.NH), dq.select(0, l));
    store(heads(rows, d.NH, d.NH + d.G), kv_part(recv, 0, l));
    store(heads(rows, d.NH + d.G, d.NH + 2 * d.G), kv_part(recv, 1, l));
  }
}

// ---- all_gather -------------------------------------------------------------------------------
// Every rank's K/V gathered and put in sequence order: (2 [K, V], B, T, G, HD).
Tensor gather_kv(const ContextParallel& cp, const Dims& d, const Tensor& qkv) {
  const Tensor mine = pack_kv(d, qkv);
  const Tensor all = empty({cp.size, 2, 2, d.B, d.Tc, d.G, d.HD}, d.dt, d.dev);
  cp.comm->all_gather(mine.view({mine.numel()}), all.view({all.numel()}));
  const Tensor kv = empty({2, d.B, d.T, d.G, d.HD}, d.dt, d.dev);
  for (int p = 0; p < cp.size; ++p) {
    ContextParallel owner = cp;
    owner.rank = p;
    for (int w = 0; w < 2; ++w)
      for (int m = 0; m < 2; ++m)
        chunk_rows(kv.select(0, w), owner.chunk_id(m), d.Tc).copy_from(all.select(0, p).select(0, w).select(0, m));
  }
  return kv;
}

void gather_forward(const ContextParallel& cp, const Dims& d, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                    float scale, const AttentionDropout& drop) {
  const Tensor kv = gather_kv(cp, d, qkv);
  for (int l = 0; l < 2; ++l) {
    const int64_t cq = cp.chunk_id(l), end = (cq + 1) * d.Tc;  // keys [0, end): bottom-right causal
    attention_block_forward(heads(chunk_rows(qkv, l, d.Tc), 0, d.NH), kv.select(0, 0).slice(1, 0, end),
                            kv.select(0, 1).slice(1, 0, end), chunk_rows(out, l, d.Tc), lse_chunk(lse, l, d.Tc), scale,
                            AttentionBlock{cq * d.Tc, 0, d.T, true}, drop);
  }
}

void gather_backward(const ContextParallel& cp, const Dims& d, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                     const Tensor& lse, const Tensor& dqkv, float scale, const AttentionDropout& drop) {
  const Tensor kv = gather_kv(cp, d, qkv);
  // dK/dV of every key chunk (2 [K, V], 2P chunks, B, Tc, G, HD), f32.
  const Tensor dkv = Tensor::zeros({2, 2 * cp.size, d.B, d.Tc, d.G, d.HD}, DType::F32, d.dev);
  for (int l = 0; l < 2; ++l) {
    const int64_t cq = cp.chunk_id(l), end = (cq + 1) * d.Tc;
    const Tensor rows = chunk_rows(dqkv, l, d.Tc);
    const Tensor tk = empty({d.B, end, d.G, d.HD}, d.dt, d.dev), tv = empty(tk.shape(), d.dt, d.dev);
    attention_block_backward(chunk_rows(dout, l, d.Tc), heads(chunk_rows(qkv, l, d.Tc), 0, d.NH),
                             kv.select(0, 0).slice(1, 0, end), kv.select(0, 1).slice(1, 0, end), chunk_rows(out, l, d.Tc),
                             lse_chunk(lse, l, d.Tc), heads(rows, 0, d.NH), tk, tv, scale,
                             AttentionBlock{cq * d.Tc, 0, d.T, true}, drop);
    for (int64_t c = 0; c <= cq; ++c) {
      add_into(dkv.select(0, 0).select(0, c), chunk_rows(tk, static_cast<int>(c), d.Tc));
      add_into(dkv.select(0, 1).select(0, c), chunk_rows(tv, static_cast<int>(c), d.Tc));
    }
  }
  // To their owners, summed: (P [owner], 2 [K, V], 2 [owner's chunk], B, Tc, G, HD) reduce-scattered.
  const Tensor by_owner = empty({cp.size, 2, 2, d.B, d.Tc, d.G, d.HD}, DType::F32, d.dev);
  for (int p = 0; p < cp.size; ++p) {
    ContextParallel owner = cp;
    owner.rank = p;
    for (int w = 0; w < 2; ++w)
      for (int m = 0; m < 2; ++m)
        by_owner.select(0, p).select(0, w).select(0, m).copy_from(dkv.select(0, w).select(0, owner.chunk_id(m)));
  }
  const Tensor mine = empty({2, 2, d.B, d.Tc, d.G, d.HD}, DType::F32, d.dev);
  cp.comm->reduce_scatter(by_owner.view({by_owner.numel()}), mine.view({mine.numel()}));
  for (int l = 0; l < 2; ++l) {
    const Tensor rows = chunk_rows(dqkv, l, d.Tc);
    store(heads(rows, d.NH, d.NH + d.G), kv_part(mine, 0, l));
    store(heads(rows, d.NH + d.G, d.NH + 2 * d.G), kv_part(mine, 1, l));
  }
}

// ---- a2a (Ulysses) --------------------------------------------------------------------------------
// in (P, n) → out (P, n): block p of in goes to rank p, block p of out came from rank p.
void all_to_all(const ContextParallel& cp, const Tensor& in, const Tensor& out) {
  const int P = cp.size;
  std::vector<Communicator::P2POp> ops;
  for (int p = 0; p < P; ++p) {
    if (p == cp.rank) continue;
    ops.push_back({true, in.select(0, p), p, 7303});
    ops.push_back({false, out.select(0, p), p, 7303});
  }
  WorkPtr w = cp.comm->batch_p2p_async(ops);
  out.select(0, cp.rank).copy_from(in.select(0, cp.rank));
  w->wait();
}

// Sequence-sharded x (B, Tl, H, HD) → head-sharded (B, T, H/P, HD): this rank's share
// of the heads of every [group] of `sizes` (consecutive head groups of x, each split
// over the ranks) for the whole sequence in order.
Tensor seq_to_heads(const ContextParallel& cp, const Dims& d, const Tensor& x, const std::vector<int64_t>& sizes) {
  const int P = cp.size;
  int64_t share = 0;
  for (int64_t n : sizes) share += n / P;
  const Tensor send = empty({P, d.B, d.Tl, share, d.HD}, x.dtype(), d.dev), recv = empty(send.shape(), x.dtype(), d.dev);
  for (int p = 0; p < P; ++p) {
    int64_t at = 0, col = 0;
    for (int64_t n : sizes) {
      const int64_t k = n / P;
      heads(send.select(0, p), col, col + k).copy_from(heads(x, at + p * k, at + (p + 1) * k));
      at += n, col += k;
    }
  }
  all_to_all(cp, send, recv);
  const Tensor full = empty({d.B, d.T, share, d.HD}, x.dtype(), d.dev);
  for (int p = 0; p < P; ++p) {
    ContextParallel from = cp;
    from.rank = p;
    for (int l = 0; l < 2; ++l)
      chunk_rows(full, from.chunk_id(l), d.Tc).copy_from(chunk_rows(recv.select(0, p), l, d.Tc));
  }
  return full;
}

// The reverse: head-sharded y (B, T, share, HD) → this rank's rows of every head,
// written into x (B, Tl, H, HD) (a view), the shares of `sizes` as in seq_to_heads.
void heads_to_seq(const ContextParallel& cp, const Dims& d, const Tensor& y, const Tensor& x,
                  const std::vector<int64_t>& sizes) {
  const int P = cp.size;
  const int64_t share = y.dim(2);
  const Tensor send = empty({P, d.B, d.Tl, share, d.HD}, y.dtype(), d.dev), recv = empty(send.shape(), y.dtype(), d.dev);
  for (int p = 0; p < P; ++p) {
    ContextParallel to = cp;
    to.rank = p;
    for (int l = 0; l < 2; ++l)
      chunk_rows(send.select(0, p), l, d.Tc).copy_from(chunk_rows(y, to.chunk_id(l), d.Tc));
  }
  all_to_all(cp, send, recv);
  for (int p = 0; p < P; ++p) {
    int64_t at = 0, col = 0;
    for (int64_t n : sizes) {
      const int64_t k = n / P;
      heads(x, at + p * k, at + (p + 1) * k).copy_from(heads(recv.select(0, p), col, col + k));
      at += n, col += k;
    }
  }
}

AttentionDropout shard_drop(const ContextParallel& cp, const Dims& d, AttentionDropout drop) {
  drop.first_head += cp.rank * (d.NH / cp.size);  // this rank's heads of the whole sequence
  return drop;
}

void a2a_forward(const ContextParallel& cp, const Dims& d, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                 float scale, const AttentionDropout& drop) {
  const std::vector<int64_t> qkv_heads{d.NH, d.G, d.G};
  const Tensor x = seq_to_heads(cp, d, qkv, qkv_heads);  // (B, T, NH/P + 2G/P, HD)
  const int64_t nh = d.NH / cp.size;
  const Tensor o = empty({d.B, d.T, nh, d.HD}, d.dt, d.dev);
  // lse: the head-sharded statistics (B, NH/P, T), stored in lse's own (B, NH, Tl) elements.
  attention_forward(x, o, lse.view({d.B, nh, d.T}), scale, shard_drop(cp, d, drop));
  heads_to_seq(cp, d, o, out, {d.NH});
}

void a2a_backward(const ContextParallel& cp, const Dims& d, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                  const Tensor& lse, const Tensor& dqkv, float scale, const AttentionDropout& drop) {
  const std::vector<int64_t> qkv_heads{d.NH, d.G, d.G};
  const Tensor x = seq_to_heads(cp, d, qkv, qkv_heads);
  const Tensor o = seq_to_heads(cp, d, out, {d.NH}), dy = seq_to_heads(cp, d, dout, {d.NH});
  const Tensor dx = empty(x.shape(), d.dt, d.dev);
  attention_backward(dy, x, o, lse.view({d.B, d.NH / cp.size, d.T}), dx, scale, shard_drop(cp, d, drop));
  heads_to_seq(cp, d, dx, dqkv, qkv_heads);
}

void check_call(const ContextParallel& cp, const Dims& d, const Tensor& lse) {
  MPT_CHECK(cp.active() && cp.comm, "context-parallel attention needs a cp group of more than one rank", "");
  check_context_parallel(cp, d.T, d.NH, d.G);
  MPT_CHECK(lse.is_contiguous() && lse.shape() == Shape({d.B, d.NH, d.Tl}) && lse.dtype() == DType::F32,
            str("context-parallel attention: lse ", lse.describe(), " must be contiguous f32 (B, NH, Tl)"), "");
}

}  // namespace

void cp_attention_forward(const ContextParallel& cp, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          float scale, const AttentionDropout& drop) {
  const Dims d = dims_of(cp, qkv, out);
  check_call(cp, d, lse);
  switch (cp.type) {
    case CpCommType::P2P: return ring_forward(cp, d, qkv, out, lse, scale, drop);
    case CpCommType::AllGather: return gather_forward(cp, d, qkv, out, lse, scale, drop);
    case CpCommType::AllToAll: return a2a_forward(cp, d, qkv, out, lse, scale, drop);
  }
}

void cp_attention_backward(const ContextParallel& cp, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                           const Tensor& lse, const Tensor& dqkv, float scale, const AttentionDropout& drop) {
  const Dims d = dims_of(cp, qkv, out);
  check_call(cp, d, lse);
  switch (cp.type) {
    case CpCommType::P2P: return ring_backward(cp, d, dout, qkv, out, lse, dqkv, scale, drop);
    case CpCommType::AllGather: return gather_backward(cp, d, dout, qkv, out, lse, dqkv, scale, drop);
    case CpCommType::AllToAll: return a2a_backward(cp, d, dout, qkv, out, lse, dqkv, scale, drop);
  }
}

}  // namespace mpitron
