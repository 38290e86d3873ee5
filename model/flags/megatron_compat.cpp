#include "model/flags/megatron_compat.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"

namespace po = boost::program_options;

namespace mpitron {

const std::vector<NoOpFlag>& megatron_noop_flags() {
  static const std::vector<NoOpFlag> table = {
      // performance switches of Megatron's fused kernels and DDP
      {"DDP-impl", "local|torch",
       "gradients are reduced by mpitron's own bucketed data-parallel engine, overlapped with backward"},
      {"distributed-backend", "nccl|gloo|mpi",
       "MPI starts every rank and carries host tensors; NCCL carries device tensors (--force-mpi-for-device: MPI only)"},
      {"no-masked-softmax-fusion", "", "attention is always one fused flash-attention kernel (scale, mask, softmax)"},
      {"use-flash-attn", "", "attention is always fused flash attention (cuDNN on the GPU, a tiled kernel otherwise)"},
      {"attention-softmax-in-fp32", "", "attention softmax statistics are always kept in fp32"},
      {"no-bias-gelu-fusion", "", "bias + GeLU fusion never changes the numbers here; the GPU fuses where it can"},
      {"no-bias-dropout-fusion", "", "bias + dropout + residual fusion never changes the numbers here"},
      {"accumulate-allreduce-grads-in-fp32", "",
       "gradients are always accumulated and reduced in fp32 (one fp32 gradient buffer, Megatron's main_grad)"},
      {"no-gradient-accumulation-fusion", "", "weight gradients are always accumulated straight into the fp32 buffer"},
      {"no-async-tensor-model-parallel-allreduce", "",
       "tensor-parallel collectives are issued in program order on the compute stream"},
      {"use-mcore-models", "", "mpitron has one model implementation, laid out as Megatron-Core's"},
      {"transformer-impl", "local|transformer_engine",
       "mpitron has one transformer implementation, its own kernels (no Transformer Engine)"},
      // data and logging
      {"data-impl", "mmap|infer", "data is always read as Megatron's mmap .bin/.idx (MMIDIDX)"},
      {"num-workers", "*", "samples are read from memory-mapped files in the training process (no loader workers)"},
      {"tensorboard-queue-size", "*", "TensorBoard events are written and flushed at every log interval"},
      {"log-batch-size-to-tensorboard", "", "the batch size is always written to TensorBoard (batch-size)"},
      {"log-validation-ppl-to-tensorboard", "", "validation perplexity is always written to TensorBoard"},
      {"log-throughput", "", "tokens/s, TFLOP/s and MFU are always on the log line"},
      {"timing-log-level", "0|1|2", "the log line always carries the time per iteration; per-op timers are in bench/"},
      // checkpoints
      {"use-dist-ckpt", "",
       "checkpoints are always distributed: HDF5 in global shapes, reloadable under any layout"},
      {"ckpt-format", "torch|torch_dist|zarr",
       "--save writes mpitron's distributed HDF5 format (with torch: also Megatron's legacy files, model only, "
       "beside it); --load reads Megatron's torch and torch_dist directories (detected; with --ckpt-format, the "
       "format they must be; docs/checkpoint-format.md)"},
      // DeepSpeed
      {"deepspeed-activation-checkpointing", "",
       "activation recompute uses mpitron's own implementation (--recompute-activations / --checkpoint-activations)"},
  };
  return table;
}

void add_noop_flags(po::options_description& desc) {
  po::options_description g("Accepted for compatibility (no effect; docs/megatron-compat.md)");
  for (const NoOpFlag& f : megatron_noop_flags()) {
    const std::string v = f.values;
    if (v.empty()) g.add_options()(f.name, po::bool_switch(), f.instead);
    else g.add_options()(f.name, po::value<std::string>(), f.instead);
  }
  desc.add(g);
}

void check_noop_flags(const po::variables_map& vm, std::vector<std::string>& notes) {
  for (const NoOpFlag& f : megatron_noop_flags()) {
    if (!vm.count(f.name)) continue;
    const std::string allowed = f.values;
    if (allowed.empty()) {
      if (!vm[f.name].as<bool>()) continue;
    } else if (allowed != "*") {
      const std::string given = vm[f.name].as<std::string>();
      std::set<std::string> ok;
      std::stringstream ss(allowed);
      for (std::string item; std::getline(ss, item, '|');) ok.insert(item);
      if (!ok.count(given)) {
        std::string list;
        for (const auto& s : ok) list += (list.empty() ? "" : ", ") + s;
        MPT_THROW(str("--", f.name, " ", given, " is not supported: ", f.instead),
                  str("give one of ", list, " or drop the flag"));
      }
    }
    notes.push_back(str("--", f.name, ": ", f.instead));
  }
}

void strip_digit_underscores(std::vector<po::option>& options) {
  static const std::regex python_int("^[+-]?[0-9]+(_[0-9]+)+$");
  for (po::option& o : options)
    for (std::string& v : o.value)
      if (std::regex_match(v, python_int)) v.erase(std::remove(v.begin(), v.end(), '_'), v.end());
}

void keep_last_occurrence(std::vector<po::option>& options, const po::options_description& desc) {
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < options.size(); ++i) {
    const po::option& o = options[i];
    if (o.unregistered || o.string_key.empty()) continue;
    const po::option_description* d = desc.find_nothrow(o.string_key, false);
    if (!d) continue;
    const auto sem = d->semantic();
    if (sem->is_composing() || sem->max_tokens() > 1) continue;  // --data-path W P …: every occurrence counts
    last[o.string_key] = i;
  }
  std::vector<po::option> kept;
  for (size_t i = 0; i < options.size(); ++i) {
    auto it = last.find(options[i].string_key);
    if (it != last.end() && it->second != i) continue;
    kept.push_back(options[i]);
  }
  options.swap(kept);
}

}  // namespace mpitron
