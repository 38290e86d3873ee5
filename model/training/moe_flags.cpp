#include "model/training/moe_flags.h"

#include "core/error.h"
#include "model/flags/flag_given.h"

namespace mpitron {

namespace po = boost::program_options;

void add_moe_flags(po::options_description& d, TrainArgs& a) {
  po::options_description m("Mixture of Experts (docs/model-families.md; the experts' shape: the Model flags)");
  m.add_options()
      ("moe-router-load-balancing-type", po::value<std::string>()->default_value("aux_loss"),
       "aux_loss (Switch Transformer's, with --moe-aux-loss-coeff) or none")
      ("moe-aux-loss-coeff", po::value(&a.moe.aux_loss_coeff)->default_value(0.0f, "0"),
       "the load-balancing loss's coefficient (Mixtral: 0.02); its gradient joins the router's, the loss is logged")
      ("moe-z-loss-coeff", po::value(&a.moe.z_loss_coeff)->default_value(0.0f, "0"),
       "the router z-loss's coefficient (ST-MoE: 1e-3)")
      ("moe-expert-capacity-factor", po::value<double>(),
       "each expert takes at most ceil(tokens x topk / experts x factor) choices, the rest dropped (default: dropless)")
      ("moe-token-drop-policy", po::value<std::string>()->default_value("probs"),
       "over capacity, drop the least probable choices (probs) or the latest tokens (position)")
      ("moe-pad-expert-input-to-capacity", po::bool_switch(), "refused: padding to capacity is not built")
      ("moe-grouped-gemm", po::bool_switch(), "the experts' GEMMs as grouped GEMMs (mpitron always groups them)")
      ("moe-token-dispatcher-type", po::value<std::string>()->default_value("allgather"),
       "allgather or alltoall: how tokens reach the experts' ranks under expert parallelism")
      ("expert-model-parallel-size", po::value<int64_t>()->default_value(1), "EP: experts split over ranks")
      ("expert-tensor-parallel-size", po::value<int64_t>(), "the experts' TP size (default: --tensor-model-parallel-size)")
      ("moe-router-bias-update-rate", po::value<double>(), "the expert bias's step per update (default 1e-3)")
      ("moe-router-dtype", po::value<std::string>(), "fp32 (the router always runs in f32 here)");
  d.add(m);
}

void check_moe_flags(const po::variables_map& vm, TrainArgs& a) {
  const bool moe = a.model.moe();
  const char* run_flags[] = {"moe-router-load-balancing-type", "moe-aux-loss-coeff", "moe-z-loss-coeff",
                             "moe-expert-capacity-factor", "moe-token-drop-policy", "moe-pad-expert-input-to-capacity",
                             "moe-grouped-gemm", "moe-token-dispatcher-type", "expert-model-parallel-size",
                             "expert-tensor-parallel-size", "moe-router-enable-expert-bias",
                             "moe-router-bias-update-rate", "moe-router-dtype",
                             // the architecture's (model/arch_fields.h), given at their default values too
                             "moe-router-topk", "moe-ffn-hidden-size", "moe-layer-freq", "moe-router-score-function",
                             "moe-router-pre-softmax", "moe-router-topk-scaling-factor",
                             "moe-shared-expert-intermediate-size", "moe-shared-expert-gate"};
  for (const char* f : run_flags)
    MPT_CHECK(moe || !flag_given(vm, f), str("--", f, " is given without --num-experts: the model has no experts"),
              "add --num-experts E for a Mixture of Experts, or drop the flag");
  if (!moe) return;
  const std::string balance = vm["moe-router-load-balancing-type"].as<std::string>();
  MPT_CHECK(balance == "aux_loss" || balance == "none",
            str("--moe-router-load-balancing-type ", balance, " is not supported"),
            "use aux_loss (with --moe-aux-loss-coeff) or none (seq_aux_loss and sinkhorn are not built)");
  if (balance == "none") {
    MPT_CHECK(!flag_given(vm, "moe-aux-loss-coeff") || a.moe.aux_loss_coeff == 0,
              "--moe-aux-loss-coeff with --moe-router-load-balancing-type none", "drop one of them");
    a.moe.aux_loss_coeff = 0;
  }
  // The float flags' ranges: model/training/arguments.cpp check_numeric_flags (finite: flag_given.h).
  if (vm.count("moe-expert-capacity-factor")) a.moe.capacity_factor = vm["moe-expert-capacity-factor"].as<double>();
  const std::string policy = vm["moe-token-drop-policy"].as<std::string>();
  MPT_CHECK(policy == "probs" || policy == "position", str("--moe-token-drop-policy ", policy, " is not known"),
            "use probs or position");
  a.moe.drop_by_probs = policy == "probs";
  MPT_CHECK(!flag_given(vm, "moe-token-drop-policy") || a.moe.capacity_factor > 0,
            "--moe-token-drop-policy without --moe-expert-capacity-factor: dropless routing drops nothing",
            "add --moe-expert-capacity-factor, or drop the flag");
  MPT_CHECK(!vm["moe-pad-expert-input-to-capacity"].as<bool>(),
            "--moe-pad-expert-input-to-capacity is not supported: the experts run on the tokens they get",
            "drop it (the results are the same without the padding)");
  const std::string dispatcher = vm["moe-token-dispatcher-type"].as<std::string>();
  MPT_CHECK(dispatcher == "allgather" || dispatcher == "alltoall",
            str("--moe-token-dispatcher-type ", dispatcher, " is not supported"), "use allgather or alltoall");
  const int64_t ep = vm["expert-model-parallel-size"].as<int64_t>();
  MPT_CHECK(ep >= 1, str("--expert-model-parallel-size must be >= 1, got ", ep), "");
  MPT_CHECK(a.model.num_experts % ep == 0,
            str("--expert-model-parallel-size ", ep, " does not divide --num-experts ", a.model.num_experts),
            "each expert-parallel rank holds num-experts / EP whole experts");
  a.expert_model_parallel_size = ep;
  a.moe_token_dispatcher_type = dispatcher;
  if (flag_given(vm, "moe-token-dispatcher-type") && ep == 1)
    a.startup_notes.push_back(str("--moe-token-dispatcher-type ", dispatcher,
                                  ": with --expert-model-parallel-size 1 every rank holds every expert, so no tokens "
                                  "are dispatched"));
  if (vm.count("expert-tensor-parallel-size")) {
    const int64_t etp = vm["expert-tensor-parallel-size"].as<int64_t>();
    MPT_CHECK(etp == a.tensor_model_parallel_size,
              str("--expert-tensor-parallel-size ", etp, " differs from --tensor-model-parallel-size ",
                  a.tensor_model_parallel_size, ": the experts are split as the dense layers only"),
              "drop --expert-tensor-parallel-size");
  }
  if (a.model.moe_router_enable_expert_bias) {  // the architecture's flag (model/arch_fields.h); its update rate here
    a.moe.expert_bias_update_rate = vm.count("moe-router-bias-update-rate") ? vm["moe-router-bias-update-rate"].as<double>() : 1e-3;
  } else {
    MPT_CHECK(!vm.count("moe-router-bias-update-rate"),
              "--moe-router-bias-update-rate without --moe-router-enable-expert-bias: there is no bias to update",
              "add --moe-router-enable-expert-bias, or drop the flag");
  }
  if (vm.count("moe-router-dtype"))
    MPT_CHECK(vm["moe-router-dtype"].as<std::string>() == "fp32",
              str("--moe-router-dtype ", vm["moe-router-dtype"].as<std::string>(), " is not supported"),
              "the router runs in fp32 (give fp32 or leave it out)");
  if (vm["moe-grouped-gemm"].as<bool>())
    a.startup_notes.push_back("--moe-grouped-gemm: the experts' GEMMs are always grouped (tensor/grouped_gemm.h)");
  MPT_CHECK(a.context_parallel_size == 1,
            str("--num-experts with --context-parallel-size ", a.context_parallel_size,
                ": the router's load-balancing statistics are not yet summed over the context-parallel ranks"),
            "train the Mixture of Experts with --context-parallel-size 1");
}

}  // namespace mpitron
