// model/inference/inference_load.h — a GPT from a training checkpoint, for inference only.
//
// Reads the newest intact checkpoint of a --save directory (io/checkpoint.h),
// builds the GPTConfig from its `model_config` attribute
// (model/checkpoint/checkpoint_config.h) and fills the parameters from the f32
// `model/<param>` datasets. Optimizer moments are not read. Dropout is 0 (inference).
#pragma once
#include <memory>
#include <string>

#include "model/checkpoint/checkpoint_config.h"  // checkpoint_exists, read_checkpoint_config
#include "model/gpt.h"

namespace mpitron {

struct InferenceModel {
  std::unique_ptr<GPT> model;
  int64_t iteration = -1;  // of the checkpoint that was loaded
  std::string dir;         // its iter_N directory
};

// Throws when load_dir holds no checkpoint. dtype: the compute dtype of the
// returned model (f32 default; bf16/f16 round the f32 master weights).
InferenceModel load_model_for_inference(const std::string& load_dir, Device device = Device::cpu(),
                                        DType dtype = DType::F32);

// Writes model as an mpitron checkpoint (iteration 0, zero Adam moments) into
// save_dir, loadable by load_model_for_inference and pretrain_gpt --load
// --finetune. Returns the iter_N directory.
std::string save_model_checkpoint(const std::string& save_dir, const GPT& model, const std::string& note);

}  // namespace mpitron
