#include "model/inference/hf_bert.h"
#include "model/inference/hf_config.h"

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mpitron {

namespace {

using nlohmann::json;

// One mpitron tensor and the HF tensors whose rows make it up (one, or query|key|value).
struct BertName {
  std::string ours;
  std::vector<std::string> hf;
};

std::vector<BertName> bert_names(const GPTConfig& c) {
  const std::string e = "bert.embeddings.";
  std::vector<BertName> v{{"wte", {e + "word_embeddings.weight"}},
                          {"wpe", {e + "position_embeddings.weight"}},
                          {"tokentype_embeddings", {e + "token_type_embeddings.weight"}},
                          {"emb_ln.weight", {e + "LayerNorm.weight"}},
                          {"emb_ln.bias", {e + "LayerNorm.bias"}}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string h = str("bert.encoder.layer.", l, "."), o = str("layers.", l, ".");
    const std::string s = h + "attention.self.";
    for (const char* wb : {"weight", "bias"}) {
      const std::string x = wb;
      v.push_back({o + "attn.qkv." + x, {s + "query." + x, s + "key." + x, s + "value." + x}});
      v.push_back({o + "attn.proj." + x, {h + "attention.output.dense." + x}});
      v.push_back({o + "ln1." + x, {h + "attention.output.LayerNorm." + x}});
      v.push_back({o + "mlp.fc." + x, {h + "intermediate.dense." + x}});
      v.push_back({o + "mlp.proj." + x, {h + "output.dense." + x}});
      v.push_back({o + "ln2." + x, {h + "output.LayerNorm." + x}});
    }
  }
  const std::string p = "cls.predictions.";
  for (const char* wb : {"weight", "bias"}) {
    const std::string x = wb;
    v.push_back({"pooler.dense." + x, {"bert.pooler.dense." + x}});
    v.push_back({"lm_head.dense." + x, {p + "transform.dense." + x}});
    v.push_back({"lm_head.ln." + x, {p + "transform.LayerNorm." + x}});
    v.push_back({"binary_head." + x, {"cls.seq_relationship." + x}});
  }
  v.push_back({"lm_head.bias", {p + "bias"}});
  return v;
}

bool is_vocab(const std::string& ours) { return ours == "wte" || ours == "lm_head.bias"; }

// The (unpadded) view of parameter `ours` inside a ParamSet-shaped flat tensor.
Tensor param_view(const GPT& model, const Tensor& flat, const std::string& ours) {
  const ParamInfo& p = model.params().info(ours);
  Tensor t = flat.flat_range(p.offset, p.numel()).view(p.shape);
  return is_vocab(ours) ? t.slice(0, 0, model.config().vocab_size) : t;
}

}  // namespace

GPTConfig hf_bert_config(const std::string& config_json, int64_t divisible_by) {
  const HfConfig cfg(config_json, "BertConfig");
  const json& j = cfg.json();
  const std::string type = hf_model_type(config_json);
  MPT_CHECK(type == "bert", str("HF model_type ", type, " is not BERT"),
            "convert BertForPreTraining checkpoints (model_type bert) here");
  // architectures is not checked: the hub's pre-trained BERTs say BertForMaskedLM yet hold the
  // BertForPreTraining tensors. The tensors decide (a missing head or a task head's extra
  // tensors are named by bert_from_hf).
  // Keys that do not change the forward math in evaluation.
  static const std::set<std::string> known{
      "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "bos_token_id",
      "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "hidden_dropout_prob",
      "attention_probs_dropout_prob", "classifier_dropout", "output_attentions", "output_hidden_states",
      "return_dict", "tokenizer_class", "_attn_implementation", "gradient_checkpointing", "directionality",
      "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head",
      "pooler_type", "chunk_size_feed_forward",
      // mapped or checked below
      "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings",
      "type_vocab_size", "vocab_size", "layer_norm_eps", "hidden_act", "position_embedding_type", "is_decoder",
      "add_cross_attention", "tie_word_embeddings"};
  cfg.refuse_unknown(known, "model/inference/hf_bert.h");
  const auto need = [&](const char* key) { return cfg.need(key); };
  const auto get_or = [&](const char* key, auto def) { return cfg.get_or(key, def); };
  GPTConfig c;
  c.bert = true;
  c.causal = false;
  c.post_ln = true;
  c.binary_head = true;
  c.hidden_size = need("hidden_size");
  c.num_layers = need("num_hidden_layers");
  c.num_attention_heads = need("num_attention_heads");
  c.ffn_hidden_size = need("intermediate_size");
  c.vocab_size = need("vocab_size");
  // BertConfig's defaults where a key is absent.
  c.max_position_embeddings = get_or("max_position_embeddings", int64_t{512});
  c.seq_length = c.max_position_embeddings;
  c.num_tokentypes = get_or("type_vocab_size", int64_t{2});
  MPT_CHECK(c.num_tokentypes >= 1, str("HF config.json type_vocab_size = ", c.num_tokentypes, " must be >= 1"), "");
  c.layernorm_epsilon = static_cast<float>(get_or("layer_norm_eps", 1e-12));
  const std::string act = get_or("hidden_act", std::string("gelu"));
  MPT_CHECK(act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh",
            str("HF config.json hidden_act = ", act, " is not supported"),
            "mpitron's BERT has \"gelu\" (exact, erf) and \"gelu_new\" / \"gelu_pytorch_tanh\" (tanh approximation)");
  c.gelu_exact = act == "gelu";
  const std::string pos = get_or("position_embedding_type", std::string("absolute"));
  MPT_CHECK(pos == "absolute", str("HF config.json position_embedding_type = ", pos, " is not supported"),
            "mpitron's BERT has learned absolute positions only (relative_key attention is not implemented)");
  MPT_CHECK(!get_or("is_decoder", false), "HF config.json is_decoder = true is not supported",
            "mpitron's BERT is the bidirectional encoder");
  MPT_CHECK(!get_or("add_cross_attention", false), "HF config.json add_cross_attention = true is not supported",
            "mpitron's BERT has no cross-attention");
  MPT_CHECK(get_or("tie_word_embeddings", true), "HF config.json tie_word_embeddings = false is not supported",
            "mpitron's BERT decoder is the word embedding matrix (tied)");
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.padded_vocab_size = data::padded_vocab_size(c.vocab_size, 1, static_cast<int>(divisible_by));
  c.validate();
  return c;
}

std::unique_ptr<Bert> bert_from_hf(const HfCheckpoint& ck, const GPTConfig& cfg) {
  const io::Safetensors& st = ck.tensors;
  auto model = std::make_unique<Bert>(cfg, Device::cpu());
  const GPT& core = model->core();
  const ParamSet& ps = core.params();
  ps.values().zero();
  std::vector<bool> used(st.tensors.size(), false);
  const auto file = [&](const std::string& name) {
    const auto it = ck.file_of.find(name);
    return it == ck.file_of.end() ? ck.dir : it->second;
  };
  // TF-era checkpoints name LayerNorm parameters gamma / beta (transformers renames them on load).
  const auto find = [&](const std::string& name) {
    int64_t i = st.index(name);
    const size_t dot = name.rfind('.');
    const std::string stem = name.substr(0, dot + 1), leaf = name.substr(dot + 1);
    if (i < 0 && name.find("LayerNorm.") != std::string::npos && (leaf == "weight" || leaf == "bias"))
      i = st.index(stem + (leaf == "weight" ? "gamma" : "beta"));
    return i;
  };
  for (const BertName& n : bert_names(cfg)) {
    const Tensor dst = param_view(core, ps.values(), n.ours);
    const int64_t rows = n.hf.size() == 1 ? 0 : dst.dim(0) / static_cast<int64_t>(n.hf.size());  // q|k|v: C each
    for (size_t k = 0; k < n.hf.size(); ++k) {
      const std::string& name = n.hf[k];
      const int64_t i = find(name);
      MPT_CHECK(i >= 0, str("HF checkpoint ", ck.dir, " has no tensor ", name, " (looked in ", file(name), ")"),
                "is it a complete BertForPreTraining checkpoint matching its config.json?");
      used[static_cast<size_t>(i)] = true;
      const int64_t r0 = static_cast<int64_t>(k) * rows;
      const Tensor part = rows == 0 ? dst : dst.slice(0, r0, r0 + rows);
      const Tensor t = st.to_f32(st.tensors[static_cast<size_t>(i)].name);
      MPT_CHECK(t.shape() == part.shape(),
                str("HF tensor ", name, " in ", file(name), " is ", shape_str(t.shape()), ", but mpitron's ", n.ours,
                    rows == 0 ? std::string() : str(" (rows ", r0, "..", r0 + rows, ")"), " needs ",
                    shape_str(part.shape())),
                "config.json does not match the weights");
      part.copy_from(t);
    }
  }
  // The tied decoder: accepted when it equals what it is tied to.
  const std::map<std::string, std::string> tied{{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
                                                {"cls.predictions.decoder.bias", "cls.predictions.bias"}};
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    if (used[i]) continue;
    const std::string& name = st.tensors[i].name;
    if (name == "bert.embeddings.position_ids" || name == "bert.embeddings.token_type_ids") continue;  // buffers
    const auto t = tied.find(name);
    if (t != tied.end()) {
      const Tensor a = st.to_f32(name), w = st.to_f32(t->second);
      MPT_CHECK(a.shape() == w.shape() && a.to_floats() == w.to_floats(),
                str(name, " in ", file(name), " differs from ", t->second, ", which BERT ties it to"),
                "mpitron's BERT decoder is the word embedding matrix and its bias cls.predictions.bias");
      continue;
    }
    MPT_THROW(str("HF tensor ", name, " in ", file(name), " is not part of a BertForPreTraining with this config.json"),
              "check num_hidden_layers; a task head (BertForSequenceClassification, …) is not converted");
  }
  return model;
}

bool hf_bert_exportable(const GPTConfig& c, std::string* why) {
  std::string w;
  if (!c.bert) w += " a BERT model";
  if (!c.post_ln) w += " the post-LN block order";
  if (c.causal) w += " bidirectional attention";
  if (!c.binary_head) w += " the binary head";
  if (c.num_tokentypes < 1) w += " token types";
  if (c.normalization != Normalization::LayerNorm) w += " --normalization LayerNorm";
  if (c.swiglu) w += " a GELU MLP (no --swiglu)";
  if (!c.learned_positions()) w += " --position-embedding-type learned_absolute";
  if (!c.add_bias_linear) w += " linear biases (no --disable-bias-linear)";
  if (c.query_groups() != c.num_attention_heads) w += " multi-head attention (no --group-query-attention)";
  if (c.untie_embeddings) w += " a tied decoder";
  if (why) *why = w.empty() ? w : "a BertForPreTraining needs" + w;
  return w.empty();
}

io::Safetensors hf_bert_from_gpt(const GPT& model, const std::string& dtype, const Tensor* flat) {
  const GPTConfig& c = model.config();
  std::string why;
  MPT_CHECK(hf_bert_exportable(c, &why), str("the model is not an HF BERT: ", why), "");
  hf_torch_dtype(dtype);  // validates
  const Tensor values = (flat ? *flat : model.params().values()).to(Device::cpu()).to(DType::F32);
  io::Safetensors st;
  for (const BertName& n : bert_names(c)) {
    const Tensor t = param_view(model, values, n.ours);
    const int64_t rows = n.hf.size() == 1 ? 0 : t.dim(0) / static_cast<int64_t>(n.hf.size());
    for (size_t k = 0; k < n.hf.size(); ++k) {
      const int64_t r0 = static_cast<int64_t>(k) * rows;
      st.add_f32(n.hf[k], (rows == 0 ? t : t.slice(0, r0, r0 + rows)).contiguous(), dtype);
    }
  }
  st.metadata["format"] = "pt";
  return st;
}

std::string hf_bert_config_json(const GPTConfig& c, const std::string& dtype) {
  const json j = {{"architectures", {"BertForPreTraining"}},
                  {"model_type", "bert"},
                  {"hidden_act", c.gelu_exact ? "gelu" : "gelu_new"},
                  {"hidden_size", c.hidden_size},
                  {"intermediate_size", c.ffn()},
                  {"num_attention_heads", c.num_attention_heads},
                  {"num_hidden_layers", c.num_layers},
                  {"max_position_embeddings", c.max_position_embeddings},
                  {"type_vocab_size", c.num_tokentypes},
                  {"vocab_size", c.vocab_size},
                  {"layer_norm_eps", hf_short_float(c.layernorm_epsilon)},
                  {"position_embedding_type", "absolute"},
                  {"tie_word_embeddings", true},
                  {"torch_dtype", hf_torch_dtype(dtype)}};
  return j.dump(2);
}

}  // namespace mpitron
