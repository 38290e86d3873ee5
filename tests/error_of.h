// tests/error_of.h — the message of the mpitron::Error a call throws ("" if it throws none),
// for tests that check what a refusal says (the file or flag it names, what to do).
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace mpitron::testing_util {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mpitron::testing_util
