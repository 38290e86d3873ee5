// model/flags/megatron_compat.h — the flags Megatron-LM and Megatron-DeepSpeed scripts pass
// that change nothing in mpitron, accepted so the scripts run unchanged.
//
// Each such flag is listed once, with what mpitron does instead; a run that passes
// it prints that sentence once at start-up. A value-taking flag accepts only the
// values for which the sentence is true (e.g. --data-impl mmap), and rejects the
// others naming the flag and the reason. docs/megatron-compat.md lists them all.
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace mpitron {

struct NoOpFlag {
  const char* name;     // flag without the leading "--"
  const char* values;   // "": a switch; "*": any value; else "a|b|c": the accepted values
  const char* instead;  // what mpitron does instead (one sentence, printed at start-up)
};

// The table (docs/megatron-compat.md is written from it).
const std::vector<NoOpFlag>& megatron_noop_flags();

// Adds every flag of the table to `desc` (group "Accepted for compatibility").
void add_noop_flags(boost::program_options::options_description& desc);

// For each table flag present in `vm`: checks its value and appends
// "--flag: <instead>" to `notes`. Throws naming the flag for a value it cannot honour.
void check_noop_flags(const boost::program_options::variables_map& vm, std::vector<std::string>& notes);

// argparse semantics for repeated flags: the last occurrence of a single-valued
// flag wins (Boost.Program_options would reject the repetition). Flags whose
// value composes (e.g. --data-path) keep every occurrence.
// Python's int() reads "5_000_000" as 5000000, and Megatron scripts write sample
// counts that way: such tokens (digits with single underscores between them) lose
// their underscores before parsing.
void strip_digit_underscores(std::vector<boost::program_options::option>& options);

void keep_last_occurrence(std::vector<boost::program_options::option>& options,
                          const boost::program_options::options_description& desc);

}  // namespace mpitron
