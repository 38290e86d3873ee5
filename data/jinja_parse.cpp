// data/jinja_parse.cpp — the parser of the chat-template subset (data/jinja.h): the lexer's tokens
// (data/jinja_lex.h) into the program (data/jinja_ast.h), refusing what the subset lacks by name.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "data/jinja_builtins.h"
#include "data/jinja_lex.h"

namespace mpitron::jinja {

namespace {

constexpr int kMaxNesting = 200;  // parentheses, brackets and blocks inside each other

class Parser {
 public:
  explicit Parser(std::vector<Tok> toks) : toks_(std::move(toks)) {}

  Program parse() {
    Program p;
    std::string end = parse_body(p.body, {});
    if (!end.empty()) throw TemplateError(str("unexpected '{% ", end, " %}'"), cur().line);
    check_calls(p.body);
    return p;
  }

 private:
  std::vector<Tok> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  std::set<std::string> macros_;
  std::vector<std::pair<std::string, int>> called_;  // plain-name calls, checked at the end

  const Tok& cur() const { return toks_[i_]; }
  const Tok& peek(size_t n = 1) const { return toks_[std::min(i_ + n, toks_.size() - 1)]; }
  bool is_op(const std::string& s) const { return cur().t == Tok::T::Op && cur().s == s; }
  bool is_name(const std::string& s) const { return cur().t == Tok::T::Name && cur().s == s; }
  void expect_op(const std::string& s) {
    if (!is_op(s)) throw TemplateError(str("expected '", s, "', got ", describe(cur())), cur().line);
    ++i_;
  }
  static std::string describe(const Tok& t) {
    switch (t.t) {
      case Tok::T::End: return "the end of the template";
      case Tok::T::VarEnd: return "'}}'";
      case Tok::T::BlockEnd: return "'%}'";
      case Tok::T::String: return "a string";
      default: return "'" + t.s + "'";
    }
  }
  std::string expect_name() {
    if (cur().t != Tok::T::Name) throw TemplateError(str("expected a name, got ", describe(cur())), cur().line);
    return toks_[i_++].s;
  }
  void expect_block_end() {
    if (cur().t != Tok::T::BlockEnd) throw TemplateError(str("expected '%}', got ", describe(cur())), cur().line);
    ++i_;
  }
  struct Depth {
    Parser& p;
    explicit Depth(Parser& q) : p(q) {
      if (++p.depth_ > kMaxNesting) throw TemplateError(str("nested more than ", kMaxNesting, " deep"), p.cur().line);
    }
    ~Depth() { --p.depth_; }
  };

  // Parses nodes until a block tag whose keyword is in `ends` (returned, its '{%' and keyword
  // consumed) or the end of the template ("" returned).
  std::string parse_body(Body& body, const std::set<std::string>& ends) {
    Depth d(*this);
    while (cur().t != Tok::T::End) {
      const Tok& t = cur();
      if (t.t == Tok::T::Text) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::Text;
        n->text = t.s;
        n->line = t.line;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.t == Tok::T::VarBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::Output;
        n->line = t.line;
        n->expr = parse_expr();
        if (cur().t != Tok::T::VarEnd) throw TemplateError(str("expected '}}', got ", describe(cur())), cur().line);
        ++i_;
        body.push_back(std::move(n));
      } else if (t.t == Tok::T::BlockBegin) {
        ++i_;
        const int line = cur().line;
        const std::string kw = expect_name();
        if (ends.count(kw)) return kw;
        body.push_back(parse_statement(kw, line));
      } else {
        throw TemplateError(str("unexpected ", describe(t)), t.line);
      }
    }
    if (!ends.empty()) {
      std::string want;
      for (const auto& e : ends) want += (want.empty() ? "" : " or ") + std::string("{% ") + e + " %}";
      throw TemplateError(str("the template ends before ", want), cur().line);
    }
    return "";
  }

  std::unique_ptr<Node> parse_statement(const std::string& kw, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->k = Node::K::If;
      n->conds.push_back(parse_expr());
      expect_block_end();
      for (;;) {
        n->bodies.emplace_back();
        const std::string end = parse_body(n->bodies.back(), {"elif", "else", "endif"});
        if (end == "endif") break;
        if (end == "elif") {
          n->conds.push_back(parse_expr());
        } else {
          n->conds.push_back(nullptr);
          expect_block_end();
          n->bodies.emplace_back();
          parse_body(n->bodies.back(), {"endif"});
          break;
        }
        expect_block_end();
      }
      expect_block_end();
    } else if (kw == "for") {
      n->k = Node::K::For;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) throw TemplateError(str("expected 'in' in a for loop, got ", describe(cur())), cur().line);
      ++i_;
      n->expr = parse_or_cond(false);
      if (is_name("if")) {
        ++i_;
        n->filter = parse_or_cond(false);
      }
      if (is_name("recursive")) throw TemplateError("recursive for loops are not supported", cur().line);
      expect_block_end();
      const std::string end = parse_body(n->body, {"else", "endfor"});
      if (end == "else") {
        expect_block_end();
        parse_body(n->else_body, {"endfor"});
      }
      expect_block_end();
    } else if (kw == "set") {
      const std::string first = expect_name();
      if (is_op(".")) {
        ++i_;
        n->targets = {first, expect_name()};
        n->attr_target = true;
      } else {
        n->targets.push_back(first);
        while (is_op(",")) {
          ++i_;
          n->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        ++i_;
        n->k = Node::K::Set;
        n->expr = parse_expr();
        expect_block_end();
      } else {
        if (n->attr_target || n->targets.size() != 1)
          throw TemplateError("a {% set %} block takes one plain name", line);
        n->k = Node::K::SetBlock;
        expect_block_end();
        parse_body(n->body, {"endset"});
        expect_block_end();
      }
    } else if (kw == "macro") {
      n->k = Node::K::Macro;
      n->name = expect_name();
      macros_.insert(n->name);
      expect_op("(");
      while (!is_op(")")) {
        n->params.push_back(expect_name());
        if (is_op("=")) {
          ++i_;
          n->defaults.push_back(parse_expr());
        } else {
          n->defaults.push_back(nullptr);
        }
        if (!is_op(")")) expect_op(",");
      }
      ++i_;
      expect_block_end();
      parse_body(n->body, {"endmacro"});
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::K::Break : Node::K::Continue;
      expect_block_end();
    } else if (kw == "generation") {
      n->k = Node::K::Block;
      expect_block_end();
      parse_body(n->body, {"endgeneration"});
      expect_block_end();
    } else if (kw == "endif" || kw == "endfor" || kw == "elif" || kw == "else" || kw == "endmacro" ||
               kw == "endset" || kw == "endgeneration") {
      throw TemplateError(str("unexpected '{% ", kw, " %}'"), line);
    } else {
      throw TemplateError(str("unsupported tag '{% ", kw, " %}'"), line);
    }
    return n;
  }

  ExprP make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  ExprP parse_expr() { return parse_or_cond(true); }

  // or_expr ['if' or_expr ['else' expr]] (the conditional only where Jinja allows it).
  ExprP parse_or_cond(bool with_cond) {
    Depth d(*this);
    ExprP e = parse_or();
    while (with_cond && is_name("if")) {
      const int line = cur().line;
      ++i_;
      auto c = make(Expr::K::Cond, line);
      c->a.push_back(std::move(e));
      c->a.push_back(parse_or());
      if (is_name("else")) {
        ++i_;
        c->a.push_back(parse_or_cond(true));
      } else {
        c->a.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      auto n = make(Expr::K::Or, cur().line);
      ++i_;
      n->a.push_back(std::move(e));
      n->a.push_back(parse_and());
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      auto n = make(Expr::K::And, cur().line);
      ++i_;
      n->a.push_back(std::move(e));
      n->a.push_back(parse_not());
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      Depth d(*this);
      auto n = make(Expr::K::Unary, cur().line);
      ++i_;
      n->name = "not";
      n->a.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    for (;;) {
      std::string op;
      if (cur().t == Tok::T::Op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == ">" ||
                                    cur().s == "<=" || cur().s == ">=")) {
        op = cur().s;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().t == Tok::T::Name && peek().s == "in") {
        op = "not in";
        i_ += 2;
      } else {
        return e;
      }
      auto n = make(Expr::K::Binary, cur().line);
      n->name = op;
      n->a.push_back(std::move(e));
      n->a.push_back(parse_math1());
      e = std::move(n);
    }
  }
  ExprP binary_loop(ExprP (Parser::*next)(), std::initializer_list<const char*> ops) {
    ExprP e = (this->*next)();
    for (;;) {
      bool hit = false;
      for (const char* o : ops)
        if (is_op(o)) hit = true;
      if (!hit) return e;
      auto n = make(Expr::K::Binary, cur().line);
      n->name = toks_[i_++].s;
      n->a.push_back(std::move(e));
      n->a.push_back((this->*next)());
      e = std::move(n);
    }
  }
  ExprP parse_math1() { return binary_loop(&Parser::parse_concat, {"+", "-"}); }
  ExprP parse_concat() { return binary_loop(&Parser::parse_math2, {"~"}); }
  ExprP parse_math2() { return binary_loop(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  ExprP parse_pow() { return binary_loop(&Parser::parse_unary_filtered, {"**"}); }
  ExprP parse_unary_filtered() { return parse_unary(true); }

  ExprP parse_unary(bool with_filter) {
    Depth d(*this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = make(Expr::K::Unary, cur().line);
      e->name = toks_[i_++].s;
      e->a.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprP parse_primary() {
    const Tok& t = cur();
    const int line = t.line;
    switch (t.t) {
      case Tok::T::Name: {
        ++i_;
        auto e = make(Expr::K::Literal, line);
        if (t.s == "true" || t.s == "True") e->lit = Value::boolean(true);
        else if (t.s == "false" || t.s == "False") e->lit = Value::boolean(false);
        else if (t.s == "none" || t.s == "None") e->lit = Value::none();
        else {
          e->k = Expr::K::Name;
          e->name = t.s;
        }
        return e;
      }
      case Tok::T::String: {
        auto e = make(Expr::K::Literal, line);
        std::string s = toks_[i_++].s;
        while (cur().t == Tok::T::String) s += toks_[i_++].s;  // adjacent literals concatenate
        e->lit = Value::string(s);
        return e;
      }
      case Tok::T::Int: {
        auto e = make(Expr::K::Literal, line);
        errno = 0;
        const long long v = std::strtoll(t.s.c_str(), nullptr, 10);
        if (errno == ERANGE) throw TemplateError(str("integer literal ", t.s, " is too large"), line);
        e->lit = Value::integer(v);
        ++i_;
        return e;
      }
      case Tok::T::Float: {
        auto e = make(Expr::K::Literal, line);
        e->lit = Value::real(std::strtod(t.s.c_str(), nullptr));
        ++i_;
        return e;
      }
      case Tok::T::Op:
        if (t.s == "(") {
          ++i_;
          if (is_op(")")) {  // the empty tuple
            ++i_;
            return make(Expr::K::ListLit, line);
          }
          ExprP first = parse_expr();
          if (is_op(",")) {
            auto tup = make(Expr::K::ListLit, line);
            tup->a.push_back(std::move(first));
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              tup->a.push_back(parse_expr());
            }
            expect_op(")");
            return tup;
          }
          expect_op(")");
          return first;
        }
        if (t.s == "[") {
          ++i_;
          auto l = make(Expr::K::ListLit, line);
          while (!is_op("]")) {
            l->a.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          ++i_;
          return l;
        }
        if (t.s == "{") {
          ++i_;
          auto d = make(Expr::K::DictLit, line);
          while (!is_op("}")) {
            d->a.push_back(parse_expr());
            expect_op(":");
            d->a.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          ++i_;
          return d;
        }
        break;
      default: break;
    }
    throw TemplateError(str("unexpected ", describe(t), " in an expression"), line);
  }

  // Arguments after '(' up to ')': positional, then name=value.
  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().t == Tok::T::Name && peek().t == Tok::T::Op && peek().s == "=") {
        call.kwnames.push_back(toks_[i_].s);
        i_ += 2;
        call.a.push_back(parse_expr());
      } else {
        if (!call.kwnames.empty())
          throw TemplateError("a positional argument follows a keyword argument", cur().line);
        call.a.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
  }

  ExprP parse_postfix(ExprP e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        ++i_;
        if (cur().t == Tok::T::Int) {  // x.0 is x[0] in Jinja
          auto n = make(Expr::K::Item, line);
          n->a.push_back(std::move(e));
          auto idx = make(Expr::K::Literal, line);
          idx->lit = Value::integer(std::strtoll(toks_[i_++].s.c_str(), nullptr, 10));
          n->a.push_back(std::move(idx));
          e = std::move(n);
          continue;
        }
        auto n = make(Expr::K::Attr, line);
        n->name = expect_name();
        n->a.push_back(std::move(e));
        e = std::move(n);
      } else if (is_op("[")) {
        ++i_;
        ExprP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (k < 2 && is_op(":")) {
            slice = true;
            ++i_;
          } else {
            break;
          }
        }
        expect_op("]");
        auto n = make(slice ? Expr::K::Slice : Expr::K::Item, line);
        n->a.push_back(std::move(e));
        if (slice) {
          for (auto& p : parts) n->a.push_back(std::move(p));
        } else {
          if (!parts[0]) throw TemplateError("an empty subscript []", line);
          n->a.push_back(std::move(parts[0]));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::K::Call, line);
        if (e->k == Expr::K::Attr) {
          if (!is_method(e->name)) throw TemplateError(str("unsupported method '.", e->name, "()'"), line);
        } else if (e->k == Expr::K::Name) {
          called_.emplace_back(e->name, line);
        }
        n->a.push_back(std::move(e));
        parse_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  ExprP parse_filters(ExprP e) {
    for (;;) {
      const int line = cur().line;
      if (is_op("|")) {
        ++i_;
        auto n = make(Expr::K::Filter, line);
        n->name = expect_name();
        if (!find_filter(n->name)) throw TemplateError(str("unknown filter '", n->name, "'"), line);
        n->a.push_back(std::move(e));
        if (is_op("(")) parse_args(*n);
        e = std::move(n);
      } else if (is_name("is")) {
        ++i_;
        auto n = make(Expr::K::Test, line);
        if (is_name("not")) {
          n->negated = true;
          ++i_;
        }
        n->name = expect_name();
        if (!find_test(n->name)) throw TemplateError(str("unknown test '", n->name, "'"), line);
        n->a.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*n);
        } else if (cur().t == Tok::T::String || cur().t == Tok::T::Int || cur().t == Tok::T::Float ||
                   (cur().t == Tok::T::Name && cur().s != "and" && cur().s != "or" && cur().s != "else" &&
                    cur().s != "if" && cur().s != "is" && cur().s != "in" && cur().s != "not")) {
          n->a.push_back(parse_unary(false));  // `is equalto 'x'`: one argument without parentheses
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::K::Call, line);
        n->a.push_back(std::move(e));
        parse_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  void check_calls(const Body&) {
    for (const auto& [name, line] : called_)
      if (!is_global_function(name) && !macros_.count(name))
        throw TemplateError(str("unknown function '", name, "()'"), line);
  }
};

}  // namespace

Program parse_program(const std::string& source) { return Parser(lex(source)).parse(); }

}  // namespace mpitron::jinja
