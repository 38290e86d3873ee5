#include "data/jinja_lex.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "data/jinja.h"
#include "data/jinja_value.h"

namespace mpitron::jinja {

namespace {

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

}  // namespace

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


}  // namespace mpitron::jinja
