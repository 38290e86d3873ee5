// model/training/kinds.h — the model kinds (model/training/model_kind.h) make_model_kind
// chooses from, one per file, and what they share. Private to model/training.
#pragma once
#include <memory>
#include <string>

#include "model/training/model_kind.h"

namespace mpitron {

struct TrainArgs;

std::unique_ptr<ModelKind> make_decoder_kind(const TrainArgs& args, Device device, const ModelParallel& mp);
std::unique_ptr<ModelKind> make_bert_kind(const TrainArgs& args, Device device, const ModelParallel& mp);
std::unique_ptr<ModelKind> make_t5_kind(const TrainArgs& args, Device device, const ModelParallel& mp);
std::unique_ptr<ModelKind> make_classifier_kind(const TrainArgs& args, Device device, const ModelParallel& mp);

// "mpitron <tool>: <layers>, hidden H, heads A<seq>": ModelKind::describe's shape.
std::string kind_heading(const std::string& tool, const std::string& layers, const GPTConfig& c,
                         const std::string& seq);

// The number of samples of `split`; an empty split is refused, naming it.
int64_t sample_count(const SampleSource& data, int split);

}  // namespace mpitron
