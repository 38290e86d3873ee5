#include "model/flags/model_flags.h"

#include "model/flags/flag_given.h"

namespace po = boost::program_options;

namespace mpitron {

void add_model_flags(po::options_description& d, const std::set<FlagScope>& scopes, const std::string& title,
                     const std::function<bool(const ArchField&, const ArchFlag&)>& keep) {
  po::options_description g(title);
  for (const ArchField& row : arch_fields()) {
    if (!scopes.count(row.scope)) continue;
    for (const ArchFlag& f : row.flags) {
      if (keep && !keep(row, f)) continue;
      const char* name = f.name.c_str();
      switch (f.type) {
        case FlagType::Switch: g.add_options()(name, po::bool_switch(), f.help.c_str()); break;
        case FlagType::Int: g.add_options()(name, po::value<int64_t>(), f.help.c_str()); break;
        case FlagType::Float: g.add_options()(name, po::value<double>(), f.help.c_str()); break;
        case FlagType::Text: g.add_options()(name, po::value<std::string>(), f.help.c_str()); break;
      }
    }
  }
  d.add(g);
}

GivenFlags given_model_flags(const po::variables_map& vm) {
  GivenFlags out;
  for (const ArchField& row : arch_fields())
    for (const ArchFlag& f : row.flags) {
      if (!flag_given(vm, f.name.c_str())) continue;
      const boost::any& v = vm[f.name].value();
      if (auto p = boost::any_cast<bool>(&v)) {
        if (*p) out[f.name] = true;
      } else if (auto p = boost::any_cast<int64_t>(&v)) {
        out[f.name] = *p;
      } else if (auto p = boost::any_cast<double>(&v)) {
        out[f.name] = *p;
      } else if (auto p = boost::any_cast<std::string>(&v)) {
        out[f.name] = *p;
      }
    }
  return out;
}

}  // namespace mpitron
