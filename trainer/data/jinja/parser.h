// Tokens -> statements, with Jinja2's operator precedence. Constructs chat
// templates do not use (extends, include, import, call, filter blocks, raw)
// are one error naming the template, the line and the construct.
#pragma once
#include <string>
#include <vector>

#include "trainer/data/jinja/ast.h"
#include "trainer/data/jinja/lexer.h"

namespace ft::jinja {

std::vector<NodePtr> parse(const std::vector<Token>& tokens, const std::string& where);

}  // namespace ft::jinja
