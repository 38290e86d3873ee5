// model/families.h — the model families as rows: the one place that tells a GPT-2 from a
// Llama or a BERT.
//
// A family is the values it pins among the architecture fields (model/arch_fields.h),
// its Hugging Face class and model_type, and its column of Hugging Face tensor names in
// the parameter table (model/param_table.h, ParamSpec::hf). Fields a family does not pin
// are free (a Llama may have grouped queries, a tied head, biases). family_of() is the
// first row whose pins a configuration meets; the refusals (pretrain_bert's GPT-family
// flags, what an HF export lacks) are the pins a configuration misses.
//
//   family   HF class                  model_type  pins (besides the defaults of every other field)
//   gpt2     GPT2LMHeadModel           gpt2        LayerNorm, tanh GELU, learned positions, tied, biases, MHA
//   llama    LlamaForCausalLM          llama       RMSNorm, SwiGLU, rope (all dims)
//   qwen2    Qwen2ForCausalLM          qwen2       Llama's, biases on q, k, v only (--add-qkv-bias)
//   mistral  MistralForCausalLM        mistral     Llama's, no biases, a sliding window (--window-size)
//   gemma    GemmaForCausalLM          gemma       RMSNorm (1 + w), GeGLU (tanh), rope, embeddings × √C, no biases
//   mixtral  MixtralForCausalLM        mixtral     Llama's, no biases, every MLP E SwiGLU experts (top-k, softmax of
//                                                  the k), a sliding window or none
//   qwen2_moe Qwen2MoeForCausalLM      qwen2_moe   Qwen2's, MoE MLPs with a gated shared expert
// The dense families pin --num-experts to none.
//   bert     BertForPreTraining        bert        encoder: LayerNorm, GELU, learned positions, tied, biases, MHA
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/param_table.h"

namespace mpitron {

// One parameter role's Hugging Face tensors in a family (the parameter table's HF column,
// model/param_table.h): the names, one per TP part of the row (q|k|v, gate|up) or one for the
// whole, after the family's prefix; "{l}" is the row's layer, "{e}" its expert, and any other
// "{x}" is the family's hf_var (T5's stack prefixes).
struct HfName {
  std::vector<std::string> names;
  HfTransform transform = HfTransform::Copy;
  std::vector<std::string> tied;  // tensors tied to this one (ParamSpec::hf_tied)
  std::vector<double> factor;     // ours = HF × factor, per name (ParamSpec::hf_factor); empty: 1
  std::vector<int64_t> rows;      // our row i is HF row rows[i] (ParamSpec::hf_rows); empty: the same order
  // Settings that depend on the configuration (a tied head, T5's factors): adjusts the resolved
  // entry for the configuration and row. Null: none.
  std::function<void(const TransformerConfig&, const ParamSpec&, HfName&)> adjust;
};
using HfNames = std::map<ParamRole, HfName>;

// One key of a family's Hugging Face config.json: what it sets (through the architecture
// table's row, so its type and bounds are that row's), what it must be, or why it does not
// change the model. A key of no row is refused by name: nothing that changes the maths is
// silently ignored (docs/model-families.md "Hugging Face").
struct HfKey {
  std::string key;
  bool required = false;  // the import refuses a config.json without it
  // Reads a present, non-null value into c; throws naming the key. Null: the key is harmless.
  std::function<void(const nlohmann::json& value, const nlohmann::json& config, TransformerConfig& c)> read;
  // What the export writes (null: nothing).
  std::function<nlohmann::json(const TransformerConfig& c)> write;
  std::string note;       // harmless keys: why
  // A key the config.json lacks (not one that is null): transformers' default when it differs from
  // what null means (Mistral's sliding_window: absent 4096, null none). Null: nothing to do.
  std::function<void(TransformerConfig& c)> absent;
};

// The Hugging Face names of an MoE layer's MLP (model/param_table.h's MoE rows), after
// "model.layers.{l}.": <block><router>.weight; <block>experts.{e}.<gate|up|down>.weight;
// <block><shared><gate|up|down>.weight and <block><shared_gate>.weight.
struct HfMoeNames {
  std::string block, router, gate, up, down, shared, shared_gate;
};
// The roles of an MoE MLP named from them.
void add_moe_names(HfNames& names, const HfMoeNames& moe);

// One value a family requires of a field.
struct FamilyPin {
  std::string key;                                  // the arch field (model/arch_fields.h)
  std::function<bool(const TransformerConfig&)> ok;
  std::string need;                                 // the flags that give it ("--swiglu")
};

struct Family {
  std::string name;                 // "gpt2", "llama", "bert": TransformerConfig::family(), model_config "family"
  std::string hf_class;             // the HF class written on export (config.json "architectures")
  std::vector<std::string> hf_model_types;  // config.json "model_type" values it reads (the first is written)
  std::vector<std::string> hf_classes_read;  // classes that mean this family when model_type is absent
  // Its tensors' names by parameter role. A family built on another starts from its names and
  // changes what differs (Phi-3: Llama's with fused qkv_proj and gate_up_proj).
  HfNames hf_names;
  // An MoE layer's expert-bias buffer (--moe-router-enable-expert-bias: DeepSeek-V3's e_score_correction_bias),
  // "{l}" its layer; empty: the family has none.
  std::string hf_expert_bias;
  // HF tensors the import skips (true), with a warning: what mpitron does not read yet (DeepSeek's MTP layers).
  std::function<bool(const TransformerConfig&, const std::string& name)> hf_skip;
  // The values of "{x}" placeholders other than {l} and {e} in the names of layer `layer` (null: none).
  std::function<std::string(const TransformerConfig&, int64_t layer, const std::string& var)> hf_var;
  std::vector<FamilyPin> pins;      // what the family is
  std::vector<FamilyPin> hf_pins;   // what its HF class also needs (BERT: post-LN with the binary head)
  // Its config.json: the values before any key is read (the fields the family fixes and
  // transformers' defaults of absent keys), and every key it may hold.
  std::function<void(TransformerConfig&)> hf_defaults;
  std::vector<HfKey> hf_keys;
  // Its tensors: name prefixes the import accepts (the first is the export's default),
  // tensors that are buffers, not parameters (skipped), and older spellings of names.
  std::vector<std::string> hf_prefixes{""};
  std::vector<std::string> hf_buffers;
  std::vector<std::pair<std::string, std::string>> hf_aliases;  // (suffix, older suffix)
  bool hf_lm_head_copy = false;     // the export may also write the tied head's copy (GPT-2's --lm-head)
  bool hf_write_tied = false;       // the export always writes every tied copy (DeepSeek-V3's MTP modules'
                                    //   embed_tokens and shared_head.head, which its own inference code reads)
  // Its weights alone (one .safetensors file, no config.json) give its sizes; the heads come from
  // --num-attention-heads (GPT-2's hub files). Other families are read from their directory.
  bool hf_single_file = false;
};

// Every family, in the order family_of() tries them.
const std::vector<Family>& families();
const Family& find_family(const std::string& name);  // throws naming the families
// The first family whose pins `c` meets; nullptr: a mix no family has ("custom").
const Family* family_of(const TransformerConfig& c);
// THE family of a configuration: its family_name (an HF import's, a checkpoint's) when c meets that
// family's pins, else family_of(c); nullptr: "custom" (a mix no family has: it trains, an export names
// what it lacks).
const Family* config_family(const TransformerConfig& c);
// The pins of f (and its HF class's with `hf`) that c misses, as the flags that would give
// them, space-separated ("--swiglu --position-embedding-type rope"); "" when none.
std::string family_misses(const Family& f, const TransformerConfig& c, bool hf = false);
// The family that misses the fewest of its pins (what an export error names).
const Family& closest_family(const TransformerConfig& c);
// The family of an HF config.json: its model_type, else its architectures' first class.
// Throws naming them when no family has them.
const Family& hf_family(const nlohmann::json& config);
// Fills the HF column of `rows` (model/param_table.h) from f's names; rows of roles f has no name
// for keep an empty column.
void hf_name_rows(const Family& f, const TransformerConfig& c, std::vector<ParamSpec>& rows);
// The shortest decimal that reads back as f (1e-05, not 9.999999747378752e-06): how the
// export writes a float epsilon.
double hf_short_float(float f);

}  // namespace mpitron
