#include "model/checkpoint/checkpointing.h"
#include "parallel/update_rule.h"

#include "model/arch_fields.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/log.h"
#include "core/timer.h"
#include "data/text_tokenizer.h"
#include "io/checkpoint.h"
#include "model/checkpoint/megatron_checkpoint.h"
#include "parallel/job_exit.h"

namespace mpitron {


void check_checkpoint_tokenizer(const std::string& where, const std::string& saved_identity, int64_t saved_vocab,
                                const std::string& identity, int64_t vocab, bool allow) {
  std::string diff, saved_desc;
  if (!saved_identity.empty()) {
    const nlohmann::json saved = nlohmann::json::parse(saved_identity), now = nlohmann::json::parse(identity);
    diff = data::tokenizer_difference(saved, now);
    saved_desc = data::describe_tokenizer_identity(saved);
  } else if (saved_vocab != vocab) {  // a checkpoint from before identities were recorded
    diff = str("vocab_size ", saved_vocab, " -> ", vocab);
    saved_desc = str(saved_vocab, " tokens");
  }
  if (diff.empty()) return;
  const std::string what =
      str(where, " was trained with another tokenizer (", diff, "): the checkpoint's is ", saved_desc, "; this run's is ",
          data::describe_tokenizer_identity(nlohmann::json::parse(identity)));
  MPT_CHECK(allow, what,
            "pass the tokenizer flags the checkpoint was trained with (--tokenizer-type, --tokenizer-model or "
            "--vocab-file/--merge-file), or --allow-tokenizer-change to go on with this one (each embedding row then "
            "stands for another token)");
  log_warn(what, "; going on as --allow-tokenizer-change asks");
}

namespace {
// This rank's part of parameter p in the optimizer slice [begin, end): local
// element range [lo, hi) of p (empty when lo >= hi).
// Layer l's router weight parameter (an MoE layer's).
std::string router_name(const GPTConfig& c, int64_t l) {
  for (const ParamSpec& spec : block_param_table(c, l))
    if (spec.role == ParamRole::RouterWeight) return spec.name;
  MPT_THROW(str("layer ", l, " has no router"), "");
}

std::pair<int64_t, int64_t> overlap(const ParamInfo& p, int64_t begin, int64_t end) {
  return {std::max(begin, p.offset) - p.offset, std::min(end, p.offset + p.numel()) - p.offset};
}
std::vector<io::Hdf5File::Hyperslab> slabs(const ParamInfo& p, int64_t lo, int64_t hi) {
  std::vector<io::Hdf5File::Hyperslab> v;
  if (hi <= lo) return v;
  for (const GlobalPiece& g : global_pieces(p, lo, hi)) v.push_back({g.start, g.count});
  return v;
}
}  // namespace

// (layer, dataset) of every MoE layer's expert bias: buffers/layers.<l>.mlp.router.expert_bias.
std::vector<std::pair<int64_t, std::string>> expert_bias_datasets(const GPTConfig& c) {
  std::vector<std::pair<int64_t, std::string>> v;
  for (int64_t l = 0; l < c.num_layers + c.mtp_num_layers; ++l)  // the MTP layers' routers too
    if (c.is_moe_layer(l)) {
      std::string r = router_name(c, l);
      v.push_back({l, "buffers/" + r.substr(0, r.size() - std::string("weight").size()) + "expert_bias"});
    }
  return v;
}

SaveInfo save_checkpoint(const std::string& save_dir, const GPT& model, const OptimState& opt,
                         const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                         const std::string& lr_schedule_json, int keep_last, MPI_Comm comm, bool writer) {
  Timer timer;
  io::CheckpointWriter w;
  if (!st.run_id.empty()) w.set_run(st.run_id, st.owned_runs);
  w.begin(save_dir, st.iteration, comm);
  const ParamSet& ps = model.params();
  const int64_t begin = opt.begin, end = opt.begin + opt.master.numel();
  // One parameter's slice at a time on the host (a device tensor is copied per
  // slice, a host f32 tensor is written from where it lies): never a second
  // copy of the whole optimizer state.
  auto host_slice = [](const Tensor& t, int64_t at, int64_t n) {
    const Tensor s = t.flat_range(at, n);
    return s.device().is_cpu() && s.dtype() == DType::F32 && s.is_contiguous() ? s : s.to(Device::cpu()).to(DType::F32);
  };
  double bytes = 0;
  // The optimizer's states (parallel/update_rule.h) in OptimState's slots, each its own datasets.
  const std::vector<std::string> state_names = optimizer_state_names(opt.optimizer);
  MPT_CHECK(!state_names.empty(), str("checkpoint save: optimizer '", opt.optimizer, "' is not built"), "");
  const Tensor* slots[2] = {&opt.exp_avg, &opt.exp_avg_sq};
  // Every rank declares every global tensor (collective); each writes its slabs.
  for (const auto& [name, gshape] : GPT::global_layout(model.config())) {
    std::vector<io::Hdf5File::Hyperslab> mine;
    Tensor master, state[2];  // this rank's slice of the parameter and of its optimizer states, host f32
    if (writer && ps.has(name) && ps.info(name).canonical) {
      const ParamInfo& p = ps.info(name);
      const auto [lo, hi] = overlap(p, begin, end);
      mine = slabs(p, lo, hi);
      if (hi > lo) {
        const int64_t first = p.offset + lo - begin;
        master = host_slice(opt.master, first, hi - lo);
        for (size_t k = 0; k < state_names.size(); ++k) state[k] = host_slice(*slots[k], first, hi - lo);
        bytes += 4.0 * static_cast<double>(1 + state_names.size()) * static_cast<double>(hi - lo);
      }
    }
    const bool any = !mine.empty();
    w.add_pieces("model/" + name, gshape, io::ElemType::F32, mine, any ? master.data_ptr() : nullptr);
    for (size_t k = 0; k < state_names.size(); ++k)
      w.add_pieces("optim/" + state_names[k] + "/" + name, gshape, io::ElemType::F32, mine,
                    any ? state[k].data_ptr() : nullptr);
  }
  // Aux-loss-free balancing's expert biases (buffers, not parameters): written by the rank whose
  // optimizer slice holds the first element of the layer's canonical router weight (one writer
  // across the dp, ZeRO, tp and ep replicas).
  if (model.has_expert_bias())
    for (const auto& [layer, name] : expert_bias_datasets(model.config())) {
      const std::string router = router_name(model.config(), layer);
      std::vector<io::Hdf5File::Hyperslab> mine;
      Tensor b;
      if (writer && ps.has(router) && ps.info(router).canonical && ps.info(router).offset >= begin &&
          ps.info(router).offset < end) {
        b = model.block_params(layer).expert_bias.to(Device::cpu());
        mine.push_back({{0}, {model.config().num_experts}});
      }
      w.add_pieces(name, {model.config().num_experts}, io::ElemType::F32, mine, b.defined() ? b.data_ptr() : nullptr);
    }
  if (comm != MPI_COMM_NULL) allreduce_bounded(&bytes, 1, MPI_DOUBLE, MPI_SUM, comm, "checkpoint bytes");
  w.set_attr_int("consumed_train_samples", st.consumed_train_samples);
  w.set_attr_int("consumed_valid_samples", st.consumed_valid_samples);
  w.set_attr_int("optimizer_steps", opt.steps);
  w.set_attr_string("optimizer", opt.optimizer);
  w.set_attr_int("skipped_iterations", st.skipped_iterations);
  w.set_attr_int("skipped_samples", st.skipped_samples);
  w.set_attr_string("flags", flags_json);
  const nlohmann::json tok = st.tokenizer.empty() ? nlohmann::json() : nlohmann::json::parse(st.tokenizer);
  w.set_attr_string("tokenizer", tok.is_object() ? tok.value("type", "") : "");
  if (tok.is_object()) w.set_attr_json("tokenizer_identity", tok);
  w.set_attr_int("vocab_size", model.config().vocab_size);
  w.set_attr_int("padded_vocab_size", model.config().padded_vocab_size);
  w.set_attr_json("model_config", config_to_json(model.config()));
  w.set_attr_string("lr_schedule", lr_schedule_json);
  const ModelParallel& mp = model.parallel();
  w.set_attr_json("parallel_layout", {{"tensor_model_parallel_size", mp.tp.size},
                                      {"pipeline_model_parallel_size", mp.pp_size},
                                      {"virtual_pipeline_stages", mp.virtual_stages},
                                      {"sequence_parallel", mp.tp.sequence_parallel}});
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

bool load_weights(const std::string& load_dir, GPT& model, LoadOptions o, TrainState* st, SaveInfo* info, MPI_Comm comm) {
  o.load_optim = false;
  o.load_rng = false;
  OptimState opt;
  LossScaler scaler;
  TrainState own;
  return load_checkpoint(load_dir, model, opt, 0, 0, scaler, st ? *st : own, o, info, comm);
}

bool load_checkpoint(const std::string& load_dir, GPT& model, OptimState& opt, int64_t begin, int64_t end,
                     LossScaler& scaler, TrainState& st, const LoadOptions& o, SaveInfo* info, MPI_Comm comm) {
  // A Megatron-LM directory (torch or torch_dist) is read by its own loader.
  const MegatronDir megatron = detect_megatron_checkpoint(load_dir, o.ckpt_format);
  if (megatron.format != MegatronFormat::None)
    return load_megatron_checkpoint(megatron, model, opt, begin, end, st, o, info, comm);
  Timer timer;
  const GPTConfig& c = model.config();
  const ParamSet& ps = model.params();
  const bool with_optim = o.load_optim && !o.finetune;
  const int64_t n = end - begin;
  std::vector<float> values(static_cast<size_t>(ps.numel()));
  const std::vector<std::string> state_names = optimizer_state_names(o.optimizer);
  MPT_CHECK(!state_names.empty(), str("checkpoint load: optimizer '", o.optimizer, "' is not built"), "");
  std::vector<std::vector<float>> states(with_optim ? state_names.size() : 0, std::vector<float>(static_cast<size_t>(n)));
  std::map<int64_t, std::vector<float>> biases;
  double bytes = 0;
  // Multi-token prediction layers the checkpoint lacks (it was trained without them, or with fewer):
  // they keep this run's initial values (and zero moments).
  std::vector<float> initial;
  if (c.mtp_num_layers > 0) initial = ps.values().to_floats();
  int64_t mtp_missing = 0, mtp_dropped = 0;
  const auto mtp_param = [&](const std::string& name) {
    if (name.rfind("mtp.", 0) == 0) return true;
    if (name.rfind("layers.", 0) != 0) return false;
    return std::stoll(name.substr(7, name.find('.', 7) - 7)) >= c.num_layers;
  };
  // Runs once per candidate checkpoint (newest first); a damaged one makes
  // read_verified throw CheckpointDamaged on every rank and the next older one is tried.
  io::CheckpointReader r = io::CheckpointReader::load_latest(load_dir, comm, [&](const io::CheckpointReader& ck) {
    const GPTConfig saved_cfg = config_from_json(ck.attr_json("model_config"), ck.path());
    MPT_CHECK(saved_cfg.bert == c.bert && saved_cfg.t5 == c.t5,
              str("checkpoint ", ck.path(), " holds a ", saved_cfg.kind(), " (", saved_cfg.tool(), ") but this run trains a ",
                  c.kind()),
              str("load it with ", saved_cfg.tool()));
    // Every Shape and Choice field of the architecture table (model/arch_fields.h).
    const std::string diff = field_differences(c, saved_cfg);
    MPT_CHECK(diff.empty(), str("checkpoint ", ck.path(), " has another architecture than this run: ", diff),
              saved_cfg.padded_vocab_size != c.padded_vocab_size
                  ? arch_field("padded_vocab_size").hint
                  : "use the model flags the checkpoint was trained with (--use-checkpoint-args takes them from it; "
                    "docs/model-families.md)");
    if (with_optim) {  // the state of another optimizer is not this one's (Adam moments are no momentum)
      const std::string saved = ck.has_attr("optimizer") ? ck.attr_string("optimizer") : "adam";
      MPT_CHECK(saved == o.optimizer,
                str("checkpoint ", ck.path(), " holds the state of --optimizer ", saved, ", but this run trains with --optimizer ",
                    o.optimizer),
                str("give --no-load-optim to load only its weights (the ", o.optimizer,
                    " state starts afresh), or train with --optimizer ", saved));
    }
    if (!o.tokenizer.empty())
      check_checkpoint_tokenizer(ck.path(), ck.has_attr("tokenizer_identity") ? ck.attr_string("tokenizer_identity") : "",
                                 saved_cfg.vocab_size, o.tokenizer, c.vocab_size, o.allow_tokenizer_change);
    std::vector<io::ReadRequest> reqs;
    bytes = 0;
    mtp_missing = 0;
    mtp_dropped = std::max<int64_t>(0, saved_cfg.mtp_num_layers - c.mtp_num_layers);
    for (const ParamInfo& p : ps.infos()) {
      if (c.mtp_num_layers > 0 && mtp_param(p.name) && !ck.has_tensor("model/" + p.name)) {
        std::copy_n(initial.begin() + p.offset, p.numel(), values.begin() + p.offset);
        ++mtp_missing;
        continue;
      }
      reqs.push_back({"model/" + p.name, slabs(p, 0, p.numel()), values.data() + p.offset, io::ElemType::F32,
                      p.global_shape});
      bytes += 4.0 * static_cast<double>(p.numel());
      if (with_optim) {
        const auto [lo, hi] = overlap(p, begin, end);
        if (hi > lo) {
          const int64_t at = p.offset + lo - begin;
          for (size_t k = 0; k < state_names.size(); ++k)
            reqs.push_back({"optim/" + state_names[k] + "/" + p.name, slabs(p, lo, hi), states[k].data() + at,
                            io::ElemType::F32, p.global_shape});
          bytes += 4.0 * static_cast<double>(state_names.size()) * static_cast<double>(hi - lo);
        }
      }
    }
    // The expert biases of this rank's MoE layers (a checkpoint trained without them: zeros).
    biases.clear();
    if (model.has_expert_bias())
      for (const auto& [layer, name] : expert_bias_datasets(c))
        if (model.holds_layer(layer) && ck.has_tensor(name)) {
          biases[layer].assign(static_cast<size_t>(c.num_experts), 0.0f);
          reqs.push_back({name, {{{0}, {c.num_experts}}}, biases[layer].data(), io::ElemType::F32, {c.num_experts}});
        }
    ck.read_verified(reqs, with_optim ? io::VerifyScope::AllDatasets : io::VerifyScope::RequestedDatasets);
  });
  if (!r.found()) return false;
  if (mtp_missing > 0)
    log_warn("checkpoint ", r.path(), " holds no weights for ", mtp_missing, " parameters of this run's ",
             c.mtp_num_layers, " multi-token prediction layer(s) (trained without --mtp-num-layers, or fewer): they "
             "start from this run's initialisation");
  if (mtp_dropped > 0)
    log_warn("checkpoint ", r.path(), " holds ", mtp_dropped, " multi-token prediction layer(s) this run does not have "
             "(--mtp-num-layers ", c.mtp_num_layers, "): their weights are not loaded");
  opt.begin = begin;
  opt.master = Tensor::from_vector(std::vector<float>(values.begin() + begin, values.begin() + end), {n});
  opt.optimizer = o.optimizer;
  opt.exp_avg = with_optim ? Tensor::from_vector(states[0], {n}) : Tensor();
  opt.exp_avg_sq = with_optim && states.size() > 1 ? Tensor::from_vector(states[1], {n}) : Tensor();
  // The compute-dtype values are the master weights rounded (bitwise the same
  // as the run that saved them, which rounded the same f32 values).
  model.params().values().copy_from(
      Tensor::from_vector(values, {ps.numel()}).to(model.params().values().dtype()).to(model.device()));
  if (model.has_expert_bias()) {
    for (const int64_t l : model.expert_bias_layers()) {
      const auto it = biases.find(l);
      const Tensor& b = model.block_params(l).expert_bias;
      if (it != biases.end() && !o.finetune) b.copy_from(Tensor::from_vector(it->second, {c.num_experts}).to(b.device()));
      else b.zero();
    }
    if (biases.empty() && !model.expert_bias_layers().empty() && !o.finetune)
      log_warn("checkpoint ", r.path(), " holds no expert biases (trained without --moe-router-enable-expert-bias): ",
               "they start at zero");
  }
  if (!o.finetune) {
    st.iteration = r.iteration();
    st.consumed_train_samples = r.attr_int("consumed_train_samples");
    st.consumed_valid_samples = r.attr_int("consumed_valid_samples");
    st.skipped_iterations = r.attr_int("skipped_iterations");
    // Written since the LR schedule skips them; older checkpoints count none.
    st.skipped_samples = r.has_attr("skipped_samples") ? r.attr_int("skipped_samples") : 0;
    if (o.load_optim) {
      opt.steps = r.attr_int("optimizer_steps");
      const nlohmann::json ls = r.attr_json("loss_scaler");
      if (scaler.enabled() && ls.value("enabled", false))
        scaler.set_state({ls.at("scale").get<float>(), ls.at("growth_tracker").get<int64_t>(),
                          ls.at("hysteresis_tracker").get<int64_t>()});
    }
    if (o.load_rng) st.seed = r.attr_json("rng").at("seed").get<uint64_t>();
  }
  if (comm != MPI_COMM_NULL) allreduce_bounded(&bytes, 1, MPI_DOUBLE, MPI_SUM, comm, "checkpoint bytes");
  if (info) {
    info->dir = r.dir();
    info->lr_schedule = r.has_attr("lr_schedule") ? r.attr_string("lr_schedule") : "";
    info->seconds = timer.seconds();
    info->bytes = bytes;
  }
  return true;
}

}  // namespace mpitron
