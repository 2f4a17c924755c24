// A Unicode regular expression (PCRE2, UTF and UCP, JIT-compiled when available) standing in
// for the Oniguruma patterns of Hugging Face tokenizers: \s and \w are rewritten to Oniguruma's
// Unicode classes (PCRE2's \s differs on U+0085 and U+180E, its \w lacks marks); \p{L}, \p{N},
// (?i:...) and lookahead keep their meaning.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ft {

class Regex {
 public:
  // oniguruma: a tokenizer.json pattern (translated); literal: the exact text; pcre2: as is.
  enum class Syntax { oniguruma, literal, pcre2 };
  // `what` names the pattern (file and field) in errors.
  Regex(std::string_view pattern, Syntax syntax, const std::string& what);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Byte ranges [begin, end) of the successive non-overlapping matches in UTF-8 `text`, as
  // tokenizers' find_iter: after an empty match the search moves on by one character, and an
  // empty match right where the previous match ended is skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  std::string what_;
};

}  // namespace ft
