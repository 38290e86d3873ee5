// model/inference/hf_convert.h — Hugging Face safetensors <-> mpitron, ONE converter for
// every family (apps/convert_checkpoint is its command line). It reads two tables and
// nothing else:
//   - the family's config.json keys (model/families.h, Family::hf_keys): each key sets an
//     architecture field through its row (so its type and bounds are checked there), must
//     have a value mpitron computes, or is harmless; any other key is refused by name;
//   - the parameter table's HF column (model/param_table.h, ParamSpec::hf): for every row,
//     the HF tensors whose rows make it (one, or one per part: q|k|v, gate|up), the
//     transform (GPT-2's Conv1D is transposed), vocabulary padding (ParamSpec::vocab: HF
//     holds the first vocab_size rows) and the tied tensors (lm_head, BERT's decoder) that
//     must equal it.
// The family names, tensor names and keys are in docs/model-families.md "Hugging Face".
//
// Tensors: a directory with model.safetensors — or, without it, model.safetensors.index.json
// and its shards (transformers' own order of preference: a directory holding both loads the
// single file) — or one .safetensors file (GPT-2 without a config.json: the sizes come from
// the shapes). F32, F16 and BF16 are widened exactly to f32; the export writes F32, F16 or
// BF16 and the same dtype round-trips bit for bit.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "model/bert.h"
#include "model/t5.h"
#include "model/gpt.h"

namespace mpitron {

// An HF checkpoint read into memory: config.json and every tensor.
struct HfCheckpoint {
  std::string dir;                             // the directory (or the single file)
  std::string config_json;                     // the text of config.json ("" for a bare GPT-2 file)
  io::Safetensors tensors;                     // every shard's tensors
  std::map<std::string, std::string> file_of;  // tensor name → the file that holds it
};
// Reads dir/config.json and dir/model.safetensors, or dir/model.safetensors.index.json and
// its shards. Throws naming the file that is missing or broken.
HfCheckpoint read_hf_checkpoint(const std::string& dir);
// One safetensors file as a checkpoint (GPT-2's single file; config_json may be "").
HfCheckpoint hf_checkpoint_of_file(const std::string& path, std::string config_json = "");

// The family (model/families.h) of an HF config.json: "gpt2", "llama", "bert", …, from
// model_type or, without it, architectures. Throws naming what is not known.
std::string hf_model_type(const std::string& config_json);
// The configuration of an HF config.json (any family). The vocabulary is padded to a
// multiple of divisible_by (Megatron's rule); dropouts are 0. Throws naming the key.
TransformerConfig hf_config(const std::string& config_json, int64_t divisible_by = 128);
// The configuration of a checkpoint read as one file (the family with Family::hf_single_file,
// GPT-2): with a config.json as hf_config, refused naming the class when its family is read
// from a directory; without one, the sizes come from the tensor shapes and the heads from
// num_attention_heads (required then). num_attention_heads, when > 0, must equal the config's.
TransformerConfig hf_file_config(const io::Safetensors& st, const std::string& config_json,
                                 int64_t num_attention_heads, int64_t divisible_by = 128);

// Fills a one-rank model's parameters from the checkpoint. Throws naming the file and tensor
// when one is missing, both shapes when one does not fit, a tied tensor that differs, and
// any tensor that is not part of the model.
void load_hf_weights(const HfCheckpoint& ck, GPT& model);
// A CPU f32 model holding the HF weights (BERT: Bert, whose core() is the GPT).
std::unique_ptr<GPT> gpt_from_hf(const HfCheckpoint& ck, const TransformerConfig& cfg);
std::unique_ptr<GPT> gpt_from_hf(const io::Safetensors& st, const TransformerConfig& cfg);  // tensors in memory
std::unique_ptr<Bert> bert_from_hf(const HfCheckpoint& ck, const TransformerConfig& cfg);
std::unique_ptr<T5> t5_from_hf(const HfCheckpoint& ck, const TransformerConfig& cfg);

// True when the configuration is a family whose HF class can hold it; why: what it lacks,
// as flags ("a LlamaForCausalLM needs --swiglu").
bool hf_exportable(const TransformerConfig& c, std::string* why = nullptr);
struct HfExportOptions {
  std::string dtype = "F32";          // F32, F16 or BF16
  std::optional<std::string> prefix;  // GPT-2: "transformer." (the default) or "" (GPT2Model names)
  bool lm_head = false;               // GPT-2: also write lm_head.weight (a copy of wte)
  bool gradients = false;             // `flat` holds gradients: a row's hf_factor applies the other way
                                      //   (T5's query and tied final norm: HF grad = ours × factor)
};
// The HF tensors of a model (vocabulary padding dropped). flat: the ParamSet-shaped values
// to export (default the model's; the tests pass its gradients).
io::Safetensors hf_from_gpt(const GPT& model, const HfExportOptions& o = {}, const Tensor* flat = nullptr);
// HF's config.json for it (architectures, model_type, the family's keys, torch_dtype).
std::string hf_config_json(const TransformerConfig& c, const std::string& dtype = "F32");
// torch_dtype of an export dtype: F32 → float32, F16 → float16, BF16 → bfloat16; throws otherwise.
const char* hf_torch_dtype(const std::string& dtype);

}  // namespace mpitron
