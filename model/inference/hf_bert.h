// model/inference/hf_bert.h — Hugging Face BertForPreTraining <-> mpitron BERT (model/bert.h;
// apps/convert_checkpoint). The HF checkpoint is the original post-LN BERT: GPTConfig bert,
// causal false, post_ln true (embedding LayerNorm, no final norm), binary head.
//
// Names (HF → ours; C hidden, F intermediate, V vocab, P positions, TT token types; b = bert.,
// e = b + "embeddings.", h = b + "encoder.layer.{l}.", each Linear's .weight and .bias alike):
//   e + word_embeddings.weight (V, C)        → wte (V_padded, C), rows [V, V_padded) zero
//   e + position_embeddings.weight (P, C)    → wpe
//   e + token_type_embeddings.weight (TT, C) → tokentype_embeddings
//   e + LayerNorm.weight / .bias             → emb_ln.weight / .bias
//   h + attention.self.query (C, C)  ┐
//   h + attention.self.key (C, C)    ├ rows concatenated Q, K, V → layers.{l}.attn.qkv (3C, C)
//   h + attention.self.value (C, C)  ┘   (our qkv rows: Q heads, then K, then V, heads contiguous:
//                                        HF's view(B, T, NH, HD) of each projection is the same order)
//   h + attention.output.dense       → layers.{l}.attn.proj
//   h + attention.output.LayerNorm   → layers.{l}.ln1      (post-LN: LN1(x + attn(x)))
//   h + intermediate.dense (F, C)    → layers.{l}.mlp.fc
//   h + output.dense (C, F)          → layers.{l}.mlp.proj
//   h + output.LayerNorm             → layers.{l}.ln2      (post-LN: LN2(x2 + mlp(x2)))
//   b + pooler.dense                 → pooler.dense
//   cls.predictions.transform.dense      → lm_head.dense
//   cls.predictions.transform.LayerNorm  → lm_head.ln
//   cls.predictions.bias (V)             → lm_head.bias (V_padded), padding zero
//   cls.predictions.decoder.weight / .bias: tied to word_embeddings / predictions.bias; read
//       only to check they are equal (save_pretrained usually leaves them out), never written
//   cls.seq_relationship (2, C)          → binary_head
// HF's buffers bert.embeddings.position_ids / token_type_ids (older checkpoints) are ignored, and
// TF-era LayerNorm names (.gamma / .beta) are read as .weight / .bias. config.json's
// architectures is not checked (the hub's BERTs say BertForMaskedLM but hold these tensors).
// nn.Linear stores (out, in) as we do: nothing is transposed.
//
// config.json → GPTConfig: hidden_size, num_hidden_layers, num_attention_heads,
// intermediate_size (ffn_hidden_size), max_position_embeddings (also seq_length),
// type_vocab_size (num_tokentypes), vocab_size (padded to a multiple of divisible_by,
// Megatron's rule), layer_norm_eps (every LayerNorm), hidden_act: "gelu" (HF's exact erf GELU)
// → gelu_exact = true; "gelu_new" / "gelu_pytorch_tanh" (the tanh approximation) → false;
// anything else is refused. position_embedding_type must be "absolute", is_decoder and
// add_cross_attention false, tie_word_embeddings true. Keys that do not change the math
// (dropouts, token ids, init range, dtype, …) are accepted; any other key is an error naming it.
//
// The sentence head: HF's next_sentence_label 0 means "sentence B follows A" and 1 "B is
// random"; mpitron's BertBatch::is_random (Megatron's sentence-order label) is 0 for the
// original order and 1 for the swapped/random one. Same index, same meaning: logit column k
// of cls.seq_relationship is column k of binary_head, and is_random = next_sentence_label.
#pragma once
#include <memory>
#include <string>

#include "model/bert.h"
#include "model/inference/hf_llama.h"

namespace mpitron {

// GPTConfig of an HF BERT config.json (see the top of this file). Throws naming the key.
GPTConfig hf_bert_config(const std::string& config_json, int64_t divisible_by = 128);
// A CPU f32 Bert holding the HF weights. Throws naming the file and tensor when one is missing,
// both shapes when one does not fit, and any tensor that is not part of the model.
std::unique_ptr<Bert> bert_from_hf(const HfCheckpoint& ck, const GPTConfig& cfg);

// True when the configuration is one BertForPreTraining can hold: BERT, post-LN, LayerNorm,
// learned positions, biases, a GELU MLP, multi-head attention, the binary head and token types.
// why: what is missing, when false.
bool hf_bert_exportable(const GPTConfig& c, std::string* why = nullptr);
// The HF tensors of a BERT model (its GPT core: Bert::core(), or a BERT checkpoint loaded by
// load_model_for_inference), vocabulary padding dropped, stored as dtype ("F32", "F16" or
// "BF16"). The tied decoder weight and bias are not written (as save_pretrained). flat: the
// ParamSet-shaped values to export (default the model's values; the tests pass gradients).
io::Safetensors hf_bert_from_gpt(const GPT& model, const std::string& dtype = "F32", const Tensor* flat = nullptr);
// HF's config.json for it (BertForPreTraining, model_type bert, hidden_act "gelu" for the erf
// GELU or "gelu_new" for the tanh one, torch_dtype from dtype).
std::string hf_bert_config_json(const GPTConfig& c, const std::string& dtype = "F32");

}  // namespace mpitron
