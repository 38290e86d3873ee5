// core/number.h — a decimal number as Python's float() reads one (Megatron parses
// --data-path weights and --split with it): [+-] digits [. digits] [e[+-]digits].
// std::stod also takes hexadecimal ("0x10" = 16), "inf", "nan" and leading
// blanks; a flag value in any of those forms is a typo, not a number.
#pragma once
#include <string>

namespace mpitron {

// True, with the value in *out, when s is exactly one finite decimal number.
bool parse_decimal(const std::string& s, double* out);

}  // namespace mpitron
