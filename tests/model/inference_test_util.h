// tests/model/inference_test_util.h — small GPT-2, Llama, Qwen2, Gemma and MLA checkpoints for the inference
// runner and engine tests (written by rank 0, read by every rank).
#pragma once
#include <mpi.h>

#include <filesystem>
#include <string>

#include "model/gpt.h"
#include "model/inference/inference_load.h"
#include "tests/model/mpi_test_util.h"

namespace mpitron::testing {

// 4 layers (PP 2 and 4 divide it), 4 heads (TP 2 and 4), a 90-token vocabulary padded to 128.
// init std 0.3: peaked distributions, so greedy decisions are far from ties.
inline GPTConfig tiny_gpt2() {
  GPTConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 64;
  c.max_position_embeddings = 64;
  c.vocab_size = 90;
  c.padded_vocab_size = 128;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.init_method_std = 0.3f;
  return c;
}

// Llama: RMSNorm, SwiGLU, rope, 8 query heads in 4 key/value groups, untied head, no biases.
inline GPTConfig tiny_llama() {
  GPTConfig c = tiny_gpt2();
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.normalization = Normalization::RMSNorm;
  c.mlp = MlpKind::SwiGLU;
  c.ffn_hidden_size = 48;
  c.position_embedding = PositionEmbedding::Rope;
  c.untie_embeddings = true;
  c.add_bias_linear = false;
  return c;
}

// Gemma: GeGLU, RMSNorm scaling by 1 + w, embeddings times sqrt(C), heads of 16 (NH·HD = 64 != C),
// tied head, rope, no biases; the embedding and final norm of model/layers/model_ends.h.
inline GPTConfig tiny_gemma() {
  GPTConfig c = tiny_gpt2();
  c.kv_channels = 16;
  c.normalization = Normalization::RMSNorm;
  c.layernorm_1p = true;
  c.scale_embeddings = true;
  c.mlp = MlpKind::GeGLU;
  c.ffn_hidden_size = 48;
  c.position_embedding = PositionEmbedding::Rope;
  c.add_bias_linear = false;
  return c;
}

// Qwen2: Llama with biases on q, k and v only.
inline GPTConfig tiny_qwen2() {
  GPTConfig c = tiny_llama();
  c.add_qkv_bias = true;
  return c;
}

// Mistral: Llama with a sliding window of 5 keys before each query (shorter than the prompts and
// than the paged cache's blocks of 8 plus the generated tokens, so windows start inside a block).
inline GPTConfig tiny_mistral() {
  GPTConfig c = tiny_llama();
  c.window_size = 5;
  return c;
}

// Multi-latent attention (DeepSeek-V3's): the cache holds one latent row of 16 + 8 values per token,
// the same on every tensor-parallel rank.
inline GPTConfig tiny_mla() {
  GPTConfig c = tiny_llama();
  c.num_query_groups = 0;
  c.multi_latent_attention = true;
  c.kv_lora_rank = 16;
  c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 8;
  c.v_head_dim = 8;
  return c;
}

// Rank 0 writes a checkpoint of cfg with weights from `seed` into dir; every rank returns after it.
inline void write_checkpoint(const std::filesystem::path& dir, const GPTConfig& cfg, uint64_t seed) {
  if (world_rank() == 0) {
    std::filesystem::remove_all(dir);
    GPT model(cfg, Device::cpu());
    model.init_weights(seed);
    save_model_checkpoint(dir.string(), model, "test");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace mpitron::testing
