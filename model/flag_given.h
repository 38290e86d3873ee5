// model/flag_given.h — whether a command-line flag was given (not merely defaulted).
#pragma once
#include <boost/program_options.hpp>

namespace mpitron {

inline bool flag_given(const boost::program_options::variables_map& vm, const char* flag) {
  return vm.count(flag) && !vm[flag].defaulted();
}

}  // namespace mpitron
