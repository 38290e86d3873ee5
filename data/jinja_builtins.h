// data/jinja_builtins.h — the filters, tests, methods and global functions a chat template may
// use (data/jinja.h lists them). One table each: the parser refuses a name that is not in it,
// the evaluator calls what it finds there.
#pragma once
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace mpitron::jinja {

using FilterFn = Value (*)(const Value& subject, std::vector<Value>& args, Kwargs& kwargs);
using TestFn = bool (*)(const Value& subject, std::vector<Value>& args);

FilterFn find_filter(const std::string& name);  // nullptr when unknown
TestFn find_test(const std::string& name);      // nullptr when unknown
bool is_method(const std::string& name);
bool is_global_function(const std::string& name);

// obj.name(args...): a str or dict method. Throws TemplateError for a method of another type.
Value call_method(const Value& obj, const std::string& name, std::vector<Value>& args, Kwargs& kwargs);
// The global functions as callables (raise_exception, range, namespace, dict, strftime_now).
Value global_function(const std::string& name);

// Attribute and item access with Jinja's rules (a missing one is undefined, never an error).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// Python's len() for str (code points), list, dict; throws for others.
int64_t length_of(const Value& v);
// Iterating: list items, str code points, dict keys; undefined: nothing.
List iterate(const Value& v);

// Bounds that keep hostile templates from exhausting the server.
constexpr size_t kMaxStringBytes = size_t{64} << 20;
constexpr int64_t kMaxRange = 1 << 20;

}  // namespace mpitron::jinja
