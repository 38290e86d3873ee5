#include "model/checkpointing.h"

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/timer.h"
#include "io/checkpoint.h"

namespace mpitron {

namespace {
nlohmann::json config_json(const GPTConfig& c) {
  return {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"ffn_hidden_size", c.ffn()},
          {"seq_length", c.seq_length},
          {"max_position_embeddings", c.max_position_embeddings},
          {"vocab_size", c.vocab_size},
          {"padded_vocab_size", c.padded_vocab_size},
          {"layernorm_epsilon", c.layernorm_epsilon}};
}
}  // namespace

SaveInfo save_checkpoint(const std::string& save_dir, const GPT& model, const AdamWOptimizer& opt,
                         const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                         const std::string& lr_schedule_json, int keep_last) {
  return save_checkpoint(save_dir, model, OptimState{opt.master(), opt.exp_avg(), opt.exp_avg_sq(), opt.steps_taken()},
                         scaler, st, flags_json, lr_schedule_json, keep_last, MPI_COMM_NULL);
}

SaveInfo save_checkpoint(const std::string& save_dir, const GPT& model, const OptimState& opt,
                         const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                         const std::string& lr_schedule_json, int keep_last, MPI_Comm comm) {
  Timer timer;
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  io::CheckpointWriter w;
  w.begin(save_dir, st.iteration, comm);
  const ParamSet& ps = model.params();
  double bytes = 0;
  for (const ParamInfo& p : ps.infos()) {
    const auto slice = [&](const Tensor& flat) {
      return rank == 0 ? flat.flat_range(p.offset, p.numel()).view(p.shape) : Tensor();
    };
    w.add_tensor("model/" + p.name, p.shape, DType::F32, slice(opt.master));
    w.add_tensor("optim/exp_avg/" + p.name, p.shape, DType::F32, slice(opt.exp_avg));
    w.add_tensor("optim/exp_avg_sq/" + p.name, p.shape, DType::F32, slice(opt.exp_avg_sq));
    bytes += 3.0 * 4.0 * static_cast<double>(p.numel());
  }
  w.set_attr_int("consumed_train_samples", st.consumed_train_samples);
  w.set_attr_int("consumed_valid_samples", st.consumed_valid_samples);
  w.set_attr_int("optimizer_steps", opt.steps);
  w.set_attr_int("skipped_iterations", st.skipped_iterations);
  w.set_attr_string("flags", flags_json);
  w.set_attr_string("tokenizer", "GPT2BPETokenizer");
  w.set_attr_int("vocab_size", model.config().vocab_size);
  w.set_attr_int("padded_vocab_size", model.config().padded_vocab_size);
  w.set_attr_json("model_config", config_json(model.config()));
  w.set_attr_string("lr_schedule", lr_schedule_json);
  const LossScaler::State s = scaler.state();
  w.set_attr_json("loss_scaler", {{"enabled", scaler.enabled()},
                                  {"scale", s.scale},
                                  {"growth_tracker", s.growth_tracker},
                                  {"hysteresis_tracker", s.hysteresis_tracker}});
  w.set_attr_json("rng", {{"seed", st.seed}, {"kind", "philox4x32-10, streams keyed by (seed, iteration)"}});
  SaveInfo info;
  info.dir = w.commit(keep_last);
  info.seconds = timer.seconds();
  info.bytes = bytes;
  return info;
}

bool load_checkpoint(const std::string& load_dir, GPT& model, AdamWOptimizer& opt, LossScaler& scaler,
                     TrainState& st, const LoadOptions& o, SaveInfo* info) {
  OptimState full;
  if (!load_checkpoint(load_dir, model, full, scaler, st, o, info, MPI_COMM_NULL)) return false;
  opt.master().copy_from(full.master.to(opt.master().device()));
  if (full.exp_avg.defined()) {
    opt.exp_avg().copy_from(full.exp_avg.to(opt.exp_avg().device()));
    opt.exp_avg_sq().copy_from(full.exp_avg_sq.to(opt.exp_avg_sq().device()));
  }
  if (o.load_optim && !o.finetune) opt.set_steps_taken(full.steps);
  opt.sync_values_from_master();
  return true;
}

bool load_checkpoint(const std::string& load_dir, GPT& model, OptimState& opt, LossScaler& scaler, TrainState& st,
                     const LoadOptions& o, SaveInfo* info, MPI_Comm comm) {
  Timer timer;
  io::CheckpointReader r = io::CheckpointReader::open_latest(load_dir, comm);
  if (!r.found()) return false;
  const GPTConfig& c = model.config();
  const nlohmann::json saved = r.attr_json("model_config");
  const nlohmann::json want = config_json(c);
  for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "padded_vocab_size"}) {
    MPT_CHECK(saved.at(k) == want.at(k),
              str("checkpoint ", r.path(), " has ", k, " = ", saved.at(k).dump(), " but this run has ", want.at(k).dump()),
              "use the model flags the checkpoint was trained with");
  }
  const ParamSet& ps = model.params();
  double bytes = 0;
  const bool with_optim = o.load_optim && !o.finetune;
  opt.master = Tensor::empty({ps.numel()}, DType::F32);
  opt.exp_avg = with_optim ? Tensor::empty({ps.numel()}, DType::F32) : Tensor();
  opt.exp_avg_sq = with_optim ? Tensor::empty({ps.numel()}, DType::F32) : Tensor();
  for (const ParamInfo& p : ps.infos()) {
    const auto slice = [&](const Tensor& flat) { return flat.flat_range(p.offset, p.numel()).view(p.shape); };
    const std::string name = "model/" + p.name;
    MPT_CHECK(r.has_tensor(name), str("checkpoint ", r.path(), " has no tensor ", name), "was it saved by another model?");
    const io::TensorInfo ti = r.tensor_info(name);
    MPT_CHECK(ti.shape == p.shape, str("checkpoint tensor ", name, " is ", shape_str(ti.shape), ", model expects ",
                                       shape_str(p.shape)), "use the model flags the checkpoint was trained with");
    slice(opt.master).copy_from(r.read(name).to(DType::F32));
    bytes += 4.0 * static_cast<double>(p.numel());
    if (with_optim) {
      slice(opt.exp_avg).copy_from(r.read("optim/exp_avg/" + p.name));
      slice(opt.exp_avg_sq).copy_from(r.read("optim/exp_avg_sq/" + p.name));
      bytes += 8.0 * static_cast<double>(p.numel());
    }
  }
  // The compute-dtype values are the master weights rounded (bitwise the same
  // as the run that saved them, which rounded the same f32 values).
  model.params().values().copy_from(opt.master.to(model.params().values().dtype()).to(model.device()));
  if (!o.finetune) {
    st.iteration = r.iteration();
    st.consumed_train_samples = r.attr_int("consumed_train_samples");
    st.consumed_valid_samples = r.attr_int("consumed_valid_samples");
    st.skipped_iterations = r.attr_int("skipped_iterations");
    if (o.load_optim) {
      opt.steps = r.attr_int("optimizer_steps");
      const nlohmann::json ls = r.attr_json("loss_scaler");
      if (scaler.enabled() && ls.value("enabled", false))
        scaler.set_state({ls.at("scale").get<float>(), ls.at("growth_tracker").get<int64_t>(),
                          ls.at("hysteresis_tracker").get<int64_t>()});
    }
    if (o.load_rng) st.seed = r.attr_json("rng").at("seed").get<uint64_t>();
  }
  if (info) {
    info->dir = r.dir();
    info->seconds = timer.seconds();
    info->bytes = bytes;
  }
  return true;
}

}  // namespace mpitron
