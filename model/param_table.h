// model/param_table.h — a model family's parameters as DATA: one row per tensor.
//
// The table is the single place that knows which tensors a configuration has.
// It drives the layout (GPT's ParamSet and the checkpoint's dataset names and
// global shapes), the tensor-parallel sharding, the init, weight decay, the
// pipeline placement, the parameter and FLOP counts, and the Hugging Face map: each
// row carries, in its HF column, the names of the configuration's family
// (model/families.h) and how the values transform, and the one converter
// (model/inference/hf_convert.h) reads and writes every family from it. Nothing
// matches names to decide what a tensor is.
//
// Rows, in single-rank order (GPT-2 / Llama; C hidden, F ffn, V padded vocab,
// P positions, NH heads, G query groups, HD head dim):
//   wte               (V, C)            vocab-parallel (rows)          first stage (+ tied head copy)
//   wpe               (P, C)            replicated                     first stage, learned positions only
//   layers.l.ln1.weight / .bias (C)     replicated, no decay           layer l (bias: LayerNorm only)
//   layers.l.attn.qkv.weight ((NH+2G)·HD, C)  column: parts Q, K, V   (rows NH·HD, G·HD, G·HD)
//   layers.l.attn.qkv.bias   ((NH+2G)·HD)     same split              (biases: unless --disable-bias-linear)
//   layers.l.attn.proj.weight (C, C)    row-parallel (columns), output init
//   layers.l.attn.proj.bias (C)         replicated
//   layers.l.ln2.weight / .bias (C)
//   layers.l.mlp.fc.weight (F or 2F, C) column: one part, or gate|up for SwiGLU
//   layers.l.mlp.fc.bias (F or 2F)
//   layers.l.mlp.proj.weight (C, F)     row-parallel, output init
//   layers.l.mlp.proj.bias (C)
// An MoE layer (cfg.is_moe_layer(l); E experts of width Fe, FCe = Fe or 2·Fe gated) has instead of the mlp rows:
//   layers.l.mlp.router.weight (E, C)            replicated
//   layers.l.mlp.experts.e.fc.weight (FCe, C)    e = 0 … E−1, column-parallel like mlp.fc (gate|up parts)
//   layers.l.mlp.experts.e.fc.bias (FCe)         biases: unless --disable-bias-linear
//   layers.l.mlp.experts.e.proj.weight (C, Fe)   row-parallel, output init
//   layers.l.mlp.experts.e.proj.bias (C)
//   layers.l.mlp.shared.fc.weight (FCs, C), layers.l.mlp.shared.proj.weight (C, Fs)   shared experts (Fs > 0)
//   layers.l.mlp.shared.gate.weight (1, C)       replicated (--moe-shared-expert-gate)
// Each kind's experts are consecutive (every fc weight, then every fc bias, …): the grouped GEMM's operands.
// Multi-token prediction (--mtp-num-layers D; model/gpt_mtp.cpp), per depth k = 1 … D, last stage:
//   mtp.{k−1}.enorm.weight, mtp.{k−1}.hnorm.weight (C)   replicated
//   mtp.{k−1}.eh_proj.weight (C, 2C)                   replicated ([enorm(e) | hnorm(h)] columns)
//   layers.{L+k−1}.*                                   a block of the last layer's kind
//   mtp.{k−1}.final_norm.weight (C)
//   lnf.weight / .bias (C)              last stage
//   head.weight (V, C)                  vocab-parallel, last stage (untied only)
// BERT (cfg.bert) adds, replicated unless said:
//   tokentype_embeddings (TT, C)        first stage (TT = 2 with the binary head, else none)
//   emb_ln.weight / .bias (C)           first stage, post-LN only (then no lnf)
//   lm_head.dense.weight (C, C) / .bias, lm_head.ln.weight / .bias    last stage
//   lm_head.bias (V)                    vocab-parallel like wte (the decoder is the tied wte)
//   pooler.dense.weight (C, C) / .bias, binary_head.weight (2, C) / .bias (2)   binary head only
// T5 (cfg.t5; model/t5.h): layers 0 … Le−1 are the encoder's blocks as above; a decoder layer l >= Le
// has, between its attention and ln2 rows, the cross-attention sublayer:
//   layers.l.ln3.weight / .bias (C)     the norm before cross-attention
//   layers.l.xattn.q.weight (NH·HD, C)  column-parallel (query heads)
//   layers.l.xattn.kv.weight (2·G·HD, C) column: parts K, V (read from the encoder's output)
//   layers.l.xattn.proj.weight (C, NH·HD) row-parallel, output init   (biases: unless --disable-bias-linear)
// and outside the blocks (first stage): enc_rel_bias.weight, dec_rel_bias.weight (buckets, NH) split by
// columns (heads) with relative positions; enc_lnf.weight / .bias (C), the encoder's final norm.
// BERT classification (cfg.num_classes = K > 0; Megatron's Classification model) has, instead
// of every lm_head and binary_head row (wte is then first stage only, no decoder):
//   pooler.dense.weight (C, C) / .bias, classification_head.weight (K, C) / .bias (K)   last stage
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace mpitron {

enum class ParamRole : uint8_t {
  WordEmbedding, PositionEmbedding,
  Norm1Weight, Norm1Bias, QkvWeight, QkvBias, ProjWeight, ProjBias,
  Norm2Weight, Norm2Bias, FcWeight, FcBias, MlpProjWeight, MlpProjBias,
  FinalNormWeight, FinalNormBias, OutputWeight,
  // BERT (model/bert.h)
  TokentypeEmbedding, EmbeddingNormWeight, EmbeddingNormBias,
  LmHeadDenseWeight, LmHeadDenseBias, LmHeadNormWeight, LmHeadNormBias, LmHeadBias,
  PoolerWeight, PoolerBias, BinaryHeadWeight, BinaryHeadBias,
  ClassificationHeadWeight, ClassificationHeadBias,  // BERT with num_classes > 0
  // A Mixture-of-Experts MLP (model/layers/moe_layer.h), instead of the dense Fc*/MlpProj* rows:
  // the router, each routed expert's two linears (ParamSpec::expert), the shared experts and their gate.
  RouterWeight, ExpertFcWeight, ExpertFcBias, ExpertProjWeight, ExpertProjBias,
  SharedFcWeight, SharedProjWeight, SharedGateWeight,
  // T5 (model/t5.h): a decoder layer's cross-attention sublayer (its norm, query, fused key|value and output
  // projections), the encoder's final norm, and each stack's relative position bias table.
  Norm3Weight, Norm3Bias, CrossQWeight, CrossQBias, CrossKvWeight, CrossKvBias, CrossProjWeight, CrossProjBias,
  EncoderFinalNormWeight, EncoderFinalNormBias, EncoderRelativeBias, DecoderRelativeBias,
  // Norms on a sublayer's output before the residual add (model/layers/layer_spec.h: Gemma 2/3's
  // sandwich, OLMo-2's output norms), and self-attention's query/key norms (QK-norm).
  Norm1PostWeight, Norm1PostBias, Norm2PostWeight, Norm2PostBias, QNormWeight, KNormWeight,
  // Multi-latent attention (model/layers/mla_layer.h): the query's down-projection, its norm and up-projection
  // (or a plain query projection), the key/value latent's down-projection (with the shared rope key), its norm
  // and up-projection.
  MlaQDownWeight, MlaQDownNormWeight, MlaQUpWeight, MlaQWeight, MlaKvDownWeight, MlaKvDownNormWeight, MlaKvUpWeight,
  // Multi-token prediction (model/gpt_mtp.cpp), per depth: the embedding's and the hidden state's norms, the
  // projection of their concatenation, and the final norm before the shared output layer.
  MtpEmbedNormWeight, MtpHiddenNormWeight, MtpProjWeight, MtpFinalNormWeight,
};
const char* to_string(ParamRole r);
// Megatron's is_embedding_or_output_parameter: tables looked up by index (word, position, token-type
// embeddings, relative-position biases) and the layers that produce the logits (the output layer, BERT's
// binary and classification heads). Matrix optimizers (muon) leave these to their scalar optimizer.
bool is_embedding_or_output(ParamRole r);

enum class ParamInit : uint8_t {
  Normal,        // N(0, init_method_std)
  OutputNormal,  // N(0, init_method_std / sqrt(2·num_layers)): the two output projections
  Ones,          // norm weights
  Zeros,         // biases
};

// How a row's values map to its Hugging Face tensors.
enum class HfTransform : uint8_t {
  Copy,       // stored as ours: nn.Linear's (out, in), embeddings, norm weights and biases
  Transpose,  // GPT-2's Conv1D stores (in, out)
};

enum class ParamPlace : uint8_t {
  FirstStage,    // embeddings
  Layer,         // the stage holding `layer`
  LastStage,     // final norm, untied head
  FirstAndLast,  // the tied word embedding: the first stage, and a copy on the last for the head
};

struct ParamSpec {
  std::string name;     // checkpoint dataset name under model/ (docs/checkpoint-format.md)
  ParamRole role;
  Shape global_shape;
  // Tensor-parallel split: axis -1 replicated, 0 rows, 1 columns. The axis is cut
  // into `parts` consecutive blocks (global sizes; empty = one block, the whole
  // axis), each split evenly over the TP ranks: qkv is Q | K | V with fewer K/V rows
  // under GQA, SwiGLU's fc is gate | up.
  int tp_axis = -1;
  std::vector<int64_t> tp_parts;
  ParamInit init = ParamInit::Normal;
  bool weight_decay = true;  // false for biases and norm parameters
  ParamPlace place = ParamPlace::Layer;
  int64_t layer = -1;        // ParamPlace::Layer only
  bool matmul = false;       // a matmul weight (counted in FLOPs: 6 per element per token)
  int64_t expert = -1;       // a routed expert's row: the expert (0 … E−1); a token runs through k of E
  bool vocab = false;        // axis 0 is the padded vocabulary (wte, head.weight, lm_head.bias): the
                             //   rows past vocab_size are padding, absent in Hugging Face
  // The Hugging Face column, for the configuration's family (empty for a mix no family
  // has): the HF tensors whose rows make this parameter, one per part of tp_parts (q|k|v,
  // gate|up) or one for the whole; names after the family's prefix (GPT-2's "transformer.").
  std::vector<std::string> hf;
  HfTransform hf_transform = HfTransform::Copy;
  // HF tensors tied to this one (lm_head.weight = wte, BERT's decoder): read only to check
  // they equal it; written only on request (GPT-2's --lm-head).
  std::vector<std::string> hf_tied;
  // Per HF tensor (part): ours = HF × factor (empty: 1). T5's unscaled attention: the query parts carry
  // √HD (mpitron scales scores by 1/√HD); the tied T5's decoder final norm carries C^−½ (HF scales the
  // decoder output by it before the tied head). Gradients go the other way (HF grad = ours × factor).
  std::vector<double> hf_factor;
  // Row order of a single-name HF tensor: our row i is HF row hf_rows[i] (empty: the same order). DeepSeek's
  // rope dims are interleaved pairs in its weights; ours are rotate-half halves (model/layers/mla_layer.h).
  std::vector<int64_t> hf_rows;
};

// Every parameter of `cfg`, in single-rank (checkpoint) order.
std::vector<ParamSpec> param_table(const GPTConfig& cfg);
// The rows of one block (layer l), in order: what BlockParams binds.
std::vector<ParamSpec> block_param_table(const GPTConfig& cfg, int64_t layer);
// Multi-token prediction depth k (1 … mtp_num_layers): the "mtp.{k−1}." rows (enorm, hnorm, eh_proj), the
// block of layer num_layers + k − 1, then its final norm; all on the last stage.
std::vector<ParamSpec> mtp_param_table(const GPTConfig& cfg, int64_t k);
std::string mtp_prefix(int64_t k);  // "mtp.{k−1}."
// The rows outside the blocks (embeddings, final norm, head), in table order:
// param_table = the first-stage ones, every block, the last-stage ones. Counting
// uses these and layer 0's rows, never the whole table (num_layers may be huge).
std::vector<ParamSpec> outer_param_table(const GPTConfig& cfg);

}  // namespace mpitron
