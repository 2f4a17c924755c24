#include "trainer/data/jinja/parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "kernels/error.h"

namespace ft::jinja {
namespace {

ExprPtr make(ExprKind kind, int line, std::string text = "") {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->line = line;
  expr->text = std::move(text);
  return expr;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& where) : tokens_(tokens), where_(where) {}

  std::vector<NodePtr> run() {
    std::vector<NodePtr> nodes = parse_body({});
    if (peek().kind != TokenKind::end) fail_here("'{% " + peek(1).text + " %}' closes nothing");
    return nodes;
  }

 private:
  // Statements and expressions nest at most kMaxNesting deep (real templates:
  // a handful), so that the recursion of parsing and rendering stays bounded.
  static constexpr int kMaxNesting = 64;
  struct Nesting {
    Parser& parser;
    explicit Nesting(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxNesting) parser.fail_here("statements or expressions nest deeper than 64");
    }
    ~Nesting() { parser.depth_--; }
  };

  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().kind == TokenKind::op && peek().text == op; }
  bool at_name(const char* name) const { return peek().kind == TokenKind::name && peek().text == name; }

  [[noreturn]] void fail_here(const std::string& what) const {
    ::ft::fail(where_, " line ", peek().line, ": ", what);
  }
  void expect_op(const char* op) {
    if (!at_op(op)) fail_here(std::string("expected '") + op + "', got '" + peek().text + "'");
    pos_++;
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::name) fail_here("expected a name, got '" + peek().text + "'");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::block_end) fail_here("expected '%}', got '" + peek().text + "'");
    pos_++;
  }

  // Statements until a block tag whose keyword is in `stops` (left unread,
  // positioned at its block_begin) or the end of the template.
  std::vector<NodePtr> parse_body(const std::set<std::string>& stops) {
    std::vector<NodePtr> nodes;
    while (peek().kind != TokenKind::end) {
      const Token& token = peek();
      if (token.kind == TokenKind::text) {
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::text;
        node->line = token.line;
        node->text = token.text;
        nodes.push_back(std::move(node));
        pos_++;
      } else if (token.kind == TokenKind::var_begin) {
        pos_++;
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::output;
        node->line = token.line;
        node->expr = parse_expression();
        if (peek().kind != TokenKind::var_end) fail_here("expected '}}', got '" + peek().text + "'");
        pos_++;
        nodes.push_back(std::move(node));
      } else {
        // A closing or continuing tag ends this body: the caller checks it is the one it expects.
        const std::string& keyword = peek(1).kind == TokenKind::name ? peek(1).text : "";
        if (stops.count(keyword) || keyword.starts_with("end") || keyword == "else" || keyword == "elif") return nodes;
        nodes.push_back(parse_statement());
      }
    }
    return nodes;
  }

  // At a block_begin whose keyword must be `keyword`: consumes "{% keyword".
  void take_tag(const char* keyword) {
    pos_++;
    if (!at_name(keyword)) fail_here(std::string("expected '{% ") + keyword + " %}', got '{% " + peek().text + " %}'");
    pos_++;
  }

  void close_with(const char* end_keyword, int open_line, const char* opener) {
    if (peek().kind == TokenKind::end)
      ::ft::fail(where_, " line ", open_line, ": '{% ", opener, " %}' is never closed with '{% ", end_keyword, " %}'");
    take_tag(end_keyword);
    expect_block_end();
  }

  NodePtr parse_statement() {
    const Nesting nesting(*this);
    pos_++;  // block_begin
    const int line = peek().line;
    const std::string keyword = peek().kind == TokenKind::name ? peek().text : "";
    auto node = std::make_unique<Node>();
    node->line = line;
    if (keyword == "if") {
      pos_++;
      parse_if(*node);
      return node;
    }
    if (keyword == "for") {
      pos_++;
      node->kind = NodeKind::for_;
      node->targets.push_back(expect_name());
      while (at_op(",")) {
        pos_++;
        node->targets.push_back(expect_name());
      }
      if (!at_name("in")) fail_here("expected 'in' in a for loop, got '" + peek().text + "'");
      pos_++;
      node->expr = parse_ternary(/*allow_if=*/false);
      if (at_name("if")) {
        pos_++;
        node->filter = parse_ternary(false);
      }
      if (at_name("recursive")) fail_here("unsupported construct 'recursive' loops");
      expect_block_end();
      node->body = parse_body({"else", "endfor"});
      if (peek().kind != TokenKind::end && peek(1).text == "else") {
        take_tag("else");
        expect_block_end();
        node->else_body = parse_body({"endfor"});
      }
      close_with("endfor", line, "for");
      return node;
    }
    if (keyword == "set") {
      pos_++;
      node->kind = NodeKind::set;
      node->targets.push_back(expect_name());
      if (at_op(".")) {
        pos_++;
        node->attribute = expect_name();
      }
      if (at_op(",")) fail_here("unsupported construct '{% set a, b = ... %}'");
      if (at_op("=")) {
        pos_++;
        node->expr = parse_expression();
        expect_block_end();
        return node;
      }
      expect_block_end();
      node->body = parse_body({"endset"});
      close_with("endset", line, "set");
      return node;
    }
    if (keyword == "macro") {
      pos_++;
      node->kind = NodeKind::macro;
      node->text = expect_name();
      expect_op("(");
      while (!at_op(")")) {
        node->targets.push_back(expect_name());
        if (at_op("=")) {
          pos_++;
          node->defaults.push_back(parse_expression());
        } else {
          node->defaults.push_back(nullptr);
        }
        if (!at_op(")")) expect_op(",");
      }
      pos_++;
      expect_block_end();
      node->body = parse_body({"endmacro"});
      close_with("endmacro", line, "macro");
      return node;
    }
    if (keyword == "generation") {
      pos_++;
      node->kind = NodeKind::generation;
      expect_block_end();
      node->body = parse_body({"endgeneration"});
      close_with("endgeneration", line, "generation");
      return node;
    }
    if (keyword == "with") {
      pos_++;
      node->kind = NodeKind::with;
      while (peek().kind != TokenKind::block_end) {
        node->targets.push_back(expect_name());
        expect_op("=");
        node->defaults.push_back(parse_expression());
        if (peek().kind != TokenKind::block_end) expect_op(",");
      }
      expect_block_end();
      node->body = parse_body({"endwith"});
      close_with("endwith", line, "with");
      return node;
    }
    if (keyword == "filter") {
      pos_++;
      node->kind = NodeKind::filter;
      node->expr = parse_filters(parse_filter(make(ExprKind::name, line)));
      expect_block_end();
      node->body = parse_body({"endfilter"});
      close_with("endfilter", line, "filter");
      return node;
    }
    if (keyword == "break" || keyword == "continue") {
      pos_++;
      node->kind = keyword == "break" ? NodeKind::break_ : NodeKind::continue_;
      expect_block_end();
      return node;
    }
    fail_here("unsupported construct '{% " + (keyword.empty() ? peek().text : keyword) +
              " %}' (chat templates here may use if, for, set, macro, with, filter, generation, break and continue)");
  }

  // After "{% if": condition, body, then elif/else chains.
  void parse_if(Node& node) {
    node.kind = NodeKind::if_;
    node.expr = parse_expression();
    expect_block_end();
    node.body = parse_body({"elif", "else", "endif"});
    if (peek().kind != TokenKind::end && peek(1).text == "elif") {
      pos_ += 2;
      auto nested = std::make_unique<Node>();
      nested->line = peek().line;
      parse_if(*nested);  // consumes the shared endif
      node.else_body.push_back(std::move(nested));
      return;
    }
    if (peek().kind != TokenKind::end && peek(1).text == "else") {
      take_tag("else");
      expect_block_end();
      node.else_body = parse_body({"endif"});
    }
    close_with("endif", node.line, "if");
  }

  // ---- expressions, lowest precedence first (Jinja2's parser.py order) ----

  ExprPtr parse_expression() { return parse_ternary(true); }

  ExprPtr parse_ternary(bool allow_if) {
    ExprPtr value = parse_binary(kOr);
    while (allow_if && at_name("if")) {
      const int line = peek().line;
      pos_++;
      auto ternary = make(ExprKind::ternary, line);
      ternary->children.push_back(std::move(value));
      ternary->children.push_back(parse_binary(kOr));
      if (at_name("else")) {
        pos_++;
        ternary->children.push_back(parse_ternary(true));
      }
      value = std::move(ternary);
    }
    return value;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto node = make(ExprKind::binary, line, op);
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }

  // Jinja2's binary operators by level, loosest first ("not" and the comparisons
  // sit between "and" and "+"); each level's operands are the next level's.
  enum Level { kOr, kAnd, kAdd, kConcat, kMultiply, kPower };
  ExprPtr parse_binary(int level) {
    static const std::vector<std::vector<std::string>> ops = {{"or"}, {"and"}, {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    auto operand = [&] { return level == kAnd ? parse_not() : level == kPower ? parse_unary(true) : parse_binary(level + 1); };
    ExprPtr left = operand();
    while (true) {
      const Token& token = peek();
      const bool is_op = (token.kind == TokenKind::op || token.kind == TokenKind::name) &&
                         std::find(ops[level].begin(), ops[level].end(), token.text) != ops[level].end() &&
                         (token.kind == TokenKind::name) == (level <= kAnd);
      if (!is_op) return left;
      pos_++;
      left = binary(token.text, std::move(left), operand(), token.line);
    }
  }

  ExprPtr parse_not() {
    const Nesting nesting(*this);
    if (at_name("not")) {
      auto node = make(ExprKind::unary, next().line, "not");
      node->children.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_binary(kAdd);
    static const std::set<std::string> ops = {"==", "!=", "<", "<=", ">", ">="};
    while (true) {
      const int line = peek().line;
      std::string op;
      bool negated = false;
      if (peek().kind == TokenKind::op && ops.count(peek().text)) {
        op = next().text;
      } else if (at_name("in")) {
        pos_++;
        op = "in";
      } else if (at_name("not") && peek(1).kind == TokenKind::name && peek(1).text == "in") {
        pos_ += 2;
        op = "in";
        negated = true;
      } else {
        break;
      }
      ExprPtr right = parse_binary(kAdd);
      left = binary(op, std::move(left), std::move(right), line);
      left->negated = negated;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nesting nesting(*this);
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& op = next();
      node = make(ExprKind::unary, op.line, op.text);
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    const Nesting nesting(*this);
    const Token& token = next();
    switch (token.kind) {
      case TokenKind::name: {
        static const std::set<std::string> truths = {"true", "True"}, falses = {"false", "False"},
                                           nones = {"none", "None"};
        if (truths.count(token.text)) return literal(true, token.line);
        if (falses.count(token.text)) return literal(false, token.line);
        if (nones.count(token.text)) return literal(nullptr, token.line);
        return make(ExprKind::name, token.line, token.text);
      }
      case TokenKind::string: {
        std::string text = token.text;
        while (peek().kind == TokenKind::string) text += next().text;  // adjacent literals join
        return literal(text, token.line);
      }
      case TokenKind::integer:
        return literal(integer_literal(token), token.line);
      case TokenKind::floating:
        return literal(std::strtod(token.text.c_str(), nullptr), token.line);  // past the range: inf, as Python
      case TokenKind::op:
        if (token.text == "(") {
          if (at_op(")")) {
            pos_++;
            return make(ExprKind::list, token.line);
          }
          ExprPtr inner = parse_expression();
          if (!at_op(",")) {
            expect_op(")");
            return inner;
          }
          auto tuple = make(ExprKind::list, token.line);  // tuples behave as lists here
          tuple->children.push_back(std::move(inner));
          while (at_op(",")) {
            pos_++;
            if (at_op(")")) break;
            tuple->children.push_back(parse_expression());
          }
          expect_op(")");
          return tuple;
        }
        if (token.text == "[") {
          auto list = make(ExprKind::list, token.line);
          while (!at_op("]")) {
            list->children.push_back(parse_expression());
            if (!at_op("]")) expect_op(",");
          }
          pos_++;
          return list;
        }
        if (token.text == "{") {
          auto dict = make(ExprKind::dict, token.line);
          while (!at_op("}")) {
            dict->children.push_back(parse_expression());
            expect_op(":");
            dict->children.push_back(parse_expression());
            if (!at_op("}")) expect_op(",");
          }
          pos_++;
          return dict;
        }
        break;
      default:
        break;
    }
    pos_--;
    fail_here("unexpected '" + token.text + "' in an expression");
  }

  // Python's ints have no bound; here one past 64 bits is refused.
  int64_t integer_literal(const Token& token) const {
    errno = 0;
    const long long value = std::strtoll(token.text.c_str(), nullptr, 10);
    if (errno == ERANGE) ::ft::fail(where_, " line ", token.line, ": the integer ", token.text, " is past 64 bits");
    return value;
  }

  ExprPtr literal(Json value, int line) {
    auto node = make(ExprKind::literal, line);
    node->value = std::move(value);
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const int line = peek().line;
      if (at_op(".")) {
        pos_++;
        auto attribute = make(ExprKind::attribute, line);
        if (peek().kind == TokenKind::integer) {  // x.0 is x[0]
          attribute->kind = ExprKind::subscript;
          attribute->children.push_back(std::move(node));
          attribute->children.push_back(literal(integer_literal(next()), line));
        } else {
          attribute->text = expect_name();
          attribute->children.push_back(std::move(node));
        }
        node = std::move(attribute);
      } else if (at_op("[")) {
        pos_++;
        node = parse_subscript(std::move(node), line);
      } else if (at_op("(")) {
        node = parse_call(std::move(node), ExprKind::call, "");
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!at_op("]")) {
      if (at_op(":")) {
        pos_++;
        is_slice = true;
        if (++part > 2) fail_here("a slice has at most two ':'");
        continue;
      }
      parts[part] = parse_expression();
    }
    pos_++;
    auto node = make(is_slice ? ExprKind::slice : ExprKind::subscript, line);
    node->children.push_back(std::move(object));
    if (!is_slice) {
      if (!parts[0]) fail_here("an empty subscript []");
      node->children.push_back(std::move(parts[0]));
      return node;
    }
    for (ExprPtr& p : parts) node->children.push_back(std::move(p));
    return node;
  }

  // "(args, name=value)" after a callee, filter or test name.
  ExprPtr parse_call(ExprPtr first, ExprKind kind, std::string name) {
    auto node = make(kind, peek().line, std::move(name));
    node->children.push_back(std::move(first));
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == TokenKind::name && peek(1).kind == TokenKind::op && peek(1).text == "=") {
        std::string key = next().text;
        pos_++;
        node->keywords.push_back({key, parse_expression()});
      } else {
        if (at_op("*") || at_op("**")) fail_here("unsupported construct: *args and **kwargs in calls");
        node->children.push_back(parse_expression());
      }
      if (!at_op(")")) expect_op(",");
    }
    pos_++;
    return node;
  }

  // "name" or "name(args)" applied to node, the part after a '|'.
  ExprPtr parse_filter(ExprPtr node) {
    const int line = peek().line;
    std::string name = expect_name();
    if (at_op("(")) return parse_call(std::move(node), ExprKind::filter, name);
    auto filter = make(ExprKind::filter, line, name);
    filter->children.push_back(std::move(node));
    return filter;
  }

  // value | filter(args) | ... and value is [not] test [arg]
  ExprPtr parse_filters(ExprPtr node) {
    while (true) {
      if (at_op("|")) {
        pos_++;
        node = parse_filter(std::move(node));
      } else if (at_name("is")) {
        const int line = next().line;
        bool negated = false;
        if (at_name("not")) {
          pos_++;
          negated = true;
        }
        std::string name = expect_name();
        if (at_op("(")) {
          node = parse_call(std::move(node), ExprKind::test, name);
        } else {
          auto test = make(ExprKind::test, line, name);
          test->children.push_back(std::move(node));
          static const std::set<std::string> not_args = {"else", "or", "and", "if", "is", "in", "not"};
          const Token& t = peek();
          const bool takes_arg = t.kind == TokenKind::string || t.kind == TokenKind::integer ||
                                 t.kind == TokenKind::floating ||
                                 (t.kind == TokenKind::name && !not_args.count(t.text)) ||
                                 (t.kind == TokenKind::op && (t.text == "[" || t.text == "{"));
          if (takes_arg) test->children.push_back(parse_postfix(parse_primary()));
          node = std::move(test);
        }
        node->negated = negated;
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& tokens_;
  const std::string& where_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<NodePtr> parse(const std::vector<Token>& tokens, const std::string& where) {
  return Parser(tokens, where).run();
}

}  // namespace ft::jinja
