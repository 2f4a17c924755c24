#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "kernels/error.h"

namespace ft {
namespace {

// Oniguruma's Unicode \s (White_Space: PCRE2's \s lacks U+0085 and has U+180E) and \w
// (Letter, Mark, Number, Connector_Punctuation), as the bodies of character classes.
constexpr std::string_view kSpaceClass = "\\p{White_Space}";
constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";

// The pattern with \s, \S, \w, \W replaced by explicit classes, inside and outside brackets.
std::string to_pcre2(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[++i];
      std::string_view body = (next == 's' || next == 'S') ? kSpaceClass
                              : (next == 'w' || next == 'W') ? kWordClass
                                                             : std::string_view();
      bool negated = next == 'S' || next == 'W';
      if (body.empty()) {
        out += c;
        out += next;
      } else if (!in_class) {
        out.append(negated ? "[^" : "[").append(body).append("]");
      } else if (!negated) {
        out.append(body);
      } else {
        out += c;  // a negated class inside brackets: left as PCRE2 has it
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a literal ] first
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, Syntax syntax, const std::string& what)
    : code_(std::make_unique<Code>()), what_(what) {
  std::string translated = syntax == Syntax::oniguruma ? to_pcre2(pattern) : std::string(pattern);
  uint32_t options = PCRE2_UTF | (syntax == Syntax::literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &error,
                              &error_offset, nullptr);
  if (!code_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail(what, ": cannot compile regex \"", pattern, "\": ", reinterpret_cast<const char*>(message), " at offset ",
         error_offset);
  }
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // the interpreter runs when JIT is unavailable
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::vector<std::pair<size_t, size_t>> matches;
  size_t start = 0;
  size_t previous_end = SIZE_MAX;
  while (start <= text.size()) {
    // The first call checks the whole text is valid UTF-8; later calls need not do it again.
    uint32_t options = start == 0 ? 0 : PCRE2_NO_UTF_CHECK;
    int rc = pcre2_match(code_->code, subject, text.size(), start, options, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      fail(what_, ": regex match failed: ", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    size_t begin = ovector[0], end = ovector[1];
    if (begin == end) {
      if (begin != previous_end) matches.push_back({begin, end});
      // Next search one UTF-8 character further on.
      start = begin + 1;
      while (start < text.size() && (uint8_t(text[start]) & 0xC0) == 0x80) ++start;
      continue;
    }
    matches.push_back({begin, end});
    previous_end = end;
    start = end;
  }
  return matches;
}

}  // namespace ft
