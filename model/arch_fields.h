// model/arch_fields.h — the architecture fields of a TransformerConfig, declared ONCE.
//
// One row per field: its checkpoint key (`model_config`), its kind, its flags (Megatron's
// names), its bounds and what it means. Everything that handles architecture fields reads
// this table and nothing else:
//   - flag parsing: model/flags/model_flags.h registers every row's flags with Boost and
//     hands the given ones back as GivenFlags; apply_model_flags sets the fields;
//   - the checkpoint's model_config JSON, both ways (config_to_json / config_from_json);
//   - --use-checkpoint-args and the inference tools (reconcile_with_checkpoint);
//   - the comparison of a run with a checkpoint and its error (field_differences);
//   - the refusals of a family (model/families.h: the values a family pins).
// model/ does not see Boost: flags arrive as GivenFlags (flag name → its JSON value).
//
// A new field is one row here and one member of TransformerConfig.
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace mpitron {

// What a field is to a checkpoint.
enum class FieldKind : uint8_t {
  Shape,   // sizes the weights have: only the checkpoint's value loads
  Choice,  // what the weights compute (sublayer kinds, rope, biases): the checkpoint's
  Run,     // the run's own (--seq-length): a given flag wins over the checkpoint's
};

// How a flag is written on the command line.
enum class FlagType : uint8_t { Switch, Int, Float, Text };

// Which tools have a row's flags.
enum class FlagScope : uint8_t {
  Model,  // every tool that builds or loads a model (pretrain_gpt/bert, generate_text, evaluate, the server, finetune)
  Bert,   // pretrain_bert and finetune (BERT's own choices)
  T5,     // pretrain_t5 (T5's stacks and relative positions)
  None,   // no flag: set by the tool or the importer (vocabulary, BERT's shape of heads)
};

struct ArchFlag {
  std::string name;  // without "--"
  FlagType type;
  std::string help;
};

// The flags the command line gave (defaults not included; a switch only when on), by
// name without "--": a switch is true, numbers are numbers, text is a string.
using GivenFlags = std::map<std::string, nlohmann::json>;

struct ArchField {
  std::string key;               // model_config key; docs/checkpoint-format.md
  FieldKind kind;
  FlagScope scope;
  std::vector<ArchFlag> flags;   // the first one is named in messages
  std::string meaning;           // one line (docs/model-families.md's field table)
  std::string inference;         // what generate_text / evaluate / the server do with it
  // The value as JSON (effective: ffn_hidden_size 0 reads 4·C).
  std::function<nlohmann::json(const TransformerConfig&)> get;
  // Sets the field from a JSON value, checking its type and bounds; `what` names where the
  // value came from in the error ("--hidden-size", "model_config key hidden_size").
  std::function<void(TransformerConfig&, const nlohmann::json&, const std::string& what)> set;
  // Back to TransformerConfig{}'s value (kv_channels 0: C / NH).
  std::function<void(TransformerConfig&)> reset;
  // Applies the given flags of the row (called when at least one of them is given);
  // throws naming the flags. Rows in table order, so later rows see earlier ones.
  std::function<void(const GivenFlags&, TransformerConfig&)> apply;
  // The value as the flags that give it ("--swiglu", "--hidden-size 64", "no --disable-bias-linear").
  std::function<std::string(const nlohmann::json&)> text;
  // The value of a checkpoint written before the key existed (may read older keys).
  // Null: the default (reset); `required` rows must be present.
  std::function<nlohmann::json(const nlohmann::json& model_config)> legacy;
  bool required = false;
  std::string hint;  // what to do when a run and a checkpoint disagree on it ("" : the general advice)
  // Shape fields that size weights only in some configurations (max_position_embeddings:
  // learned positions only) say so here; elsewhere they behave as Run. Null: always `kind`.
  std::function<bool(const TransformerConfig&)> sizes_weights;
  FieldKind kind_for(const TransformerConfig& c) const {
    return kind == FieldKind::Shape && sizes_weights && !sizes_weights(c) ? FieldKind::Run : kind;
  }
  bool flag_given(const GivenFlags& g) const;
};

// transformers' rope_scaling object (config.json, the checkpoint's "rope_scaling") as RopeScaling; null:
// none. Throws naming `what` and the key for a rope_type that is not built or a key it would ignore.
RopeScaling rope_scaling_from_json(const nlohmann::json& v, const std::string& what);

// Every row, in the order they are applied and listed.
const std::vector<ArchField>& arch_fields();
const ArchField& arch_field(const std::string& key);  // throws for an unknown key

// The model_config JSON of a checkpoint: every row's key, and "family" (informative).
nlohmann::json config_to_json(const TransformerConfig& c);
// Reads a model_config; absent keys take their legacy value (a checkpoint from before the
// key), and every value is checked against its row. Dropouts are 0 and compute_dtype f32
// (run settings, not the model's). Throws naming `where` and the key.
TransformerConfig config_from_json(const nlohmann::json& j, const std::string& where);

// Sets the fields of every row one of whose flags is given (rows of `scopes` only).
void apply_model_flags(const GivenFlags& given, TransformerConfig& c,
                       const std::set<FlagScope>& scopes = {FlagScope::Model});

// The fields of `kinds` whose values differ between a run and a checkpoint, as
// "--flag value (checkpoint: --flag value)" items joined by ", " ("" when none).
std::string field_differences(const TransformerConfig& run, const TransformerConfig& saved,
                              const std::set<FieldKind>& kinds = {FieldKind::Shape, FieldKind::Choice},
                              const std::set<std::string>& skip = {});

// The flags given to a tool against a checkpoint's configuration, row by row:
//   - a row none of whose flags is given takes the checkpoint's value when `fill`
//     (--use-checkpoint-args; the inference tools load the checkpoint's configuration anyway);
//   - a given Shape or Choice row must agree with the checkpoint;
//   - a given Run row wins when `fill` (fine-tuning at a shorter --seq-length, as Megatron),
//     and must agree otherwise (the inference tools name what the model was trained with).
// Rows in `skip` are left alone (evaluate's --seq-length is its window). Throws naming
// every flag that disagrees, with both values; `where` names the checkpoint.
void reconcile_with_checkpoint(const GivenFlags& given, const TransformerConfig& saved, TransformerConfig& m,
                               bool fill, const std::string& where, const std::set<std::string>& skip = {});

}  // namespace mpitron
