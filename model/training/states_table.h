// model/training/states_table.h — the implementations of model_states.h, one row each
// (model/training/model_states.cpp's table picks one by --zero-stage).
#pragma once
#include <memory>

#include "model/training/model_states.h"

namespace mpitron {

using MakeStates = std::unique_ptr<ModelStates> (*)(const StatesConfig&, GPT&, Communicator* grad_comm,
                                                    Communicator* norm_group);
std::unique_ptr<ModelStates> make_replicated_states(const StatesConfig&, GPT&, Communicator*, Communicator*);
std::unique_ptr<ModelStates> make_zero_states(const StatesConfig&, GPT&, Communicator*, Communicator*);
std::unique_ptr<ModelStates> make_zero3_states(const StatesConfig&, GPT&, Communicator*, Communicator*);

}  // namespace mpitron
