// data/jinja_eval.cpp — runs a parsed chat template (data/jinja_ast.h) over its variables with
// Jinja2's scoping: a for loop's body and a macro's body have their own variables (assignments
// there do not leak out; namespaces exist for that), if-blocks do not.
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "data/jinja_builtins.h"

namespace mpitron::jinja {

namespace {

constexpr int kMaxCallDepth = 100;          // macro calls inside each other
constexpr int64_t kMaxSteps = 2'000'000;    // statements and loop iterations in one render

using Frame = std::unordered_map<std::string, Value>;

class Evaluator {
 public:
  explicit Evaluator(const Value& context) {
    auto root = std::make_shared<Frame>();
    for (const auto& [k, v] : *context.dict) (*root)[k] = v;
    scopes_.push_back(std::move(root));
    scopes_.push_back(std::make_shared<Frame>());  // the template's own top-level variables
  }

  std::string run(const Body& body) {
    std::string out;
    if (exec(body, out) != Flow::Normal) throw TemplateError("{% break %} or {% continue %} outside a loop");
    return out;
  }

 private:
  enum class Flow { Normal, Break, Continue };
  std::vector<std::shared_ptr<Frame>> scopes_;
  int call_depth_ = 0;
  int64_t steps_ = 0;

  void step(int line) {
    if (++steps_ > kMaxSteps) throw TemplateError(str("the template runs more than ", kMaxSteps, " steps"), line);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value::undefined(name);
  }
  void assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

  void emit(std::string& out, const std::string& s, int line) {
    if (out.size() + s.size() > kMaxStringBytes)
      throw TemplateError(str("the rendered text exceeds ", kMaxStringBytes >> 20, " MiB"), line);
    out += s;
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void bind(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    if (!v.is_list() || v.list->size() != targets.size())
      throw TemplateError(str("cannot unpack ", type_name(v), " into ", targets.size(), " names"), line);
    for (size_t k = 0; k < targets.size(); ++k) assign(targets[k], (*v.list)[k]);
  }

  Flow exec(const Node& n, std::string& out) {
    step(n.line);
    switch (n.k) {
      case Node::K::Text: emit(out, n.text, n.line); return Flow::Normal;
      case Node::K::Output: emit(out, to_str(eval(*n.expr)), n.line); return Flow::Normal;
      case Node::K::If:
        for (size_t b = 0; b < n.bodies.size(); ++b)
          if (!n.conds[b] || truthy(eval(*n.conds[b]))) return exec(n.bodies[b], out);
        return Flow::Normal;
      case Node::K::For: return exec_for(n, out);
      case Node::K::Set: {
        Value v = eval(*n.expr);
        if (n.attr_target) {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Value::Kind::Namespace)
            throw TemplateError(str("cannot assign attribute '", n.targets[1], "' of ", type_name(ns),
                                    " '", n.targets[0], "' (only a namespace())"), n.line);
          ns.put(n.targets[1], std::move(v));
        } else {
          bind(n.targets, v, n.line);
        }
        return Flow::Normal;
      }
      case Node::K::SetBlock: {
        std::string inner;
        exec(n.body, inner);
        assign(n.targets[0], Value::string(inner));
        return Flow::Normal;
      }
      case Node::K::Macro: assign(n.name, make_macro(n)); return Flow::Normal;
      case Node::K::Break: return Flow::Break;
      case Node::K::Continue: return Flow::Continue;
      case Node::K::Block: return exec(n.body, out);
    }
    return Flow::Normal;
  }

  Flow exec_for(const Node& n, std::string& out) {
    const List all = iterate(eval(*n.expr));
    List items;
    if (n.filter) {
      scopes_.push_back(std::make_shared<Frame>());
      for (const Value& v : all) {
        step(n.line);
        bind(n.targets, v, n.line);
        if (truthy(eval(*n.filter))) items.push_back(v);
      }
      scopes_.pop_back();
    } else {
      items = all;
    }
    if (items.empty()) return exec(n.else_body, out);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n.line);
      scopes_.push_back(std::make_shared<Frame>());
      bind(n.targets, items[static_cast<size_t>(k)], n.line);
      Value loop;
      loop.kind = Value::Kind::Dict;
      loop.dict = std::make_shared<Dict>(Dict{
          {"index0", Value::integer(k)},
          {"index", Value::integer(k + 1)},
          {"revindex0", Value::integer(len - k - 1)},
          {"revindex", Value::integer(len - k)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == len - 1)},
          {"length", Value::integer(len)},
          {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("previtem")},
          {"nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value::undefined("nextitem")},
      });
      assign("loop", loop);
      const Flow f = exec(n.body, out);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::callable([this, node](std::vector<Value>& args, Kwargs& kw) {
      if (args.size() > node->params.size())
        throw TemplateError(str("macro '", node->name, "' takes ", node->params.size(), " arguments, got ",
                                args.size()), node->line);
      if (++call_depth_ > kMaxCallDepth)
        throw TemplateError(str("macros call each other more than ", kMaxCallDepth, " deep"), node->line);
      std::vector<std::shared_ptr<Frame>> saved = {scopes_[0], scopes_[1], std::make_shared<Frame>()};
      std::swap(saved, scopes_);
      std::string out;
      try {
        for (size_t p = 0; p < node->params.size(); ++p) {
          Value v = p < args.size() ? args[p] : kw.take(node->params[p]);
          if (v.is_undefined() && node->defaults[p]) v = eval(*node->defaults[p]);
          assign(node->params[p], v);
        }
        if (!kw.items.empty())
          throw TemplateError(str("macro '", node->name, "' has no argument '", kw.items[0].first, "'"), node->line);
        exec(node->body, out);
      } catch (...) {
        std::swap(saved, scopes_);
        --call_depth_;
        throw;
      }
      std::swap(saved, scopes_);
      --call_depth_;
      return Value::string(out);
    });
  }

  void eval_args(const Expr& e, size_t first, std::vector<Value>& args, Kwargs& kw) {
    const size_t nkw = e.kwnames.size(), end = e.a.size() - nkw;
    for (size_t k = first; k < end; ++k) args.push_back(eval(*e.a[k]));
    for (size_t k = 0; k < nkw; ++k) kw.items.emplace_back(e.kwnames[k], eval(*e.a[end + k]));
  }

  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::Literal: return e.lit;
      case Expr::K::Name: return lookup(e.name);
      case Expr::K::Attr: {
        const Value obj = eval(*e.a[0]);
        if (obj.is_undefined()) throw TemplateError(undefined_msg(obj, e.name), e.line);
        return get_attr(obj, e.name);
      }
      case Expr::K::Item: {
        const Value obj = eval(*e.a[0]);
        if (obj.is_undefined()) throw TemplateError(undefined_msg(obj, ""), e.line);
        return get_item(obj, eval(*e.a[1]));
      }
      case Expr::K::Slice: return slice(e);
      case Expr::K::Call: return call(e);
      case Expr::K::Filter: {
        Value subject = eval(*e.a[0]);
        std::vector<Value> args;
        Kwargs kw;
        eval_args(e, 1, args, kw);
        return rethrow_at(e.line, [&] { return find_filter(e.name)(subject, args, kw); });
      }
      case Expr::K::Test: {
        Value subject = eval(*e.a[0]);
        std::vector<Value> args;
        Kwargs kw;
        eval_args(e, 1, args, kw);
        const bool r = rethrow_at(e.line, [&] { return find_test(e.name)(subject, args); });
        return Value::boolean(r != e.negated);
      }
      case Expr::K::Unary: {
        const Value v = eval(*e.a[0]);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.kind == Value::Kind::Int) return Value::integer(e.name == "-" ? -v.i : v.i);
        if (v.is_number()) return Value::real(e.name == "-" ? -v.as_double() : v.as_double());
        throw TemplateError(str("bad operand type for unary ", e.name, ": '", type_name(v), "'"), e.line);
      }
      case Expr::K::Binary: return rethrow_at(e.line, [&] { return binary(e.name, eval(*e.a[0]), eval(*e.a[1])); });
      case Expr::K::And: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? eval(*e.a[1]) : l;
      }
      case Expr::K::Or: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? l : eval(*e.a[1]);
      }
      case Expr::K::Cond:
        if (truthy(eval(*e.a[1]))) return eval(*e.a[0]);
        return e.a[2] ? eval(*e.a[2]) : Value::undefined();
      case Expr::K::ListLit: {
        List l;
        for (const auto& x : e.a) l.push_back(eval(*x));
        return Value::make_list(std::move(l));
      }
      case Expr::K::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
          const Value key = eval(*e.a[k]);
          if (!key.is_str()) throw TemplateError("dict keys must be strings here", e.line);
          d.put(key.s, eval(*e.a[k + 1]));
        }
        return d;
      }
    }
    return Value::undefined();
  }

  static std::string undefined_msg(const Value& obj, const std::string& attr) {
    if (!obj.s.empty()) return str("'", obj.s, "' is undefined");
    return attr.empty() ? "an undefined value has no items" : str("an undefined value has no attribute '", attr, "'");
  }

  template <typename F>
  static auto rethrow_at(int line, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const TemplateError& err) {
      if (err.line() != 0) throw;
      throw TemplateError(err.what(), line);
    }
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.a[0];
    std::vector<Value> args;
    Kwargs kw;
    if (callee.k == Expr::K::Attr) {
      const Value obj = eval(*callee.a[0]);
      if (obj.is_undefined()) throw TemplateError(undefined_msg(obj, callee.name), e.line);
      eval_args(e, 1, args, kw);
      return rethrow_at(e.line, [&] { return call_method(obj, callee.name, args, kw); });
    }
    Value fn = eval(callee);
    if (fn.is_undefined() && callee.k == Expr::K::Name) fn = global_function(callee.name);
    if (fn.kind != Value::Kind::Callable) throw TemplateError(str("'", type_name(fn), "' object is not callable"), e.line);
    eval_args(e, 1, args, kw);
    return rethrow_at(e.line, [&] { return (*fn.fn)(args, kw); });
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.a[0]);
    const auto part = [&](int k, bool& given) -> int64_t {
      given = e.a[static_cast<size_t>(k)] != nullptr;
      if (!given) return 0;
      const Value v = eval(*e.a[static_cast<size_t>(k)]);
      if (v.is_none()) {
        given = false;
        return 0;
      }
      if (v.kind != Value::Kind::Int) throw TemplateError("slice indices must be integers", e.line);
      return v.i;
    };
    bool has_start, has_stop, has_step;
    int64_t start = part(1, has_start), stop = part(2, has_stop), stepv = part(3, has_step);
    if (!has_step) stepv = 1;
    if (stepv == 0) throw TemplateError("slice step cannot be zero", e.line);
    std::u32string chars;
    const bool is_str = obj.is_str();
    int64_t len;
    if (is_str) {
      chars = utf8_decode(obj.s);
      len = static_cast<int64_t>(chars.size());
    } else if (obj.is_list()) {
      len = static_cast<int64_t>(obj.list->size());
    } else {
      throw TemplateError(str("'", type_name(obj), "' object cannot be sliced"), e.line);
    }
    // Python's slice.indices().
    const auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += len;
      if (stepv > 0) return std::min(std::max<int64_t>(v, 0), len);
      return std::min(std::max<int64_t>(v, -1), len - 1);
    };
    start = clamp(start, has_start, stepv > 0 ? 0 : len - 1);
    stop = clamp(stop, has_stop, stepv > 0 ? len : -1);
    std::u32string s;
    List l;
    for (int64_t k = start; stepv > 0 ? k < stop : k > stop; k += stepv) {
      if (is_str) s += chars[static_cast<size_t>(k)];
      else l.push_back((*obj.list)[static_cast<size_t>(k)]);
    }
    return is_str ? Value::string(utf8_encode(s)) : Value::make_list(std::move(l));
  }

  static Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value::string(to_str(a) + to_str(b));
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_str()) {
        if (!a.is_str()) throw TemplateError(str("'in <string>' requires string as left operand, not ", type_name(a)));
        found = b.s.find(a.s) != std::string::npos;
      } else if (b.is_mapping()) {
        found = a.is_str() && b.find(a.s) != nullptr;
      } else if (b.is_list()) {
        for (const Value& x : *b.list) found = found || equal(a, x);
      } else if (!b.is_undefined()) {
        throw TemplateError(str("argument of type '", type_name(b), "' is not iterable"));
      }
      return Value::boolean(found != (op == "not in"));
    }
    if (a.is_undefined() || b.is_undefined())
      throw TemplateError(str("'", a.is_undefined() ? a.s : b.s, "' is undefined"));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (a.is_number() && b.is_number()) c = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
      else if (a.is_str() && b.is_str()) c = a.s.compare(b.s);
      else throw TemplateError(str("'", op, "' not supported between '", type_name(a), "' and '", type_name(b), "'"));
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    const bool ints = (a.kind == Value::Kind::Int || a.kind == Value::Kind::Bool) &&
                      (b.kind == Value::Kind::Int || b.kind == Value::Kind::Bool);
    const int64_t x = a.kind == Value::Kind::Bool ? a.b : a.i, y = b.kind == Value::Kind::Bool ? b.b : b.i;
    if (op == "+") {
      if (a.is_str() && b.is_str()) {
        if (a.s.size() + b.s.size() > kMaxStringBytes) throw TemplateError("a string grows past the size limit");
        return Value::string(a.s + b.s);
      }
      if (a.is_list() && b.is_list()) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" && ((a.is_str() || a.is_list()) && b.kind == Value::Kind::Int)) {
      const int64_t n = std::max<int64_t>(b.i, 0);
      const size_t unit = a.is_str() ? a.s.size() : a.list->size();
      if (unit && static_cast<size_t>(n) > kMaxStringBytes / unit) throw TemplateError("a repetition grows past the size limit");
      if (a.is_str()) {
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += a.s;
        return Value::string(s);
      }
      List l;
      for (int64_t k = 0; k < n; ++k) l.insert(l.end(), a.list->begin(), a.list->end());
      return Value::make_list(std::move(l));
    }
    if (!a.is_number() || !b.is_number())
      throw TemplateError(str("unsupported operand type(s) for ", op, ": '", type_name(a), "' and '", type_name(b), "'"));
    const double fa = a.as_double(), fb = b.as_double();
    if (op == "/") {
      if (fb == 0) throw TemplateError("division by zero");
      return Value::real(fa / fb);
    }
    if (ints) {
      int64_t r = 0;
      if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::integer(r);
      if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::integer(r);
      if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::integer(r);
      if (op == "//" || op == "%") {
        if (y == 0) throw TemplateError("integer division or modulo by zero");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**" && y >= 0) {
        int64_t p = 1;
        for (int64_t k = 0; k < y; ++k)
          if (__builtin_mul_overflow(p, x, &p)) throw TemplateError("an integer power overflows");
        return Value::integer(p);
      }
      if (op == "+" || op == "-" || op == "*") throw TemplateError("an integer operation overflows 64 bits");
    }
    if (op == "+") return Value::real(fa + fb);
    if (op == "-") return Value::real(fa - fb);
    if (op == "*") return Value::real(fa * fb);
    if (op == "//" || op == "%") {
      if (fb == 0) throw TemplateError("float division or modulo by zero");
      const double q = std::floor(fa / fb);
      return Value::real(op == "//" ? q : fa - q * fb);
    }
    if (op == "**") return Value::real(std::pow(fa, fb));
    throw TemplateError(str("unknown operator ", op));
  }
};

}  // namespace

Template::Template(const std::string& source, const std::string& name) : name_(name) {
  try {
    program_ = std::make_unique<Program>(parse_program(source));
  } catch (const TemplateError& e) {
    MPT_THROW(str("chat template ", name, " line ", e.line(), ": ", e.what()),
              "mpitron renders the Jinja subset listed in docs/generate-eval.md (\"Chat templates\")");
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  try {
    return Evaluator(context).run(program_->body);
  } catch (const TemplateError& e) {
    MPT_THROW(str("chat template ", name_, " line ", e.line(), ": ", e.what()), "");
  }
}

}  // namespace mpitron::jinja
