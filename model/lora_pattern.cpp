#include "model/lora_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <charconv>
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

// text compiled with options; an invalid one is an Error naming `what` and
// key, the part of text the user wrote, which starts at key_offset.
Code compile(const std::string& text, const std::string& key, size_t key_offset, uint32_t options,
             const std::string& what) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  Code code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), options | PCRE2_UTF | PCRE2_UCP,
                          &error, &offset, nullptr),
            &pcre2_code_free);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    const size_t at = std::min(key.size(), offset > key_offset ? offset - key_offset : 0);
    fail(what, " \"", key, "\": not a valid regular expression (at offset ", at, ": ",
         reinterpret_cast<const char*>(message), ")");
  }
  return code;
}

Code compile_key(const std::string& key, const std::string& what) {
  return compile(kPrefix + key + kSuffix, key, kPrefix.size(), PCRE2_ANCHORED, what);
}

// As Python's re.fullmatch: anchored at both ends, backtracking to reach the end.
Code compile_full(const std::string& pattern, const std::string& what) {
  return compile(pattern, pattern, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, what);
}

// PEFT's layer index patterns: re.match(r".*?\.[^.]*\.(\d+)\.", module) without
// a layers_pattern, re.match(rf".*?\.{pattern}\.(\d+)\.", module) with one.
const std::string kLayerPrefix = ".*?\\.";
const std::string kLayerSuffix = "\\.(\\d+)\\.";

Code compile_layer(const std::string& pattern, const std::string& what) {
  return compile(kLayerPrefix + pattern + kLayerSuffix, pattern, kLayerPrefix.size(), PCRE2_ANCHORED, what);
}

// Whether code matches subject; with group, its first capture group (empty
// if unset). A match PCRE2 gives up on (its backtracking limit, which a
// pattern such as (a+)+b reaches) is an Error naming `what`, not a no.
bool matches(const Code& code, const std::string& subject, const std::string& what, std::string* group = nullptr) {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), &pcre2_match_data_free);
  const int result = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0,
                                 match.get(), nullptr);
  if (result == PCRE2_ERROR_NOMATCH) return false;
  if (result < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(result, message, sizeof message);
    fail(what, ": matching ", subject, " failed (", reinterpret_cast<const char*>(message),
         "): simplify the regular expression");
  }
  if (group) {
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const bool set = pcre2_get_ovector_count(match.get()) > 1 && ovector[2] != PCRE2_UNSET;
    *group = set ? subject.substr(ovector[2], ovector[3] - ovector[2]) : std::string();
  }
  return true;
}

// The value of the first key that matches module, else fallback.
template <class T>
T first_match(const std::vector<std::pair<std::string, T>>& pattern, const std::string& module, T fallback,
              const std::string& what) {
  for (const auto& [key, value] : pattern)
    if (module_pattern_matches(key, module, what)) return value;
  return fallback;
}

// PEFT's list rule: a name equal to the module or ending it after a dot.
bool matches_a_name(const std::vector<std::string>& names, const std::string& module) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& name) { return module_matches_target(module, name); });
}

}  // namespace

bool module_pattern_matches(const std::string& key, const std::string& module, const std::string& what) {
  return matches(compile_key(key, what), module, what);
}

bool is_all_linear(const std::string& target_modules) { return ascii_lowercase(target_modules) == kAllLinear; }

std::string ascii_lowercase(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool regex_fullmatch(const std::string& pattern, const std::string& subject, const std::string& what) {
  return matches(compile_full(pattern, what), subject, what);
}

int64_t peft_layer_index(const std::string& module, const std::vector<std::string>& layers_pattern) {
  std::string digits;
  bool found = false;
  if (layers_pattern.empty())
    found = matches(compile_layer("[^.]*", "lora.layers_pattern"), module, "lora.layers_pattern", &digits);
  for (size_t i = 0; i < layers_pattern.size() && !found; ++i)
    found = matches(compile_layer(layers_pattern[i], "lora.layers_pattern"), module, "lora.layers_pattern", &digits);
  if (!found) return -1;
  // Python takes int() of the match's first group: a pattern with its own
  // group puts that group first, whose text int() refuses.
  int64_t index = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  FT_CHECK(!digits.empty() && error == std::errc() && end == digits.data() + digits.size(),
           "lora.layers_pattern reads \"", digits, "\" as the layer index of ", module,
           " (PEFT takes the match's first group, so a pattern's own group comes first: write (?:...) for it)");
  return index;
}

bool lora_targets_module(const LoraOptions& lora, const std::string& module) {
  const bool excluded = lora.exclude_modules_regex.empty()
                            ? matches_a_name(lora.exclude_modules, module)
                            : regex_fullmatch(lora.exclude_modules_regex, module, "lora.exclude_modules");
  if (excluded) return false;
  if (!lora.target_modules_regex.empty())
    return regex_fullmatch(lora.target_modules_regex, module, "lora.target_modules");
  const std::vector<std::string>& targets = lora.target_modules;
  if (std::find(targets.begin(), targets.end(), module) != targets.end()) return true;
  const bool all_linear = targets == std::vector<std::string>{kAllLinear};
  if (!all_linear && !matches_a_name(targets, module)) return false;
  if (lora.layers_to_transform.empty()) return true;
  const int64_t layer = peft_layer_index(module, lora.layers_pattern);
  return std::find(lora.layers_to_transform.begin(), lora.layers_to_transform.end(), layer) !=
         lora.layers_to_transform.end();
}

void check_lora_targets(const LoraOptions& lora, const std::string& what) {
  if (!lora.target_modules_regex.empty()) compile_full(lora.target_modules_regex, what + "target_modules");
  if (!lora.exclude_modules_regex.empty()) compile_full(lora.exclude_modules_regex, what + "exclude_modules");
  for (const std::string& pattern : lora.layers_pattern) compile_layer(pattern, what + "layers_pattern");
  const bool layers = !lora.layers_to_transform.empty() || !lora.layers_pattern.empty();
  const bool names = lora.target_modules_regex.empty() && lora.target_modules != std::vector<std::string>{kAllLinear};
  FT_CHECK(names || !layers, what, "layers_to_transform and layers_pattern need target_modules as a list of names "
           "(PEFT refuses them with a string target_modules, all-linear included; a regular expression can name "
           "the layers itself)");
  FT_CHECK(lora.layers_pattern.empty() || !lora.layers_to_transform.empty(), what,
           "layers_pattern is set without layers_to_transform (as in PEFT, it only says where the layer index "
           "of layers_to_transform is read)");
  for (int64_t layer : lora.layers_to_transform)
    FT_CHECK(layer >= 0, what, "layers_to_transform: expected layer indexes >= 0, got ", layer);
}

std::vector<std::string> unmatched_lora_keys(const LoraOptions& lora, const std::vector<std::string>& linear_modules,
                                             const std::vector<std::string>& adapted_modules) {
  std::vector<std::string> unmatched;
  // kind: the modules the entry acts on, "adapted" or "linear".
  auto note = [&](const char* field, const std::string& key, const char* kind, bool used) {
    if (!used) unmatched.push_back(std::string("lora.") + field + " \"" + key + "\" matches no " + kind + " module");
  };
  auto any_module = [](const std::vector<std::string>& modules, const auto& matches) {
    return std::any_of(modules.begin(), modules.end(), matches);
  };
  // entry, not a structured binding: clang in OpenMP mode cannot capture one.
  for (const auto& entry : lora.rank_pattern)
    note("rank_pattern", entry.first, "adapted", any_module(adapted_modules, [&](const std::string& m) {
           return module_pattern_matches(entry.first, m, "lora.rank_pattern");
         }));
  for (const auto& entry : lora.alpha_pattern)
    note("alpha_pattern", entry.first, "adapted", any_module(adapted_modules, [&](const std::string& m) {
           return module_pattern_matches(entry.first, m, "lora.alpha_pattern");
         }));
  for (const std::string& name : lora.exclude_modules)
    note("exclude_modules", name, "linear", any_module(linear_modules, [&](const std::string& m) {
           return module_matches_target(m, name);
         }));
  if (!lora.exclude_modules_regex.empty())
    note("exclude_modules", lora.exclude_modules_regex, "linear", any_module(linear_modules, [&](const std::string& m) {
           return regex_fullmatch(lora.exclude_modules_regex, m, "lora.exclude_modules");
         }));
  return unmatched;
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
    compile_key(key, what + "rank_pattern");
    FT_CHECK(r > 0, what, "rank_pattern \"", key, "\": expected a positive integer rank, got ", r);
  }
  for (const auto& [key, alpha] : lora.alpha_pattern) {
    compile_key(key, what + "alpha_pattern");
    FT_CHECK(alpha > 0 && std::isfinite(alpha), what, "alpha_pattern \"", key,
             "\": expected a positive number, got ", alpha);
  }
}

}  // namespace ft
