#include "model/inference/inference_load.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/checkpoint/checkpointing.h"

namespace mpitron {

InferenceModel load_model_for_inference(const std::string& load_dir, Device device, DType dtype) {
  io::CheckpointReader r = open_latest_checkpoint(load_dir);
  GPTConfig cfg = checkpoint_config(r);
  cfg.compute_dtype = dtype;
  InferenceModel out;
  out.model = std::make_unique<GPT>(cfg, device);
  out.iteration = r.iteration();
  out.dir = r.dir();
  const ParamSet& ps = out.model->params();
  for (const ParamInfo& p : ps.infos()) {
    const std::string name = "model/" + p.name;
    MPT_CHECK(r.has_tensor(name), str("checkpoint ", r.path(), " has no tensor ", name), "");
    const io::TensorInfo ti = r.tensor_info(name);
    MPT_CHECK(ti.shape == p.shape,
              str("checkpoint tensor ", name, " is ", shape_str(ti.shape), ", its model_config implies ", shape_str(p.shape)),
              "the checkpoint is inconsistent with its own model_config");
    const Tensor w = r.read(name).to(DType::F32);
    const float* v = w.data<float>();
    MPT_CHECK(std::all_of(v, v + w.numel(), [](float x) { return std::isfinite(x); }),
              str("checkpoint tensor ", name, " in ", r.path(), " holds non-finite values (NaN or Inf)"),
              "the checkpoint was saved from a diverged run; pass --load a directory with an earlier checkpoint");
    ps.values().flat_range(p.offset, p.numel()).view(p.shape).copy_from(w.to(dtype).to(device));
  }
  // Aux-loss-free balancing's expert biases: part of the routing (a checkpoint without them: zeros).
  if (out.model->has_expert_bias())
    for (const auto& [layer, name] : expert_bias_datasets(cfg))
      if (r.has_tensor(name))
        out.model->block_params(layer).expert_bias.copy_from(r.read(name).to(DType::F32).view({cfg.num_experts}).to(device));
  return out;
}

std::string save_model_checkpoint(const std::string& save_dir, const GPT& model, const std::string& note) {
  // A fresh optimizer's state: the values as f32 master weights, zero moments, no steps.
  const Tensor& values = model.params().values();
  const int64_t n = values.numel();
  OptimState opt;
  opt.master = values.dtype() == DType::F32 ? values : values.to(DType::F32);
  opt.exp_avg = Tensor::zeros({n}, DType::F32, values.device());
  opt.exp_avg_sq = Tensor::zeros({n}, DType::F32, values.device());
  const nlohmann::json flags = {{"converted_from", note}};
  return save_checkpoint(save_dir, model, opt, LossScaler(), TrainState(), flags.dump(), "{}").dir;
}

}  // namespace mpitron
