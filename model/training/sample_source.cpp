#include "model/training/sample_source.h"

#include "core/error.h"

namespace mpitron {

void SampleSource::sample(int, int64_t, int32_t*) const {
  MPT_THROW("a GPT-like model trains on token runs, but this data source gives samples of another form "
            "(BERT, T5 or classification)",
            "this is a bug in the caller of Trainer: pretrain_gpt builds token-run data (model/training/gpt_data.h)");
}

}  // namespace mpitron
