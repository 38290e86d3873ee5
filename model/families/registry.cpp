// The registry of families (model/families.h): their order (family_of tries them in it), lookups,
// and the HF column of the parameter table.
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

namespace {

std::vector<Family> build() {
  return {bert_family(), t5_family(), gpt2_family(), llama_family(), qwen2_family(), mistral_family(),
          gemma_family(), mixtral_family(), qwen2_moe_family(), qwen3_family(), qwen3_moe_family(),
          gemma2_family(), gemma3_family(), olmo2_family(), phi3_family(),
          deepseek_v3_family()};
}

}  // namespace


const std::vector<Family>& families() {
  static const std::vector<Family> rows = build();
  return rows;
}

const Family& find_family(const std::string& name) {
  std::string names;
  for (const Family& f : families()) {
    if (f.name == name) return f;
    names += (names.empty() ? "" : ", ") + f.name;
  }
  MPT_THROW(str("model family ", name, " is not known"), str("the families are ", names));
}

const Family* family_of(const TransformerConfig& c) {
  for (const Family& f : families())
    if (family_misses(f, c).empty()) return &f;
  return nullptr;
}

const Family* config_family(const TransformerConfig& c) {
  if (!c.family_name.empty()) {
    const Family& f = find_family(c.family_name);
    if (family_misses(f, c).empty()) return &f;
  }
  return family_of(c);
}

std::string family_misses(const Family& f, const TransformerConfig& c, bool hf) {
  std::string out;
  for (const std::vector<FamilyPin>* pins : {&f.pins, &f.hf_pins}) {
    if (pins == &f.hf_pins && !hf) break;
    for (const FamilyPin& p : *pins)
      if (!p.ok(c)) out += (out.empty() ? "" : " ") + p.need;
  }
  return out;
}

const Family& closest_family(const TransformerConfig& c) {
  const Family* best = nullptr;
  size_t fewest = 0;
  for (const Family& f : families()) {
    size_t n = 0;
    for (const std::vector<FamilyPin>* pins : {&f.pins, &f.hf_pins})
      for (const FamilyPin& p : *pins) n += p.ok(c) ? 0 : 1;
    if (!best || n < fewest) best = &f, fewest = n;
  }
  return *best;
}

}  // namespace mpitron

namespace mpitron {

const Family& hf_family(const nlohmann::json& config) {
  if (config.contains("model_type") && config["model_type"].is_string()) {
    const std::string t = config["model_type"].get<std::string>();
    for (const Family& f : families())
      for (const std::string& m : f.hf_model_types)
        if (m == t) return f;
    std::string known;
    for (const Family& f : families()) known += (known.empty() ? "" : ", ") + f.hf_model_types[0];
    MPT_THROW(str("HF config.json model_type ", t, " is not a family mpitron converts"),
              str("the model types it converts: ", known, " (docs/model-families.md)"));
  }
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    const std::string a = config["architectures"][0].get<std::string>();
    for (const Family& f : families())
      for (const std::string& k : f.hf_classes_read)
        if (k == a) return f;
    std::string known;
    for (const Family& f : families())
      for (const std::string& k : f.hf_classes_read) known += (known.empty() ? "" : ", ") + k;
    MPT_THROW(str("HF config.json has no model_type and architecture ", a, " is not known"),
              str("mpitron converts ", known));
  }
  MPT_THROW("HF config.json has neither model_type nor architectures", "is it a Hugging Face config.json?");
}

double hf_short_float(float f) {
  for (int p = 6; p < 10; ++p) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*g", p, static_cast<double>(f));
    if (std::strtof(b, nullptr) == f) return std::strtod(b, nullptr);
  }
  return f;
}

}  // namespace mpitron

namespace mpitron {

using family_kit::nm;

void add_moe_names(HfNames& names, const HfMoeNames& n) {
  using R = ParamRole;
  const std::string m = "model.layers.{l}." + n.block, e = m + "experts.{e}.", sh = m + n.shared;
  names[R::RouterWeight] = nm({m + n.router + ".weight"});
  names[R::ExpertFcWeight] = nm({e + n.gate + ".weight", e + n.up + ".weight"});
  names[R::ExpertProjWeight] = nm({e + n.down + ".weight"});
  if (!n.shared.empty()) {
    names[R::SharedFcWeight] = nm({sh + n.gate + ".weight", sh + n.up + ".weight"});
    names[R::SharedProjWeight] = nm({sh + n.down + ".weight"});
    names[R::SharedGateWeight] = nm({m + n.shared_gate + ".weight"});
  }
}

void hf_name_rows(const Family& f, const TransformerConfig& c, std::vector<ParamSpec>& rows) {
  for (ParamSpec& r : rows) {
    const auto it = f.hf_names.find(r.role);
    if (it == f.hf_names.end()) continue;
    HfName n = it->second;
    if (n.adjust) n.adjust(c, r, n);
    const auto resolve = [&](std::string s) {
      for (size_t at = s.find('{'); at != std::string::npos; at = s.find('{', at)) {
        const size_t end = s.find('}', at);
        const std::string var = s.substr(at + 1, end - at - 1);
        const std::string val = var == "l" ? std::to_string(r.layer) : var == "e" ? std::to_string(r.expert)
                                : f.hf_var ? f.hf_var(c, r.layer, var) : "";
        MPT_CHECK(!val.empty() || var == "l" || var == "e", str("family ", f.name, ": no value for {", var, "} in ", s), "");
        s.replace(at, end - at + 1, val);
        at += val.size();
      }
      return s;
    };
    r.hf.clear();
    for (const std::string& x : n.names) r.hf.push_back(resolve(x));
    r.hf_transform = n.transform;
    r.hf_tied = n.tied;
    r.hf_factor = n.factor;
    r.hf_rows = n.rows;
  }
}

}  // namespace mpitron

