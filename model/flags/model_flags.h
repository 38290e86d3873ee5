// model/flags/model_flags.h — the architecture table's flags (model/arch_fields.h) on
// Boost.Program_options: every tool that builds or loads a model registers them here, so a
// flag exists in one place and means one thing in pretrain_gpt, pretrain_bert, finetune,
// generate_text, evaluate and the server. model/ itself never sees Boost.
#pragma once
#include <boost/program_options.hpp>
#include <functional>
#include <set>
#include <string>

#include "model/arch_fields.h"

namespace mpitron {

// Adds the flags of the rows of `scopes` (those for which `keep(row, flag)` holds, when
// given) to d under `title`.
void add_model_flags(boost::program_options::options_description& d, const std::set<FlagScope>& scopes,
                     const std::string& title = "Model (docs/model-families.md)",
                     const std::function<bool(const ArchField&, const ArchFlag&)>& keep = {});
// The table's flags the command line gave (defaulted values are not given; a switch only when on).
GivenFlags given_model_flags(const boost::program_options::variables_map& vm);

}  // namespace mpitron
