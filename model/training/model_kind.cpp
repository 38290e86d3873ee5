#include "model/training/model_kind.h"

#include <cstdio>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/training/kinds.h"
#include "model/training/sample_source.h"

namespace mpitron {

std::unique_ptr<ModelKind> make_model_kind(const TrainArgs& args, Device device, const ModelParallel& mp) {
  const GPTConfig& c = args.model;
  if (c.bert && c.num_classes > 0) return make_classifier_kind(args, device, mp);
  if (c.bert) return make_bert_kind(args, device, mp);
  if (c.t5) return make_t5_kind(args, device, mp);
  return make_decoder_kind(args, device, mp);
}

void add_losses(LogFields& out, const std::vector<NamedLoss>& losses) {
  for (size_t i = 0; i < losses.size(); ++i) {
    const NamedLoss& l = losses[i];
    char num[32];
    std::snprintf(num, sizeof num, "%.6E", l.value);
    out.text += str(i ? " | " : "", l.name, ": ", num);
    out.scalars.push_back({"lm-loss-training", l.name, l.value});
    std::string key = l.name;  // "lm loss" -> "lm_loss"
    for (char& ch : key)
      if (ch == ' ') ch = '_';
    out.metrics[key] = l.value;
  }
}

void throw_wrong_batch() {
  MPT_THROW("a micro-batch reached a model kind that did not build it", "this is a bug in the trainer");
}

std::string kind_heading(const std::string& tool, const std::string& layers, const GPTConfig& c,
                         const std::string& seq) {
  return str("mpitron ", tool, ": ", layers, ", hidden ", c.hidden_size, ", heads ", c.num_attention_heads, seq);
}

int64_t sample_count(const SampleSource& data, int split) {
  const int64_t n = data.num_samples(split);
  MPT_CHECK(n > 0, str("the ", split == 0 ? "train" : split == 1 ? "valid" : "test", " split has no samples"),
            "check --split and --data-path");
  return n;
}

}  // namespace mpitron
