// data/jinja_ast.h — the parsed form of a chat template (data/jinja.h): expressions and
// statements, each with the source line it came from (for errors). Built by jinja_parse.cpp,
// run by jinja_eval.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace mpitron::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    Literal,   // lit
    Name,      // name
    Attr,      // a[0].name
    Item,      // a[0][a[1]]
    Slice,     // a[0][a[1]:a[2]:a[3]] (null parts absent)
    Call,      // a[0](a[1..]); the last kwnames.size() arguments are keyword arguments
    Filter,    // a[0] | name(a[1..])
    Test,      // a[0] is [not] name(a[1..])
    Unary,     // name in {"-", "+", "not"} applied to a[0]
    Binary,    // a[0] name a[1]: + - * / // % ** ~ == != < > <= >= in "not in"
    And,       // a[0] and a[1]
    Or,        // a[0] or a[1]
    Cond,      // a[0] if a[1] else a[2] (a[2] null: undefined)
    ListLit,   // [a...] and tuples
    DictLit,   // {a[0]: a[1], a[2]: a[3], ...}
  };
  K k;
  int line = 0;
  Value lit;
  std::string name;
  bool negated = false;  // Test: "is not"
  std::vector<ExprP> a;
  std::vector<std::string> kwnames;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class K { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Block };
  K k;
  int line = 0;
  std::string text;                  // Text
  ExprP expr;                        // Output, Set value, For iterable
  std::vector<ExprP> conds;          // If: one per branch; null for else
  std::vector<Body> bodies;          // If: one per branch
  std::vector<std::string> targets;  // For/Set targets; Set of ns.attr: {ns, attr} with attr_target
  bool attr_target = false;
  ExprP filter;                      // For ... if filter
  Body body, else_body;              // For, SetBlock, Macro, Block
  std::string name;                  // Macro
  std::vector<std::string> params;   // Macro
  std::vector<ExprP> defaults;       // Macro: per param, null when none
};

struct Program {
  Body body;
};

// Lexes and parses `source` (jinja_parse.cpp); throws TemplateError with the line.
Program parse_program(const std::string& source);

}  // namespace mpitron::jinja
