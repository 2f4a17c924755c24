// The parsed template: statements (Node) holding expressions (Expr).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data/jinja/value.h"

namespace ft::jinja {

enum class ExprKind {
  literal,    // value
  name,       // text
  list,       // children
  dict,       // children: key, value, key, value, ...
  attribute,  // children[0].text
  subscript,  // children[0][children[1]]
  slice,      // children[0][children[1]:children[2]:children[3]] (null parts absent)
  call,       // children[0](children[1..], keywords)
  filter,     // children[0] | text(children[1..], keywords)
  test,       // children[0] is [not] text(children[1..])
  unary,      // text: "not", "-", "+"
  binary,     // text: or and in ~ + - * / // % ** == != < <= > >=; negated: not in
  ternary,    // children[0] if children[1] else children[2] (else absent: Undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string text;
  Json value;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  bool negated = false;
};

enum class NodeKind {
  text,        // text
  output,      // {{ expr }}
  if_,         // {% if expr %} body {% else %} else_body (elif: an if inside else_body)
  for_,        // {% for targets in expr [if filter] %} body {% else %} else_body
  set,         // {% set targets[0][.attribute] = expr %}, or the body rendered when expr is null
  macro,       // {% macro text(targets = defaults) %} body
  generation,  // {% generation %} body: the assistant's tokens, for return_assistant_tokens_mask
  with,        // {% with targets = defaults %} body: the names bound in a scope of their own
  filter,      // {% filter f(args) | g %} body: expr, filters over the name "" (the body's text)
  break_,
  continue_,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<ExprPtr> defaults;  // macro: one per target, null where none; with: one per target
  std::vector<NodePtr> body, else_body;
};

}  // namespace ft::jinja
