#include "model/inference/hf_convert.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "model/families.h"
#include "model/param_table.h"

namespace mpitron {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open ", path), "");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& what) {
  const json j = parse_json_text(text, what);  // bounded depth (core/json.h)
  MPT_CHECK(j.is_object(), str(what, " is not a JSON object"), "");
  return j;
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// The (unpadded) view of a row's values inside a ParamSet-shaped flat tensor.
Tensor row_view(const GPT& model, const Tensor& flat, const ParamSpec& spec) {
  const ParamInfo& p = model.params().info(spec.name);
  Tensor t = flat.flat_range(p.offset, p.numel()).view(p.shape);
  return spec.vocab ? t.slice(0, 0, model.config().vocab_size) : t;
}

// Rows of each HF part of a row: its TP parts (Q, K, V; gate, up), or the whole.
std::vector<int64_t> part_rows(const ParamSpec& spec) {
  if (spec.hf.size() == 1) return {spec.global_shape[0]};
  MPT_CHECK(spec.tp_axis == 0 && spec.tp_parts.size() == spec.hf.size(),
            str("internal: ", spec.name, " has ", spec.hf.size(), " HF parts but ", spec.tp_parts.size(), " row parts"), "");
  return spec.tp_parts;
}

const Family& exportable_family(const TransformerConfig& c) {
  std::string why;
  MPT_CHECK(hf_exportable(c, &why), str("the model has no Hugging Face class: ", why),
            "mpitron-to-hf exports the families of docs/model-families.md");
  return *config_family(c);
}

}  // namespace

const char* hf_torch_dtype(const std::string& dtype) {
  if (dtype == "F32") return "float32";
  if (dtype == "F16") return "float16";
  if (dtype == "BF16") return "bfloat16";
  MPT_THROW(str("export dtype ", dtype, " is not known"), "use F32, F16 or BF16");
}

HfCheckpoint read_hf_checkpoint(const std::string& dir) {
  HfCheckpoint ck;
  ck.dir = dir;
  const fs::path d(dir);
  MPT_CHECK(fs::is_directory(d), str(dir, " is not a directory"),
            "pass the Hugging Face model directory (config.json + model.safetensors[.index.json])");
  MPT_CHECK(fs::exists(d / "config.json"), str("no config.json in ", dir), "pass a Hugging Face model directory");
  ck.config_json = slurp_file((d / "config.json").string());
  const fs::path index = d / "model.safetensors.index.json", single = d / "model.safetensors";
  if (fs::exists(single)) {  // transformers' first choice, also when an index is there
    if (fs::exists(index))
      log_info(dir, " holds model.safetensors and model.safetensors.index.json: reading model.safetensors, as "
                    "transformers' from_pretrained does");
    ck.tensors = io::read_safetensors(single.string());
    for (const io::SafeTensor& t : ck.tensors.tensors) ck.file_of[t.name] = single.string();
    return ck;
  }
  MPT_CHECK(fs::exists(index), str("no model.safetensors or model.safetensors.index.json in ", dir),
            "only safetensors checkpoints are read (convert pytorch_model.bin with transformers' save_pretrained)");
  const json j = parse_json(slurp_file(index.string()), index.string());
  MPT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), str(index.string(), " has no weight_map object"),
            "it should map every tensor name to its shard file");
  std::map<std::string, std::vector<std::string>> by_file;  // shard → the tensors it should hold
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    MPT_CHECK(it.value().is_string(), str(index.string(), ": weight_map[", it.key(), "] is not a file name"), "");
    by_file[it.value().get<std::string>()].push_back(it.key());
  }
  for (auto& [file, names] : by_file) {
    const std::string path = (d / file).string();
    MPT_CHECK(fs::exists(path), str(index.string(), " names shard ", file, ", which is not in ", dir),
              "download every shard of the checkpoint");
    io::Safetensors shard = io::read_safetensors(path);
    for (const std::string& n : names)
      MPT_CHECK(shard.has(n), str("shard ", path, " has no tensor ", n, " (", index.string(), " says it does)"),
                "the download is incomplete or the index belongs to another checkpoint");
    for (io::SafeTensor& t : shard.tensors) {
      MPT_CHECK(!ck.file_of.count(t.name), str("tensor ", t.name, " is in both ", ck.file_of[t.name], " and ", path), "");
      ck.file_of[t.name] = path;
      ck.tensors.tensors.push_back(std::move(t));
    }
  }
  return ck;
}

HfCheckpoint hf_checkpoint_of_file(const std::string& path, std::string config_json) {
  HfCheckpoint ck;
  ck.dir = path;
  ck.config_json = std::move(config_json);
  ck.tensors = io::read_safetensors(path);
  for (const io::SafeTensor& t : ck.tensors.tensors) ck.file_of[t.name] = path;
  return ck;
}

std::string hf_model_type(const std::string& config_json) {
  return hf_family(parse_json(config_json, "HF config.json")).name;
}

TransformerConfig hf_config(const std::string& config_json, int64_t divisible_by) {
  const json j = parse_json(config_json, "HF config.json");
  const Family& fam = hf_family(j);
  TransformerConfig c;
  fam.hf_defaults(c);
  const auto key_of = [&](const std::string& k) -> const HfKey* {
    for (const HfKey& h : fam.hf_keys)
      if (h.key == k) return &h;
    return nullptr;
  };
  for (auto it = j.begin(); it != j.end(); ++it)
    MPT_CHECK(key_of(it.key()),
              str("HF config.json key ", it.key(), " (", it.value().dump(), ") is not a key of ", fam.hf_class,
                  " (model_type ", fam.hf_model_types[0], ") that mpitron knows"),
              "a key that changes the model cannot be ignored: docs/model-families.md lists each family's keys");
  for (const HfKey& h : fam.hf_keys) {
    const bool present = j.contains(h.key) && !j[h.key].is_null();
    MPT_CHECK(present || !h.required, str("HF config.json has no ", h.key), str(fam.hf_class, " needs it"));
    if (present && h.read) h.read(j[h.key], j, c);
    if (!j.contains(h.key) && h.absent) h.absent(c);
  }
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.padded_vocab_size = data::padded_vocab_size(c.vocab_size, 1, static_cast<int>(divisible_by));
  c.family_name = fam.name;  // the model keeps its identity (its HF class and names) through training
  if (c.window_size == 0) {  // no window (sliding_window null): every layer is global, whatever the pattern
    c.window_attn_skip_freq = 0;
    c.window_layer_pattern.clear();
    c.rotary_base_local = 0;
  }
  c.validate();
  return c;
}

TransformerConfig hf_file_config(const io::Safetensors& st, const std::string& config_json, int64_t num_attention_heads,
                                 int64_t divisible_by) {
  if (!config_json.empty()) {
    const Family& f = hf_family(parse_json(config_json, "HF config.json"));
    MPT_CHECK(f.hf_single_file, str("HF config.json is a ", f.hf_class, ": it is read from its model directory"),
              "pass the Hugging Face model directory (config.json + model.safetensors[.index.json])");
    TransformerConfig c = hf_config(config_json, divisible_by);
    MPT_CHECK(num_attention_heads == 0 || num_attention_heads == c.num_attention_heads,
              str("--num-attention-heads ", num_attention_heads, " contradicts the HF config's n_head ",
                  c.num_attention_heads),
              "drop --num-attention-heads: config.json gives it");
    return c;
  }
  const Family* single = nullptr;
  for (const Family& f : families())
    if (f.hf_single_file) single = &f;
  MPT_CHECK(single, "no family converts from a lone safetensors file", "");
  const Family& fam = *single;  // GPT-2: the names below are its HF column's
  std::string pre;
  bool found = false;
  for (const std::string& p : fam.hf_prefixes)
    if (!found && st.has(p + "wte.weight")) pre = p, found = true;
  MPT_CHECK(found, "safetensors file has neither transformer.wte.weight nor wte.weight: not a GPT-2 checkpoint",
            "convert a Hugging Face GPT2LMHeadModel / GPT2Model checkpoint");
  const Shape wte = st.at(pre + "wte.weight").shape, wpe = st.at(pre + "wpe.weight").shape;
  MPT_CHECK(wte.size() == 2 && wpe.size() == 2 && wte[1] == wpe[1],
            str("wte ", shape_str(wte), " and wpe ", shape_str(wpe), " are not (V, C) and (P, C)"), "");
  TransformerConfig c;
  int64_t layers = 0;
  while (st.has(str(pre, "h.", layers, ".ln_1.weight"))) ++layers;
  MPT_CHECK(layers >= 1, "safetensors file has no h.0.* tensors", "");
  c.num_layers = layers;
  c.hidden_size = wte[1];
  c.vocab_size = wte[0];
  c.max_position_embeddings = c.seq_length = wpe[0];
  const Shape fc = st.at(str(pre, "h.0.mlp.c_fc.weight")).shape;
  MPT_CHECK(fc.size() == 2 && fc[0] == c.hidden_size, str("h.0.mlp.c_fc.weight is ", shape_str(fc), ", expected (C, F)"), "");
  c.ffn_hidden_size = fc[1];
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  MPT_CHECK(num_attention_heads >= 1, "the number of attention heads is not in the weights",
            "pass the HF config.json (--hf-config) or --num-attention-heads");
  c.num_attention_heads = num_attention_heads;
  c.padded_vocab_size = data::padded_vocab_size(c.vocab_size, 1, static_cast<int>(divisible_by));
  c.validate();
  return c;
}

namespace {
// Rows of a matrix t (R, …) reordered: out row i = t row order[i] (inverse: out row order[i] = t row i).
Tensor reorder_rows(const Tensor& t, const std::vector<int64_t>& order, bool inverse) {
  const Tensor c = t.contiguous();
  Tensor out = Tensor::empty(c.shape(), c.dtype(), c.device());
  MPT_CHECK(static_cast<int64_t>(order.size()) == c.dim(0),
            str("internal: a row order of ", order.size(), " rows for a tensor of ", c.dim(0)), "");
  for (int64_t i = 0; i < c.dim(0); ++i) {
    const int64_t j = order[static_cast<size_t>(i)];
    (inverse ? out.slice(0, j, j + 1) : out.slice(0, i, i + 1)).copy_from(inverse ? c.slice(0, i, i + 1) : c.slice(0, j, j + 1));
  }
  return out;
}
// The expert-bias buffers' HF names of the layers that have one, with their layer.
std::vector<std::pair<int64_t, std::string>> expert_bias_names(const Family& fam, const TransformerConfig& c) {
  std::vector<std::pair<int64_t, std::string>> v;
  if (fam.hf_expert_bias.empty() || !c.moe_router_enable_expert_bias) return v;
  for (int64_t l = 0; l < c.num_layers + c.mtp_num_layers; ++l)  // the MTP blocks' routers too
    if (c.is_moe_layer(l)) {
      std::string n = fam.hf_expert_bias;
      const size_t at = n.find("{l}");
      if (at != std::string::npos) n.replace(at, 3, std::to_string(l));
      v.push_back({l, n});
    }
  return v;
}
// t × f, computed in f64 and rounded once to f32 (a factor of a power of 2 is exact).
Tensor scaled(const Tensor& t, double f) {
  std::vector<float> v = t.contiguous().to_floats();
  for (float& x : v) x = static_cast<float>(static_cast<double>(x) * f);
  return Tensor::from_vector(v, t.shape(), DType::F32);
}
}  // namespace

void load_hf_weights(const HfCheckpoint& ck, GPT& model) {
  const TransformerConfig& cfg = model.config();
  const Family& fam = exportable_family(cfg);
  const io::Safetensors& st = ck.tensors;
  const ParamSet& ps = model.params();
  ps.values().zero();
  const std::vector<ParamSpec> table = param_table(cfg);
  // The name prefix the checkpoint uses (GPT-2: "transformer." or none).
  std::string prefix = fam.hf_prefixes[0];
  for (const std::string& p : fam.hf_prefixes)
    if (st.has(p + table.front().hf.at(0))) {
      prefix = p;
      break;
    }
  // A tensor by name, or by an older spelling of it (TF-era BERT's LayerNorm gamma / beta).
  const auto find = [&](const std::string& name) {
    int64_t i = st.index(name);
    for (const auto& [now, old] : fam.hf_aliases)
      if (i < 0 && ends_with(name, now)) i = st.index(name.substr(0, name.size() - now.size()) + old);
    return i;
  };
  const auto file = [&](const std::string& name) {
    const auto it = ck.file_of.find(name);
    return it == ck.file_of.end() ? ck.dir : it->second;
  };
  std::vector<bool> used(st.tensors.size(), false);
  std::map<std::string, std::string> tied_to;  // tied HF tensor → the HF tensor it must equal
  for (const ParamSpec& spec : table) {
    MPT_CHECK(!spec.hf.empty(), str("internal: ", spec.name, " has no ", fam.hf_class, " name"), "");
    const Tensor dst = row_view(model, ps.values(), spec);
    const std::vector<int64_t> rows = part_rows(spec);
    int64_t row = 0;
    for (size_t k = 0; k < spec.hf.size(); ++k) {
      const std::string name = prefix + spec.hf[k];
      const int64_t i = find(name);
      MPT_CHECK(i >= 0, str("HF checkpoint ", ck.dir, " has no tensor ", name, " (looked in ", file(name), ")"),
                str("is it a complete ", fam.hf_class, " checkpoint matching its config.json?"));
      used[static_cast<size_t>(i)] = true;
      const std::string& found = st.tensors[static_cast<size_t>(i)].name;
      Tensor t = st.to_f32(found);
      if (spec.hf_transform == HfTransform::Transpose) {
        MPT_CHECK(t.ndim() == 2, str("HF tensor ", found, " is ", shape_str(t.shape()), ", expected a matrix"), "");
        t = t.transpose(0, 1).contiguous();
      }
      const bool whole = spec.hf.size() == 1;
      const Tensor part = whole ? dst : dst.slice(0, row, row + rows[k]);
      MPT_CHECK(t.shape() == part.shape(),
                str("HF tensor ", found, " in ", file(found), " is ",
                    shape_str(spec.hf_transform == HfTransform::Transpose ? st.at(found).shape : t.shape()),
                    spec.hf_transform == HfTransform::Transpose ? " (transposed on import)" : "", ", but mpitron's ",
                    spec.name, whole ? std::string() : str(" (rows ", row, "..", row + rows[k], ")"), " needs ",
                    shape_str(part.shape())),
                "config.json does not match the weights");
      if (!spec.hf_factor.empty() && spec.hf_factor[k] != 1.0) t = scaled(t, spec.hf_factor[k]);
      if (!spec.hf_rows.empty()) t = reorder_rows(t, spec.hf_rows, false);
      part.copy_from(t.to(part.dtype()));
      row += rows[k];
    }
    for (const std::string& t : spec.hf_tied) tied_to[t] = prefix + spec.hf[0];
  }
  // The routers' expert biases (buffers, not parameters).
  for (const auto& [layer, bias] : expert_bias_names(fam, cfg)) {
    const int64_t i = find(prefix + bias);
    MPT_CHECK(i >= 0, str("HF checkpoint ", ck.dir, " has no tensor ", prefix + bias), "its config asks for expert biases");
    used[static_cast<size_t>(i)] = true;
    const Tensor t = st.to_f32(st.tensors[static_cast<size_t>(i)].name);
    MPT_CHECK(t.numel() == cfg.num_experts, str("HF tensor ", bias, " holds ", t.numel(), " values for ", cfg.num_experts, " experts"), "");
    if (model.holds_layer(layer)) model.block_params(layer).expert_bias.copy_from(t.contiguous().view({cfg.num_experts}).to(model.device()));
  }
  bool skipped = false;
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    if (used[i]) continue;
    const std::string& name = st.tensors[i].name;
    if (fam.hf_skip && fam.hf_skip(cfg, name)) {
      if (!skipped) log_warn("HF checkpoint ", ck.dir, ": ", name, " and the tensors like it are not read (", fam.hf_class,
                             "'s multi-token prediction modules: their copies of the embedding and output layer, "
                             "or depths past num_nextn_predict_layers)");
      skipped = true;
      continue;
    }
    bool buffer = false;
    for (const std::string& b : fam.hf_buffers) buffer |= name.find(b) != std::string::npos;
    if (buffer) continue;
    const auto t = tied_to.find(name);
    if (t != tied_to.end()) {
      const Tensor a = st.to_f32(name), w = st.to_f32(st.tensors[static_cast<size_t>(find(t->second))].name);
      MPT_CHECK(a.shape() == w.shape() && a.to_floats() == w.to_floats(),
                str(name, " in ", file(name), " differs from ", t->second, ", which ", fam.hf_class, " ties it to"),
                "an untied output layer: set tie_word_embeddings false in config.json if the family has one");
      continue;
    }
    MPT_THROW(str("HF tensor ", name, " in ", file(name), " is not part of a ", fam.hf_class, " with this config.json"),
              "check num_hidden_layers and the keys that add tensors (biases, tie_word_embeddings); task heads "
              "(…ForSequenceClassification) are not converted");
  }
}

std::unique_ptr<GPT> gpt_from_hf(const HfCheckpoint& ck, const TransformerConfig& cfg) {
  auto model = std::make_unique<GPT>(cfg, Device::cpu());
  load_hf_weights(ck, *model);
  return model;
}

std::unique_ptr<GPT> gpt_from_hf(const io::Safetensors& st, const TransformerConfig& cfg) {
  HfCheckpoint ck;
  ck.dir = "the safetensors tensors";
  ck.tensors = st;
  return gpt_from_hf(ck, cfg);
}

std::unique_ptr<Bert> bert_from_hf(const HfCheckpoint& ck, const TransformerConfig& cfg) {
  auto model = std::make_unique<Bert>(cfg, Device::cpu());
  load_hf_weights(ck, model->core());
  return model;
}

std::unique_ptr<T5> t5_from_hf(const HfCheckpoint& ck, const TransformerConfig& cfg) {
  auto model = std::make_unique<T5>(cfg, Device::cpu());
  load_hf_weights(ck, model->core());
  return model;
}

bool hf_exportable(const TransformerConfig& c, std::string* why) {
  const Family* fam = config_family(c);
  const Family& f = fam ? *fam : !c.family_name.empty() ? find_family(c.family_name) : closest_family(c);
  const std::string misses = family_misses(f, c, /*hf=*/true);
  if (why) *why = misses.empty() ? misses : str("a ", f.hf_class, " needs ", misses);
  return misses.empty();
}

io::Safetensors hf_from_gpt(const GPT& model, const HfExportOptions& o, const Tensor* flat) {
  const TransformerConfig& c = model.config();
  const Family& fam = exportable_family(c);
  hf_torch_dtype(o.dtype);  // validates
  const std::string prefix = o.prefix ? *o.prefix : fam.hf_prefixes[0];
  bool known = false;
  for (const std::string& p : fam.hf_prefixes) known |= p == prefix;
  MPT_CHECK(known, str("tensor name prefix \"", prefix, "\" is not one ", fam.hf_class, " has"), "");
  MPT_CHECK(!o.lm_head || fam.hf_lm_head_copy, str("a copy of the tied head is GPT-2's option, not ", fam.hf_class, "'s"),
            "");
  const Tensor values = (flat ? *flat : model.params().values()).to(Device::cpu()).to(DType::F32);
  io::Safetensors st;
  std::vector<std::pair<std::string, Tensor>> copies;
  for (const ParamSpec& spec : param_table(c)) {
    const Tensor t = row_view(model, values, spec);
    const std::vector<int64_t> rows = part_rows(spec);
    int64_t row = 0;
    for (size_t k = 0; k < spec.hf.size(); ++k) {
      Tensor part = spec.hf.size() == 1 ? t : t.slice(0, row, row + rows[k]);
      if (spec.hf_transform == HfTransform::Transpose) part = part.transpose(0, 1);
      if (!spec.hf_factor.empty() && spec.hf_factor[k] != 1.0)  // values: ours / factor; gradients: ours × factor
        part = scaled(part.contiguous(), o.gradients ? spec.hf_factor[k] : 1.0 / spec.hf_factor[k]);
      if (!spec.hf_rows.empty()) part = reorder_rows(part, spec.hf_rows, true);
      st.add_f32(prefix + spec.hf[k], part.contiguous(), o.dtype);
      row += rows[k];
    }
    if (fam.hf_write_tied)
      for (const std::string& name : spec.hf_tied) copies.push_back({name, t.contiguous()});
    else if (o.lm_head && !spec.hf_tied.empty())
      copies.push_back({spec.hf_tied[0], t.contiguous()});
  }
  for (const auto& [name, t] : copies) st.add_f32(name, t, o.dtype);
  if (!o.gradients)
    for (const auto& [layer, bias] : expert_bias_names(fam, c))
      if (model.holds_layer(layer)) st.add_f32(prefix + bias, model.block_params(layer).expert_bias.to(Device::cpu()), o.dtype);
  st.metadata["format"] = "pt";
  return st;
}

std::string hf_config_json(const TransformerConfig& c, const std::string& dtype) {
  const Family& fam = exportable_family(c);
  json j = {{"architectures", {fam.hf_class}}, {"model_type", fam.hf_model_types[0]}};
  for (const HfKey& h : fam.hf_keys)
    if (h.write) j[h.key] = h.write(c);
  j["torch_dtype"] = hf_torch_dtype(dtype);
  return j.dump(2);
}

}  // namespace mpitron
