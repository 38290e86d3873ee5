// model/training/muon_flags.h — Megatron-Core's Muon flags (--optimizer muon | dist_muon;
// parallel/muon_rule.cpp does the maths): registered beside the training flags, checked after
// the sharding flags. dist_muon is Muon with its states sharded by whole tensors over the
// data-parallel ranks (ZeRO-1's model states with ShardLayout::whole_tensors: Megatron's
// layer-wise distributed optimizer); plain muon keeps them replicated and, as Megatron, refuses
// --use-distributed-optimizer. What is not built is refused naming the flag.
#pragma once
#include <boost/program_options.hpp>

#include "model/training/arguments.h"

namespace mpitron {

void add_muon_flags(boost::program_options::options_description& d, TrainArgs& a);
// Checks the Muon flags against --optimizer, the sharding and the precision; dist_muon raises
// --zero-stage 0 to 1. Throws naming the flags.
void check_muon_flags(const boost::program_options::variables_map& vm, TrainArgs& a);

}  // namespace mpitron
