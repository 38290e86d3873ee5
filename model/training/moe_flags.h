// model/training/moe_flags.h — Megatron's Mixture-of-Experts run flags (the architecture's are
// rows of model/arch_fields.h): the load-balancing and z losses, capacity and its drop policy,
// the dispatcher and expert parallelism. What is not built is refused naming the flag.
#pragma once
#include <boost/program_options.hpp>

#include "model/training/arguments.h"

namespace mpitron {

void add_moe_flags(boost::program_options::options_description& d, TrainArgs& a);
// Checks the given MoE flags against the model and the layout; fills a.moe. Throws naming them.
void check_moe_flags(const boost::program_options::variables_map& vm, TrainArgs& a);

}  // namespace mpitron
