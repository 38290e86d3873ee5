// tests/tensor/test_attention_block.cpp — the block form of attention (attention_block.h):
// a block of query rows against a block of key rows, each at its place in the whole
// sequence, with its log-sum-exp; attention_merge; and the block backward given the
// merged output and log-sum-exp.
//
// Reference: a float64 attention written here over the GLOBAL positions of a packed
// sequence (B, T, NH + 2G, HD): a block's output and lse over its own visible keys,
// and a block's share of dq, dk, dv given the whole rows' output and lse (computed
// by the same reference over every key). Dropout masks come from attention_keep at the
// global positions (the pure Philox function that defines them).
// Then what context parallelism relies on: a sequence cut into chunks, every
// (query chunk, key chunk) block run and merged, equals attention_forward over the
// whole sequence, and the blocks' gradient shares summed equal attention_backward's —
// with dropout too, GQA too. Inputs are strided views of the packed qkv (row stride
// W, the heads sliced), outputs contiguous guarded buffers or views into bigger ones.
// On CUDA the path is asserted: the fallback wherever cuDNN cannot be (f32, dropout,
// a partly causal block, misaligned outputs); under the simulated device always.
// Last, value heads of another width than the query/key heads (DeepSeek's MLA, Dqk != Dv),
// with their own float64 reference (checked against finite differences) over GQA/MQA,
// causal and bidirectional blocks, dropout, a score bias and a softcap, and split-and-merged.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

// The whole sequence: qkv (B, T, NH + 2G, HD).
struct Geo {
  int64_t b, t, nh, g, hd;
  int64_t heads() const { return nh + 2 * g; }
  Shape qkv_shape() const { return {b, t, heads(), hd}; }
  std::string str_() const { return str("B=", b, " T=", t, " NH=", nh, " G=", g, " HD=", hd); }
};
// A block: queries [q0, q0 + tq), keys [k0, k0 + tk).
struct Blk {
  int64_t q0, tq, k0, tk;
  bool causal = true;
  std::string str_() const { return str("q ", q0, "+", tq, " k ", k0, "+", tk, causal ? " causal" : " full"); }
  AttentionBlock block(int64_t seq) const { return {q0, k0, seq, causal}; }
};

// Element e of Q head h (which 0), or of K / V group g (which 1 / 2), of token t.
size_t at(const Geo& d, int64_t b, int64_t t, int which, int64_t head, int64_t e) {
  const int64_t col = which == 0 ? head : which == 1 ? d.nh + head : d.nh + d.g + head;
  return static_cast<size_t>(((b * d.t + t) * d.heads() + col) * d.hd + e);
}
// (B, tq, NH, HD) and (B, NH, tq) of a block's rows.
size_t o_at(const Geo& d, const Blk& k, int64_t b, int64_t i, int64_t h, int64_t e) {
  return static_cast<size_t>(((b * k.tq + i) * d.nh + h) * d.hd + e);
}
size_t l_at(const Geo& d, const Blk& k, int64_t b, int64_t h, int64_t i) {
  return static_cast<size_t>((b * d.nh + h) * k.tq + i);
}

double keep_w(const AttentionDropout& dr, int64_t b, int64_t h, int64_t i, int64_t j, int64_t T) {
  if (dr.p == 0) return 1.0;
  return attention_keep(dr.seed, dr.offset, b, dr.first_head + h, i, j, T, dr.p) ? 1.0 / (1.0 - dr.p) : 0.0;
}
bool visible(const Blk& k, int64_t i, int64_t j) { return !k.causal || j <= i; }  // global positions

// The block's out (B, tq, NH, HD) and lse (B, NH, tq) over its visible keys.
void ref_block(const Geo& d, const std::vector<double>& x, const Blk& k, double scale, const AttentionDropout& dr,
               std::vector<double>& out, std::vector<double>& lse) {
  out.assign(static_cast<size_t>(d.b * k.tq * d.nh * d.hd), 0.0);
  lse.assign(static_cast<size_t>(d.b * d.nh * k.tq), -INFINITY);
  const int64_t rep = d.nh / d.g;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t r = 0; r < k.tq; ++r) {
        const int64_t i = k.q0 + r;
        std::vector<double> s(static_cast<size_t>(k.tk), -INFINITY);
        double mx = -INFINITY;
        for (int64_t c = 0; c < k.tk; ++c) {
          const int64_t j = k.k0 + c;
          if (!visible(k, i, j)) continue;
          double a = 0;
          for (int64_t e = 0; e < d.hd; ++e) a += x[at(d, b, i, 0, h, e)] * x[at(d, b, j, 1, h / rep, e)];
          s[c] = a * scale;
          mx = std::max(mx, s[c]);
        }
        if (mx == -INFINITY) continue;  // no visible key: out 0, lse −∞
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        lse[l_at(d, k, b, h, r)] = mx + std::log(sum);
        for (int64_t c = 0; c < k.tk; ++c) {
          const int64_t j = k.k0 + c;
          if (!visible(k, i, j)) continue;
          const double w = s[c] / sum * keep_w(dr, b, h, i, j, d.t);
          for (int64_t e = 0; e < d.hd; ++e) out[o_at(d, k, b, r, h, e)] += w * x[at(d, b, j, 2, h / rep, e)];
        }
      }
}

// The block's share of dq (B, tq, NH, HD), dk, dv (B, tk, G, HD) given the whole rows'
// output O and statistics L (of the block's query rows over every key).
void ref_block_backward(const Geo& d, const std::vector<double>& x, const Blk& k, double scale,
                        const AttentionDropout& dr, const std::vector<double>& dout, const std::vector<double>& O,
                        const std::vector<double>& L, std::vector<double>& dq, std::vector<double>& dk,
                        std::vector<double>& dv) {
  dq.assign(static_cast<size_t>(d.b * k.tq * d.nh * d.hd), 0.0);
  dk.assign(static_cast<size_t>(d.b * k.tk * d.g * d.hd), 0.0);
  dv.assign(dk.size(), 0.0);
  auto kv_at = [&](int64_t b, int64_t c, int64_t g, int64_t e) {
    return static_cast<size_t>(((b * k.tk + c) * d.g + g) * d.hd + e);
  };
  const int64_t rep = d.nh / d.g;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t r = 0; r < k.tq; ++r) {
        const int64_t i = k.q0 + r, grp = h / rep;
        double D = 0;
        for (int64_t e = 0; e < d.hd; ++e) D += dout[o_at(d, k, b, r, h, e)] * O[o_at(d, k, b, r, h, e)];
        for (int64_t c = 0; c < k.tk; ++c) {
          const int64_t j = k.k0 + c;
          if (!visible(k, i, j)) continue;
          double s = 0, dp = 0;
          for (int64_t e = 0; e < d.hd; ++e) {
            s += x[at(d, b, i, 0, h, e)] * x[at(d, b, j, 1, grp, e)];
            dp += dout[o_at(d, k, b, r, h, e)] * x[at(d, b, j, 2, grp, e)];
          }
          const double p = std::exp(s * scale - L[l_at(d, k, b, h, r)]), m = keep_w(dr, b, h, i, j, d.t);
          const double ds = p * (dp * m - D) * scale;
          for (int64_t e = 0; e < d.hd; ++e) {
            dq[o_at(d, k, b, r, h, e)] += ds * x[at(d, b, j, 1, grp, e)];
            dk[kv_at(b, c, grp, e)] += ds * x[at(d, b, i, 0, h, e)];
            dv[kv_at(b, c, grp, e)] += p * m * dout[o_at(d, k, b, r, h, e)];
          }
        }
      }
}

// q, k, v of a block as strided views of the packed qkv (B, T, NH + 2G, HD).
struct Views {
  Tensor q, k, v;
};
Views views(const Tensor& qkv, const Geo& d, const Blk& k) {
  const Tensor rows_q = qkv.slice(1, k.q0, k.q0 + k.tq), rows_k = qkv.slice(1, k.k0, k.k0 + k.tk);
  return {rows_q.slice(2, 0, d.nh), rows_k.slice(2, d.nh, d.nh + d.g), rows_k.slice(2, d.nh + d.g, d.nh + 2 * d.g)};
}

// The path a CUDA block call must take: cuDNN only where attention_block.h says it
// can (16-bit, no dropout, aligned, HD % 8 == 0 and <= 128, and a mask form cuDNN
// has); "" where either may run (the bottom-right form depends on the cuDNN version).
std::string block_path(const std::string& op, DType dt, const Geo& d, const Blk& k, const AttentionDropout& dr) {
  const bool eligible = cuda_attention_backend() == "cudnn" && dt != DType::F32 && dr.p == 0 && outputs_aligned() &&
                        d.hd % 8 == 0 && d.hd <= 128;
  const bool full = !k.causal || k.k0 + k.tk - 1 <= k.q0, diag = k.q0 == k.k0 && k.tq == k.tk;
  const bool bottom_right = k.q0 + k.tq == k.k0 + k.tk && k.tq <= k.tk;
  if (!eligible || !(full || diag || bottom_right)) return op + ".fallback";
  if (full || diag) return op + ".cudnn";
  return "";
}

void run_block(Device dev, DType dt, const Geo& d, const Blk& k, const AttentionDropout& dr, uint64_t seed) {
  Rng rng(seed);
  const Input qkv = rand_input(rng, d.qkv_shape(), dt, dev, -1.5, 1.5);
  const Input dout = rand_input(rng, {d.b, k.tq, d.nh, d.hd}, dt, dev, -1, 1);
  const double scale = 1 / std::sqrt(static_cast<double>(d.hd));
  const Views in = views(qkv.t, d, k);
  const std::string name = case_name(dev, dt, str("attention block ", d.str_(), " ", k.str_(), " p=", dr.p));
  Out out = make_out({d.b, k.tq, d.nh, d.hd}, dt, dev), lse = make_out({d.b, d.nh, k.tq}, DType::F32, dev);
  const PathProbe fp;
  attention_block_forward(in.q, in.k, in.v, out.t, lse.t, static_cast<float>(scale), k.block(d.t), dr);
  const std::string want_f = block_path("attention_block_forward", dt, d, k, dr);
  if (!want_f.empty()) check_path(dev, fp, want_f, name + " forward");
  std::vector<double> oref, lref;
  ref_block(d, qkv.v, k, scale, dr, oref, lref);
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  // Backward with the whole rows' output and lse (every key of the sequence).
  const Blk whole{k.q0, k.tq, 0, d.t, k.causal};
  std::vector<double> O, L;
  ref_block(d, qkv.v, whole, scale, dr, O, L);
  std::vector<double> Or(O.size()), Lr(L.size());
  for (size_t i = 0; i < O.size(); ++i) Or[i] = round_to(dt, O[i]);  // the output as the merge stored it
  for (size_t i = 0; i < L.size(); ++i) Lr[i] = static_cast<float>(L[i]);
  const Tensor Ot = make_tensor(Or, {d.b, k.tq, d.nh, d.hd}, dt, dev), Lt = make_tensor(Lr, {d.b, d.nh, k.tq}, DType::F32, dev);
  Out dq = make_out({d.b, k.tq, d.nh, d.hd}, dt, dev), dk = make_out({d.b, k.tk, d.g, d.hd}, dt, dev),
      dv = make_out({d.b, k.tk, d.g, d.hd}, dt, dev);
  const PathProbe bp;
  attention_block_backward(dout.t, in.q, in.k, in.v, Ot, Lt, dq.t, dk.t, dv.t, static_cast<float>(scale),
                           k.block(d.t), dr);
  const std::string want_b = block_path("attention_block_backward", dt, d, k, dr);
  if (!want_b.empty()) check_path(dev, bp, want_b, name + " backward");
  std::vector<double> dqr, dkr, dvr;
  ref_block_backward(d, qkv.v, k, scale, dr, dout.v, Or, Lr, dqr, dkr, dvr);
  check_out(name + " dq", dq, dqr, tol(dt, Kind::Attention));
  check_out(name + " dk", dk, dkr, tol(dt, Kind::Attention));
  check_out(name + " dv", dv, dvr, tol(dt, Kind::Attention));
}

// The blocks context parallelism runs for T cut into n equal chunks: every (query
// chunk a, key chunk c) pair with c <= a (causal; c > a is masked whole and skipped).
std::vector<Blk> chunk_blocks(int64_t T, int64_t n, bool causal) {
  std::vector<Blk> v;
  const int64_t tc = T / n;
  for (int64_t a = 0; a < n; ++a)
    for (int64_t c = 0; c < n; ++c)
      if (!causal || c <= a) v.push_back({a * tc, tc, c * tc, tc, causal});
  return v;
}

// attention over the whole sequence vs the chunked blocks merged (forward) and their
// gradient shares summed (backward); the same inputs, the same dtype.
void run_split(Device dev, DType dt, const Geo& d, int64_t chunks, bool causal, const AttentionDropout& dr,
               uint64_t seed) {
  Rng rng(seed);
  const Input qkv = rand_input(rng, d.qkv_shape(), dt, dev, -1.5, 1.5);
  const Input dout = rand_input(rng, {d.b, d.t, d.nh, d.hd}, dt, dev, -1, 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  const std::string name =
      case_name(dev, dt, str("attention split into ", chunks, " chunks ", d.str_(), causal ? " causal" : " full", " p=", dr.p));
  const Tensor out = Tensor::empty({d.b, d.t, d.nh, d.hd}, dt, dev), lse = Tensor::empty({d.b, d.nh, d.t}, DType::F32, dev);
  attention_forward(qkv.t, out, lse, scale, dr, AttentionMask{causal, Tensor()});
  const Tensor dqkv = Tensor::empty(d.qkv_shape(), dt, dev);
  attention_backward(dout.t, qkv.t, out, lse, dqkv, scale, dr, AttentionMask{causal, Tensor()});

  // Forward: per query chunk, merge the blocks of every key chunk it sees.
  const Tensor acc = Tensor::zeros({d.b, d.t, d.nh, d.hd}, DType::F32, dev);
  const Tensor acc_lse = Tensor::empty({d.b, d.nh, d.t}, DType::F32, dev);
  acc_lse.fill(-INFINITY);
  const int64_t tc = d.t / chunks;
  const Tensor part = Tensor::empty({d.b, tc, d.nh, d.hd}, dt, dev), part_lse = Tensor::empty({d.b, d.nh, tc}, DType::F32, dev);
  for (const Blk& k : chunk_blocks(d.t, chunks, causal)) {
    const Views in = views(qkv.t, d, k);
    attention_block_forward(in.q, in.k, in.v, part, part_lse, scale, k.block(d.t), dr);
    // acc's rows of the chunk are not contiguous (B > 1): merge into per-chunk scratch.
    const Tensor a = acc.slice(1, k.q0, k.q0 + tc).contiguous(), al = acc_lse.slice(2, k.q0, k.q0 + tc).contiguous();
    attention_merge(a, al, part, part_lse);
    acc.slice(1, k.q0, k.q0 + tc).copy_from(a);
    acc_lse.slice(2, k.q0, k.q0 + tc).copy_from(al);
  }
  const Tol t = tol(dt, Kind::Attention);
  check_close(name + " merged out", acc, values(out), t);
  check_close(name + " merged lse", acc_lse, values(lse), tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  // Backward: each block's share given the merged rows (the stored output), summed.
  const Tensor gq = Tensor::zeros({d.b, d.t, d.nh, d.hd}, DType::F32, dev);
  const Tensor gk = Tensor::zeros({d.b, d.t, d.g, d.hd}, DType::F32, dev), gv = Tensor::zeros(gk.shape(), DType::F32, dev);
  const Tensor dq = Tensor::empty({d.b, tc, d.nh, d.hd}, dt, dev), dk = Tensor::empty({d.b, tc, d.g, d.hd}, dt, dev),
               dv = Tensor::empty(dk.shape(), dt, dev);
  for (const Blk& k : chunk_blocks(d.t, chunks, causal)) {
    const Views in = views(qkv.t, d, k);
    attention_block_backward(dout.t.slice(1, k.q0, k.q0 + tc), in.q, in.k, in.v, out.slice(1, k.q0, k.q0 + tc),
                             lse.slice(2, k.q0, k.q0 + tc), dq, dk, dv, scale, k.block(d.t), dr);
    auto add = [](const Tensor& into, const Tensor& part_) {
      const Tensor c = into.contiguous();
      axpby(1.0f, part_, 1.0f, c);
      into.copy_from(c);
    };
    add(gq.slice(1, k.q0, k.q0 + tc), dq);
    add(gk.slice(1, k.k0, k.k0 + tc), dk);
    add(gv.slice(1, k.k0, k.k0 + tc), dv);
  }
  const Tensor dq_whole = dqkv.slice(2, 0, d.nh).contiguous(), dk_whole = dqkv.slice(2, d.nh, d.nh + d.g).contiguous(),
               dv_whole = dqkv.slice(2, d.nh + d.g, d.nh + 2 * d.g).contiguous();
  check_close(name + " summed dq", gq, values(dq_whole), t);
  check_close(name + " summed dk", gk, values(dk_whole), t);
  check_close(name + " summed dv", gv, values(dv_whole), t);
}

// ---- value heads of another width (DeepSeek's MLA: Dqk != Dv) -----------------------------
// q (B, Tq, NH, Dqk), k (B, Tk, G, Dqk), v (B, Tk, G, Dv), out (B, Tq, NH, Dv). The reference
// works on the block's local indices (query i at global q0 + i, key j at k0 + j):
//   U = scale·q_i·k_j + bias[i, j, h], S = c·tanh(U/c) with a softcap c (else U), on visible keys;
//   lse = log Σ_j exp S, P = exp(S − lse), out = Σ_j P·M·v_j (M: attention_keep / (1 − p));
//   dS = P ∘ (dO·vᵀ ∘ M − D) ∘ (1 − tanh²(U/c)), D = dO·O: dq = scale·dS·k, dk = scale·dSᵀ·q,
//   dv = (P ∘ M)ᵀ·dO, dbias = Σ_b dS.
// The reference backward is checked against float64 central differences of the reference
// forward (every element of q, k, v and bias), so the formula is not taken on trust.
struct Mla {
  const char* what;
  int64_t b, nh, g, dqk, dv;
  int64_t q0, tq, k0, tk, seq;
  bool causal = true;
  float p = 0.0f;        // attention dropout
  bool bias = false;     // a score bias (Tq, Tk, NH) and its gradient
  float softcap = 0.0f;  // c > 0: scores capped
  size_t qi(int64_t b_, int64_t i, int64_t h, int64_t e) const { return static_cast<size_t>(((b_ * tq + i) * nh + h) * dqk + e); }
  size_t ki(int64_t b_, int64_t j, int64_t gr, int64_t e) const { return static_cast<size_t>(((b_ * tk + j) * g + gr) * dqk + e); }
  size_t vi(int64_t b_, int64_t j, int64_t gr, int64_t e) const { return static_cast<size_t>(((b_ * tk + j) * g + gr) * dv + e); }
  size_t oi(int64_t b_, int64_t i, int64_t h, int64_t e) const { return static_cast<size_t>(((b_ * tq + i) * nh + h) * dv + e); }
  size_t li(int64_t b_, int64_t h, int64_t i) const { return static_cast<size_t>((b_ * nh + h) * tq + i); }
  size_t bi(int64_t i, int64_t j, int64_t h) const { return static_cast<size_t>((i * tk + j) * nh + h); }
  Shape q_shape() const { return {b, tq, nh, dqk}; }
  Shape k_shape() const { return {b, tk, g, dqk}; }
  Shape v_shape() const { return {b, tk, g, dv}; }
  Shape o_shape() const { return {b, tq, nh, dv}; }
  Shape l_shape() const { return {b, nh, tq}; }
  Shape bias_shape() const { return {tq, tk, nh}; }
  bool seen(int64_t i, int64_t j) const { return !causal || k0 + j <= q0 + i; }
  AttentionDropout drop() const { return p > 0 ? AttentionDropout{p, 41, 777, 1} : AttentionDropout{}; }
  AttentionBlock block() const {
    AttentionBlock blk{q0, k0, seq, causal};
    blk.softcap = softcap;
    return blk;
  }
  double keep(int64_t b_, int64_t h, int64_t i, int64_t j) const {
    const AttentionDropout dr = drop();
    if (dr.p == 0) return 1.0;
    return attention_keep(dr.seed, dr.offset, b_, dr.first_head + h, q0 + i, k0 + j, seq, dr.p) ? 1.0 / (1.0 - dr.p) : 0.0;
  }
};
struct MlaIn {
  std::vector<double> q, k, v, bias;  // bias all 0 when the case has none
};

// U (the score before the cap) and S (after it) of (b, h, i, j).
std::pair<double, double> mla_score(const Mla& c, const MlaIn& x, double scale, int64_t b, int64_t h, int64_t i,
                                    int64_t j) {
  double a = 0;
  for (int64_t e = 0; e < c.dqk; ++e) a += x.q[c.qi(b, i, h, e)] * x.k[c.ki(b, j, h / (c.nh / c.g), e)];
  const double u = a * scale + x.bias[c.bi(i, j, h)];
  return {u, c.softcap > 0 ? c.softcap * std::tanh(u / c.softcap) : u};
}

void mla_forward(const Mla& c, const MlaIn& x, double scale, std::vector<double>& out, std::vector<double>& lse) {
  out.assign(static_cast<size_t>(shape_numel(c.o_shape())), 0.0);
  lse.assign(static_cast<size_t>(shape_numel(c.l_shape())), -INFINITY);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.nh; ++h)
      for (int64_t i = 0; i < c.tq; ++i) {
        std::vector<double> s(static_cast<size_t>(c.tk), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.tk; ++j)
          if (c.seen(i, j)) mx = std::max(mx, s[static_cast<size_t>(j)] = mla_score(c, x, scale, b, h, i, j).second);
        if (mx == -INFINITY) continue;  // no visible key: out 0, lse −∞
        double sum = 0;
        for (int64_t j = 0; j < c.tk; ++j)
          if (c.seen(i, j)) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        const double l = mx + std::log(sum);
        lse[c.li(b, h, i)] = l;
        for (int64_t j = 0; j < c.tk; ++j) {
          if (!c.seen(i, j)) continue;
          const double w = std::exp(s[static_cast<size_t>(j)] - l) * c.keep(b, h, i, j);
          for (int64_t e = 0; e < c.dv; ++e) out[c.oi(b, i, h, e)] += w * x.v[c.vi(b, j, h / (c.nh / c.g), e)];
        }
      }
}

// Given the rows' output O and statistics L (what the op reads).
MlaIn mla_backward(const Mla& c, const MlaIn& x, double scale, const std::vector<double>& dout,
                   const std::vector<double>& O, const std::vector<double>& L) {
  MlaIn g{std::vector<double>(x.q.size()), std::vector<double>(x.k.size()), std::vector<double>(x.v.size()),
          std::vector<double>(x.bias.size())};
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.nh; ++h)
      for (int64_t i = 0; i < c.tq; ++i) {
        const int64_t grp = h / (c.nh / c.g);
        double D = 0;
        for (int64_t e = 0; e < c.dv; ++e) D += dout[c.oi(b, i, h, e)] * O[c.oi(b, i, h, e)];
        for (int64_t j = 0; j < c.tk; ++j) {
          if (!c.seen(i, j)) continue;
          double dp = 0;
          for (int64_t e = 0; e < c.dv; ++e) dp += dout[c.oi(b, i, h, e)] * x.v[c.vi(b, j, grp, e)];
          const auto [u, sc] = mla_score(c, x, scale, b, h, i, j);
          const double pr = std::exp(sc - L[c.li(b, h, i)]), m = c.keep(b, h, i, j);
          const double t = c.softcap > 0 ? std::tanh(u / c.softcap) : 0.0;
          const double ds = pr * (dp * m - D) * (c.softcap > 0 ? 1 - t * t : 1.0);
          g.bias[c.bi(i, j, h)] += ds;
          for (int64_t e = 0; e < c.dqk; ++e) {
            g.q[c.qi(b, i, h, e)] += scale * ds * x.k[c.ki(b, j, grp, e)];
            g.k[c.ki(b, j, grp, e)] += scale * ds * x.q[c.qi(b, i, h, e)];
          }
          for (int64_t e = 0; e < c.dv; ++e) g.v[c.vi(b, j, grp, e)] += pr * m * dout[c.oi(b, i, h, e)];
        }
      }
  return g;
}

// The CUDA path a Dqk != Dv block must take: the fallback wherever attention_block.h rules
// cuDNN out; "" (either) where cuDNN may take it, which depends on its support of d_qk != d_v.
std::string mla_path(const std::string& op, DType dt, const Mla& c) {
  const bool full = !c.causal || c.k0 + c.tk - 1 <= c.q0, diag = c.q0 == c.k0 && c.tq == c.tk;
  const bool bottom_right = c.q0 + c.tq == c.k0 + c.tk && c.tq <= c.tk;
  const bool eligible = cuda_attention_backend() == "cudnn" && dt != DType::F32 && c.p == 0 && !c.bias &&
                        c.softcap == 0 && outputs_aligned() && (full || diag || bottom_right);
  return eligible ? "" : op + ".fallback";
}

struct MlaTensors {
  MlaIn x;
  Tensor q, k, v, bias, dout;
  std::vector<double> dout_v;
};
MlaTensors mla_inputs(Rng& rng, const Mla& c, DType dt, Device dev) {
  MlaTensors t;
  Input iq = rand_input(rng, c.q_shape(), dt, dev, -1.5, 1.5), ik = rand_input(rng, c.k_shape(), dt, dev, -1.5, 1.5),
        iv = rand_input(rng, c.v_shape(), dt, dev, -1.5, 1.5), ib = rand_input(rng, c.bias_shape(), DType::F32, dev, -2, 2),
        idout = rand_input(rng, c.o_shape(), dt, dev, -1, 1);
  if (c.bias) t.bias = ib.t;
  else std::fill(ib.v.begin(), ib.v.end(), 0.0);
  t.x = {iq.v, ik.v, iv.v, ib.v};
  t.q = iq.t, t.k = ik.t, t.v = iv.t, t.dout = idout.t, t.dout_v = idout.v;
  return t;
}

void run_mla(Device dev, DType dt, const Mla& c, uint64_t seed) {
  Rng rng(seed);
  const MlaTensors in = mla_inputs(rng, c, dt, dev);
  const double scale = 1 / std::sqrt(static_cast<double>(c.dqk));
  const std::string name = case_name(dev, dt, str("attention block Dqk ", c.dqk, " != Dv ", c.dv, ": ", c.what));
  AttentionBlock blk = c.block();
  blk.bias = in.bias;
  Out out = make_out(c.o_shape(), dt, dev), lse = make_out(c.l_shape(), DType::F32, dev);
  const PathProbe fp;
  attention_block_forward(in.q, in.k, in.v, out.t, lse.t, static_cast<float>(scale), blk, c.drop());
  const std::string want_f = mla_path("attention_block_forward", dt, c);
  if (!want_f.empty()) check_path(dev, fp, want_f, name + " forward");
  std::vector<double> oref, lref;
  mla_forward(c, in.x, scale, oref, lref);
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  // Backward from the stored output (rounded to dt) and lse (f32), as a layer keeps them.
  std::vector<double> Or(oref.size()), Lr(lref.size());
  for (size_t i = 0; i < Or.size(); ++i) Or[i] = round_to(dt, oref[i]);
  for (size_t i = 0; i < Lr.size(); ++i) Lr[i] = static_cast<float>(lref[i]);
  const Tensor Ot = make_tensor(Or, c.o_shape(), dt, dev), Lt = make_tensor(Lr, c.l_shape(), DType::F32, dev);
  Out dq = make_out(c.q_shape(), dt, dev), dk = make_out(c.k_shape(), dt, dev), dv = make_out(c.v_shape(), dt, dev);
  const std::vector<double> zeros(static_cast<size_t>(shape_numel(c.bias_shape())), 0.0);
  Out bg = make_out(c.bias_shape(), DType::F32, dev, &zeros);
  if (c.bias) blk.bias_grad = bg.t;
  const PathProbe bp;
  attention_block_backward(in.dout, in.q, in.k, in.v, Ot, Lt, dq.t, dk.t, dv.t, static_cast<float>(scale), blk,
                           c.drop());
  const std::string want_b = mla_path("attention_block_backward", dt, c);
  if (!want_b.empty()) check_path(dev, bp, want_b, name + " backward");
  const MlaIn gr = mla_backward(c, in.x, scale, in.dout_v, Or, Lr);
  const Tol t = tol(dt, Kind::Attention);
  check_out(name + " dq", dq, gr.q, t);
  check_out(name + " dk", dk, gr.k, t);
  check_out(name + " dv", dv, gr.v, t);
  if (c.bias) check_out(name + " bias_grad", bg, gr.bias, t);
}

// The keys cut in two blocks [0, t1) and [t1, Tk): the blocks merged (attention_merge on Dv-wide
// rows) equal the single block, and their gradient shares (given the merged rows) add up to its
// gradient — context parallelism with MLA's heads. Same dtype, same device, no bias.
void run_mla_split(Device dev, DType dt, const Mla& c, int64_t t1, uint64_t seed) {
  Rng rng(seed);
  const MlaTensors in = mla_inputs(rng, c, dt, dev);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dqk));
  const std::string name = case_name(dev, dt, str("attention block Dqk ", c.dqk, " != Dv ", c.dv, " split at key ",
                                                  t1, ": ", c.what));
  const Tensor out = Tensor::empty(c.o_shape(), dt, dev), lse = Tensor::empty(c.l_shape(), DType::F32, dev);
  attention_block_forward(in.q, in.k, in.v, out, lse, scale, c.block(), c.drop());
  const Tensor dq = Tensor::empty(c.q_shape(), dt, dev), dk = Tensor::empty(c.k_shape(), dt, dev),
               dv = Tensor::empty(c.v_shape(), dt, dev);
  attention_block_backward(in.dout, in.q, in.k, in.v, out, lse, dq, dk, dv, scale, c.block(), c.drop());

  const Tensor acc = Tensor::zeros(c.o_shape(), DType::F32, dev), acc_lse = Tensor::empty(c.l_shape(), DType::F32, dev);
  acc_lse.fill(-INFINITY);
  const Tensor gq = Tensor::zeros(c.q_shape(), DType::F32, dev);
  std::vector<double> gk, gv;  // the key blocks' dk, dv side by side along Tk (per sample)
  gk.assign(static_cast<size_t>(shape_numel(c.k_shape())), 0.0);
  gv.assign(static_cast<size_t>(shape_numel(c.v_shape())), 0.0);
  const std::pair<int64_t, int64_t> parts[] = {{0, t1}, {t1, c.tk}};
  for (const auto& [a, e] : parts) {
    const AttentionBlock blk{c.q0, c.k0 + a, c.seq, c.causal};
    const Tensor part = Tensor::empty(c.o_shape(), dt, dev), part_lse = Tensor::empty(c.l_shape(), DType::F32, dev);
    attention_block_forward(in.q, in.k.slice(1, a, e), in.v.slice(1, a, e), part, part_lse, scale, blk, c.drop());
    attention_merge(acc, acc_lse, part, part_lse);
  }
  for (const auto& [a, e] : parts) {
    const AttentionBlock blk{c.q0, c.k0 + a, c.seq, c.causal};
    const Tensor pq = Tensor::empty(c.q_shape(), dt, dev), pk = Tensor::empty({c.b, e - a, c.g, c.dqk}, dt, dev),
                 pv = Tensor::empty({c.b, e - a, c.g, c.dv}, dt, dev);
    attention_block_backward(in.dout, in.q, in.k.slice(1, a, e), in.v.slice(1, a, e), out, lse, pq, pk, pv, scale, blk,
                             c.drop());
    axpby(1.0f, pq, 1.0f, gq);
    const std::vector<double> vk = values(pk), vv = values(pv);
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t j = a; j < e; ++j)
        for (int64_t gr = 0; gr < c.g; ++gr) {
          for (int64_t x = 0; x < c.dqk; ++x)
            gk[c.ki(b, j, gr, x)] = vk[static_cast<size_t>(((b * (e - a) + j - a) * c.g + gr) * c.dqk + x)];
          for (int64_t x = 0; x < c.dv; ++x)
            gv[c.vi(b, j, gr, x)] = vv[static_cast<size_t>(((b * (e - a) + j - a) * c.g + gr) * c.dv + x)];
        }
  }
  const Tol t = tol(dt, Kind::Attention);
  check_close(name + " merged out", acc, values(out), t);
  check_close(name + " merged lse", acc_lse, values(lse), tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));
  check_close(name + " summed dq", gq, values(dq), t);
  check_close(name + " dk", gk, values(dk), t);
  check_close(name + " dv", gv, values(dv), t);
}

const std::vector<Mla>& mla_cases() {
  static const std::vector<Mla> c{
      // what                                       B NH G Dqk Dv   q0 tq k0 tk seq causal p  bias softcap
      {"MHA, the diagonal block (a cuDNN form)", 2, 2, 2, 24, 16, 0, 8, 0, 8, 8},
      {"GQA, partly causal, rows without keys", 1, 4, 2, 12, 8, 3, 9, 5, 7, 16},
      {"MQA, bidirectional, Tq != Tk", 1, 4, 1, 20, 12, 0, 6, 0, 10, 10, false},
      {"GQA, bottom-right causal, dropout", 1, 4, 2, 16, 8, 6, 6, 2, 10, 12, true, 0.25f},
      {"GQA, Dv > Dqk, bias and softcap, causal", 2, 4, 2, 12, 20, 2, 5, 0, 7, 7, true, 0.0f, true, 1.5f},
      {"MHA, bias, softcap and dropout, bidirectional", 1, 2, 2, 8, 16, 0, 5, 0, 7, 7, false, 0.2f, true, 2.0f},
  };
  return c;
}

}  // namespace

TEST_CASE("attention block vs float64 reference: diagonal, full, partly causal, empty rows; every dtype") {
  uint64_t seed = 9000;
  const AttentionDropout none;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      const Geo mha{2, 24, 2, 2, 8}, gqa{1, 24, 4, 2, 16};
      for (const Geo& d : {mha, gqa}) {
        run_block(dev, dt, d, {6, 6, 6, 6}, none, ++seed);      // the diagonal block
        run_block(dev, dt, d, {12, 6, 0, 6}, none, ++seed);     // every key before every query: no mask
        run_block(dev, dt, d, {0, 12, 0, 24, false}, none, ++seed);  // bidirectional, Tq != Tk
        run_block(dev, dt, d, {8, 6, 2, 12}, none, ++seed);     // bottom-right causal (ends together)
        run_block(dev, dt, d, {3, 9, 5, 7}, none, ++seed);      // partly causal: rows 3, 4 see no key
        run_block(dev, dt, d, {10, 5, 0, 13}, none, ++seed);    // queries inside the key range
      }
      if (dev.is_cpu()) run_block(dev, dt, {1, 9, 3, 1, 3}, {2, 4, 1, 6}, none, ++seed);  // odd head dim, MQA
    }
}

TEST_CASE("attention block with dropout at global positions vs float64 reference") {
  uint64_t seed = 9100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      const AttentionDropout dr{0.25f, 77, 1234, 2};
      run_block(dev, dt, {2, 20, 2, 1, 8}, {10, 5, 5, 5}, dr, ++seed);
      run_block(dev, dt, {1, 20, 4, 2, 8}, {4, 8, 0, 12}, dr, ++seed);
    }
}

TEST_CASE("attention block: a long block (query tiles of the CPU path, several key prefixes)") {
  uint64_t seed = 9200;
  for (Device dev : test_devices()) {
    run_block(dev, DType::F32, {1, 600, 2, 1, 8}, {300, 300, 0, 600}, {}, ++seed);
    run_block(dev, DType::F32, {1, 600, 2, 2, 8}, {0, 560, 20, 540}, {}, ++seed);
  }
}

TEST_CASE("attention split into chunks and merged equals attention over the whole sequence") {
  uint64_t seed = 9300;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run_split(dev, dt, {2, 16, 2, 2, 8}, 4, true, {}, ++seed);
      run_split(dev, dt, {1, 24, 4, 2, 16}, 8, true, {}, ++seed);  // GQA, 8 chunks (CP 4)
      run_split(dev, dt, {1, 12, 2, 1, 8}, 3, false, {}, ++seed);  // bidirectional
      run_split(dev, dt, {2, 16, 4, 2, 8}, 4, true, AttentionDropout{0.2f, 5, 40, 4}, ++seed);  // the single call's mask
    }
  for (Device dev : test_devices()) run_split(dev, DType::F32, {1, 520, 2, 1, 8}, 4, true, {}, ++seed);
}

TEST_CASE("attention_merge vs float64 reference, rows a block leaves empty untouched") {
  uint64_t seed = 9400;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      Rng rng(++seed);
      const int64_t B = 2, T = 5, NH = 3, HD = 8;
      const Input a = rand_input(rng, {B, T, NH, HD}, DType::F32, dev, -1, 1);
      const Input p = rand_input(rng, {B, T, NH, HD}, dt, dev, -1, 1);
      std::vector<double> la(static_cast<size_t>(B * NH * T)), lp(la.size());
      for (size_t i = 0; i < la.size(); ++i) {
        la[i] = i % 7 == 0 ? -INFINITY : static_cast<float>(rng.uniform(-3, 3));
        lp[i] = i % 5 == 1 ? -INFINITY : static_cast<float>(rng.uniform(-3, 3));
      }
      std::vector<double> want = a.v, want_l = la;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
          for (int64_t t = 0; t < T; ++t) {
            const size_t li = static_cast<size_t>((b * NH + h) * T + t);
            if (lp[li] == -INFINITY) continue;
            const double L = la[li] == -INFINITY ? lp[li] : std::log(std::exp(la[li]) + std::exp(lp[li]));
            const double wa = la[li] == -INFINITY ? 0 : std::exp(la[li] - L), wp = std::exp(lp[li] - L);
            for (int64_t e = 0; e < HD; ++e) {
              const size_t oi = static_cast<size_t>(((b * T + t) * NH + h) * HD + e);
              want[oi] = a.v[oi] * wa + p.v[oi] * wp;
            }
            want_l[li] = L;
          }
      Out acc = make_out({B, T, NH, HD}, DType::F32, dev, &a.v), acc_l = make_out({B, NH, T}, DType::F32, dev, &la);
      attention_merge(acc.t, acc_l.t, p.t, make_tensor(lp, {B, NH, T}, DType::F32, dev));
      const std::string name = case_name(dev, dt, "attention_merge");
      check_out(name + " acc", acc, want, tol(DType::F32, Kind::Reduction));
      check_out(name + " acc_lse", acc_l, want_l, tol(DType::F32, Kind::Reduction));
    }
}

TEST_CASE("attention block: invalid arguments throw naming the op") {
  const Tensor qkv = Tensor::zeros({1, 8, 4, 8}, DType::F32);  // NH 2, G 1
  const Tensor q = qkv.slice(2, 0, 2), k = qkv.slice(2, 2, 3), v = qkv.slice(2, 3, 4);
  const Tensor out = Tensor::zeros({1, 8, 2, 8}, DType::F32), lse = Tensor::zeros({1, 2, 8}, DType::F32);
  const char* f = "attention_block_forward";
  check_throws_naming(f, [&] { attention_block_forward(q, k, v, out, lse, 1, {0, 0, 4, true}); }, "block past seq");
  check_throws_naming(f, [&] { attention_block_forward(q, k, v, out, lse, 1, {-1, 0, 0, true}); }, "negative position");
  check_throws_naming(f, [&] { attention_block_forward(q.transpose(1, 2), k, v, out, lse, 1, {}); }, "q (B, NH, T, HD)");
  check_throws_naming(f, [&] { attention_block_forward(q, k, v, Tensor::zeros({1, 8, 2, 4}, DType::F32), lse, 1, {}); },
                      "out shape");
  check_throws_naming(f, [&] { attention_block_forward(q, k, v, out, Tensor::zeros({1, 2, 8}, DType::BF16), 1, {}); },
                      "lse dtype");
  const Tensor kv2 = Tensor::zeros({1, 8, 2, 8}, DType::F32);
  check_throws_naming(f, [&] { attention_block_forward(qkv.slice(2, 0, 3), kv2, kv2, Tensor::zeros({1, 8, 3, 8}, DType::F32),
                                                       Tensor::zeros({1, 3, 8}, DType::F32), 1, {}); },
                      "NH not divisible by G");
  check_throws_naming("attention_block_backward", [&] {
    attention_block_backward(out, q, k, v, out, lse, Tensor::zeros({1, 8, 2, 8}, DType::F32),
                             Tensor::zeros({1, 8, 2, 8}, DType::F32), Tensor::zeros({1, 8, 1, 8}, DType::F32), 1, {});
  }, "dk with NH heads");
  check_throws_naming("attention_merge", [&] {
    attention_merge(Tensor::zeros({1, 8, 2, 8}, DType::BF16), lse, out, lse);
  }, "acc not f32");
}

TEST_CASE("attention block with Dqk != Dv (MLA): the reference backward equals float64 finite differences") {
  uint64_t seed = 9500;
  for (const Mla& c : mla_cases()) {
    Rng rng(++seed);
    MlaIn x = mla_inputs(rng, c, DType::F32, Device::cpu()).x;
    Rng rd(seed + 100);
    std::vector<double> dout(static_cast<size_t>(shape_numel(c.o_shape())));
    for (double& d : dout) d = rd.uniform(-1, 1);
    const double scale = 1 / std::sqrt(static_cast<double>(c.dqk));
    std::vector<double> O, L;
    mla_forward(c, x, scale, O, L);
    const MlaIn g = mla_backward(c, x, scale, dout, O, L);
    const std::string name = str("finite differences, Dqk ", c.dqk, " Dv ", c.dv, ": ", c.what);
    const Tol t{1e-6, 1e-7, 0};
    auto fd = [&](std::vector<double> MlaIn::*field) {
      return fd_grad(x.*field, [&](const std::vector<double>& xs) {
        MlaIn y = x;
        y.*field = xs;
        std::vector<double> o, l;
        mla_forward(c, y, scale, o, l);
        return o;
      }, dout);
    };
    check_close(name + " dq", g.q, fd(&MlaIn::q), t);
    check_close(name + " dk", g.k, fd(&MlaIn::k), t);
    check_close(name + " dv", g.v, fd(&MlaIn::v), t);
    if (c.bias) check_close(name + " dbias", g.bias, fd(&MlaIn::bias), t);
  }
}

TEST_CASE("attention block with Dqk != Dv (MLA) vs float64: causal and not, GQA/MQA, dropout, bias, softcap; every dtype") {
  uint64_t seed = 9600;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const Mla& c : mla_cases()) run_mla(dev, dt, c, ++seed);
  // DeepSeek-V3's widths (nope 128 + rope 64 = 192, v 128), and a block longer than the CPU's query tile.
  for (Device dev : test_devices()) {
    run_mla(dev, DType::BF16, {"DeepSeek-V3 widths, diagonal block", 1, 2, 2, 192, 128, 0, 16, 0, 16, 16}, ++seed);
    if (dev.is_cpu())
      run_mla(dev, DType::F32, {"a long block (two query tiles)", 1, 2, 1, 12, 8, 20, 280, 0, 300, 300}, ++seed);
  }
}

TEST_CASE("attention block with Dqk != Dv (MLA): key blocks merged and their gradient shares summed equal one block") {
  uint64_t seed = 9700;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run_mla_split(dev, dt, {"GQA causal", 2, 4, 2, 24, 16, 4, 8, 0, 12, 12}, 5, ++seed);
      run_mla_split(dev, dt, {"MQA bidirectional, dropout", 1, 4, 1, 12, 20, 0, 6, 0, 9, 9, false, 0.2f}, 4, ++seed);
    }
}

TEST_CASE("attention block with Dqk != Dv (MLA): shapes that do not fit throw naming the op") {
  const int64_t B = 1, T = 6, NH = 2, G = 1, Dqk = 12, Dv = 8;
  const Tensor q = Tensor::zeros({B, T, NH, Dqk}, DType::F32), k = Tensor::zeros({B, T, G, Dqk}, DType::F32),
               v = Tensor::zeros({B, T, G, Dv}, DType::F32), out = Tensor::zeros({B, T, NH, Dv}, DType::F32),
               lse = Tensor::zeros({B, NH, T}, DType::F32);
  const char* f = "attention_block_forward";
  attention_block_forward(q, k, v, out, lse, 1, {});  // the shapes that fit
  check_throws_naming(f, [&] { attention_block_forward(q, k, v, Tensor::zeros({B, T, NH, Dqk}, DType::F32), lse, 1, {}); },
                      "out with q's width instead of v's");
  check_throws_naming(f, [&] { attention_block_forward(q, v, v, out, lse, 1, {}); }, "k with v's width");
  check_throws_naming(f, [&] { attention_block_forward(q, k, Tensor::zeros({B, T, 2, Dv}, DType::F32), out, lse, 1, {}); },
                      "v with another head count");
  check_throws_naming(f, [&] { attention_block_forward(q, k, Tensor::zeros({B, T, G}, DType::F32), out, lse, 1, {}); },
                      "v 3-D");
  const char* bw = "attention_block_backward";
  const Tensor dq = Tensor::zeros(q.shape(), DType::F32), dk = Tensor::zeros(k.shape(), DType::F32),
               dv = Tensor::zeros(v.shape(), DType::F32);
  attention_block_backward(out, q, k, v, out, lse, dq, dk, dv, 1, {});  // the shapes that fit
  check_throws_naming(bw, [&] { attention_block_backward(Tensor::zeros(q.shape(), DType::F32), q, k, v, out, lse, dq, dk, dv, 1, {}); },
                      "dout with q's width");
  check_throws_naming(bw, [&] { attention_block_backward(out, q, k, v, out, lse, out, dk, dv, 1, {}); }, "dq with Dv");
  check_throws_naming(bw, [&] { attention_block_backward(out, q, k, v, out, lse, dq, dv, dv, 1, {}); }, "dk with Dv");
  check_throws_naming(bw, [&] { attention_block_backward(out, q, k, v, out, lse, dq, dk, dk, 1, {}); }, "dv with Dqk");
}
