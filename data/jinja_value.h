// data/jinja_value.h — the values a chat template computes with (data/jinja.h), with Python's
// meaning, since transformers renders templates with Jinja2 on Python objects:
//   undefined (Jinja's default Undefined: prints "", false, iterates as empty), None, bool, int
//   (int64), float (double), str (UTF-8; lengths, indices and slices count code points), list
//   (tuples too), dict (string keys, insertion order as Python's dict), a namespace (a dict
//   whose attributes `set ns.x = ...` may assign), and a callable (a macro or a built-in).
// Lists and dicts are shared by reference as in Python; templates cannot mutate them
// (transformers' ImmutableSandboxedEnvironment), only namespaces.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mpitron::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order
struct Kwargs;
using Function = std::function<Value(std::vector<Value>& args, Kwargs& kwargs)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, Str, List, Dict, Namespace, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                    // Str; for Undefined the name that was looked up
  std::shared_ptr<List> list;       // List
  std::shared_ptr<Dict> dict;       // Dict, Namespace
  std::shared_ptr<Function> fn;     // Callable

  static Value undefined(std::string name = "") { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::Str; v.s = std::move(x); return v; }
  static Value make_list(List l = {}) { Value v; v.kind = Kind::List; v.list = std::make_shared<List>(std::move(l)); return v; }
  static Value make_dict(Dict d = {}) { Value v; v.kind = Kind::Dict; v.dict = std::make_shared<Dict>(std::move(d)); return v; }
  static Value callable(Function f) { Value v; v.kind = Kind::Callable; v.fn = std::make_shared<Function>(std::move(f)); return v; }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_str() const { return kind == Kind::Str; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? (b ? 1 : 0) : static_cast<double>(i); }

  // Dict or namespace member; nullptr when absent.
  const Value* find(const std::string& key) const;
  void put(const std::string& key, Value v);  // dict or namespace: replace or append
};

struct Kwargs {
  std::vector<std::pair<std::string, Value>> items;
  // Removes and returns the named argument (undefined when absent).
  Value take(const std::string& name);
};

// Python's bool(v).
bool truthy(const Value& v);
// Python's str(v) as Jinja prints it: None, True, 1.5, ['a', 1], {'k': 'v'}; undefined prints "".
std::string to_str(const Value& v);
// Python's repr(v) (strings quoted).
std::string repr(const Value& v);
// Python's ==.
bool equal(const Value& a, const Value& b);
// Python's json.dumps(v, ensure_ascii=False, indent=indent (-1: None), sort_keys=sort_keys),
// which is transformers' tojson filter. Throws for undefined and callables.
std::string to_json(const Value& v, int indent, bool sort_keys);
// A JSON document as values (objects keep their order).
Value from_json(const nlohmann::ordered_json& j);
// "list", "str", ... as Python names the type (for error messages).
const char* type_name(const Value& v);

// UTF-8 strings as Python sees them: code points.
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
bool is_py_space(char32_t c);  // str.isspace()

}  // namespace mpitron::jinja
