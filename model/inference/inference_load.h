// model/inference/inference_load.h — a GPT from a training checkpoint, for inference only.
//
// Reads the newest intact checkpoint of a --save directory (io/checkpoint.h),
// builds the GPTConfig from its `model_config` attribute (num_layers,
// hidden_size, num_attention_heads, ffn_hidden_size, seq_length,
// max_position_embeddings, vocab_size, padded_vocab_size, layernorm_epsilon)
// and fills the parameters from the f32 `model/<param>` datasets. Optimizer
// moments are not read. Dropout is 0 (inference).
#pragma once
#include <memory>
#include <string>

#include "io/safetensors.h"
#include "model/gpt.h"

namespace mpitron {

struct InferenceModel {
  std::unique_ptr<GPT> model;
  int64_t iteration = -1;  // of the checkpoint that was loaded
  std::string dir;         // its iter_N directory
};

// True when load_dir names a --save directory that has committed a checkpoint.
bool checkpoint_exists(const std::string& load_dir);

// The GPTConfig stored in a checkpoint's `model_config` attribute (dropout 0).
GPTConfig read_checkpoint_config(const std::string& load_dir);

// Throws when load_dir holds no checkpoint. dtype: the compute dtype of the
// returned model (f32 default; bf16/f16 round the f32 master weights).
InferenceModel load_model_for_inference(const std::string& load_dir, Device device = Device::cpu(),
                                        DType dtype = DType::F32);

// ---- Hugging Face GPT-2 <-> mpitron (apps/convert_checkpoint) -------------------
//
// HF names (GPT2LMHeadModel; the prefix "transformer." may be absent, as in the
// hub's gpt2/model.safetensors) and ours:
//   wte.weight (V, C)                   → wte (V_padded, C), rows [V, V_padded) zero
//   wpe.weight (P, C)                   → wpe
//   h.{l}.ln_1.weight/bias              → layers.{l}.ln1.weight/bias
//   h.{l}.attn.c_attn.weight (C, 3C)    → layers.{l}.attn.qkv.weight (3C, C)   transposed
//   h.{l}.attn.c_attn.bias (3C)         → layers.{l}.attn.qkv.bias
//   h.{l}.attn.c_proj.weight (C, C)     → layers.{l}.attn.proj.weight          transposed
//   h.{l}.ln_2.weight/bias              → layers.{l}.ln2.weight/bias
//   h.{l}.mlp.c_fc.weight (C, F)        → layers.{l}.mlp.fc.weight (F, C)      transposed
//   h.{l}.mlp.c_proj.weight (F, C)      → layers.{l}.mlp.proj.weight (C, F)    transposed
//   ln_f.weight/bias                    → lnf.weight/bias
// HF's Conv1D stores (in, out) and computes x·W + b; our linear stores (out, in).
// The q/k/v column blocks of c_attn are in our row order already (q, k, v; heads
// contiguous). lm_head.weight, when present, must equal wte (tied); the causal
// mask buffers h.{l}.attn.bias / attn.masked_bias are skipped. Any other name is
// an error. F16/BF16 tensors are widened exactly to f32.

// GPT config of an HF GPT-2 checkpoint: sizes from the tensor shapes; heads and
// layernorm epsilon from HF's config.json text (n_head, layer_norm_epsilon) when
// given, else num_attention_heads (required then). padded vocab = vocab rounded
// up to divisible_by (Megatron's --make-vocab-size-divisible-by).
GPTConfig hf_gpt2_config(const io::Safetensors& st, const std::string& hf_config_json, int64_t num_attention_heads,
                         int64_t divisible_by = 128);
// A CPU f32 GPT holding the HF weights.
std::unique_ptr<GPT> gpt_from_hf_gpt2(const io::Safetensors& st, const GPTConfig& cfg);
// Writes model as an mpitron checkpoint (iteration 0, zero Adam moments) into
// save_dir, loadable by load_model_for_inference and pretrain_gpt --load
// --finetune. Returns the iter_N directory.
std::string save_model_checkpoint(const std::string& save_dir, const GPT& model, const std::string& note);

struct HfExportOptions {
  std::string prefix = "transformer.";  // "" gives GPT2Model names (wte.weight, h.0....)
  std::string dtype = "F32";            // F32, F16 or BF16
  bool lm_head = false;                 // also write lm_head.weight (a copy of wte)
};
// The HF safetensors of a GPT (padding rows of wte dropped, matrices transposed back).
io::Safetensors hf_gpt2_from_gpt(const GPT& model, const HfExportOptions& o = {});
// HF's config.json for it (GPT2LMHeadModel, activation gelu_new).
std::string hf_gpt2_config_json(const GPTConfig& c);

}  // namespace mpitron
