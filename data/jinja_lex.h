// data/jinja_lex.h — the chat-template lexer (data/jinja.h): text and the tokens inside {{ }} and
// {% %} tags, with transformers' whitespace rules applied to the text: trim_blocks (the newline right
// after a block or comment tag is dropped), lstrip_blocks (spaces and tabs between a line start and a
// block or comment tag are dropped), '-' strips all whitespace on its side, '+' keeps it. Comments
// are dropped. Throws TemplateError with the line.
#pragma once
#include <string>
#include <vector>

namespace mpitron::jinja {

struct Tok {
  enum class T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End } t;
  std::string s;  // text, name, operator, or a string literal's value (escapes decoded)
  int line;
};

std::vector<Tok> lex(const std::string& src);

}  // namespace mpitron::jinja
