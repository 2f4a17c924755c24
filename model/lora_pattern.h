// PEFT's module patterns: which modules LoRA adapts (LoraConfig's
// target_modules, exclude_modules, layers_to_transform and layers_pattern)
// and which r and lora_alpha each gets (rank_pattern and alpha_pattern).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

// Whether a string target_modules is PEFT's "all-linear", which PEFT reads
// in any case.
bool is_all_linear(const std::string& target_modules);

// text in ASCII lower case: PEFT compares some spellings after str.lower()
// (all-linear, init_lora_weights' "gaussian" and "olora").
std::string ascii_lowercase(std::string text);

// Python's re.fullmatch(pattern, subject), in PCRE2 (UTF, UCP) as above. An
// invalid pattern is an Error naming `what` and the pattern.
bool regex_fullmatch(const std::string& pattern, const std::string& subject, const std::string& what);

// As PEFT's check_target_module_exists: whether module (a full name such as
// model.layers.0.self_attn.q_proj) carries an adapter. Excluded first
// (exclude_modules_regex fully matching it, or a name of exclude_modules
// equal to it or ending it after a dot); then targeted by
// target_modules_regex fully matching it, or by a name of target_modules
// equal to it (which, as in PEFT, skips the layer filter), ending it after a
// dot, or by kAllLinear; the two last kept only when layers_to_transform is
// empty or holds the module's layer index (peft_layer_index).
bool lora_targets_module(const LoraOptions& lora, const std::string& module);

// PEFT's layer index of a module for layers_to_transform: the number after
// the first "<name>." with a dot before it, where name is any dot-free name
// when layers_pattern is empty (model.layers.3.mlp.up_proj: 3;
// encoder.block.1.layer.0.SelfAttention.q: 1), else the first of
// layers_pattern (regular expressions) that matches, as Python's
// re.match(rf".*?\.{pattern}\.(\d+)\.", module); -1 when none does.
int64_t peft_layer_index(const std::string& module, const std::vector<std::string>& layers_pattern);

// Checks lora's module selection as PEFT's LoraConfig does: its regular
// expressions compile; layers_to_transform (each index >= 0) and
// layers_pattern only with target_modules a list of names (not all-linear,
// which PEFT reads as a string too); layers_pattern only
// with layers_to_transform. Errors name the field as `what` + the field
// (what: "x.yaml: lora." or "adapter_config.json: field ").
void check_lora_targets(const LoraOptions& lora, const std::string& what);

// What of lora's module fields changes nothing on a model whose linear
// modules are linear_modules and whose adapted ones adapted_modules: each
// rank_pattern or alpha_pattern key that matches no adapted module, and
// each exclude_modules name (or its regular expression) that matches no
// linear module, as `lora.<field> "<key>" matches no adapted module` (or
// "linear module"): a typo, most likely; PEFT passes them silently.
std::vector<std::string> unmatched_lora_keys(const LoraOptions& lora, const std::vector<std::string>& linear_modules,
                                             const std::vector<std::string>& adapted_modules);

// Checks that every key of lora's patterns compiles, each r is positive and
// each alpha positive and finite; an Error names the field as `what` +
// "rank_pattern" (what: "x.yaml:4: lora." or "adapter_config.json: ") and the key.
void check_lora_patterns(const LoraOptions& lora, const std::string& what);

}  // namespace ft
