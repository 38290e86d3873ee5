// data/chat_template.h — a model's chat template (the `chat_template` of its Hugging Face
// tokenizer_config.json) applied to OpenAI-style messages, giving the same text as transformers'
// tokenizer.apply_chat_template(messages, add_generation_prompt=..., tokenize=False).
//
// The template runs with the variables transformers passes: messages, tools (None),
// documents (None), add_generation_prompt, the special tokens the config names (bos_token,
// eos_token, unk_token, pad_token, as strings), and any extra keyword arguments
// (e.g. Qwen3's enable_thinking). The renderer is data/jinja.h.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "data/jinja.h"

namespace mpitron::data {

class ChatTemplate {
 public:
  // `path`: a tokenizer_config.json (its "chat_template": a string, or a list of
  // {"name", "template"} of which "default" is used) or, for any other file, the template text
  // itself. Throws an Error naming the file when it has no template or the template uses a
  // construct outside the supported subset.
  static ChatTemplate load(const std::string& path);
  // The server's choice: `flag` (--chat-template) when given, else the tokenizer_config.json beside
  // `tokenizer_model` (--tokenizer-model) when that has a chat_template; else null, with `why_none`
  // saying what was looked for. A template that does not parse is an Error (at start-up).
  static std::shared_ptr<const ChatTemplate> find(const std::string& flag, const std::string& tokenizer_model,
                                                  std::string& why_none);
  // The template `source` named `name` (in errors), with its special tokens.
  ChatTemplate(const std::string& source, const std::string& name, const nlohmann::ordered_json& special_tokens);

  // Throws an Error naming the template and line when it fails (raise_exception's message).
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;
  const std::string& name() const { return tmpl_.name(); }
  // A special token the config names ("eos_token" → "<|im_end|>"), "" when it names none.
  std::string special_token(const std::string& key) const;

 private:
  jinja::Template tmpl_;
  nlohmann::ordered_json special_;  // {"bos_token": "<s>", ...}
};

}  // namespace mpitron::data
