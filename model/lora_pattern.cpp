#include "model/lora_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/error.h"
#include "model/lora_linear.h"

namespace ft {
namespace {

// PEFT's re.match(rf"(.*\.)?({key})$", module): anchored at the start by
// re.match, at the end (or before a final newline, as Python's $) by $.
const std::string kPrefix = "(.*\\.)?(";
const std::string kSuffix = ")$";

using Code = std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)>;

Code compile(const std::string& key, const std::string& what) {
  const std::string pattern = kPrefix + key + kSuffix;
  int error = 0;
  PCRE2_SIZE offset = 0;
  Code code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_ANCHORED | PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr),
            &pcre2_code_free);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    // The offset is into the wrapped pattern; the user wrote only the key.
    const size_t at = std::min(key.size(), offset > kPrefix.size() ? offset - kPrefix.size() : 0);
    fail(what, " \"", key, "\": not a valid regular expression (at offset ", at, ": ",
         reinterpret_cast<const char*>(message), ")");
  }
  return code;
}

// The value of the first key that matches module, else fallback.
template <class T>
T first_match(const std::vector<std::pair<std::string, T>>& pattern, const std::string& module, T fallback,
              const std::string& what) {
  for (const auto& [key, value] : pattern)
    if (module_pattern_matches(key, module, what)) return value;
  return fallback;
}

}  // namespace

bool module_pattern_matches(const std::string& key, const std::string& module, const std::string& what) {
  const Code code = compile(key, what);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), &pcre2_match_data_free);
  return pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0, 0, match.get(),
                     nullptr) >= 0;
}

ModuleLora module_lora(const LoraOptions& lora, const std::string& module) {
  ModuleLora out;
  out.r = first_match(lora.rank_pattern, module, lora.r, "lora.rank_pattern");
  out.lora_alpha = first_match(lora.alpha_pattern, module, lora.lora_alpha, "lora.alpha_pattern");
  out.scaling = lora_scaling(out.lora_alpha, out.r, lora.use_rslora);
  return out;
}

void check_lora_patterns(const LoraOptions& lora, const std::string& what) {
  for (const auto& [key, r] : lora.rank_pattern) {
    compile(key, what + "rank_pattern");
    FT_CHECK(r > 0, what, "rank_pattern \"", key, "\": expected a positive integer rank, got ", r);
  }
  for (const auto& [key, alpha] : lora.alpha_pattern) {
    compile(key, what + "alpha_pattern");
    FT_CHECK(alpha > 0 && std::isfinite(alpha), what, "alpha_pattern \"", key,
             "\": expected a positive number, got ", alpha);
  }
}

}  // namespace ft
