// model/inference/hf_config.h — one Hugging Face config.json as the converters read it
// (model/inference/hf_llama.cpp, hf_bert.cpp): parsed once, every key checked against the
// model class's list (a key that changes the model cannot be ignored), and typed getters
// whose errors name the key.
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mpitron {

class HfConfig {
 public:
  // text: config.json; cls: transformers' config class ("LlamaConfig"), named in type errors.
  // Throws when text is not a JSON object.
  HfConfig(const std::string& text, std::string cls);
  // Throws naming the first key not in `known`; `listed_in` is the header that documents the keys.
  void refuse_unknown(const std::set<std::string>& known, const std::string& listed_in) const;
  // An integer key >= 1 that must be there.
  int64_t need(const char* key) const;
  // key's value, or def when it is absent or null; a value of another type is an error.
  template <class T>
  T get_or(const char* key, T def) const {
    if (!j_.contains(key) || j_[key].is_null()) return def;
    try {
      return j_[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      MPT_THROW(str("HF config.json ", key, " = ", j_[key].dump(), " has the wrong type"),
                str("see transformers' ", cls_, " for the key's type"));
    }
  }
  const nlohmann::json& json() const { return j_; }

 private:
  nlohmann::json j_;
  std::string cls_;
};

}  // namespace mpitron
