#include "model/inference/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/block.h"
#include "tensor/ops.h"

namespace mpitron {

KvLayout kv_layout(const TransformerConfig& c, int64_t tp) {
  KvLayout k;
  if (c.multi_latent_attention) {
    k.groups = 1, k.k_dim = c.kv_lora_rank + c.qk_pos_emb_head_dim, k.v_dim = c.kv_lora_rank, k.latent = true;
  } else {
    k.groups = c.query_groups() / tp, k.k_dim = k.v_dim = c.head_dim();
  }
  return k;
}

std::string describe(const KvLayout& k, DType dtype) {
  const int64_t n = k.elements_per_token(), bytes = n * static_cast<int64_t>(dtype_size(dtype));
  if (k.latent)
    return str(n, " values (the latent ", k.v_dim, " + the rope key ", k.k_dim - k.v_dim, "), ", bytes, " bytes");
  return str(n, " values (keys and values: 2 x ", k.groups, " heads x ", k.k_dim, "), ", bytes, " bytes");
}

PagedKVCache::PagedKVCache(int64_t layers, const KvLayout& layout, int64_t block_size, int64_t num_blocks, DType dtype,
                           Device device)
    : layers_(layers), layout_(layout), block_size_(block_size), num_blocks_(num_blocks), dtype_(dtype) {
  MPT_CHECK(layers >= 1 && layout.groups >= 1 && layout.k_dim >= 1 && layout.v_dim >= 1 && block_size >= 1 &&
                num_blocks >= 1,
            str("paged KV cache: bad sizes (layers ", layers, ", groups ", layout.groups, ", key width ", layout.k_dim,
                ", value width ", layout.v_dim, ", block_size ", block_size, ", blocks ", num_blocks, ")"),
            "");
  for (int64_t l = 0; l < layers; ++l) {
    k_.push_back(Tensor::zeros({num_blocks, layout.groups, block_size, layout.k_dim}, dtype, device));
    if (!layout.latent) v_.push_back(Tensor::zeros({num_blocks, layout.groups, block_size, layout.v_dim}, dtype, device));
  }
}

int64_t PagedKVCache::bytes_per_block(int64_t layers, const KvLayout& layout, int64_t block_size, DType dtype) {
  return layers * block_size * layout.elements_per_token() * static_cast<int64_t>(dtype_size(dtype));
}

PagedAttentionCore::PagedAttentionCore(const PagedKVCache& cache, int64_t local_layer, const PagedRows& rows,
                                       int64_t first, int64_t n, bool force_ops)
    : cache_(cache), layer_(local_layer), rows_(rows), first_(first), n_(n), force_ops_(force_ops) {
  rope_pos_.resize(static_cast<size_t>(n));
  rope_len_.resize(static_cast<size_t>(n), 1);
  std::vector<int64_t> last(rows.tables.size(), 0);  // per sequence: its last position in the step + 1
  for (size_t r = 0; r < rows.pos.size(); ++r)
    if (rows.pos[r] >= 0) {
      int64_t& l = last[static_cast<size_t>(rows.seq[r])];
      l = std::max(l, rows.pos[r] + 1);
    }
  for (int64_t i = 0; i < n; ++i) {
    if (rows.pos[static_cast<size_t>(first + i)] >= 0)
      rope_len_[static_cast<size_t>(i)] = last[static_cast<size_t>(rows.seq[static_cast<size_t>(first + i)])];
    const int64_t p = rows.pos[static_cast<size_t>(first + i)];
    rope_pos_[static_cast<size_t>(i)] = std::max<int64_t>(p, 0);
    if (p < 0) continue;
    const auto& t = rows.tables[static_cast<size_t>(rows.seq[static_cast<size_t>(first + i)])];
    MPT_CHECK(p / cache.block_size() < static_cast<int64_t>(t.size()),
              str("paged KV cache: position ", p, " is beyond its block table of ", t.size(), " blocks"), "");
  }
}

const int32_t* PagedAttentionCore::table(int64_t i) const {
  return rows_.tables[static_cast<size_t>(rows_.seq[static_cast<size_t>(first_ + i)])].data();
}

void PagedAttentionCore::forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att,
                                 const Tensor&, uint64_t) const {
  MPT_CHECK(qkv.dim(0) == n_, str("paged attention: ", qkv.dim(0), " rows of qkv for a tile of ", n_), "");
  if (!force_ops_ && qkv.device().is_cpu() && qkv.dtype() == DType::F32) attend_loop(s, a, qkv, att);
  else attend_ops(s, a, qkv, att);
}

// CPU f32: write each row's k/v, then one loop per (row, head) over its positions.
void PagedAttentionCore::attend_loop(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv,
                                     const Tensor& att) const {
  const int64_t NH = a.local_heads(s.tp), G = a.local_groups(s.tp), HD = a.head_dim, r = NH / G;
  const int64_t QL = (NH + 2 * G) * HD, C = NH * HD, bs = cache_.block_size();
  const float scale = a.scale;
  const float* q = qkv.data<float>();
  float* K = cache_.k(layer_).data<float>();
  float* V = cache_.v(layer_).data<float>();
  float* o = att.data<float>();
  const auto slot = [&](const int32_t* tab, int64_t g, int64_t t) {  // (block, group, offset) → element
    return ((static_cast<int64_t>(tab[t / bs]) * G + g) * bs + t % bs) * HD;
  };
  for (int64_t i = 0; i < n_; ++i) {
    const int64_t p = rope_pos_[static_cast<size_t>(i)];
    if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) continue;
    const int32_t* tab = table(i);
    for (int64_t g = 0; g < G; ++g) {
      std::memcpy(K + slot(tab, g, p), q + i * QL + (NH + g) * HD, static_cast<size_t>(HD) * sizeof(float));
      std::memcpy(V + slot(tab, g, p), q + i * QL + (NH + G + g) * HD, static_cast<size_t>(HD) * sizeof(float));
    }
  }
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t i = 0; i < n_; ++i)
    for (int64_t h = 0; h < NH; ++h) {
      float* oi = o + i * C + h * HD;
      if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) {
        std::fill(oi, oi + HD, 0.0f);
        continue;
      }
      const int64_t p = rope_pos_[static_cast<size_t>(i)], t0 = a.first_key(p), L = p + 1 - t0, g = h / r;
      const int32_t* tab = table(i);
      const float* qi = q + i * QL + h * HD;
      std::vector<float> sc(static_cast<size_t>(L));
      float mx = -INFINITY;
      for (int64_t t = 0; t < L; ++t) {  // key t0 + t
        const float* k = K + slot(tab, g, t0 + t);
        float d = 0.0f;
        for (int64_t e = 0; e < HD; ++e) d += qi[e] * k[e];
        sc[static_cast<size_t>(t)] = a.softcap > 0 ? a.softcap * std::tanh(d * scale / a.softcap) : d * scale;
        mx = std::max(mx, sc[static_cast<size_t>(t)]);
      }
      float sum = 0.0f;
      for (int64_t t = 0; t < L; ++t) sum += (sc[static_cast<size_t>(t)] = std::exp(sc[static_cast<size_t>(t)] - mx));
      std::fill(oi, oi + HD, 0.0f);
      for (int64_t t = 0; t < L; ++t) {
        const float w = sc[static_cast<size_t>(t)] / sum;
        const float* v = V + slot(tab, g, t0 + t);
        for (int64_t e = 0; e < HD; ++e) oi[e] += w * v[e];
      }
    }
}

// Any device / dtype: tensor ops per (row, group).
void PagedAttentionCore::attend_ops(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv,
                                    const Tensor& att) const {
  const int64_t NH = a.local_heads(s.tp), G = a.local_groups(s.tp), HD = a.head_dim, r = NH / G;
  const int64_t bs = cache_.block_size();
  const float scale = a.scale;
  const Tensor q3 = qkv.view({n_, NH + 2 * G, HD});
  const Tensor o3 = att.view({n_, NH, HD});
  const Tensor& K = cache_.k(layer_);
  const Tensor& V = cache_.v(layer_);
  for (int64_t i = 0; i < n_; ++i) {
    if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) continue;
    const int64_t p = rope_pos_[static_cast<size_t>(i)];
    const int32_t* tab = table(i);
    const Tensor row = q3.select(0, i);  // (NH + 2G, HD)
    K.select(0, tab[p / bs]).select(1, p % bs).copy_from(row.slice(0, NH, NH + G));
    V.select(0, tab[p / bs]).select(1, p % bs).copy_from(row.slice(0, NH + G, NH + 2 * G));
  }
  for (int64_t i = 0; i < n_; ++i) {
    if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) {
      o3.select(0, i).zero();
      continue;
    }
    const int64_t p = rope_pos_[static_cast<size_t>(i)], first = a.first_key(p), L = p + 1 - first;  // keys first … p
    const int32_t* tab = table(i);
    for (int64_t g = 0; g < G; ++g) {
      Tensor k = Tensor::empty({L, HD}, qkv.dtype(), qkv.device());
      Tensor v = Tensor::empty({L, HD}, qkv.dtype(), qkv.device());
      for (int64_t t = first; t <= p;) {  // the run of keys t … inside t's block
        const int64_t off = t % bs, len = std::min(bs - off, p + 1 - t);
        k.slice(0, t - first, t - first + len).copy_from(K.select(0, tab[t / bs]).select(0, g).slice(0, off, off + len));
        v.slice(0, t - first, t - first + len).copy_from(V.select(0, tab[t / bs]).select(0, g).slice(0, off, off + len));
        t += len;
      }
      const Tensor qg = q3.select(0, i).slice(0, g * r, (g + 1) * r).contiguous();  // (r, HD)
      Tensor scores = Tensor::empty({r, L}, qkv.dtype(), qkv.device());
      gemm(qg, k, scores, GemmArgs{false, true, scale, 0.0f});
      if (a.softcap > 0) softcap_forward(scores, scores, a.softcap);
      Tensor probs = Tensor::empty({r, L}, qkv.dtype(), qkv.device());
      softmax_forward(scores, probs);
      Tensor og = Tensor::empty({r, HD}, qkv.dtype(), qkv.device());
      gemm(probs, v, og, GemmArgs{});
      o3.select(0, i).slice(0, g * r, (g + 1) * r).copy_from(og);
    }
  }
}

void PagedAttentionCore::latent_forward(const BlockShape&, const Tensor& q, const Tensor& kv, const Tensor& out,
                                        float scale) const {
  const KvLayout& L = cache_.layout();
  const int64_t NH = q.dim(1), Dk = L.k_dim, Dv = L.v_dim, bs = cache_.block_size();
  MPT_CHECK(L.latent && q.dim(0) == n_ && q.dim(2) == Dk && kv.dim(0) == n_ && kv.dim(1) == Dk && out.dim(2) == Dv,
            str("paged latent attention: q ", q.describe(), ", kv ", kv.describe(), ", out ", out.describe(),
                " for a ", L.latent ? "latent" : "key/value", " cache of rows ", Dk, " (values ", Dv, ")"), "");
  const Tensor& K = cache_.k(layer_);  // (num_blocks, 1, bs, Dk)
  for (int64_t i = 0; i < n_; ++i) {  // every row's latent at its position first
    if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) continue;
    const int64_t p = rope_pos_[static_cast<size_t>(i)];
    K.select(0, table(i)[p / bs]).select(0, 0).select(0, p % bs).copy_from(kv.select(0, i));
  }
  if (!force_ops_ && q.device().is_cpu() && q.dtype() == DType::F32) {
    const Tensor qc = q.contiguous();
    const float* qp = qc.data<float>();
    const float* Kp = K.data<float>();
    float* o = out.data<float>();
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t h = 0; h < NH; ++h) {
        float* oi = o + (i * NH + h) * Dv;
        std::fill(oi, oi + Dv, 0.0f);
        if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) continue;
        const int64_t p = rope_pos_[static_cast<size_t>(i)];
        const int32_t* tab = table(i);
        const float* qi = qp + (i * NH + h) * Dk;
        std::vector<float> sc(static_cast<size_t>(p + 1));
        float mx = -INFINITY;
        for (int64_t t = 0; t <= p; ++t) {
          const float* k = Kp + (static_cast<int64_t>(tab[t / bs]) * bs + t % bs) * Dk;
          float d = 0.0f;
          for (int64_t e = 0; e < Dk; ++e) d += qi[e] * k[e];
          sc[static_cast<size_t>(t)] = d * scale;
          mx = std::max(mx, sc[static_cast<size_t>(t)]);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t <= p; ++t) sum += (sc[static_cast<size_t>(t)] = std::exp(sc[static_cast<size_t>(t)] - mx));
        for (int64_t t = 0; t <= p; ++t) {
          const float w = sc[static_cast<size_t>(t)] / sum;
          const float* k = Kp + (static_cast<int64_t>(tab[t / bs]) * bs + t % bs) * Dk;
          for (int64_t e = 0; e < Dv; ++e) oi[e] += w * k[e];
        }
      }
    return;
  }
  for (int64_t i = 0; i < n_; ++i) {  // any device / dtype: tensor ops per row
    if (rows_.pos[static_cast<size_t>(first_ + i)] < 0) {
      out.select(0, i).zero();
      continue;
    }
    const int64_t p = rope_pos_[static_cast<size_t>(i)], Lk = p + 1;
    const int32_t* tab = table(i);
    Tensor k = Tensor::empty({Lk, Dk}, q.dtype(), q.device());
    for (int64_t t = 0; t <= p;) {
      const int64_t off = t % bs, len = std::min(bs - off, p + 1 - t);
      k.slice(0, t, t + len).copy_from(K.select(0, tab[t / bs]).select(0, 0).slice(0, off, off + len));
      t += len;
    }
    Tensor scores = Tensor::empty({NH, Lk}, q.dtype(), q.device());
    gemm(q.select(0, i).contiguous(), k, scores, GemmArgs{false, true, scale, 0.0f});
    Tensor probs = Tensor::empty({NH, Lk}, q.dtype(), q.device());
    softmax_forward(scores, probs);
    Tensor oi = Tensor::empty({NH, Dv}, q.dtype(), q.device());
    gemm(probs, k.slice(1, 0, Dv).contiguous(), oi, GemmArgs{});
    out.select(0, i).copy_from(oi);
  }
}

Tensor paged_layers(const GPT& model, int64_t first, int64_t end, const Tensor& x_in, const PagedRows& rows,
                    const PagedKVCache& kv, const TensorParallel& tp, bool force_ops, int64_t kv_first) {
  const GPTConfig& c = model.config();
  const int64_t n = x_in.dim(0), C = c.hidden_size;
  MPT_CHECK(n % kRowTile == 0 && static_cast<int64_t>(rows.pos.size()) == n,
            str("paged_layers: ", n, " rows (", rows.pos.size(), " positions) is no whole number of ", kRowTile, "-row tiles"),
            "");
  Tensor x = x_in;
  for (int64_t l = first; l < end; ++l) {
    BlockShape s = block_shape(c, 1, kRowTile, tp, false, l);
    Tensor y = Tensor::empty({n, C}, x.dtype(), x.device());
    BlockActs acts;
    for (int64_t t0 = 0; t0 < n; t0 += kRowTile) {
      s.core = std::make_shared<PagedAttentionCore>(kv, kv_first + l - first, rows, t0, kRowTile, force_ops);
      block_forward(s, model.block_params(l), x.slice(0, t0, t0 + kRowTile), y.slice(0, t0, t0 + kRowTile), acts, 0, 0);
    }
    x = y;
  }
  return x;
}

}  // namespace mpitron
