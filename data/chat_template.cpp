#include "data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

namespace mpitron::data {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot read the chat template file '", path, "'"), "check --chat-template");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// A special token in tokenizer_config.json: a string, or an AddedToken {"content": ...}.
bool token_text(const nlohmann::json& v, std::string& out) {
  if (v.is_string()) out = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string()) out = v["content"].get<std::string>();
  else return false;
  return true;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& path) {
  const std::string text = read_text(path);
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!is_json) return ChatTemplate(text, "'" + path + "'", nlohmann::ordered_json::object());
  const nlohmann::json cfg = parse_json_text(text, str("tokenizer config '", path, "'"));
  MPT_CHECK(cfg.is_object() && cfg.contains("chat_template"),
            str("'", path, "' has no chat_template, so /v1/chat/completions cannot render messages"),
            "pass --chat-template FILE (a tokenizer_config.json with one, or a Jinja template file)");
  const nlohmann::json& ct = cfg["chat_template"];
  std::string source, which;
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    for (const auto& t : ct)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        source = t["template"].get<std::string>(), which = " (template 'default')";
    MPT_CHECK(!which.empty(), str("'", path, "': chat_template is a list without a template named 'default'"), "");
  } else {
    MPT_THROW(str("'", path, "': chat_template must be a string or a list of {name, template}"), "");
  }
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    std::string t;
    if (cfg.contains(k) && token_text(cfg[k], t)) special[k] = t;
  }
  return ChatTemplate(source, "'" + path + "'" + which, special);
}

std::shared_ptr<const ChatTemplate> ChatTemplate::find(const std::string& flag, const std::string& tokenizer_model,
                                                       std::string& why_none) {
  if (!flag.empty()) return std::make_shared<const ChatTemplate>(load(flag));
  if (tokenizer_model.empty()) {
    why_none = "no --chat-template, and no --tokenizer-model whose tokenizer_config.json could have one";
    return nullptr;
  }
  const std::filesystem::path cfg = std::filesystem::path(tokenizer_model).parent_path() / "tokenizer_config.json";
  if (!std::filesystem::is_regular_file(cfg)) {
    why_none = str("no --chat-template, and no ", cfg.string());
    return nullptr;
  }
  const nlohmann::json j = read_json_file(cfg.string(), "tokenizer config");
  if (!j.is_object() || !j.contains("chat_template")) {
    why_none = str(cfg.string(), " has no chat_template");
    return nullptr;
  }
  return std::make_shared<const ChatTemplate>(load(cfg.string()));
}

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name, const nlohmann::ordered_json& special)
    : tmpl_(source, name), special_(special) {}

std::string ChatTemplate::special_token(const std::string& key) const {
  return special_.contains(key) && special_[key].is_string() ? special_[key].get<std::string>() : "";
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& kwargs) const {
  jinja::Value ctx = jinja::Value::make_dict();
  ctx.put("messages", jinja::from_json(messages));
  ctx.put("tools", jinja::Value::none());
  ctx.put("documents", jinja::Value::none());
  ctx.put("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  for (auto it = special_.begin(); it != special_.end(); ++it) ctx.put(it.key(), jinja::from_json(it.value()));
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) ctx.put(it.key(), jinja::from_json(it.value()));
  return tmpl_.render(ctx);
}

}  // namespace mpitron::data
