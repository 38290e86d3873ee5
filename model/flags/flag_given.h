// model/flags/flag_given.h — whether a command-line flag was given (not merely
// defaulted), and the checks every app's parser runs on the raw values.
#pragma once
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"

namespace mpitron {

inline bool flag_given(const boost::program_options::variables_map& vm, const char* flag) {
  return vm.count(flag) && !vm[flag].defaulted();
}

// Boost.Program_options reads "-1" into an unsigned flag as 2^64-1 (lexical_cast
// wraps): every parser calls this on its parsed options, and a negative value
// for a flag of an unsigned type is an error naming the flag.
inline void refuse_negative_unsigned(const boost::program_options::parsed_options& parsed,
                                     const boost::program_options::options_description& desc, const char* app) {
  namespace po = boost::program_options;
  for (const po::option& o : parsed.options) {
    const po::option_description* d = desc.find_nothrow(o.string_key, false);
    if (!d) continue;
    const po::value_semantic* sem = d->semantic().get();
    const bool is_unsigned = dynamic_cast<const po::typed_value<uint64_t>*>(sem) ||
                             dynamic_cast<const po::typed_value<uint32_t>*>(sem) ||
                             dynamic_cast<const po::typed_value<unsigned long long>*>(sem);
    if (!is_unsigned) continue;
    for (const std::string& v : o.value)
      MPT_CHECK(v.find('-') == std::string::npos,
                str(app, ": --", o.string_key, " must be a non-negative integer, got ", v), "");
  }
}

// Every floating-point flag finite, in one place: Boost parses "inf", "nan" and "1e999"
// (inf) into a double or float flag, and a value that is not finite would overflow
// whatever is sized or scaled by it (a capacity, a step) far from the flag. The error names
// the flag and the value; each flag's range is its parser's own check.
inline void refuse_non_finite(const boost::program_options::parsed_options& parsed,
                              const boost::program_options::options_description& desc, const char* app) {
  namespace po = boost::program_options;
  for (const po::option& o : parsed.options) {
    const po::option_description* d = desc.find_nothrow(o.string_key, false);
    if (!d) continue;
    const po::value_semantic* sem = d->semantic().get();
    const bool is_float = dynamic_cast<const po::typed_value<double>*>(sem) ||
                          dynamic_cast<const po::typed_value<float>*>(sem) ||
                          dynamic_cast<const po::typed_value<std::vector<double>>*>(sem) ||
                          dynamic_cast<const po::typed_value<std::vector<float>>*>(sem);
    if (!is_float) continue;
    for (const std::string& v : o.value) {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      MPT_CHECK(end == v.c_str() || std::isfinite(x),  // not a number at all: Boost's own error names it
                str(app, ": --", o.string_key, " must be a finite number, got ", v), "give a finite value");
    }
  }
}

// The checks every parser runs on the raw values before storing them.
inline void check_parsed_values(const boost::program_options::parsed_options& parsed,
                                const boost::program_options::options_description& desc, const char* app) {
  refuse_negative_unsigned(parsed, desc, app);
  refuse_non_finite(parsed, desc, app);
}

}  // namespace mpitron
