#include "model/config_json.h"

#include "core/error.h"

namespace mpitron {

nlohmann::json config_to_json(const GPTConfig& c) {
  nlohmann::json j = {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"ffn_hidden_size", c.ffn()},
          {"seq_length", c.seq_length},
          {"max_position_embeddings", c.max_position_embeddings},
          {"vocab_size", c.vocab_size},
          {"padded_vocab_size", c.padded_vocab_size},
          {"layernorm_epsilon", c.layernorm_epsilon},
          {"family", c.family()},
          {"normalization", to_string(c.normalization)},
          {"swiglu", c.swiglu},
          {"position_embedding", to_string(c.position_embedding)},
          {"rotary_base", c.rotary_base},
          {"rotary_percent", c.rotary_percent},
          {"num_query_groups", c.query_groups()},
          {"untie_embeddings", c.untie_embeddings},
          {"add_bias_linear", c.add_bias_linear}};
  if (c.gelu_exact) j["gelu_exact"] = true;  // absent: the tanh approximation (checkpoints before the key)
  if (c.bert) {  // BERT's choices (model/bert.h); absent: a decoder
    j["bert"] = true;
    j["causal"] = c.causal;
    j["post_ln"] = c.post_ln;
    j["num_tokentypes"] = c.num_tokentypes;
    j["binary_head"] = c.binary_head;
    if (c.num_classes > 0) j["num_classes"] = c.num_classes;  // a fine-tuned classifier (finetune --task)
  }
  return j;
}

GPTConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  GPTConfig c;
  try {
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.num_attention_heads = j.at("num_attention_heads").get<int64_t>();
    c.ffn_hidden_size = j.at("ffn_hidden_size").get<int64_t>();
    c.seq_length = j.at("seq_length").get<int64_t>();
    c.max_position_embeddings = j.at("max_position_embeddings").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.padded_vocab_size = j.at("padded_vocab_size").get<int64_t>();
    c.layernorm_epsilon = j.at("layernorm_epsilon").get<float>();
    c.normalization = parse_normalization(j.value("normalization", std::string("LayerNorm")));
    c.swiglu = j.value("swiglu", false);
    c.position_embedding = parse_position_embedding(j.value("position_embedding", std::string("learned_absolute")));
    c.rotary_base = j.value("rotary_base", 10000.0);
    c.rotary_percent = j.value("rotary_percent", 1.0);
    const int64_t g = j.value("num_query_groups", int64_t{0});
    c.num_query_groups = g == c.num_attention_heads ? 0 : g;
    c.untie_embeddings = j.value("untie_embeddings", false);
    c.add_bias_linear = j.value("add_bias_linear", true);
    c.gelu_exact = j.value("gelu_exact", false);
    c.bert = j.value("bert", false);
    c.causal = j.value("causal", true);
    c.post_ln = j.value("post_ln", false);
    c.num_tokentypes = j.value("num_tokentypes", int64_t{0});
    c.binary_head = j.value("binary_head", true);
    c.num_classes = j.value("num_classes", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    MPT_THROW(str(where, ": model_config ", j.dump(), " is incomplete: ", e.what()), "");
  } catch (const Error& e) {
    MPT_THROW(str(where, ": model_config ", j.dump(), ": ", e.what()), "was it written by a newer mpitron?");
  }
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

}  // namespace mpitron
