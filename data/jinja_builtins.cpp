// data/jinja_builtins.cpp — filters, tests, methods and globals with the meaning Jinja2 and
// Python give them (transformers' tojson: json.dumps(ensure_ascii=False)).
#include "data/jinja_builtins.h"

#include <unicode/unistr.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "core/error.h"
#include "data/jinja.h"

namespace mpitron::jinja {

namespace {

// Argument `pos` or keyword `name`, else `dflt` (by value: the default is often a temporary).
Value arg(std::vector<Value>& args, Kwargs& kw, size_t pos, const std::string& name, const Value& dflt, Value& slot) {
  if (pos < args.size()) return args[pos];
  slot = kw.take(name);
  return slot.is_undefined() ? dflt : slot;
}

void no_more(const char* what, size_t max_args, const std::vector<Value>& args, const Kwargs& kw) {
  if (args.size() > max_args) throw TemplateError(str(what, " takes at most ", max_args, " arguments"));
  if (!kw.items.empty()) throw TemplateError(str(what, " has no argument '", kw.items[0].first, "'"));
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_str()) throw TemplateError(str(what, " needs a string, got ", type_name(v)));
  return v.s;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = utf8_decode(s);
  const std::u32string set = chars.is_str() ? utf8_decode(chars.s) : std::u32string();
  const auto strip_it = [&](char32_t c) { return chars.is_str() ? set.find(c) != std::u32string::npos : is_py_space(c); };
  size_t b = 0, e = u.size();
  while (left && b < e && strip_it(u[b])) ++b;
  while (right && e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

std::string icu_case(const std::string& s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (upper) u.toUpper(); else u.toLower();
  std::string out;
  u.toUTF8String(out);
  return out;
}

std::string py_capitalize(const std::string& s) {
  const std::u32string u = utf8_decode(s);
  if (u.empty()) return s;
  return icu_case(utf8_encode(u.substr(0, 1)), true) + icu_case(utf8_encode(u.substr(1)), false);
}

// Python's str.title(): a cased letter after an uncased character starts a word.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    const std::string one = utf8_encode(std::u32string(1, c));
    const std::string up = icu_case(one, true), low = icu_case(one, false);
    const bool cased = up != low;
    out += cased ? (prev_cased ? low : up) : one;
    prev_cased = cased;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) throw TemplateError("replace() of an empty string is not supported");
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    if (out.size() > kMaxStringBytes) throw TemplateError("replace() grows past the size limit");
    pos = hit + from.size();
  }
  return out + s.substr(pos);
}

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string u = utf8_decode(s);
    size_t k = 0;
    while (k < u.size()) {
      while (k < u.size() && is_py_space(u[k])) ++k;
      if (k == u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && is_py_space(u[e - 1])) --e;
        parts.push_back(Value::string(utf8_encode(u.substr(k, e - k))));
        break;
      }
      size_t e = k;
      while (e < u.size() && !is_py_space(u[e])) ++e;
      parts.push_back(Value::string(utf8_encode(u.substr(k, e - k))));
      k = e;
    }
    return Value::make_list(std::move(parts));
  }
  const std::string& d = need_str(sep, "split()");
  if (d.empty()) throw TemplateError("split(): empty separator");
  size_t pos = 0;
  for (;;) {
    const size_t hit = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) ? std::string::npos
                                                                                           : s.find(d, pos);
    if (hit == std::string::npos) {
      parts.push_back(Value::string(s.substr(pos)));
      break;
    }
    parts.push_back(Value::string(s.substr(pos, hit - pos)));
    pos = hit + d.size();
  }
  return Value::make_list(std::move(parts));
}

bool py_affix(const std::string& s, const Value& what, bool start) {
  const auto one = [&](const Value& v) {
    const std::string& a = need_str(v, start ? "startswith()" : "endswith()");
    return a.size() <= s.size() && (start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (what.is_list()) {
    for (const Value& v : *what.list)
      if (one(v)) return true;
    return false;
  }
  return one(what);
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  if (a.is_str() && b.is_str()) return a.s.compare(b.s);
  throw TemplateError(str("cannot compare ", type_name(a), " and ", type_name(b)));
}

// --- filters ---

Value f_trim(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value slot;
  const Value& chars = arg(args, kw, 0, "chars", Value::none(), slot);
  no_more("trim", 1, args, kw);
  return Value::string(py_strip(to_str(v), chars, true, true));
}
Value f_tojson(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2, s3, s4;
  const Value& ensure_ascii = arg(args, kw, 0, "ensure_ascii", Value::boolean(false), s1);
  const Value& indent = arg(args, kw, 1, "indent", Value::none(), s2);
  const Value& separators = arg(args, kw, 2, "separators", Value::none(), s3);
  const Value& sort_keys = arg(args, kw, 3, "sort_keys", Value::boolean(false), s4);
  no_more("tojson", 4, args, kw);
  if (truthy(ensure_ascii)) throw TemplateError("tojson(ensure_ascii=True) is not supported");
  if (!separators.is_none()) throw TemplateError("tojson(separators=...) is not supported");
  if (!indent.is_none() && indent.kind != Value::Kind::Int) throw TemplateError("tojson(indent=) takes an integer");
  if (indent.kind == Value::Kind::Int && (indent.i < 0 || indent.i > 64)) throw TemplateError("tojson(indent=) out of [0, 64]");
  return Value::string(to_json(v, indent.is_none() ? -1 : static_cast<int>(indent.i), truthy(sort_keys)));
}
Value f_length(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("length", 0, args, kw);
  return Value::integer(length_of(v));
}
Value f_upper(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("upper", 0, args, kw);
  return Value::string(icu_case(to_str(v), true));
}
Value f_lower(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("lower", 0, args, kw);
  return Value::string(icu_case(to_str(v), false));
}
Value f_capitalize(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("capitalize", 0, args, kw);
  return Value::string(py_capitalize(to_str(v)));
}
Value f_title(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("title", 0, args, kw);
  return Value::string(py_title(to_str(v)));
}
Value f_string(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("string", 0, args, kw);
  return Value::string(to_str(v));
}
Value f_safe(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("safe", 0, args, kw);
  return v;
}
Value f_first(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("first", 0, args, kw);
  const List l = iterate(v);
  return l.empty() ? Value::undefined("first") : l.front();
}
Value f_last(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("last", 0, args, kw);
  const List l = iterate(v);
  return l.empty() ? Value::undefined("last") : l.back();
}
Value f_default(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2;
  const Value& dflt = arg(args, kw, 0, "default_value", Value::string(""), s1);
  const Value& boolean = arg(args, kw, 1, "boolean", Value::boolean(false), s2);
  no_more("default", 2, args, kw);
  return (v.is_undefined() || (truthy(boolean) && !truthy(v))) ? dflt : v;
}
Value f_join(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2;
  const Value& sep = arg(args, kw, 0, "d", Value::string(""), s1);
  const Value& attribute = arg(args, kw, 1, "attribute", Value::none(), s2);
  no_more("join", 2, args, kw);
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    out += (first ? "" : to_str(sep)) + to_str(attribute.is_none() ? x : get_item(x, attribute));
    first = false;
    if (out.size() > kMaxStringBytes) throw TemplateError("join() grows past the size limit");
  }
  return Value::string(out);
}
Value f_list(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("list", 0, args, kw);
  return Value::make_list(iterate(v));
}
Value f_items(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("items", 0, args, kw);
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_mapping()) throw TemplateError(str("items() of a ", type_name(v)));
  List l;
  for (const auto& [k, x] : *v.dict) l.push_back(Value::make_list({Value::string(k), x}));
  return Value::make_list(std::move(l));
}
Value f_dictsort(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2, s3;
  const Value& case_sensitive = arg(args, kw, 0, "case_sensitive", Value::boolean(false), s1);
  const Value& by = arg(args, kw, 1, "by", Value::string("key"), s2);
  const Value& reverse = arg(args, kw, 2, "reverse", Value::boolean(false), s3);
  no_more("dictsort", 3, args, kw);
  std::vector<Value> a;
  Value items = f_items(v, a, kw);
  const bool by_value = to_str(by) == "value";
  const auto key = [&](const Value& pair) {
    Value k = (*pair.list)[by_value ? 1 : 0];
    if (!truthy(case_sensitive) && k.is_str()) k.s = icu_case(k.s, false);
    return k;
  };
  std::stable_sort(items.list->begin(), items.list->end(),
                   [&](const Value& x, const Value& y) { return compare_values(key(x), key(y)) < 0; });
  if (truthy(reverse)) std::reverse(items.list->begin(), items.list->end());
  return items;
}
Value f_replace(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2, s3;
  const Value& from = arg(args, kw, 0, "old", Value::undefined("old"), s1);
  const Value& to = arg(args, kw, 1, "new", Value::undefined("new"), s2);
  const Value& count = arg(args, kw, 2, "count", Value::none(), s3);
  no_more("replace", 3, args, kw);
  return Value::string(py_replace(to_str(v), need_str(from, "replace()"), to_str(to), count.is_none() ? -1 : count.i));
}
Value f_int(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1;
  const Value& dflt = arg(args, kw, 0, "default", Value::integer(0), s1);
  no_more("int", 2, args, kw);
  if (v.kind == Value::Kind::Int) return v;
  if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
  if (v.kind == Value::Kind::Float) return Value::integer(static_cast<int64_t>(v.f));
  if (v.is_str()) {
    try {
      size_t used = 0;
      const std::string t = py_strip(v.s, Value::none(), true, true);
      const long long x = std::stoll(t, &used);
      if (used == t.size()) return Value::integer(x);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}
Value f_float(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1;
  const Value& dflt = arg(args, kw, 0, "default", Value::real(0), s1);
  no_more("float", 1, args, kw);
  if (v.is_number()) return Value::real(v.as_double());
  if (v.is_str()) {
    try {
      size_t used = 0;
      const std::string t = py_strip(v.s, Value::none(), true, true);
      const double x = std::stod(t, &used);
      if (used == t.size()) return Value::real(x);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}
Value f_abs(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("abs", 0, args, kw);
  if (v.kind == Value::Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
  if (v.is_number()) return Value::real(std::fabs(v.as_double()));
  throw TemplateError(str("abs() of a ", type_name(v)));
}
Value f_unique(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  no_more("unique", 0, args, kw);
  List out;
  for (const Value& x : iterate(v))
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
  return Value::make_list(std::move(out));
}
Value f_sort(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2, s3;
  const Value& reverse = arg(args, kw, 0, "reverse", Value::boolean(false), s1);
  const Value& case_sensitive = arg(args, kw, 1, "case_sensitive", Value::boolean(false), s2);
  const Value& attribute = arg(args, kw, 2, "attribute", Value::none(), s3);
  no_more("sort", 3, args, kw);
  List l = iterate(v);
  const auto key = [&](const Value& x) {
    Value k = attribute.is_none() ? x : get_item(x, attribute);
    if (!truthy(case_sensitive) && k.is_str()) k.s = icu_case(k.s, false);
    return k;
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) { return compare_values(key(x), key(y)) < 0; });
  if (truthy(reverse)) std::reverse(l.begin(), l.end());
  return Value::make_list(std::move(l));
}

// select/reject/selectattr/rejectattr: keep the items whose test (truthiness without one) holds.
Value select_items(const Value& v, std::vector<Value>& args, Kwargs& kw, bool by_attr, bool keep) {
  if (!kw.items.empty()) throw TemplateError(str("unexpected keyword argument '", kw.items[0].first, "'"));
  size_t k = 0;
  Value attr;
  if (by_attr) {
    if (args.empty()) throw TemplateError("selectattr/rejectattr need an attribute name");
    attr = args[k++];
  }
  TestFn test = nullptr;
  if (k < args.size()) {
    const std::string& name = need_str(args[k++], "the test name");
    test = find_test(name);
    if (!test) throw TemplateError(str("unknown test '", name, "'"));
  }
  std::vector<Value> test_args(args.begin() + static_cast<std::ptrdiff_t>(k), args.end());
  List out;
  for (const Value& x : iterate(v)) {
    const Value subject = by_attr ? (x.is_mapping() ? get_item(x, attr) : Value::undefined(to_str(attr))) : x;
    const bool hit = test ? test(subject, test_args) : truthy(subject);
    if (hit == keep) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}
Value f_select(const Value& v, std::vector<Value>& a, Kwargs& kw) { return select_items(v, a, kw, false, true); }
Value f_reject(const Value& v, std::vector<Value>& a, Kwargs& kw) { return select_items(v, a, kw, false, false); }
Value f_selectattr(const Value& v, std::vector<Value>& a, Kwargs& kw) { return select_items(v, a, kw, true, true); }
Value f_rejectattr(const Value& v, std::vector<Value>& a, Kwargs& kw) { return select_items(v, a, kw, true, false); }

Value f_map(const Value& v, std::vector<Value>& args, Kwargs& kw) {
  Value attribute = kw.take("attribute"), dflt = kw.take("default");
  List out;
  if (!attribute.is_undefined()) {
    no_more("map", 0, args, kw);
    for (const Value& x : iterate(v)) {
      Value y = get_item(x, attribute);
      out.push_back(y.is_undefined() && !dflt.is_undefined() ? dflt : y);
    }
    return Value::make_list(std::move(out));
  }
  if (args.empty()) throw TemplateError("map() needs a filter name or attribute=");
  const std::string& name = need_str(args[0], "map()");
  FilterFn f = find_filter(name);
  if (!f) throw TemplateError(str("unknown filter '", name, "'"));
  std::vector<Value> rest(args.begin() + 1, args.end());
  for (const Value& x : iterate(v)) {
    std::vector<Value> a = rest;
    Kwargs k = kw;
    out.push_back(f(x, a, k));
  }
  return Value::make_list(std::move(out));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"abs", f_abs},         {"capitalize", f_capitalize}, {"count", f_length},   {"d", f_default},
      {"default", f_default}, {"dictsort", f_dictsort},     {"first", f_first},    {"float", f_float},
      {"int", f_int},         {"items", f_items},           {"join", f_join},      {"last", f_last},
      {"length", f_length},   {"list", f_list},             {"lower", f_lower},    {"map", f_map},
      {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"safe", f_safe},
      {"select", f_select},   {"selectattr", f_selectattr}, {"sort", f_sort},      {"string", f_string},
      {"title", f_title},     {"tojson", f_tojson},         {"trim", f_trim},      {"unique", f_unique},
      {"upper", f_upper},
  };
  return m;
}

// --- tests ---

const Value& targ(std::vector<Value>& args, const char* test) {
  if (args.empty()) throw TemplateError(str("the test '", test, "' needs an argument"));
  return args[0];
}
bool t_defined(const Value& v, std::vector<Value>&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, std::vector<Value>&) { return v.is_undefined(); }
bool t_none(const Value& v, std::vector<Value>&) { return v.is_none(); }
bool t_string(const Value& v, std::vector<Value>&) { return v.is_str(); }
bool t_number(const Value& v, std::vector<Value>&) { return v.is_number(); }
bool t_integer(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Int; }
bool t_float(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Float; }
bool t_boolean(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Bool; }
bool t_true(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Bool && v.b; }
bool t_false(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Bool && !v.b; }
bool t_mapping(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Dict; }
bool t_iterable(const Value& v, std::vector<Value>&) {
  return v.is_str() || v.is_list() || v.kind == Value::Kind::Dict || v.is_undefined();
}
bool t_sequence(const Value& v, std::vector<Value>&) { return v.is_str() || v.is_list() || v.kind == Value::Kind::Dict; }
bool t_callable(const Value& v, std::vector<Value>&) { return v.kind == Value::Kind::Callable; }
bool t_eq(const Value& v, std::vector<Value>& a) { return equal(v, targ(a, "eq")); }
bool t_ne(const Value& v, std::vector<Value>& a) { return !equal(v, targ(a, "ne")); }
bool t_lt(const Value& v, std::vector<Value>& a) { return compare_values(v, targ(a, "lt")) < 0; }
bool t_gt(const Value& v, std::vector<Value>& a) { return compare_values(v, targ(a, "gt")) > 0; }
bool t_le(const Value& v, std::vector<Value>& a) { return compare_values(v, targ(a, "le")) <= 0; }
bool t_ge(const Value& v, std::vector<Value>& a) { return compare_values(v, targ(a, "ge")) >= 0; }
bool t_in(const Value& v, std::vector<Value>& a) {
  const Value& c = targ(a, "in");
  if (c.is_str()) return v.is_str() && c.s.find(v.s) != std::string::npos;
  if (c.is_mapping()) return v.is_str() && c.find(v.s);
  for (const Value& x : iterate(c))
    if (equal(v, x)) return true;
  return false;
}
int64_t int_of(const Value& v, const char* test) {
  if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Bool) throw TemplateError(str("the test '", test, "' needs an integer"));
  return v.kind == Value::Kind::Bool ? v.b : v.i;
}
bool t_odd(const Value& v, std::vector<Value>&) { return int_of(v, "odd") % 2 != 0; }
bool t_even(const Value& v, std::vector<Value>&) { return int_of(v, "even") % 2 == 0; }
bool t_divisibleby(const Value& v, std::vector<Value>& a) {
  const int64_t d = int_of(targ(a, "divisibleby"), "divisibleby");
  if (d == 0) throw TemplateError("divisibleby 0");
  return int_of(v, "divisibleby") % d == 0;
}
bool t_lower(const Value& v, std::vector<Value>&) { return v.is_str() && icu_case(v.s, false) == v.s; }
bool t_upper(const Value& v, std::vector<Value>&) { return v.is_str() && icu_case(v.s, true) == v.s; }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"boolean", t_boolean},   {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
      {"eq", t_eq},             {"equalto", t_eq},        {"==", t_eq},           {"even", t_even},
      {"false", t_false},       {"float", t_float},       {"ge", t_ge},           {"gt", t_gt},
      {"in", t_in},             {"integer", t_integer},   {"iterable", t_iterable}, {"le", t_le},
      {"lower", t_lower},       {"lt", t_lt},             {"mapping", t_mapping}, {"ne", t_ne},
      {"none", t_none},         {"number", t_number},     {"odd", t_odd},         {"sequence", t_sequence},
      {"string", t_string},     {"true", t_true},         {"undefined", t_undefined}, {"upper", t_upper},
  };
  return m;
}

const char* const kMethods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper", "lower",
                                "replace", "title", "capitalize", "find", "count", "join", "items", "keys",
                                "values", "get"};

Value str_method(const std::string& s, const std::string& name, std::vector<Value>& args, Kwargs& kw) {
  Value s1, s2, s3;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value& chars = arg(args, kw, 0, "chars", Value::none(), s1);
    no_more(name.c_str(), 1, args, kw);
    return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    no_more(name.c_str(), 1, args, kw);
    if (args.empty()) throw TemplateError(str(name, "() needs an argument"));
    return Value::boolean(py_affix(s, args[0], name == "startswith"));
  }
  if (name == "split") {
    const Value& sep = arg(args, kw, 0, "sep", Value::none(), s1);
    const Value& maxsplit = arg(args, kw, 1, "maxsplit", Value::integer(-1), s2);
    no_more("split", 2, args, kw);
    return py_split(s, sep, maxsplit.i);
  }
  if (name == "upper" || name == "lower") {
    no_more(name.c_str(), 0, args, kw);
    return Value::string(icu_case(s, name == "upper"));
  }
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    const Value& from = arg(args, kw, 0, "old", Value::undefined("old"), s1);
    const Value& to = arg(args, kw, 1, "new", Value::undefined("new"), s2);
    const Value& count = arg(args, kw, 2, "count", Value::integer(-1), s3);
    no_more("replace", 3, args, kw);
    return Value::string(py_replace(s, need_str(from, "replace()"), need_str(to, "replace()"), count.i));
  }
  if (name == "find" || name == "count") {
    no_more(name.c_str(), 1, args, kw);
    if (args.empty()) throw TemplateError(str(name, "() needs an argument"));
    const std::string& sub = need_str(args[0], name.c_str());
    if (name == "find") {
      const size_t hit = s.find(sub);
      return Value::integer(hit == std::string::npos ? -1 : static_cast<int64_t>(utf8_decode(s.substr(0, hit)).size()));
    }
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s).size()) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    no_more("join", 1, args, kw);
    if (args.empty()) throw TemplateError("join() needs an argument");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(args[0])) {
      out += (first ? "" : s) + need_str(x, "join()");
      first = false;
    }
    return Value::string(out);
  }
  throw TemplateError(str("str has no method '", name, "'"));
}

Value dict_method(const Value& d, const std::string& name, std::vector<Value>& args, Kwargs& kw) {
  if (name == "get") {
    no_more("get", 2, args, kw);
    if (args.empty()) throw TemplateError("get() needs a key");
    const Value* v = args[0].is_str() ? d.find(args[0].s) : nullptr;
    return v ? *v : args.size() > 1 ? args[1] : Value::none();
  }
  no_more(name.c_str(), 0, args, kw);
  List l;
  for (const auto& [k, v] : *d.dict) {
    if (name == "items") l.push_back(Value::make_list({Value::string(k), v}));
    else if (name == "keys") l.push_back(Value::string(k));
    else if (name == "values") l.push_back(v);
    else throw TemplateError(str("dict has no method '", name, "'"));
  }
  return Value::make_list(std::move(l));
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

bool is_method(const std::string& name) {
  return std::find(std::begin(kMethods), std::end(kMethods), name) != std::end(kMethods);
}

bool is_global_function(const std::string& name) {
  return name == "raise_exception" || name == "range" || name == "namespace" || name == "dict" || name == "strftime_now";
}

Value call_method(const Value& obj, const std::string& name, std::vector<Value>& args, Kwargs& kw) {
  if (obj.is_str()) return str_method(obj.s, name, args, kw);
  if (obj.kind == Value::Kind::Dict) return dict_method(obj, name, args, kw);
  if (obj.kind == Value::Kind::Namespace) {
    const Value* f = obj.find(name);
    if (f && f->kind == Value::Kind::Callable) return (*f->fn)(args, kw);
  }
  throw TemplateError(str("'", type_name(obj), "' object has no method '", name, "'"));
}

Value global_function(const std::string& name) {
  if (name == "raise_exception")
    return Value::callable([](std::vector<Value>& args, Kwargs&) -> Value {
      throw TemplateError(args.empty() ? "raise_exception()" : to_str(args[0]));
    });
  if (name == "range")
    return Value::callable([](std::vector<Value>& args, Kwargs& kw) {
      no_more("range", 3, args, kw);
      for (const Value& a : args)
        if (a.kind != Value::Kind::Int) throw TemplateError("range() takes integers");
      int64_t start = 0, stop = 0, stepv = 1;
      if (args.size() == 1) stop = args[0].i;
      else if (args.size() >= 2) start = args[0].i, stop = args[1].i;
      if (args.size() == 3) stepv = args[2].i;
      if (stepv == 0) throw TemplateError("range() step must not be zero");
      List l;
      for (int64_t k = start; stepv > 0 ? k < stop : k > stop; k += stepv) {
        if (static_cast<int64_t>(l.size()) >= kMaxRange) throw TemplateError(str("range() longer than ", kMaxRange));
        l.push_back(Value::integer(k));
      }
      return Value::make_list(std::move(l));
    });
  if (name == "namespace" || name == "dict")
    return Value::callable([name](std::vector<Value>& args, Kwargs& kw) {
      Value v = Value::make_dict();
      if (name == "namespace") v.kind = Value::Kind::Namespace;
      for (const Value& a : args) {
        if (!a.is_mapping()) throw TemplateError(str(name, "() takes a dict or keyword arguments"));
        for (const auto& [k, x] : *a.dict) v.put(k, x);
      }
      for (const auto& [k, x] : kw.items) v.put(k, x);
      return v;
    });
  if (name == "strftime_now")
    return Value::callable([](std::vector<Value>& args, Kwargs& kw) {
      no_more("strftime_now", 1, args, kw);
      if (args.empty()) throw TemplateError("strftime_now() needs a format");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, need_str(args[0], "strftime_now()").c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  return Value::undefined(name);
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_mapping()) {
    const Value* v = obj.find(name);
    return v ? *v : Value::undefined(name);
  }
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_mapping()) return key.is_str() ? get_attr(obj, key.s) : Value::undefined();
  if ((obj.is_list() || obj.is_str()) && (key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool)) {
    const int64_t idx = key.kind == Value::Kind::Bool ? key.b : key.i;
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list->size());
      const int64_t k = idx < 0 ? idx + n : idx;
      return k >= 0 && k < n ? (*obj.list)[static_cast<size_t>(k)] : Value::undefined();
    }
    const std::u32string u = utf8_decode(obj.s);
    const int64_t n = static_cast<int64_t>(u.size());
    const int64_t k = idx < 0 ? idx + n : idx;
    return k >= 0 && k < n ? Value::string(utf8_encode(u.substr(static_cast<size_t>(k), 1))) : Value::undefined();
  }
  return Value::undefined();
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::Str: return static_cast<int64_t>(utf8_decode(v.s).size());
    case Value::Kind::List: return static_cast<int64_t>(v.list->size());
    case Value::Kind::Dict:
    case Value::Kind::Namespace: return static_cast<int64_t>(v.dict->size());
    default: throw TemplateError(str("object of type '", type_name(v), "' has no len()"));
  }
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::Dict: {
      List l;
      for (const auto& kv : *v.dict) l.push_back(Value::string(kv.first));
      return l;
    }
    case Value::Kind::Str: {
      List l;
      for (char32_t c : utf8_decode(v.s)) l.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      return l;
    }
    default: throw TemplateError(str("'", type_name(v), "' object is not iterable"));
  }
}

}  // namespace mpitron::jinja
