#include "model/training/muon_flags.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/flags/flag_given.h"
#include "parallel/newton_schulz.h"

namespace mpitron {

namespace po = boost::program_options;

void add_muon_flags(po::options_description& d, TrainArgs& a) {
  OptimizerConfig& o = a.optim;
  po::options_description m("Muon (--optimizer muon | dist_muon; docs/training.md \"Muon\")");
  m.add_options()
      ("muon-momentum", po::value(&o.muon_momentum)->default_value(0.95f, "0.95"), "the momentum of Muon's buffer")
      ("muon-use-nesterov", po::bool_switch(&o.muon_nesterov), "Nesterov momentum: orthogonalise (1-m)·g + m·buf")
      ("muon-nesterov", po::bool_switch(), "= --muon-use-nesterov")
      ("muon-no-split-qkv", po::bool_switch(), "orthogonalise the fused qkv weight whole (default: q, k, v apart)")
      ("muon-scale-mode", po::value(&o.muon_scale_mode)->default_value("spectral"),
       "the update's scale: spectral sqrt(max(rows, cols)) | unit_rms_norm sqrt(rows/cols) | shape_scaling "
       "sqrt(max(1, rows/cols)) (torch.optim.Muon's)")
      ("muon-extra-scale-factor", po::value(&o.muon_extra_scale)->default_value(1.0f, "1"),
       "times the scale (0.2 with spectral: AdamW's update RMS)")
      ("muon-fp32-matmul-prec", po::value(&o.muon_matmul_prec)->default_value("medium"),
       "Newton-Schulz products: medium (bf16 operands, f32 accumulation; low: the same) | high (f32)")
      ("muon-num-ns-steps", po::value(&o.muon_ns_steps)->default_value(5), "Newton-Schulz iterations")
      ("muon-coefficient-type", po::value(&o.muon_coefficients)->default_value("quintic"),
       "Newton-Schulz coefficients: simple | quintic | polar_express | cans")
      ("muon-tp-mode", po::value(&o.muon_tp_mode)->default_value("blockwise"),
       "tensor-parallel weights: blockwise (each shard) | duplicated (the whole, gathered on every tp rank) | "
       "distributed (the shards, each iteration's Gram matrix summed over tp)")
      ("muon-scalar-optimizer", po::value<std::string>()->default_value("adam"),
       "the optimizer of embeddings, the output layer, norms and biases: adam");
  d.add(m);
}

void check_muon_flags(const po::variables_map& vm, TrainArgs& a) {
  OptimizerConfig& o = a.optim;
  const bool muon = o.optimizer == "muon" || o.optimizer == "dist_muon";
  for (const char* f : {"muon-momentum", "muon-use-nesterov", "muon-nesterov", "muon-no-split-qkv", "muon-scale-mode",
                        "muon-extra-scale-factor", "muon-fp32-matmul-prec", "muon-num-ns-steps",
                        "muon-coefficient-type", "muon-tp-mode", "muon-scalar-optimizer"})
    MPT_CHECK(muon || !flag_given(vm, f), str("--", f, " is given but --optimizer is ", o.optimizer),
              "add --optimizer muon (or dist_muon)");
  if (!muon) return;
  if (vm["muon-nesterov"].as<bool>()) o.muon_nesterov = true;
  if (vm["muon-no-split-qkv"].as<bool>()) o.muon_split_qkv = false;
  const std::string scalar = vm["muon-scalar-optimizer"].as<std::string>();
  MPT_CHECK(scalar == "adam",
            str("--muon-scalar-optimizer ", scalar, scalar == "lion" ? " (Megatron-Core's) is not built in mpitron" : " is unknown"),
            "use --muon-scalar-optimizer adam");
  MPT_CHECK(o.muon_momentum >= 0 && o.muon_momentum < 1, str("--muon-momentum ", o.muon_momentum, " is not in [0, 1)"),
            "the default is 0.95");
  MPT_CHECK(std::isfinite(o.muon_extra_scale) && o.muon_extra_scale > 0,
            str("--muon-extra-scale-factor ", o.muon_extra_scale, " is not a positive number"), "the default is 1");
  MPT_CHECK(o.muon_ns_steps >= 1 && o.muon_ns_steps <= 100,
            str("--muon-num-ns-steps ", o.muon_ns_steps, " is not in 1..100"), "the default is 5");
  const std::string& sm = o.muon_scale_mode;
  MPT_CHECK(sm == "spectral" || sm == "unit_rms_norm" || sm == "shape_scaling",
            str("--muon-scale-mode ", sm, " is not built"), "use spectral, unit_rms_norm or shape_scaling");
  const std::string& pr = o.muon_matmul_prec;
  MPT_CHECK(pr == "low" || pr == "medium" || pr == "high", str("--muon-fp32-matmul-prec ", pr, " is not low, medium or high"),
            "");
  ns_coefficients(o.muon_coefficients, o.muon_ns_steps);  // an unknown type refused naming the flag
  const std::string& tm = o.muon_tp_mode;
  MPT_CHECK(tm == "blockwise" || tm == "duplicated" || tm == "distributed", str("--muon-tp-mode ", tm, " is unknown"),
            "use --muon-tp-mode blockwise, duplicated or distributed");
  MPT_CHECK(!a.fp16, str("--optimizer ", o.optimizer, " with --fp16: Megatron-Core's Muon has no loss scaling either"),
            "use --bf16 or f32");
  if (o.optimizer == "muon") {
    MPT_CHECK(a.zero_stage == 0,
              str("--optimizer muon keeps whole matrices on every rank; ZeRO stage ", a.zero_stage,
                  " (--use-distributed-optimizer / --zero-stage) shards them (Megatron refuses the pair too)"),
              "use --optimizer dist_muon (Muon's states sharded by whole tensors), or drop the ZeRO flag");
    return;
  }
  MPT_CHECK(a.zero_stage <= 2,
            "--optimizer dist_muon with --zero-stage 3: sharding the parameters themselves is not built for Muon",
            "use --zero-stage 1 or 2 (or leave it out: dist_muon shards its states by whole tensors)");
  MPT_CHECK(!a.optim.cpu_offload, "--optimizer dist_muon with --optimizer-cpu-offload is not built", "");
  if (a.zero_stage == 0) a.zero_stage = 1;  // dist_muon is ZeRO-1 by whole tensors
}

}  // namespace mpitron
