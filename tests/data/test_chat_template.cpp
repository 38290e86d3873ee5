// tests/data/test_chat_template.cpp — the chat-template renderer (data/jinja.h, data/chat_template.h)
// against transformers' apply_chat_template: every published template in tests/data/chat_templates/
// (SOURCES.md) over seven conversations, with and without the generation prompt, byte for byte, and
// the same errors where transformers raises (tests/reference/chat_template_ref.py wrote the answers), and
// the prompt's ids as apply_chat_template(tokenize=True) gives them with a Llama-3-style tokenizer.json.
// Then hostile templates and inputs: each a clear error naming the template and line, never a crash.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_template.h"
#include "data/jinja.h"
#include "data/text_tokenizer.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using namespace mpitron::testing;
using ojson = nlohmann::ordered_json;

namespace {

std::string render(const std::string& source, const ojson& messages = ojson::array({{{"role", "user"}, {"content", "hi"}}}),
                   const ojson& kwargs = ojson::object()) {
  data::ChatTemplate t(source, "'test'", ojson{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  return t.apply(messages, true, kwargs);
}

// The message of the Error that parsing or rendering `source` throws ("" when none).
std::string error_of(const std::string& source, const ojson& messages = ojson::array({{{"role", "user"}, {"content", "hi"}}})) {
  try {
    render(source, messages);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("chat templates render exactly as transformers' apply_chat_template") {
  const ojson ref = ojson::parse(read_all(source_path("tests/data/ref/chat_templates.json")));
  const ojson& special = ref["special"];
  std::map<std::string, int> per_template;
  int compared = 0, errors = 0;
  for (const auto& c : ref["cases"]) {
    const std::string name = c["template"];
    const std::string path = source_path("tests/data/chat_templates/" + name);
    data::ChatTemplate t(read_all(path), name, special);
    CAPTURE(name);
    CAPTURE(c["conversation"].get<std::string>());
    CAPTURE(c["add_generation_prompt"].get<bool>());
    if (c.contains("output")) {
      CHECK(t.apply(c["messages"], c["add_generation_prompt"], c["kwargs"]) == c["output"].get<std::string>());
    } else {
      // transformers: "TemplateError: <raise_exception's message>"; ours names the template and line too.
      std::string want = c["error"];
      want = want.substr(want.find(": ") + 2);
      std::string got;
      try {
        t.apply(c["messages"], c["add_generation_prompt"], c["kwargs"]);
      } catch (const Error& e) {
        got = e.message();
      }
      CHECK_MESSAGE(got.find(want) != std::string::npos, got);
      CHECK(got.find(name) != std::string::npos);
      ++errors;
    }
    ++per_template[name];
    ++compared;
  }
  // Every committed template is in the reference, and the reference is not trivially small.
  for (const auto& f : std::filesystem::directory_iterator(source_path("tests/data/chat_templates")))
    if (f.path().extension() == ".jinja") CHECK_MESSAGE(per_template[f.path().filename().string()] >= 14, f.path());
  CHECK(compared >= 180);
  CHECK(errors >= 8);
}

TEST_CASE("chat prompts tokenise as apply_chat_template(tokenize=True) does (a Llama-3-style tokenizer.json)") {
  const ojson ref = ojson::parse(read_all(source_path("tests/data/ref/chat_templates.json")));
  const auto tok = data::make_tokenizer({"HuggingFaceTokenizer", source_path(ref["tokenizer"].get<std::string>()), "", ""});
  const auto enc = tok->make_encoder(false);  // the template carries the BOS
  REQUIRE(ref["tokenized"].size() >= 6);
  for (const auto& c : ref["tokenized"]) {
    const std::string name = c["template"];
    CAPTURE(name);
    CAPTURE(c["conversation"].get<std::string>());
    data::ChatTemplate t(read_all(source_path("tests/data/chat_templates/" + name)), name, ref["tokenizer_special"]);
    const std::string text = t.apply(c["messages"], true);
    CHECK(text == c["text"].get<std::string>());
    CHECK(enc->encode(text) == c["ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("chat templates: tokenizer_config.json forms and a missing template") {
  TempDir tmp("chat_template");
  const std::string cfg = tmp / "tokenizer_config.json";
  write_all(cfg, R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                     "chat_template": [{"name": "tool_use", "template": "TOOLS"},
                                       {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})");
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", "hey"}}});
  CHECK(data::ChatTemplate::load(cfg).apply(msgs, true) == "<s>hey</s>");
  write_all(cfg, R"({"chat_template": "{{ messages | length }}"})");
  CHECK(data::ChatTemplate::load(cfg).apply(msgs, false) == "1");
  write_all(cfg, R"({"eos_token": "</s>"})");
  CHECK_THROWS_WITH_AS(data::ChatTemplate::load(cfg), doctest::Contains("has no chat_template"), Error);
  write_all(cfg, R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  CHECK_THROWS_WITH_AS(data::ChatTemplate::load(cfg), doctest::Contains("without a template named 'default'"), Error);
  const std::string plain = tmp / "t.jinja";
  write_all(plain, "{% for m in messages %}[{{ m.role }}]{% endfor %}");
  CHECK(data::ChatTemplate::load(plain).apply(msgs, true) == "[user]");
  CHECK_THROWS_AS(data::ChatTemplate::load(tmp / "absent.json"), Error);
}

TEST_CASE("chat templates: unsupported constructs are refused when parsed, naming the construct and line") {
  const auto parse_error = [](const std::string& src) {
    try {
      data::ChatTemplate t(src, "'bad.jinja'", ojson::object());
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  CHECK(parse_error("{{ x | nosuchfilter }}").find("unknown filter 'nosuchfilter'") != std::string::npos);
  CHECK(parse_error("{{ x | nosuchfilter }}").find("'bad.jinja' line 1") != std::string::npos);
  CHECK(parse_error("a\nb\n{% if x is frobbable %}{% endif %}").find("line 3: unknown test 'frobbable'") != std::string::npos);
  CHECK(parse_error("{{ messages.append(1) }}").find("unsupported method '.append()'") != std::string::npos);
  CHECK(parse_error("{{ lipsum() }}").find("unknown function 'lipsum()'") != std::string::npos);
  CHECK(parse_error("{% include 'x.jinja' %}").find("unsupported tag '{% include %}'") != std::string::npos);
  CHECK(parse_error("{% raw %}x{% endraw %}").find("unsupported tag '{% raw %}'") != std::string::npos);
  CHECK(parse_error("{% for x in y recursive %}{% endfor %}").find("recursive") != std::string::npos);
}

TEST_CASE("chat templates: hostile templates and inputs end in an error, never a crash") {
  const auto has = [](const std::string& msg, const std::string& what) {
    CAPTURE(msg);
    CAPTURE(what);
    CHECK(msg.find(what) != std::string::npos);
  };
  has(error_of("{{ x "), "{{ is not closed");
  has(error_of("{% if x %}"), "ends before {% elif %} or {% else %} or {% endif %}");
  has(error_of("{% for x in y %}"), "ends before");
  has(error_of("{# never closed"), "comment {# is not closed");
  has(error_of("{{ 'abc }}"), "string literal is not closed");
  has(error_of("{% endif %}"), "unexpected '{% endif %}'");
  has(error_of("{{ (1 }}"), "expected ')'");
  has(error_of("{{ 1 + }}"), "unexpected '}}' in an expression");
  has(error_of("{{ a $ b }}"), "unexpected character '$'");
  has(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "nested more than");
  std::string deep;
  for (int i = 0; i < 300; ++i) deep += "{% if true %}";
  has(error_of(deep), "nested more than");
  has(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "macros call each other more than");
  has(error_of("{{ range(100000000) | length }}"), "range() longer than");
  has(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}"), "steps");
  has(error_of("{{ 'x' * 100000000000 }}"), "size limit");
  // (a loop's own `set` does not leak out of the loop in Jinja: a namespace carries the string)
  has(error_of("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s + ns.s %}"
               "{% endfor %}{{ ns.s }}"),
      "size limit");
  CHECK(render("{% set s = 'ab' %}{% for i in range(3) %}{% set s = s + s %}{% endfor %}{{ s }}") == "ab");
  has(error_of("{{ 9223372036854775807 + 1 }}"), "overflows");
  has(error_of("{{ 1 // 0 }}"), "by zero");
  has(error_of("{{ undefined_thing.attr }}"), "'undefined_thing' is undefined");
  has(error_of("{{ 'a' + 1 }}"), "unsupported operand type(s) for +: 'str' and 'int'");
  has(error_of("{% for x in 5 %}{% endfor %}"), "'int' object is not iterable");
  has(error_of("{% set x = 1 %}{% set x.y = 2 %}"), "only a namespace()");
  has(error_of("{{ raise_exception('custom failure') }}"), "custom failure");
  has(error_of("{{ messages[0].content | tojson(indent=-3) }}"), "indent");
  has(error_of("{% break %}"), "outside a loop");
  // Hostile messages: deep nesting and odd types go through tojson and string filters without a crash.
  ojson nested = "leaf";
  for (int i = 0; i < 100; ++i) nested = ojson::array({nested});
  CHECK(render("{{ messages[0].content | tojson }}", ojson::array({{{"role", "user"}, {"content", nested}}})).size() == 206);
  has(error_of("{{ messages[0].content + '!' }}", ojson::array({{{"role", "user"}, {"content", 5}}})),
      "unsupported operand type(s) for +: 'int' and 'str'");
  CHECK(render("{{ messages[0].content | trim }}|{{ messages[5] }}|{{ messages[0].missing }}",
               ojson::array({{{"role", "user"}, {"content", std::string("\x01\xff bad utf8 \xc3")}}}))
            .find("|||") == std::string::npos);
}

TEST_CASE("chat templates: whitespace control as transformers' environment (trim_blocks, lstrip_blocks)") {
  CHECK(render("a\n  {% if true %}\n  b\n  {% endif %}\nc") == "a\n  b\nc");
  CHECK(render("a  {%- if true -%}  b  {%- endif -%}  c") == "abc");
  CHECK(render("a\n  {%+ if true %}b{% endif %}") == "a\n  b");
  CHECK(render("x {# note #}\ny") == "x y");
  CHECK(render("{{ 'a' }}\n{{ 'b' }}") == "a\nb");  // expressions keep their newline
  CHECK(render("{{ bos_token }}{{ eos_token }}") == "<s></s>");
  CHECK(render("{{ x }}", ojson::array(), ojson{{"x", "kwarg"}}) == "kwarg");
}
