// PEFT's per-module rank and alpha (LoraConfig's rank_pattern and
// alpha_pattern): which r and lora_alpha one adapted module gets.
#pragma once
#include <cstdint>
#include <string>

#include "model/model_options.h"

namespace ft {

// One adapted module's rank and alpha, and the scaling they give.
struct ModuleLora {
  int64_t r = 0;
  double lora_alpha = 0;
  float scaling = 0;  // lora_scaling(lora_alpha, r, use_rslora)
};

// As PEFT's get_pattern_key: the first key K of lora.rank_pattern (and,
// separately, of lora.alpha_pattern) for which Python's
// re.match(rf"(.*\.)?({K})$", module) matches gives the module's r (its
// lora_alpha), else lora.r (lora.lora_alpha). So "q_proj" matches every
// q_proj and "layers.1.mlp.down_proj" one module, at a dot boundary.
// An invalid key is an Error.
ModuleLora module_lora(const LoraOptions& lora, const std::string& module);

// Whether PEFT's pattern key matches the full module name, as above. The
// regular expression is PCRE2's (UTF, UCP), which reads module names as
// Python's re does. An invalid key is an Error naming `what` (e.g.
// "x.yaml:4: lora.rank_pattern") and the key.
bool module_pattern_matches(const std::string& key, const std::string& module, const std::string& what);

// Checks that every key of lora's patterns compiles, each r is positive and
// each alpha positive and finite; an Error names the field as `what` +
// "rank_pattern" (what: "x.yaml:4: lora." or "adapter_config.json: ") and the key.
void check_lora_patterns(const LoraOptions& lora, const std::string& what);

}  // namespace ft
