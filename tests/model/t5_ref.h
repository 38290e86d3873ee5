// tests/model/t5_ref.h — the committed transformers T5 references (tests/apps/ref/hf_t5_<variant>/,
// written by tests/reference/hf_t5_ref.py) that the T5 model tests compare against.
#pragma once
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace t5_test {

inline const std::string kRef = std::string(MPITRON_SOURCE_DIR) + "/tests/apps/ref/hf_t5_";

inline nlohmann::json ref_json(const std::string& variant) {
  std::ifstream f(kRef + variant + "/ref.json");
  REQUIRE_MESSAGE(f.good(), std::string(kRef + variant + "/ref.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace t5_test
