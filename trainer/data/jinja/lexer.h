// Template source -> tokens, with the whitespace rules transformers renders
// chat templates under: Jinja2's trim_blocks and lstrip_blocks, `-` on a tag
// strips the whitespace beside it, and one trailing newline of the source is
// dropped (keep_trailing_newline=False).
#pragma once
#include <string>
#include <vector>

namespace ft::jinja {

enum class TokenKind { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, end };

struct Token {
  TokenKind kind;
  std::string text;  // text, name, string (unescaped), number or operator
  int line;          // 1-based line of the template where the token starts
};

// `where` names the template in errors ("<file>: chat_template").
std::vector<Token> tokenize(const std::string& source, const std::string& where);

}  // namespace ft::jinja
