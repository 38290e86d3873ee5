#include "model/inference/hf_llama.h"
#include "model/inference/hf_config.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer.h"

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
  return parse_json_text(text, what);
}

// One mpitron tensor and the HF tensors whose rows make it up (one, or q|k|v, or gate|up).
struct LlamaName {
  std::string ours;
  std::vector<std::string> hf;
};

std::vector<LlamaName> llama_names(const GPTConfig& c) {
  std::vector<LlamaName> v{{"wte", {"model.embed_tokens.weight"}}};
  const bool b = c.add_bias_linear;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string h = str("model.layers.", l, "."), o = str("layers.", l, ".");
    const std::string a = h + "self_attn.", m = h + "mlp.";
    v.push_back({o + "ln1.weight", {h + "input_layernorm.weight"}});
    v.push_back({o + "attn.qkv.weight", {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}});
    if (b) v.push_back({o + "attn.qkv.bias", {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}});
    v.push_back({o + "attn.proj.weight", {a + "o_proj.weight"}});
    if (b) v.push_back({o + "attn.proj.bias", {a + "o_proj.bias"}});
    v.push_back({o + "ln2.weight", {h + "post_attention_layernorm.weight"}});
    v.push_back({o + "mlp.fc.weight", {m + "gate_proj.weight", m + "up_proj.weight"}});
    if (b) v.push_back({o + "mlp.fc.bias", {m + "gate_proj.bias", m + "up_proj.bias"}});
    v.push_back({o + "mlp.proj.weight", {m + "down_proj.weight"}});
    if (b) v.push_back({o + "mlp.proj.bias", {m + "down_proj.bias"}});
  }
  v.push_back({"lnf.weight", {"model.norm.weight"}});
  if (c.untie_embeddings) v.push_back({"head.weight", {"lm_head.weight"}});
  return v;
}

// Rows of each HF part of `ours` (the parameter table's TP parts: Q, K, V or gate, up).
std::vector<int64_t> part_rows(const GPTConfig& c, const std::string& ours, size_t parts) {
  if (parts == 1) return {};
  const int64_t q = c.num_attention_heads * c.head_dim(), kv = c.query_groups() * c.head_dim();
  if (parts == 3) return {q, kv, kv};
  MPT_CHECK(parts == 2 && c.swiglu, str("internal: ", ours, " has ", parts, " HF parts"), "");
  return {c.ffn(), c.ffn()};
}

bool is_vocab(const std::string& ours) { return ours == "wte" || ours == "head.weight"; }

// The (unpadded) view of parameter `ours` inside a ParamSet-shaped flat tensor.
Tensor param_view(const GPT& model, const Tensor& flat, const std::string& ours) {
  const ParamInfo& p = model.params().info(ours);
  Tensor t = flat.flat_range(p.offset, p.numel()).view(p.shape);
  return is_vocab(ours) ? t.slice(0, 0, model.config().vocab_size) : t;
}

}  // namespace

double hf_short_float(float f) {
  for (int p = 6; p < 10; ++p) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*g", p, static_cast<double>(f));
    if (std::strtof(b, nullptr) == f) return std::strtod(b, nullptr);
  }
  return f;
}

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
  if (fs::exists(index)) {
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
  } else {
    MPT_CHECK(fs::exists(single), str("no model.safetensors.index.json or model.safetensors in ", dir),
              "only safetensors checkpoints are read (convert pytorch_model.bin with transformers' save_pretrained)");
    ck.tensors = io::read_safetensors(single.string());
    for (const io::SafeTensor& t : ck.tensors.tensors) ck.file_of[t.name] = single.string();
  }
  return ck;
}

std::string hf_model_type(const std::string& config_json) {
  const json j = parse_json(config_json, "HF config.json");
  if (j.contains("model_type") && j["model_type"].is_string()) return j["model_type"].get<std::string>();
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    const std::string a = j["architectures"][0].get<std::string>();
    if (a == "GPT2LMHeadModel" || a == "GPT2Model") return "gpt2";
    if (a == "LlamaForCausalLM") return "llama";
    if (a == "MistralForCausalLM") return "mistral";
    if (a == "BertForPreTraining" || a == "BertForMaskedLM") return "bert";
    MPT_THROW(str("HF config.json has no model_type and architecture ", a, " is not known"),
              "mpitron converts GPT-2, Llama (LlamaForCausalLM, MistralForCausalLM without sliding window) and "
              "BERT (BertForPreTraining)");
  }
  MPT_THROW("HF config.json has neither model_type nor architectures", "is it a Hugging Face config.json?");
}

GPTConfig hf_llama_config(const std::string& config_json, int64_t divisible_by) {
  const HfConfig cfg(config_json, "LlamaConfig");
  const json& j = cfg.json();
  const std::string type = hf_model_type(config_json);
  MPT_CHECK(type != "qwen2", "HF model_type qwen2 has biases on q/k/v but not on o_proj and the MLP",
            "mpitron's --disable-bias-linear is all or nothing; Qwen2 checkpoints cannot be converted yet");
  MPT_CHECK(type == "llama" || type == "mistral", str("HF model_type ", type, " is not a Llama-family model"),
            "convert LlamaForCausalLM or MistralForCausalLM checkpoints (GPT-2 has its own path)");
  // Keys that do not change the forward math.
  static const std::set<std::string> benign{
      "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "bos_token_id",
      "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout", "pretraining_tp",
      "output_attentions", "output_hidden_states", "return_dict", "tokenizer_class", "_attn_implementation",
      "max_window_layers", "use_sliding_window", "tie_word_embeddings", "hidden_size", "intermediate_size",
      "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "rms_norm_eps", "rope_theta",
      "max_position_embeddings", "vocab_size", "attention_bias", "mlp_bias", "hidden_act", "rope_scaling",
      "partial_rotary_factor", "head_dim", "sliding_window"};
  cfg.refuse_unknown(benign, "model/inference/hf_llama.h");
  const auto need = [&](const char* key) { return cfg.need(key); };
  const auto get_or = [&](const char* key, auto def) { return cfg.get_or(key, def); };
  GPTConfig c;
  c.hidden_size = need("hidden_size");
  c.ffn_hidden_size = need("intermediate_size");
  c.num_attention_heads = need("num_attention_heads");
  c.num_layers = need("num_hidden_layers");
  c.vocab_size = need("vocab_size");
  c.num_query_groups = get_or("num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = get_or("max_position_embeddings", int64_t{2048});
  c.seq_length = c.max_position_embeddings;
  c.layernorm_epsilon = static_cast<float>(get_or("rms_norm_eps", 1e-6));
  c.rotary_base = get_or("rope_theta", 10000.0);
  c.rotary_percent = get_or("partial_rotary_factor", 1.0);
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.position_embedding = PositionEmbedding::Rope;
  c.untie_embeddings = !get_or("tie_word_embeddings", false);
  const bool attn_bias = get_or("attention_bias", false), mlp_bias = get_or("mlp_bias", false);
  MPT_CHECK(attn_bias == mlp_bias, str("HF config.json attention_bias = ", attn_bias, " but mlp_bias = ", mlp_bias),
            "mpitron has biases on every linear or on none (--disable-bias-linear)");
  c.add_bias_linear = attn_bias;
  const std::string act = get_or("hidden_act", std::string("silu"));
  MPT_CHECK(act == "silu" || act == "swish", str("HF config.json hidden_act = ", act, " is not supported"),
            "mpitron's SwiGLU gates with silu");
  MPT_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
            str("HF config.json rope_scaling = ", j.contains("rope_scaling") ? j["rope_scaling"].dump() : "", " is not supported"),
            "mpitron's rope has no scaling (linear, dynamic, yarn, llama3); only rope_scaling null converts");
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    MPT_CHECK(j["head_dim"].get<int64_t>() * c.num_attention_heads == c.hidden_size,
              str("HF config.json head_dim = ", j["head_dim"].dump(), " is not hidden_size / num_attention_heads = ",
                  c.hidden_size / c.num_attention_heads),
              "mpitron's head dim is hidden_size / num_attention_heads");
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() && get_or("use_sliding_window", true))
    MPT_CHECK(j["sliding_window"].get<int64_t>() >= c.max_position_embeddings,
              str("HF config.json sliding_window = ", j["sliding_window"].dump(), " (below max_position_embeddings ",
                  c.max_position_embeddings, ") is not supported"),
              "mpitron's attention is full causal attention");
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.padded_vocab_size = data::padded_vocab_size(c.vocab_size, 1, static_cast<int>(divisible_by));
  c.validate();
  return c;
}

std::unique_ptr<GPT> gpt_from_hf_llama(const HfCheckpoint& ck, const GPTConfig& cfg) {
  const io::Safetensors& st = ck.tensors;
  auto model = std::make_unique<GPT>(cfg, Device::cpu());
  const ParamSet& ps = model->params();
  ps.values().zero();
  std::vector<bool> used(st.tensors.size(), false);
  const auto file = [&](const std::string& name) {
    const auto it = ck.file_of.find(name);
    return it == ck.file_of.end() ? ck.dir : it->second;
  };
  for (const LlamaName& n : llama_names(cfg)) {
    const Tensor dst = param_view(*model, ps.values(), n.ours);
    const std::vector<int64_t> rows = part_rows(cfg, n.ours, n.hf.size());
    int64_t row = 0;
    for (size_t k = 0; k < n.hf.size(); ++k) {
      const std::string& name = n.hf[k];
      const int64_t i = st.index(name);
      MPT_CHECK(i >= 0, str("HF checkpoint ", ck.dir, " has no tensor ", name, " (looked in ", file(name), ")"),
                "is it a complete LlamaForCausalLM checkpoint matching its config.json?");
      used[static_cast<size_t>(i)] = true;
      const Tensor part = rows.empty() ? dst : dst.slice(0, row, row + rows[k]);
      const Tensor t = st.to_f32(name);
      MPT_CHECK(t.shape() == part.shape(),
                str("HF tensor ", name, " in ", file(name), " is ", shape_str(t.shape()), ", but mpitron's ", n.ours,
                    rows.empty() ? std::string() : str(" (rows ", row, "..", row + rows[k], ")"), " needs ",
                    shape_str(part.shape())),
                "config.json does not match the weights");
      part.copy_from(t);
      if (!rows.empty()) row += rows[k];
    }
  }
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    if (used[i]) continue;
    const std::string& name = st.tensors[i].name;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // a buffer older checkpoints saved
    if (name == "lm_head.weight" && !cfg.untie_embeddings) {
      const Tensor a = st.to_f32(name), w = st.to_f32("model.embed_tokens.weight");
      MPT_CHECK(a.shape() == w.shape() && a.to_floats() == w.to_floats(),
                str("lm_head.weight in ", file(name), " differs from model.embed_tokens.weight, but config.json says "
                    "tie_word_embeddings true"),
                "set tie_word_embeddings false in config.json if the head is its own matrix");
      continue;
    }
    MPT_THROW(str("HF tensor ", name, " in ", file(name), " is not part of a Llama model with this config.json"),
              "check attention_bias / mlp_bias / tie_word_embeddings / num_hidden_layers");
  }
  return model;
}

bool hf_llama_exportable(const GPTConfig& c, std::string* why) {
  std::string w;
  if (c.normalization != Normalization::RMSNorm) w += " --normalization RMSNorm";
  if (!c.swiglu) w += " --swiglu";
  if (c.position_embedding != PositionEmbedding::Rope) w += " --position-embedding-type rope";
  if (c.rotary_percent != 1.0) w += " --rotary-percent 1 (LlamaForCausalLM rotates every head dim)";
  if (why) *why = w.empty() ? w : "a LlamaForCausalLM needs" + w;
  return w.empty();
}

io::Safetensors hf_llama_from_gpt(const GPT& model, const std::string& dtype, const Tensor* flat) {
  const GPTConfig& c = model.config();
  std::string why;
  MPT_CHECK(hf_llama_exportable(c, &why), str("the model is not a Llama: ", why), "");
  hf_torch_dtype(dtype);  // validates
  const Tensor values = (flat ? *flat : model.params().values()).to(Device::cpu()).to(DType::F32);
  io::Safetensors st;
  for (const LlamaName& n : llama_names(c)) {
    const Tensor t = param_view(model, values, n.ours);
    const std::vector<int64_t> rows = part_rows(c, n.ours, n.hf.size());
    int64_t row = 0;
    for (size_t k = 0; k < n.hf.size(); ++k) {
      st.add_f32(n.hf[k], (rows.empty() ? t : t.slice(0, row, row + rows[k])).contiguous(), dtype);
      if (!rows.empty()) row += rows[k];
    }
  }
  st.metadata["format"] = "pt";
  return st;
}

std::string hf_llama_config_json(const GPTConfig& c, const std::string& dtype) {
  const json j = {{"architectures", {"LlamaForCausalLM"}},
                  {"model_type", "llama"},
                  {"hidden_act", "silu"},
                  {"hidden_size", c.hidden_size},
                  {"intermediate_size", c.ffn()},
                  {"num_attention_heads", c.num_attention_heads},
                  {"num_key_value_heads", c.query_groups()},
                  {"num_hidden_layers", c.num_layers},
                  {"max_position_embeddings", c.max_position_embeddings},
                  {"vocab_size", c.vocab_size},
                  {"rms_norm_eps", hf_short_float(c.layernorm_epsilon)},
                  {"rope_theta", c.rotary_base},
                  {"rope_scaling", nullptr},
                  {"tie_word_embeddings", !c.untie_embeddings},
                  {"attention_bias", c.add_bias_linear},
                  {"mlp_bias", c.add_bias_linear},
                  {"attention_dropout", 0.0},
                  {"torch_dtype", hf_torch_dtype(dtype)}};
  return j.dump(2);
}

}  // namespace mpitron
