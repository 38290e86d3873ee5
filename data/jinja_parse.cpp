// data/jinja_parse.cpp — lexer and parser of the chat-template subset (data/jinja.h).
// Whitespace follows transformers' environment: trim_blocks (the newline right after a block
// or comment tag is dropped) and lstrip_blocks (spaces and tabs between a line start and a
// block or comment tag are dropped), '-' strips all whitespace on its side, '+' keeps it.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "data/jinja_builtins.h"

namespace mpitron::jinja {

namespace {

constexpr int kMaxNesting = 200;  // parentheses, brackets and blocks inside each other

struct Tok {
  enum class T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End } t;
  std::string s;
  int line;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python string literal escapes as Jinja decodes them ("unicode-escape").
std::string unescape(const std::string& body, int line) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '\\' || k + 1 == body.size()) {
      out += body[k];
      continue;
    }
    const char c = body[++k];
    const auto hex = [&](size_t n) {
      const std::string h = body.substr(k + 1, n);
      if (h.size() != n || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        throw TemplateError("bad \\x/\\u escape in a string", line);
      k += n;
      return static_cast<char32_t>(std::strtoul(h.c_str(), nullptr, 16));
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '0': out += '\0'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;  // a line continuation
      case 'x': out += utf8_encode(std::u32string(1, hex(2))); break;
      case 'u': out += utf8_encode(std::u32string(1, hex(4))); break;
      case 'U': out += utf8_encode(std::u32string(1, hex(8))); break;
      default: out += '\\'; out += c;
    }
  }
  return out;
}

std::vector<Tok> lex(const std::string& src) {
  std::vector<Tok> toks;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, line_starting = true;
  const auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (pos < src.size()) {
    size_t t = pos;
    while ((t = src.find('{', t)) != std::string::npos &&
           !(t + 1 < src.size() && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#')))
      ++t;
    std::string text = src.substr(pos, t == std::string::npos ? std::string::npos : t - pos);
    const int text_line = line;
    count_lines(pos, t == std::string::npos ? src.size() : t);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      text.erase(0, k);
      strip_next = false;
    }
    if (t == std::string::npos) {
      if (!text.empty()) toks.push_back({Tok::T::Text, text, text_line});
      break;
    }
    const char kind = src[t + 1];
    const char mod = t + 2 < src.size() ? src[t + 2] : '\0';
    if (mod == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (mod != '+' && kind != '{') {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          text.find_first_not_of(" \t\r\f\v", l_pos) == std::string::npos)
        text.erase(l_pos);
    }
    if (!text.empty()) toks.push_back({Tok::T::Text, text, text_line});
    size_t p = t + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    const int tag_line = line;
    if (kind == '#') {
      const size_t e = src.find("#}", p);
      if (e == std::string::npos) throw TemplateError("a comment {# is not closed with #}", tag_line);
      count_lines(p, e);
      const bool minus = e > p && src[e - 1] == '-';
      pos = e + 2;
      if (minus) strip_next = true;
      else if (pos < src.size() && src[pos] == '\n') ++pos, ++line;  // trim_blocks
      line_starting = src[pos - 1] == '\n';
      continue;
    }
    const bool var = kind == '{';
    toks.push_back({var ? Tok::T::VarBegin : Tok::T::BlockBegin, "", tag_line});
    const char close = var ? '}' : '%';
    bool closed = false;
    while (p < src.size()) {
      const char c = src[p];
      if (is_ws(c)) {
        line += c == '\n';
        ++p;
        continue;
      }
      // The end of the tag: "}}" / "%}", or with '-' / '+' before it.
      if ((c == '-' || c == '+') && p + 2 < src.size() && src[p + 1] == close && src[p + 2] == '}') {
        pos = p + 3;
        toks.push_back({var ? Tok::T::VarEnd : Tok::T::BlockEnd, "", line});
        if (c == '-') strip_next = true;
        closed = true;
        break;
      }
      if (c == close && p + 1 < src.size() && src[p + 1] == '}') {
        pos = p + 2;
        toks.push_back({var ? Tok::T::VarEnd : Tok::T::BlockEnd, "", line});
        if (!var && pos < src.size() && src[pos] == '\n') ++pos, ++line;  // trim_blocks
        closed = true;
        break;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        toks.push_back({Tok::T::Name, src.substr(p, e - p), line});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
        if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
          size_t f = e + 1;
          if (f < src.size() && (src[f] == '+' || src[f] == '-')) ++f;
          if (f < src.size() && std::isdigit(static_cast<unsigned char>(src[f]))) {
            is_float = true;
            e = f;
            while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = p; k < e; ++k)
          if (src[k] != '_') num += src[k];
        toks.push_back({is_float ? Tok::T::Float : Tok::T::Int, num, line});
        p = e;
      } else if (c == '\'' || c == '"') {
        size_t e = p + 1;
        const int start_line = line;
        while (e < src.size() && src[e] != c) {
          if (src[e] == '\\') ++e;
          if (e < src.size() && src[e] == '\n') ++line;
          ++e;
        }
        if (e >= src.size()) throw TemplateError("a string literal is not closed", start_line);
        toks.push_back({Tok::T::String, unescape(src.substr(p + 1, e - p - 1), start_line), start_line});
        p = e + 1;
      } else {
        static const char* const kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* o : kOps2)
          if (src.compare(p, 2, o) == 0) op = o;
        if (op.size() == 1 && std::string("+-*/%~<>()[]{},.:|=").find(c) == std::string::npos)
          throw TemplateError(str("unexpected character '", c, "' in a tag"), line);
        toks.push_back({Tok::T::Op, op, line});
        p += op.size();
      }
    }
    if (!closed) throw TemplateError(var ? "a {{ is not closed with }}" : "a {% is not closed with %}", tag_line);
    line_starting = src[pos - 1] == '\n';
  }
  toks.push_back({Tok::T::End, "", line});
  return toks;
}

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
