// model/config.h — what a GPT is made of. Every field: meaning and default.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace mpitron {

struct GPTConfig {
  int64_t num_layers = 12;               // --num-layers: transformer blocks
  int64_t hidden_size = 768;             // --hidden-size: C, the residual stream width
  int64_t num_attention_heads = 12;      // --num-attention-heads: NH; C must divide by it
  int64_t ffn_hidden_size = 0;           // --ffn-hidden-size: F; 0 means 4·C
  int64_t seq_length = 1024;             // --seq-length: T, tokens per sample
  int64_t max_position_embeddings = 1024;// --max-position-embeddings: rows of wpe; >= T
  int64_t vocab_size = 50257;            // tokenizer vocabulary (GPT-2: 50257)
  int64_t padded_vocab_size = 50304;     // V: vocab rounded up (make-vocab-size-divisible-by × TP)
  float hidden_dropout = 0.1f;           // --hidden-dropout: after embeddings, attn proj and MLP
  float attention_dropout = 0.1f;        // --attention-dropout: on the attention probabilities (Megatron's 0.1)
  float init_method_std = 0.02f;         // --init-method-std: N(0, std) for weights; output
                                         //   projections use std / sqrt(2·num_layers)
  float layernorm_epsilon = 1e-5f;       // --layernorm-epsilon
  DType compute_dtype = DType::F32;      // f32, or bf16/f16 with --bf16/--fp16

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Validate; throws naming the flags that conflict.
  void validate() const;
  // Parameters (the tied LM head counts once).
  int64_t num_parameters() const;
  // Training FLOPs per token (forward + backward = 3 × forward), documented in docs/flops.md:
  //   6·N_matmul + 6·L·T·C   (attention scores and values counted for the causal half: 12·L·T·C/2)
  // where N_matmul counts every matmul weight including the tied LM head.
  double flops_per_token() const;
};

}  // namespace mpitron
