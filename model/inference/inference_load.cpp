#include "model/inference/inference_load.h"

#include "model/arch_fields.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "model/training/checkpointing.h"
#include "model/training/optimizer.h"

namespace mpitron {

namespace {

io::CheckpointReader open_or_throw(const std::string& load_dir) {
  io::CheckpointReader r = io::CheckpointReader::open_latest(load_dir);
  MPT_CHECK(r.found(), str("no checkpoint in ", load_dir),
            "pass the directory given to pretrain_gpt --save (it holds latest_checkpointed_iteration.txt)");
  return r;
}

GPTConfig config_from(const io::CheckpointReader& r) {
  MPT_CHECK(r.has_attr("model_config"), str("checkpoint ", r.path(), " has no model_config attribute"),
            "was it written by mpitron's save_checkpoint?");
  return config_from_json(r.attr_json("model_config"), str("checkpoint ", r.path()));
}

}  // namespace

bool checkpoint_exists(const std::string& load_dir) {
  return std::filesystem::exists(std::filesystem::path(load_dir) / io::kTrackerFileName);
}

GPTConfig read_checkpoint_config(const std::string& load_dir) { return config_from(open_or_throw(load_dir)); }

InferenceModel load_model_for_inference(const std::string& load_dir, Device device, DType dtype) {
  io::CheckpointReader r = open_or_throw(load_dir);
  GPTConfig cfg = config_from(r);
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
  return out;
}

std::string save_model_checkpoint(const std::string& save_dir, const GPT& model, const std::string& note) {
  // The optimizer only reads the values here (f32: master weights alias them).
  AdamWOptimizer opt(const_cast<ParamSet&>(model.params()), OptimizerConfig{});
  LossScaler scaler;
  TrainState st;
  const nlohmann::json flags = {{"converted_from", note}};
  return save_checkpoint(save_dir, model, opt, scaler, st, flags.dump(), "{}").dir;
}

}  // namespace mpitron
