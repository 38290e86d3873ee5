#include "model/inference/hf_config.h"

#include "core/json.h"

namespace mpitron {

HfConfig::HfConfig(const std::string& text, std::string cls) : cls_(std::move(cls)) {
  j_ = parse_json_text(text, "HF config.json");
  MPT_CHECK(j_.is_object(), "HF config.json is not a JSON object", "");
}

void HfConfig::refuse_unknown(const std::set<std::string>& known, const std::string& listed_in) const {
  for (auto it = j_.begin(); it != j_.end(); ++it)
    MPT_CHECK(known.count(it.key()), str("HF config.json key ", it.key(), " (", it.value().dump(), ") is not supported"),
              str("mpitron maps the ", cls_, " keys listed in ", listed_in, "; a key that changes the model cannot be "
                  "ignored"));
}

int64_t HfConfig::need(const char* key) const {
  MPT_CHECK(j_.contains(key) && j_[key].is_number_integer(), str("HF config.json has no integer ", key), "");
  const int64_t v = j_[key].get<int64_t>();
  MPT_CHECK(v >= 1, str("HF config.json ", key, " = ", v, " must be >= 1"), "");
  return v;
}

}  // namespace mpitron
