// data/jinja.h — the subset of Jinja2 that Hugging Face chat templates use, rendered exactly as
// transformers' apply_chat_template renders them (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; its own tojson and
// raise_exception; Python's semantics for the values). There is no C++ Jinja engine in Debian.
//
// Supported (docs/generate-eval.md "Chat templates" keeps this list):
//   {{ expr }}, {% if/elif/else/endif %}, {% for x[, y] in expr [if cond] %}…{% else %}…{% endfor %}
//   with loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem, {% break %},
//   {% continue %}, {% set x = expr %}, {% set a, b = expr %}, {% set ns.attr = expr %},
//   {% set x %}…{% endset %}, {% macro name(a, b=default) %}…{% endmacro %}, {% generation %}
//   (transformers' tag: renders its body), {# comments #}, whitespace control {%- -%} {{- -}} {%+.
//   Expressions: literals (strings with Python escapes, ints, floats, true/false/none in either
//   case, lists, tuples, dicts), names, .attr, [index], [a:b:c] slices, calls with keyword
//   arguments, + - * / // % ** ~, comparisons, in / not in, and/or/not, x if c else y, filters
//   and tests.
//   Filters: abs capitalize count d default dictsort first float int items join last length list
//   lower map reject rejectattr replace safe select selectattr sort string title tojson trim
//   unique upper.
//   Tests: boolean callable defined divisibleby eq equalto even false float ge gt in integer
//   iterable le lower lt mapping ne none number odd sequence string true undefined upper.
//   Methods: str.strip/lstrip/rstrip/startswith/endswith/split/upper/lower/replace/title/
//   capitalize/find/count/join/format-free; dict.items/keys/values/get.
//   Globals: raise_exception(msg), range(), namespace(...), dict(...), strftime_now(fmt).
// Anything else (an unknown tag, filter, test, method or function; include/import/extends/raw)
// is refused when the template is parsed, naming the construct, the template and the line.
// Hostile templates and inputs end in a TemplateError, never a crash: nesting, macro recursion,
// loop lengths and output size are bounded.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>

#include "data/jinja_value.h"

namespace mpitron::jinja {

// What a template did wrong (or raise_exception said); line 0 when unknown.
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& what, int line = 0) : std::runtime_error(what), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

struct Program;  // the parsed template (data/jinja_ast.h)

class Template {
 public:
  // Parses `source`; `name` names it in errors. Throws mpitron::Error ("chat template NAME line L:
  // unknown filter 'foo'") for a syntax error or an unsupported construct.
  Template(const std::string& source, const std::string& name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` (a dict) as the template's variables. Throws mpitron::Error naming the
  // template and line when the template fails (raise_exception: its message).
  std::string render(const Value& context) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<Program> program_;
};

}  // namespace mpitron::jinja
