// model/inference/paged_kv_cache.h — the paged KV cache and the attention that reads it.
//
// Storage (one rank: its pipeline stage's layers, its tensor-parallel key/value heads):
//   k[l], v[l]: (num_blocks, Gl, block_size, HD)   compute dtype, model device
// or, for multi-latent attention (KvLayout::latent), the latent cache: one row per token,
//   k[l]: (num_blocks, 1, block_size, kr + dr)     [norm(c) (kr) | rope(k_pe) (dr)], no v
// (the values are the rows' first kr values; model/layers/mla_layer.h absorbs the up-projections).
// Gl = query groups / TP (G = heads without grouping). A sequence's position p
// lives in block table[p / block_size] at offset p % block_size (the tables come
// from the scheduler's KVBlockAllocator, kv_block_allocator.h, with each step).
//
// PagedAttentionCore is the AttentionCore (model/layers/attention_core.h) of a
// forward over the cache. Its rows may be anything: prompt chunks (several
// consecutive positions of one sequence), decode tokens (one position each) of
// many sequences, and padding rows. attend() first writes every row's rotated
// key and value at its position, then each row's query heads attend over
// positions [0, pos] of their sequence (causal by construction: the cache holds
// only the past and the rows just written).
//
// Each row's output is computed on its own, in the same order whatever the other
// rows are (one loop per (row, head) over the row's positions), so a sequence's
// attention never depends on what else is in the batch.
//   CPU, f32: a direct loop (OpenMP over rows × heads);
//   any other device or dtype: tensor ops per (row, group): the row's keys and
//     values gathered from its blocks into (L, HD), scores = q·Kᵀ (r, L),
//     softmax_forward, · V. Tested on the CPU against the loop (force_ops).
// Padding rows (pos < 0) write nothing and get zeros.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/layers/attention_core.h"
#include "tensor/tensor.h"

namespace mpitron {

// What one layer's cache holds per token on one rank.
struct KvLayout {
  int64_t groups = 1;   // Gl key (and value) heads; 1 for the latent cache
  int64_t k_dim = 0;    // a key head's width: HD, or kr + dr for the latent cache
  int64_t v_dim = 0;    // a value head's width: HD, or kr (the latent row's first kr values)
  bool latent = false;  // multi-latent attention: keys only, the values are their first v_dim values
  int64_t elements_per_token() const { return groups * (k_dim + (latent ? 0 : v_dim)); }
};
// The layout of configuration c on a tensor-parallel rank of tp: Gl = G/tp heads of HD, or the latent
// row (kr + dr, the same on every TP rank) with --multi-latent-attention.
KvLayout kv_layout(const TransformerConfig& c, int64_t tp);
// "576 values (the latent 512 + the rope key 64), 1152 bytes" / "2 × 2 heads × 64 values (keys and values), …".
std::string describe(const KvLayout& k, DType dtype);

class PagedKVCache {
 public:
  // layers: the layers this rank holds.
  PagedKVCache(int64_t layers, const KvLayout& layout, int64_t block_size, int64_t num_blocks, DType dtype, Device device);
  // Bytes of one block over `layers` layers (keys and values).
  static int64_t bytes_per_block(int64_t layers, const KvLayout& layout, int64_t block_size, DType dtype);

  const KvLayout& layout() const { return layout_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t bytes() const { return num_blocks_ * bytes_per_block(layers_, layout_, block_size_, dtype_); }
  const Tensor& k(int64_t local_layer) const { return k_[static_cast<size_t>(local_layer)]; }
  const Tensor& v(int64_t local_layer) const { return v_[static_cast<size_t>(local_layer)]; }

 private:
  int64_t layers_;
  KvLayout layout_;
  int64_t block_size_, num_blocks_;
  DType dtype_;
  std::vector<Tensor> k_, v_;  // [local layer] (num_blocks, Gl, block_size, k_dim / v_dim); v_ empty when latent
};

// The rows of one forward over the cache.
struct PagedRows {
  std::vector<int64_t> pos;                   // [row] position in its sequence; < 0: a padding row
  std::vector<int32_t> seq;                   // [row] index into tables (ignored for padding rows)
  std::vector<std::vector<int32_t>> tables;   // [sequence] block ids covering positions [0, its last row's pos]
};

class PagedAttentionCore final : public AttentionCore {
 public:
  // Rows [first, first + n) of `rows` are the n rows of this forward (a tile of the step).
  PagedAttentionCore(const PagedKVCache& cache, int64_t local_layer, const PagedRows& rows, int64_t first, int64_t n,
                     bool force_ops = false);
  void forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att, const Tensor& lse,
               uint64_t seed) const override;
  bool trains() const override { return false; }
  void latent_forward(const BlockShape& s, const Tensor& q, const Tensor& kv, const Tensor& out,
                      float scale) const override;
  const std::vector<int64_t>* positions() const override { return &rope_pos_; }
  const std::vector<int64_t>* rope_lengths() const override { return &rope_len_; }

 private:
  const int32_t* table(int64_t i) const;  // block table of row i of this tile
  void attend_loop(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att) const;
  void attend_ops(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att) const;

  const PagedKVCache& cache_;
  int64_t layer_;
  const PagedRows& rows_;
  int64_t first_, n_;
  bool force_ops_;
  std::vector<int64_t> rope_pos_;  // [row of the tile] its position (0 for padding)
  std::vector<int64_t> rope_len_;  // [row of the tile] its sequence's last position in the step + 1
};

// Rows per GEMM when decoding: every matmul runs on tiles of kRowTile rows (the last one padded),
// so a row's numbers are those of a tile-sized GEMM whatever else is in the step (BLAS and cuBLAS
// choose their kernels by shape, and a row's result depends on the kernel): a request's tokens never
// depend on the batch. The output layer has its own, larger tile: its weight (V/t × C) is the biggest
// matrix and BLAS reads (packs) all of it once per call, so a decode step of 32 requests costs one
// call instead of four (on the 2-core CPU a 32-row head GEMM costs ~1.3x an 8-row one, not 4x); a lone
// request pays for the padding.
constexpr int64_t kRowTile = 8;
constexpr int64_t kHeadRowTile = 32;

// THE decoder of every caller (the serving engine's ModelRunner, generate()): x (n, C), n a multiple
// of kRowTile (rows.pos padded with −1 rows), through this rank's layers [first, end) of `model` over
// the cache, tile by tile, each layer's block (model/block.h) with a PagedAttentionCore. Returns the
// rows' hidden states (n, C). The cache's local layer of layer l is l − first.
// kv_first: the cache's local layer of layer `first` (default 0; the MTP layer's cache sits after the
// stage's own layers).
Tensor paged_layers(const GPT& model, int64_t first, int64_t end, const Tensor& x, const PagedRows& rows,
                    const PagedKVCache& kv, const TensorParallel& tp, bool force_ops = false, int64_t kv_first = 0);

}  // namespace mpitron
