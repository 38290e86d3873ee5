// model/inference/hf_llama.h — Hugging Face LlamaForCausalLM <-> mpitron (apps/convert_checkpoint).
//
// Names (HF → ours; C hidden, F intermediate, NH heads, G key/value heads, HD = C / NH):
//   model.embed_tokens.weight (V, C)                → wte (V_padded, C), rows [V, V_padded) zero
//   model.layers.{l}.input_layernorm.weight (C)     → layers.{l}.ln1.weight
//   model.layers.{l}.self_attn.q_proj.weight (NH·HD, C) ┐
//   model.layers.{l}.self_attn.k_proj.weight (G·HD, C)  ├ rows concatenated in this order
//   model.layers.{l}.self_attn.v_proj.weight (G·HD, C)  ┘ → layers.{l}.attn.qkv.weight ((NH+2G)·HD, C)
//   model.layers.{l}.self_attn.o_proj.weight (C, NH·HD) → layers.{l}.attn.proj.weight
//   model.layers.{l}.post_attention_layernorm.weight → layers.{l}.ln2.weight
//   model.layers.{l}.mlp.gate_proj.weight (F, C) ┐ rows concatenated [gate; up]
//   model.layers.{l}.mlp.up_proj.weight (F, C)   ┘ → layers.{l}.mlp.fc.weight (2F, C)
//   model.layers.{l}.mlp.down_proj.weight (C, F)    → layers.{l}.mlp.proj.weight
//   model.norm.weight (C)                           → lnf.weight
//   lm_head.weight (V, C)                           → head.weight (V_padded, C) (untied; when
//                                                     tie_word_embeddings is true it must be absent
//                                                     or equal embed_tokens)
// With attention_bias = mlp_bias = true the .bias vectors map the same way (add_bias_linear).
// HF's nn.Linear stores (out, in) as we do: nothing is transposed.
//
// Rotary embeddings: mpitron's rope (tensor/rope.h) uses HF's rotate_half convention
// (dimension i pairs with i + rot/2 within each head), so q_proj/k_proj rows are copied
// WITHOUT the permutation that Meta's original checkpoints (consolidated.*.pth,
// interleaved pairs) would need. Meta's original format is not supported: convert it to
// HF's layout with transformers' convert_llama_weights_to_hf.py first.
//
// config.json → GPTConfig: hidden_size, intermediate_size (ffn_hidden_size),
// num_attention_heads, num_key_value_heads (num_query_groups; absent = NH),
// num_hidden_layers, rms_norm_eps, rope_theta (rotary_base), max_position_embeddings (also
// seq_length), vocab_size (padded to a multiple of divisible_by, Megatron's rule),
// tie_word_embeddings (default false), attention_bias / mlp_bias (must agree),
// partial_rotary_factor (rotary_percent). hidden_act must be silu, rope_scaling null,
// head_dim (if present) C / NH, sliding_window null (Mistral). model_type llama or mistral.
// Keys that do not change the math (token ids, dtype, dropout, init range, …) are accepted;
// any other key is an error naming it.
//
// Tensors: a directory with model.safetensors.index.json (weight_map → shard files) or a
// single model.safetensors; F32, F16 and BF16 (widened exactly to f32).
#pragma once
#include <map>
#include <memory>
#include <string>

#include "io/safetensors.h"
#include "model/gpt.h"

namespace mpitron {

// An HF checkpoint directory read into memory: config.json and every tensor.
struct HfCheckpoint {
  std::string dir;
  std::string config_json;                    // the text of config.json
  io::Safetensors tensors;                    // every shard's tensors, in weight_map / file order
  std::map<std::string, std::string> file_of; // tensor name → the file that holds it
};
// Reads dir/config.json and dir/model.safetensors.index.json (+ its shards) or
// dir/model.safetensors. Throws naming the file that is missing or broken.
HfCheckpoint read_hf_checkpoint(const std::string& dir);

// The model_type of an HF config.json text ("gpt2", "llama", …; from "architectures" when
// model_type is absent: GPT2LMHeadModel → gpt2, LlamaForCausalLM → llama, MistralForCausalLM
// → mistral, BertForPreTraining / BertForMaskedLM → bert). Throws when neither is there.
std::string hf_model_type(const std::string& config_json);

// Shared by the HF name maps (hf_llama.cpp, hf_bert.cpp):
// the shortest decimal that reads back as f (1e-05, not 9.999999747378752e-06);
double hf_short_float(float f);
// torch_dtype of an export dtype: F32 → float32, F16 → float16, BF16 → bfloat16; throws otherwise.
const char* hf_torch_dtype(const std::string& dtype);

// GPTConfig of an HF Llama config.json (see the top of this file). Throws naming the key.
GPTConfig hf_llama_config(const std::string& config_json, int64_t divisible_by = 128);
// A CPU f32 GPT holding the HF weights. Throws naming the file and tensor when one is
// missing, both shapes when one does not fit, and any tensor that is not part of the model.
std::unique_ptr<GPT> gpt_from_hf_llama(const HfCheckpoint& ck, const GPTConfig& cfg);

// True when the configuration is one LlamaForCausalLM can hold: RMSNorm, SwiGLU, rope.
// (GPTConfig::family() is "llama" only for the untied, bias-free form; tied embeddings or
// biases are also exportable.) why: what is missing, when false.
bool hf_llama_exportable(const GPTConfig& c, std::string* why = nullptr);
// The HF tensors of a model (vocabulary padding rows dropped), stored as dtype
// ("F32", "F16" or "BF16"). flat: the ParamSet-shaped values to export (default the
// model's values; the tests pass its gradients).
io::Safetensors hf_llama_from_gpt(const GPT& model, const std::string& dtype = "F32", const Tensor* flat = nullptr);
// HF's config.json for it (LlamaForCausalLM, model_type llama, torch_dtype from dtype).
std::string hf_llama_config_json(const GPTConfig& c, const std::string& dtype = "F32");

}  // namespace mpitron
