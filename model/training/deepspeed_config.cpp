#include "model/training/deepspeed_config.h"

#include <algorithm>
#include "model/flags/flag_given.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "model/training/arguments.h"

namespace mpitron {

namespace {

using json = nlohmann::json;

// Keys that only change what DeepSpeed prints or profiles, and what mpitron does instead.
const std::map<std::string, const char*>& display_only() {
  static const std::map<std::string, const char*> m = {
      {"steps_per_print", "mpitron prints a log line every --log-interval iterations"},
      {"wall_clock_breakdown", "the log line carries the time per iteration; per-op timings are in bench/"},
      {"zero_allow_untested_optimizer", "mpitron's ZeRO shards its own AdamW"},
      {"memory_breakdown", "mpitron logs its memory estimate at start-up and the peak on every log line"},
      {"dump_state", "mpitron logs its configuration at start-up"},
      {"flops_profiler", "the log line carries TFLOP/s and MFU (docs/flops.md)"},
      {"comms_logger", "bench_comm measures the collectives"},
      {"tensorboard", "use --tensorboard-dir"},
      {"wandb", "use --tensorboard-dir"},
      {"csv_monitor", "use --metrics-file (JSONL)"},
  };
  return m;
}

// zero_optimization keys that only tune DeepSpeed's buffers, and why they change nothing here.
const std::map<std::string, const char*>& zero_tuning() {
  static const std::map<std::string, const char*> m = {
      {"contiguous_gradients", "gradients always live in one contiguous buffer"},
      {"reduce_scatter", "ZeRO-2 always reduce-scatters gradients"},
      {"allgather_partitions", "the distributed optimizer always all-gathers its updated shard"},
      {"allgather_bucket_size", "the updated shard is gathered in one collective"},
      {"round_robin_gradients", "shards are contiguous slices of the flat buffer"},
  };
  return m;
}

[[noreturn]] void bad(const std::string& file, const std::string& what, const std::string& hint = "") {
  MPT_THROW(str("--deepspeed_config ", file, ": ", what), hint.empty() ? "fix the value in the JSON file" : hint);
}

int64_t get_int(const std::string& file, const json& j, const std::string& key, int64_t lo, int64_t hi) {
  // DeepSpeed accepts "auto" only through the HF integration; here it must be a number.
  if (!j.is_number_integer() && !(j.is_number_float() && std::floor(j.get<double>()) == j.get<double>()))
    bad(file, str(key, " must be an integer, got ", json_excerpt(j)));
  const double v = j.get<double>();
  if (v < static_cast<double>(lo) || v > static_cast<double>(hi))
    bad(file, str(key, " must be in [", lo, ", ", hi, "], got ", json_excerpt(j)));
  return static_cast<int64_t>(v);
}

double get_num(const std::string& file, const json& j, const std::string& key, double lo, double hi) {
  if (!j.is_number()) bad(file, str(key, " must be a number, got ", json_excerpt(j)));
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) bad(file, str(key, " must be in [", lo, ", ", hi, "], got ", json_excerpt(j)));
  return v;
}

bool get_bool(const std::string& file, const json& j, const std::string& key) {
  if (!j.is_boolean()) bad(file, str(key, " must be true or false, got ", json_excerpt(j)));
  return j.get<bool>();
}

}  // namespace

DeepSpeedConfig read_deepspeed_config(const std::string& path) {
  const json root = read_json_file(path, "--deepspeed_config", /*ignore_comments=*/true);
  if (!root.is_object()) bad(path, "the top level must be a JSON object");
  DeepSpeedConfig c;
  c.file = path;
  std::vector<std::string> unsupported, offload;
  const int64_t big = int64_t{1} << 40;
  for (const auto& [key, v] : root.items()) {
    if (key == "train_micro_batch_size_per_gpu") c.micro_batch = get_int(path, v, key, 1, big);
    else if (key == "train_batch_size") c.global_batch = get_int(path, v, key, 1, big);
    else if (key == "gradient_accumulation_steps") c.grad_accum = get_int(path, v, key, 1, big);
    else if (key == "gradient_clipping") c.clip_grad = get_num(path, v, key, 0, 1e30);
    else if (key == "zero_optimization") {
      if (!v.is_object()) bad(path, "zero_optimization must be an object");
      for (const auto& [zk, zv] : v.items()) {
        const std::string name = "zero_optimization." + zk;
        if (zk == "stage") {
          c.zero_stage = get_int(path, zv, name, 0, 3);
        } else if (zk == "overlap_comm") c.overlap_comm = get_bool(path, zv, name);
        else if (zk == "stage3_prefetch_bucket_size") c.prefetch_bucket_size = get_int(path, zv, name, 0, big);
        else if (zk == "stage3_param_persistence_threshold") c.persistence_threshold = get_int(path, zv, name, 0, big);
        else if (zk == "stage3_max_live_parameters") c.max_live_parameters = get_int(path, zv, name, 1, big);
        else if (zk == "offload_optimizer") {
          if (!zv.is_object()) bad(path, name + " must be an object");
          for (const auto& [ok, ov] : zv.items()) {
            const std::string oname = name + "." + ok;
            if (ok == "device") {
              const std::string d = ov.is_string() ? ov.get<std::string>() : "";
              if (d == "cpu") c.offload_optimizer = true;
              else if (d == "none") c.offload_optimizer = false;
              else offload.push_back(str(oname, " ", json_excerpt(ov)));
            } else if (ok == "pin_memory") {
              get_bool(path, ov, oname);
              c.notes.push_back(str("DeepSpeed ", oname, ": the host copies use pageable memory"));
            } else if (ok == "ratio") {
              if (get_num(path, ov, oname, 0, 1) != 1.0) offload.push_back(str(oname, " below 1"));
            } else {
              unsupported.push_back(oname);
            }
          }
        } else if (zk == "offload_param") {
          offload.push_back(name);
        }
        else if (zk == "reduce_bucket_size") c.reduce_bucket_size = get_int(path, zv, name, 1, big);
        else if (auto it = zero_tuning().find(zk); it != zero_tuning().end())
          c.notes.push_back(str("DeepSpeed ", name, ": ", it->second));
        else unsupported.push_back(name);
      }
    } else if (key == "fp16") {
      if (!v.is_object()) bad(path, "fp16 must be an object");
      for (const auto& [fk, fv] : v.items()) {
        const std::string name = "fp16." + fk;
        if (fk == "enabled") c.fp16 = get_bool(path, fv, name);
        else if (fk == "loss_scale") c.loss_scale = get_num(path, fv, name, 0, 1e30);
        else if (fk == "initial_scale_power") c.initial_scale_power = get_int(path, fv, name, 0, 127);
        else if (fk == "loss_scale_window") c.loss_scale_window = get_int(path, fv, name, 1, big);
        else if (fk == "hysteresis") c.hysteresis = get_int(path, fv, name, 1, big);
        else if (fk == "min_loss_scale") c.min_loss_scale = get_num(path, fv, name, 1e-30, 1e30);
        else unsupported.push_back(name);
      }
    } else if (key == "bf16") {
      if (!v.is_object()) bad(path, "bf16 must be an object");
      for (const auto& [bk, bv] : v.items()) {
        if (bk == "enabled") c.bf16 = get_bool(path, bv, "bf16.enabled");
        else unsupported.push_back("bf16." + bk);
      }
    } else if (key == "optimizer") {
      if (!v.is_object()) bad(path, "optimizer must be an object");
      for (const auto& [ok, ov] : v.items()) {
        const std::string name = "optimizer." + ok;
        if (ok == "type") {
          const std::string t = ov.is_string() ? ov.get<std::string>() : "";
          std::string lower = t;
          for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          if (lower == "adam" || lower == "adamw") c.optimizer = "adam";
          else if (lower == "sgd") c.optimizer = "sgd";
          else if (lower == "muon") c.optimizer = "muon";  // Megatron-Core's Muon; DeepSpeed's muon_lr / adam_lr refused
          else unsupported.push_back(str(name, " ", json_excerpt(ov), " (built: Adam, AdamW, SGD, Muon)"));
        } else if (ok == "params") {
          if (!ov.is_object()) bad(path, name + " must be an object");
          for (const auto& [pk, pv] : ov.items()) {
            const std::string pname = name + "." + pk;
            if (pk == "lr") c.lr = get_num(path, pv, pname, 0, 1e30);
            else if (pk == "eps") c.eps = get_num(path, pv, pname, 1e-30, 1e30);
            else if (pk == "weight_decay") c.weight_decay = get_num(path, pv, pname, 0, 1e30);
            else if (pk == "momentum") c.momentum = get_num(path, pv, pname, 0, 1);
            else if (pk == "betas") {
              if (!pv.is_array() || pv.size() != 2) bad(path, pname + " must be [beta1, beta2]");
              c.beta1 = get_num(path, pv[0], pname + "[0]", 0, 1);
              c.beta2 = get_num(path, pv[1], pname + "[1]", 0, 1);
            } else if (pk == "adam_w_mode") {
              if (!get_bool(path, pv, pname)) unsupported.push_back(pname + " false (Adam with L2 weight decay)");
            } else {
              unsupported.push_back(pname);
            }
          }
        } else {
          unsupported.push_back(name);
        }
      }
    } else if (auto it = display_only().find(key); it != display_only().end()) {
      c.notes.push_back(str("DeepSpeed ", key, ": ", it->second));
    } else {
      unsupported.push_back(key);
    }
  }
  if (!offload.empty() || !unsupported.empty()) {  // every key mpitron cannot honour, in one error
    std::string list, off;
    for (const auto& k : unsupported) list += (list.empty() ? "" : ", ") + k;
    for (const auto& k : offload) off += (off.empty() ? "" : " and ") + k;
    if (!off.empty())
      list += str(list.empty() ? "" : "; ", off, " (offloading is built only for the whole optimizer state, to the "
                  "CPU: offload_optimizer: {\"device\": \"cpu\"})");
    bad(path, str("mpitron cannot honour these keys: ", list),
        "remove them (docs/megatron-compat.md lists the keys mpitron reads: batch sizes, gradient_clipping, "
        "zero_optimization.stage 0-3 and its stage3_* keys, fp16, bf16, optimizer)");
  }
  if (c.fp16.value_or(false) && c.bf16.value_or(false)) bad(path, "fp16.enabled and bf16.enabled are both true");
  return c;
}

namespace {

// Takes the JSON's value for `field` unless the command line set `flag` to another.
template <class Field, class Json>
void take(const DeepSpeedConfig& ds, const boost::program_options::variables_map& vm, const std::optional<Json>& js,
          const char* key, const char* flag, Field& field) {
  if (!js) return;
  const Field v = static_cast<Field>(*js);
  if (flag_given(vm, flag) && field != v)
    MPT_THROW(str("--deepspeed_config ", ds.file, " sets ", key, " = ", *js, " but the command line gives --", flag, " ",
                  field),
              "make the two agree, or drop one of them");
  field = v;
}

}  // namespace

void apply_deepspeed_config(const DeepSpeedConfig& ds, const boost::program_options::variables_map& vm, TrainArgs& a) {
  take(ds, vm, ds.micro_batch, "train_micro_batch_size_per_gpu", "micro-batch-size", a.micro_batch_size);
  take(ds, vm, ds.global_batch, "train_batch_size", "global-batch-size", a.global_batch_size);
  take(ds, vm, ds.clip_grad, "gradient_clipping", "clip-grad", a.optim.clip_grad);
  take(ds, vm, ds.zero_stage, "zero_optimization.stage", "zero-stage", a.zero_stage);
  if (ds.zero_stage && flag_given(vm, "data-parallel-sharding-strategy")) {
    // Megatron-FSDP's names of the ZeRO stages, in stage order.
    const std::vector<std::string> names = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
    const std::string st = vm["data-parallel-sharding-strategy"].as<std::string>();
    const auto it = std::find(names.begin(), names.end(), st);
    if (it != names.end() && it - names.begin() != *ds.zero_stage)
      MPT_THROW(str("--deepspeed_config ", ds.file, " sets zero_optimization.stage = ", *ds.zero_stage,
                    " but the command line gives --data-parallel-sharding-strategy ", st, " (ZeRO stage ",
                    it - names.begin(), ")"),
                "make the two agree, or drop one of them");
  }
  if (ds.zero_stage && *ds.zero_stage == 0 && flag_given(vm, "use-distributed-optimizer"))
    MPT_THROW(str("--deepspeed_config ", ds.file, " sets zero_optimization.stage = 0 but the command line gives "
                  "--use-distributed-optimizer (stage 1)"),
              "make the two agree, or drop one of them");
  if (ds.overlap_comm) {
    if (*ds.overlap_comm && flag_given(vm, "no-overlap-grad-reduce"))
      MPT_THROW(str("--deepspeed_config ", ds.file, " sets zero_optimization.overlap_comm = true but the command line "
                    "gives --no-overlap-grad-reduce"),
                "make the two agree, or drop one of them");
    a.overlap_grad_reduce = *ds.overlap_comm;
  }
  take(ds, vm, ds.reduce_bucket_size, "zero_optimization.reduce_bucket_size", "ddp-bucket-size", a.ddp_bucket_size);
  const bool stage3 = ds.zero_stage && *ds.zero_stage == 3;
  for (const char* k : {"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters"}) {
    const bool given = std::string(k) == "stage3_prefetch_bucket_size" ? ds.prefetch_bucket_size.has_value()
                       : std::string(k) == "stage3_max_live_parameters" ? ds.max_live_parameters.has_value()
                                                                         : ds.persistence_threshold.has_value();
    if (given && !stage3)
      MPT_THROW(str("--deepspeed_config ", ds.file, " sets zero_optimization.", k, " but not stage 3"),
                "set zero_optimization.stage to 3, or remove the key");
  }
  if (ds.offload_optimizer) {
    if (!*ds.offload_optimizer && flag_given(vm, "optimizer-cpu-offload"))
      MPT_THROW(str("--deepspeed_config ", ds.file, " sets zero_optimization.offload_optimizer.device = none but the "
                    "command line gives --optimizer-cpu-offload"),
                "make the two agree, or drop one of them");
    a.optim.cpu_offload = a.optim.cpu_offload || *ds.offload_optimizer;
  }
  if (ds.prefetch_bucket_size) a.zero3.prefetch = *ds.prefetch_bucket_size > 0;
  if (ds.persistence_threshold) a.zero3.persistence_threshold = *ds.persistence_threshold;
  if (ds.max_live_parameters) a.zero3.max_live_parameters = *ds.max_live_parameters;
  if (ds.fp16) {
    if (*ds.fp16 && a.bf16 && !ds.bf16)
      MPT_THROW(str("--deepspeed_config ", ds.file, " enables fp16 but the command line gives --bf16"),
                "make the two agree");
    take(ds, vm, ds.fp16, "fp16.enabled", "fp16", a.fp16);
  }
  take(ds, vm, ds.bf16, "bf16.enabled", "bf16", a.bf16);
  if (ds.loss_scale && *ds.loss_scale == 0 && flag_given(vm, "loss-scale"))  // 0: dynamic scaling, DeepSpeed's default
    MPT_THROW(str("--deepspeed_config ", ds.file, " sets fp16.loss_scale = 0 (dynamic) but the command line gives "
                  "--loss-scale ", a.scaler.constant, " (static)"),
              "make the two agree, or drop one of them");
  if (ds.loss_scale && *ds.loss_scale > 0)
    take(ds, vm, ds.loss_scale, "fp16.loss_scale", "loss-scale", a.scaler.constant);
  if (ds.initial_scale_power) {
    const std::optional<double> init = std::ldexp(1.0, static_cast<int>(*ds.initial_scale_power));
    take(ds, vm, init, "fp16.initial_scale_power (as 2^p)", "initial-loss-scale", a.scaler.initial_scale);
  }
  take(ds, vm, ds.loss_scale_window, "fp16.loss_scale_window", "loss-scale-window", a.scaler.window);
  take(ds, vm, ds.hysteresis, "fp16.hysteresis", "hysteresis", a.scaler.hysteresis);
  take(ds, vm, ds.min_loss_scale, "fp16.min_loss_scale", "min-loss-scale", a.scaler.min_scale);
  take(ds, vm, ds.optimizer, "optimizer.type", "optimizer", a.optim.optimizer);
  take(ds, vm, ds.lr, "optimizer.params.lr", "lr", a.lr);
  take(ds, vm, ds.beta1, "optimizer.params.betas[0]", "adam-beta1", a.optim.beta1);
  take(ds, vm, ds.beta2, "optimizer.params.betas[1]", "adam-beta2", a.optim.beta2);
  take(ds, vm, ds.eps, "optimizer.params.eps", "adam-eps", a.optim.eps);
  take(ds, vm, ds.weight_decay, "optimizer.params.weight_decay", "weight-decay", a.optim.weight_decay);
  if (a.optim.optimizer == "muon") take(ds, vm, ds.momentum, "optimizer.params.momentum", "muon-momentum", a.optim.muon_momentum);
  else take(ds, vm, ds.momentum, "optimizer.params.momentum", "sgd-momentum", a.optim.sgd_momentum);
  for (const std::string& n : ds.notes) a.startup_notes.push_back(n);
}

void check_deepspeed_batch(const DeepSpeedConfig& ds, const TrainArgs& a) {
  if (!ds.grad_accum) return;
  const int64_t want = a.micro_batch_size * *ds.grad_accum * a.data_parallel_size;
  if (a.global_batch_size != want)
    MPT_THROW(str("--deepspeed_config ", ds.file, ": train_batch_size ", a.global_batch_size,
                  " != train_micro_batch_size_per_gpu ", a.micro_batch_size, " x gradient_accumulation_steps ",
                  *ds.grad_accum, " x data-parallel size ", a.data_parallel_size, " = ", want),
              "DeepSpeed requires train_batch_size = micro batch x accumulation steps x data-parallel ranks");
}

}  // namespace mpitron
