#include "trainer/data/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "kernels/error.h"
#include "tokenizer/unicode.h"

namespace ft::jinja {
namespace {

constexpr const char* kSpace = " \t\r\n\f\v";

bool is_name_start(char c) { return std::isalpha((unsigned char)c) || c == '_'; }
bool is_name_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& where) : src_(source), where_(where) {
    // keep_trailing_newline=False: Jinja2 drops one newline at the end of the source.
    if (src_.ends_with("\r\n")) src_.resize(src_.size() - 2);
    else if (src_.ends_with("\n")) src_.pop_back();
  }

  std::vector<Token> run() {
    bool strip_next = false, trim_next = false;  // what the previous tag asks of the text after it
    bool line_starting = true;  // what came before the text ended a line (Jinja2's lstrip_blocks test)
    while (pos_ < src_.size()) {
      size_t open = find_tag(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      const int text_line = line_;
      const bool after_tag = pos_ > 0;
      advance_to(open);
      if (strip_next) {
        size_t keep = text.find_first_not_of(kSpace);
        size_t cut = keep == std::string::npos ? text.size() : keep;
        line_starting = cut > 0 && text[cut - 1] == '\n';
        text.erase(0, cut);
      } else if (trim_next && (text.starts_with("\n") || text.starts_with("\r\n"))) {
        text.erase(0, text.find('\n') + 1);
        line_starting = true;
      } else if (after_tag) {
        line_starting = false;
      }
      strip_next = trim_next = false;
      if (open == src_.size()) {
        emit_text(text, text_line);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char modifier = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (modifier == '-') {
        size_t keep = text.find_last_not_of(kSpace);
        text.erase(keep == std::string::npos ? 0 : keep + 1);
      } else if (kind != '{' && modifier != '+') {
        // lstrip_blocks: blanks between a line's start and a block or comment tag go.
        size_t line_start = text.rfind('\n');
        line_start = line_start == std::string::npos ? 0 : line_start + 1;
        if ((line_start > 0 || line_starting) && text.find_first_not_of(" \t\r\f\v", line_start) == std::string::npos)
          text.erase(line_start);
      }
      emit_text(text, text_line);
      const int tag_line = line_;
      advance_to(open + 2 + (modifier == '-' || modifier == '+'));
      bool stripped_end = false;
      if (kind == '#') {
        size_t close = src_.find("#}", pos_);
        FT_CHECK(close != std::string::npos, where_, " line ", tag_line, ": a comment {# is never closed with #}");
        stripped_end = close > pos_ && src_[close - 1] == '-';
        advance_to(close + 2);
      } else {
        tokens_.push_back({kind == '{' ? TokenKind::var_begin : TokenKind::block_begin, "", tag_line});
        stripped_end = lex_tag(kind == '{' ? "}}" : "%}", tag_line);
        tokens_.push_back({kind == '{' ? TokenKind::var_end : TokenKind::block_end, "", line_});
      }
      strip_next = stripped_end;
      trim_next = !stripped_end && kind != '{';  // trim_blocks: a block or comment tag eats one newline
    }
    tokens_.push_back({TokenKind::end, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && std::strchr("{%#", src_[i + 1])) return i;
    return src_.size();
  }

  void advance_to(size_t target) {
    for (; pos_ < target && pos_ < src_.size(); pos_++) line_ += src_[pos_] == '\n';
  }

  void emit_text(const std::string& text, int line) {
    if (!text.empty()) tokens_.push_back({TokenKind::text, text, line});
  }

  // Expression tokens up to `close`; true when the tag ends with `-`.
  bool lex_tag(const char* close, int tag_line) {
    int braces = 0;
    while (true) {
      while (pos_ < src_.size() && std::isspace((unsigned char)src_[pos_])) advance_to(pos_ + 1);
      FT_CHECK(pos_ < src_.size(), where_, " line ", tag_line, ": a tag is never closed with ", close);
      if (braces == 0) {
        if (src_.compare(pos_, 2, close) == 0) {
          advance_to(pos_ + 2);
          return false;
        }
        if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
          advance_to(pos_ + 3);
          return true;
        }
      }
      const char c = src_[pos_];
      if (is_name_start(c)) {
        size_t end = pos_;
        while (end < src_.size() && is_name_char(src_[end])) end++;
        tokens_.push_back({TokenKind::name, src_.substr(pos_, end - pos_), line_});
        advance_to(end);
      } else if (std::isdigit((unsigned char)c)) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                    "=",  ".",  ",",  ":",  "|",  "(",  ")", "[", "]", "{", "}"};
        const char* found = nullptr;
        for (const char* op : ops)
          if (src_.compare(pos_, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        FT_CHECK(found, where_, " line ", line_, ": unexpected character '", c, "' in a tag");
        braces += std::strcmp(found, "{") == 0 ? 1 : std::strcmp(found, "}") == 0 ? -1 : 0;
        tokens_.push_back({TokenKind::op, found, line_});
        advance_to(pos_ + std::strlen(found));
      }
    }
  }

  void lex_number() {
    size_t end = pos_;
    while (end < src_.size() && (std::isdigit((unsigned char)src_[end]) || src_[end] == '_')) end++;
    bool floating = end + 1 < src_.size() && src_[end] == '.' && std::isdigit((unsigned char)src_[end + 1]);
    if (floating) {
      end++;
      while (end < src_.size() && std::isdigit((unsigned char)src_[end])) end++;
    }
    // An exponent (1e3, 2.5e-4) makes a float, as in Python.
    size_t digits = end + 1;
    if (digits < src_.size() && (src_[digits] == '+' || src_[digits] == '-')) digits++;
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E') && digits < src_.size() &&
        std::isdigit((unsigned char)src_[digits])) {
      floating = true;
      end = digits;
      while (end < src_.size() && (std::isdigit((unsigned char)src_[end]) || src_[end] == '_')) end++;
    }
    std::string text = src_.substr(pos_, end - pos_);
    std::erase(text, '_');
    tokens_.push_back({floating ? TokenKind::floating : TokenKind::integer, text, line_});
    advance_to(end);
  }

  // A quoted literal with Python's escapes (Jinja2 unescapes them as unicode-escape).
  void lex_string(char quote) {
    const int start_line = line_;
    std::string value;
    size_t i = pos_ + 1;
    for (; i < src_.size() && src_[i] != quote; i++) {
      if (src_[i] != '\\' || i + 1 >= src_.size()) {
        value += src_[i];
        continue;
      }
      const char e = src_[++i];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '0': value += '\0'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\\': case '\'': case '"': value += e; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          const std::string hex = i + digits < src_.size() ? src_.substr(i + 1, digits) : "";
          FT_CHECK(hex.size() == digits && std::all_of(hex.begin(), hex.end(), [](char h) { return std::isxdigit((unsigned char)h); }),
                   where_, " line ", line_, ": a \\", e, " escape needs ", digits, " hex digits");
          unicode::append_utf8(value, char32_t(std::stoul(hex, nullptr, 16)));
          i += digits;
          break;
        }
        default: value += '\\'; value += e;  // Python keeps unknown escapes as written
      }
    }
    FT_CHECK(i < src_.size(), where_, " line ", start_line, ": a string literal is never closed with ", quote);
    tokens_.push_back({TokenKind::string, value, start_line});
    advance_to(i + 1);
  }

  std::string src_;
  const std::string& where_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& where) { return Lexer(source, where).run(); }

}  // namespace ft::jinja
