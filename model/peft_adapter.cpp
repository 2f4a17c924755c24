#include "model/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "kernels/error.h"
#include "model/atomic_file.h"
#include "model/checksum.h"
#include "model/json_input.h"
#include "model/lora_linear.h"
#include "model/lora_pattern.h"
#include "model/safetensors.h"

namespace ft {
namespace {

using nlohmann::json;
// adapter_config.json as read: its keys in the file's order, which
// rank_pattern and alpha_pattern need (PEFT tries their keys in that order).
using Config = nlohmann::ordered_json;
namespace fs = std::filesystem;

// PEFT saves the adapted model's state dict, whose names start with the
// PeftModel wrapper ("base_model") and the LoraModel's wrapped model ("model").
const std::string kKeyPrefix = "base_model.model.";

bool is_set(const Config& config, const char* field) { return config.contains(field) && !config[field].is_null(); }

std::string optional_string(const Config& config, const char* field, const std::string& fallback,
                            const std::string& source) {
  if (!is_set(config, field)) return fallback;
  FT_CHECK(config[field].is_string(), source, ": field \"", field, "\" must be a string, got ", config[field].dump());
  return config[field].get<std::string>();
}

// PEFT options that change what the adapter computes or which modules carry
// it, and that this trainer does not implement: each must be absent or hold
// PEFT's default (null, false or empty), or the loaded adapter would compute
// something else than it did in PEFT.
void require_peft_default(const Config& config, const char* field, const std::string& source) {
  if (!config.contains(field)) return;
  const Config& value = config[field];
  const bool is_default = value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
                          ((value.is_object() || value.is_array()) && value.empty());
  FT_CHECK(is_default, source, ": field \"", field, "\" = ", value.dump(),
           " is not supported (only PEFT's default, null/false/empty, is)");
}

// A list of strings, or null/absent as empty; else an Error naming the field.
std::vector<std::string> string_list(const Config& config, const char* field, const std::string& source) {
  if (!is_set(config, field)) return {};
  const Config& value = config[field];
  FT_CHECK(value.is_array(), source, ": field \"", field, "\" must be a list of strings, got ", value.dump());
  std::vector<std::string> names;
  for (const Config& name : value) {
    FT_CHECK(name.is_string(), source, ": field \"", field, "\" must hold strings, got ", name.dump());
    names.push_back(name.get<std::string>());
  }
  return names;
}

// PEFT's module selection: target_modules and exclude_modules each a list
// of names or one string (a regular expression; "all-linear" for targets,
// in any case, as PEFT lowercases it), layers_to_transform an index or a
// list of them, layers_pattern a name or a list of them.
void read_module_selection(const Config& config, LoraOptions& lora, const std::string& source) {
  FT_CHECK(config.contains("target_modules"), source, ": missing required field \"target_modules\"");
  const Config& targets = config["target_modules"];
  if (targets.is_string()) {
    const std::string text = targets.get<std::string>();
    FT_CHECK(!text.empty(), source, ": field \"target_modules\" is an empty string (expected a list of module "
             "names, or a regular expression over whole module names)");
    if (is_all_linear(text)) lora.target_modules = {kAllLinear};
    else lora.target_modules_regex = text;
  } else {
    lora.target_modules = string_list(config, "target_modules", source);
    FT_CHECK(!lora.target_modules.empty(), source, ": field \"target_modules\" must be a non-empty list of module "
             "names or a regular expression, got ", targets.dump());
  }
  if (is_set(config, "exclude_modules") && config["exclude_modules"].is_string())
    lora.exclude_modules_regex = config["exclude_modules"].get<std::string>();  // "": none, as in PEFT
  else
    lora.exclude_modules = string_list(config, "exclude_modules", source);
  if (is_set(config, "layers_to_transform")) {
    const Config& layers = config["layers_to_transform"];
    auto index = [&](const Config& value) {
      FT_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0, source,
               ": field \"layers_to_transform\" must be a layer index or a list of them (integers >= 0), got ",
               layers.dump());
      lora.layers_to_transform.push_back(value.get<int64_t>());
    };
    if (layers.is_array()) {
      for (const Config& layer : layers) index(layer);
    } else {
      index(layers);
    }
  }
  // PEFT checks layers_pattern against a null layers_to_transform only: beside an empty list it does nothing.
  const bool empty_layers = is_set(config, "layers_to_transform") && lora.layers_to_transform.empty();
  if (is_set(config, "layers_pattern") && config["layers_pattern"].is_string()) {
    const std::string pattern = config["layers_pattern"].get<std::string>();
    if (!pattern.empty()) lora.layers_pattern = {pattern};  // "": the first dotted name's number, as in PEFT
  } else {
    lora.layers_pattern = string_list(config, "layers_pattern", source);
  }
  if (empty_layers) lora.layers_pattern.clear();
  check_lora_targets(lora, source + ": field ");
}

// PEFT's rank_pattern (pattern -> positive integer) and alpha_pattern
// (pattern -> positive number), in the file's order; absent or null is empty.
void read_patterns(const Config& config, LoraOptions& lora, const std::string& source) {
  for (const char* field : {"rank_pattern", "alpha_pattern"}) {
    if (!is_set(config, field)) continue;
    FT_CHECK(config[field].is_object(), source, ": field \"", field,
             "\" must be an object from module pattern to value, got ", config[field].dump());
    for (const auto& [key, value] : config[field].items()) {
      const bool rank = field == std::string("rank_pattern");
      const bool fits = rank ? value.is_number_integer() && value.get<int64_t>() > 0
                             : value.is_number() && value.get<double>() > 0;
      FT_CHECK(fits, source, ": field \"", field, "\" \"", key, "\" must be a positive ",
               rank ? "integer" : "number", ", got ", value.dump());
      if (rank) lora.rank_pattern.emplace_back(key, value.get<int64_t>());
      else lora.alpha_pattern.emplace_back(key, value.get<double>());
    }
  }
  check_lora_patterns(lora, source + ": field ");
}

// A number as Python's json writes it: an integral alpha as 8, not 8.0.
json peft_number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 9.0e15) return int64_t(value);
  return value;
}

// A pattern as PEFT saves it: a JSON object, its keys sorted (json.dumps'
// sort_keys, as nlohmann::json keeps them).
template <class T>
json pattern_json(const std::vector<std::pair<std::string, T>>& pattern) {
  json out = json::object();
  for (const auto& [key, value] : pattern) out[key] = peft_number(double(value));
  return out;
}

// A list field as saved: null when empty.
template <class T>
json list_or_null(const std::vector<T>& values) {
  return values.empty() ? json() : json(values);
}

// target_modules or exclude_modules as PEFT saves them: the regular
// expression when set, else the names sorted (PEFT saves a Python set), or
// null.
json names_json(std::vector<std::string> names, const std::string& regex) {
  if (!regex.empty()) return regex;
  std::sort(names.begin(), names.end());
  return list_or_null(names);
}

// layers_to_transform sorted (membership is all it means), or null.
json layers_json(std::vector<int64_t> layers) {
  std::sort(layers.begin(), layers.end());
  return list_or_null(layers);
}

// The adapter the model holds must be the one described: same rank, same
// scaling and the same modules (as a set: PEFT saves a Python set).
void check_matches_model(const LoraOptions& config, const std::optional<LoraOptions>& model_lora,
                         const std::string& source) {
  FT_CHECK(model_lora, source, ": the model was built without LoRA adapters");
  const LoraOptions& lora = *model_lora;
  FT_CHECK(config.r == lora.r, source, ": field \"r\" is ", config.r, " but the model's adapters have r = ", lora.r);
  FT_CHECK(config.lora_alpha == lora.lora_alpha, source, ": field \"lora_alpha\" is ", config.lora_alpha,
           " but the model's adapters have lora_alpha = ", lora.lora_alpha);
  auto name = [](bool value) { return value ? "true" : "false"; };
  FT_CHECK(config.use_rslora == lora.use_rslora, source, ": field \"use_rslora\" is ", name(config.use_rslora),
           " but the model's adapters have use_rslora = ", name(lora.use_rslora));
  FT_CHECK(config.use_dora == lora.use_dora, source, ": field \"use_dora\" is ", name(config.use_dora),
           " but the model's adapters have use_dora = ", name(lora.use_dora));
  for (auto [field, mine, model] : {std::tuple{"target_modules", names_json(config.target_modules,
                                                                             config.target_modules_regex),
                                               names_json(lora.target_modules, lora.target_modules_regex)},
                                    std::tuple{"exclude_modules", names_json(config.exclude_modules,
                                                                             config.exclude_modules_regex),
                                               names_json(lora.exclude_modules, lora.exclude_modules_regex)},
                                    std::tuple{"layers_to_transform", layers_json(config.layers_to_transform),
                                               layers_json(lora.layers_to_transform)},
                                    std::tuple{"layers_pattern", list_or_null(config.layers_pattern),
                                               list_or_null(lora.layers_pattern)},
                                    // As objects, keys sorted: PEFT's save sorts them, so a saved
                                    // adapter's order is not the one trained with.
                                    std::tuple{"rank_pattern", pattern_json(config.rank_pattern),
                                               pattern_json(lora.rank_pattern)},
                                    std::tuple{"alpha_pattern", pattern_json(config.alpha_pattern),
                                               pattern_json(lora.alpha_pattern)}})
    FT_CHECK(mine == model, source, ": field \"", field, "\" is ", mine.dump(), " but the model's adapters have ",
             model.dump());
}

// Our adapter name for a saved key, or "" when the key is no LoRA weight:
// base_model.model.X.lora_A.weight and base_model.model.X.lora_A.<adapter>.weight
// both give X.lora_A.weight; DoRA's base_model.model.X.lora_magnitude_vector
// (PEFT's saved key), or with .weight or .<adapter>.weight (the module's own
// parameter name), gives X.lora_magnitude_vector.
std::string adapter_name_of(const std::string& key) {
  if (key.rfind(kKeyPrefix, 0) != 0) return "";
  const std::string name = key.substr(kKeyPrefix.size());
  const std::string magnitude = kDoraMagnitudeSuffix;
  if (const size_t at = name.rfind(magnitude); at != std::string::npos) {
    const std::string tail = name.substr(at + magnitude.size());
    const size_t dot = tail.find('.', 1);
    if (tail.empty() || tail == ".weight" || (dot != std::string::npos && dot > 1 && tail.substr(dot) == ".weight"))
      return name.substr(0, at + magnitude.size());
    return "";
  }
  for (const std::string part : {".lora_A.", ".lora_B."}) {
    const size_t at = name.rfind(part);
    if (at == std::string::npos) continue;
    const std::string tail = name.substr(at + part.size());
    const size_t dot = tail.find('.');
    if (tail == "weight" || (dot != std::string::npos && dot > 0 && tail.substr(dot) == ".weight"))
      return name.substr(0, at + part.size()) + "weight";
  }
  return "";
}

// The modules PEFT saves whole: modules_to_save, and with ensure_weight_tying
// the head too (PEFT lists the tied embedding and saves the head beside it).
std::vector<std::string> saved_module_names(const PeftAdapterConfig& config) {
  std::vector<std::string> names = config.modules_to_save;
  if (config.ensure_weight_tying) names.push_back("lm_head");
  return names;
}

// The base model's tensor name for a saved key of a modules_to_save module
// (base_model.model.score.weight -> score.weight), else "". A module is
// saved when its name ends with a listed string, as PEFT's _set_trainable
// matches (not at a dot: "norm" saves every input_layernorm too).
std::string saved_module_tensor(const std::string& key, const PeftAdapterConfig& config) {
  if (key.rfind(kKeyPrefix, 0) != 0) return "";
  const std::string name = key.substr(kKeyPrefix.size());
  for (const char* leaf : {".weight", ".bias"}) {
    if (!name.ends_with(leaf) || name.size() == std::strlen(leaf)) continue;
    const std::string module_name = name.substr(0, name.size() - std::strlen(leaf));
    for (const std::string& module : saved_module_names(config))
      if (module_name.ends_with(module)) return name;
  }
  return "";
}

// "<module>.weight" of PEFT's copy of a LoRA module's base weight
// (base_model.model.lm_head.base_layer.weight), which its default
// save_embedding_layers saves for LoRA on an embedding or a head; else "".
std::string base_layer_copy_of(const std::string& key) {
  const std::string suffix = ".base_layer.weight";
  if (key.rfind(kKeyPrefix, 0) != 0 || !key.ends_with(suffix)) return "";
  return key.substr(kKeyPrefix.size(), key.size() - kKeyPrefix.size() - suffix.size()) + ".weight";
}

bool same_bytes(const SafetensorsEntry& a, const SafetensorsEntry& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.size_bytes == b.size_bytes &&
         std::memcmp(a.data, b.data, a.size_bytes) == 0;
}

// Each config.modules_to_save entry naming a module the model has (a
// weight's module, or a tied head) needs a tensor in the file (saved: the
// base names of those it holds): without one PEFT would keep the base's
// module, which an adapter that lists it does not mean. Entries the model
// lacks are skipped (PEFT's SEQ_CLS adapters list both "classifier" and "score").
void check_saved_modules_complete(LanguageModel& model, const PeftAdapterConfig& config,
                                  const std::map<std::string, const SafetensorsEntry*>& saved,
                                  const std::string& path) {
  const auto module_of = [](const std::string& tensor) { return tensor.substr(0, tensor.rfind('.')); };
  std::vector<std::string> model_modules;
  for (const Parameter& p : model.parameters()) model_modules.push_back(module_of(p.name));
  if (model.config().tie_word_embeddings && !model.untied_head_name().empty())
    model_modules.push_back(module_of(model.untied_head_name()));
  for (const std::string& listed : config.modules_to_save) {
    const std::string target = module_of(model.checkpoint_name(listed + ".weight"));
    const auto matches = [&](const std::string& module) { return module.ends_with(target); };
    if (std::none_of(model_modules.begin(), model_modules.end(), matches)) continue;
    FT_CHECK(std::any_of(saved.begin(), saved.end(), [&](const auto& s) { return matches(module_of(s.first)); }),
             path, ": adapter_config.json's modules_to_save lists \"", listed, "\" but the file holds no tensor of "
             "it (expected \"", kKeyPrefix, listed, ".weight\")");
  }
}

// A config.json's model: its fields but how the weights are stored (a saved
// quantised base's quantization_config and dtype, a merged folder's dtype)
// and the writer's version.
json model_fields(const std::string& path) {
  json config = read_json_object(path, "a model's config.json");
  for (const char* storage : {"quantization_config", "torch_dtype", "dtype", "transformers_version"})
    config.erase(storage);
  return config;
}

}  // namespace

// PEFT's initialisations that also rewrite the base layer's weight (PiSSA,
// CorDA, OLoRA, LoRA-GA: W - scaling B A; LoftQ: its quantised residual), as
// PEFT's LoraLayer.update_layer tells them apart.
static bool init_rewrites_base(const std::string& init) {
  return init.starts_with("pissa") || init.starts_with("corda") || ascii_lowercase(init) == "olora" ||
         init == "loftq" || init == "lora_ga";
}

std::string other_base_warning(const PeftAdapterConfig& adapter, const std::string& adapter_folder,
                               const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string& own = adapter.base_model_name_or_path;
  const fs::path own_config = fs::path(own) / "config.json", model_config = fs::path(model_dir) / "config.json";
  std::error_code error;
  if (own.empty() || !fs::is_regular_file(own_config, error) || !fs::is_regular_file(model_config, error) ||
      fs::equivalent(own, model_dir, error) ||
      model_fields(own_config.string()) == model_fields(model_config.string()))
    return "";
  return adapter_folder + ": trained on " + own + " (its base_model_name_or_path), whose config.json differs from " +
         model_config.string() + ": the adapter may not belong to this base";
}

// init_lora_weights: true, false or "gaussian" into the LoRA options (how a
// run continuing this adapter would start new ones); another string (PEFT's
// eva, ...) is kept as written. One that rewrites the base is refused: PEFT's
// from_pretrained runs it again over the base it loads (W - scaling B0 A0:
// checked, an untrained PiSSA adapter over llama_gqa loads to the base's
// logits), which adding B A to W here would not give.
static void read_init_lora_weights(const Config& config, PeftAdapterConfig& adapter, const std::string& source) {
  if (!is_set(config, "init_lora_weights")) return;
  const json& init = config["init_lora_weights"];
  FT_CHECK(init.is_boolean() || init.is_string(), source,
           ": field \"init_lora_weights\" must be a boolean or a string, got ", init.dump());
  if (init.is_boolean()) {
    adapter.lora.init_lora_weights = init.get<bool>() ? LoraInit::kaiming_uniform : LoraInit::random;
    return;
  }
  const std::string value = init.get<std::string>();
  FT_CHECK(!init_rewrites_base(value), source, ": init_lora_weights \"", value, "\": PEFT runs this initialisation "
           "again over the base when it loads the adapter (the base weight becomes W - scaling B0 A0), which is not "
           "supported here; PEFT's save_pretrained(..., path_initial_model_for_weight_conversion=...) converts it "
           "into a plain LoRA adapter of the original base, which loads");
  if (ascii_lowercase(value) == "gaussian")
    adapter.lora.init_lora_weights = LoraInit::gaussian;
  else
    adapter.init_lora_weights = value;
}

PeftAdapterConfig read_peft_adapter_config(const std::string& folder) {
  const std::string source = (fs::path(folder) / "adapter_config.json").string();
  const Config config = read_ordered_json_object(source, "a PEFT adapter_config.json");
  FT_CHECK(config.contains("peft_type"), source, ": missing required field \"peft_type\" (expected \"LORA\")");
  FT_CHECK(config["peft_type"] == "LORA", source, ": field \"peft_type\" is ", config["peft_type"].dump(),
           " but only \"LORA\" adapters are supported");
  PeftAdapterConfig adapter;
  LoraOptions& result = adapter.lora;
  // Absent fields keep LoraOptions' defaults, which are PEFT's.
  if (is_set(config, "r")) {
    FT_CHECK(config["r"].is_number_integer() && config["r"].get<int64_t>() > 0, source,
             ": field \"r\" must be a positive integer, got ", config["r"].dump());
    result.r = config["r"].get<int64_t>();
  }
  if (is_set(config, "lora_alpha")) {
    FT_CHECK(config["lora_alpha"].is_number() && config["lora_alpha"].get<double>() > 0, source,
             ": field \"lora_alpha\" must be a positive number, got ", config["lora_alpha"].dump());
    result.lora_alpha = config["lora_alpha"].get<double>();
  }
  read_module_selection(config, result, source);
  if (is_set(config, "lora_dropout")) {
    const json& p = config["lora_dropout"];
    FT_CHECK(p.is_number() && p.get<double>() >= 0 && p.get<double>() < 1, source,
             ": field \"lora_dropout\" must be a number in [0, 1), got ", p.dump());
    result.lora_dropout = p.get<double>();
  }
  for (auto [field, value] : {std::pair{"use_rslora", &result.use_rslora}, std::pair{"use_dora", &result.use_dora}}) {
    if (!is_set(config, field)) continue;
    FT_CHECK(config[field].is_boolean(), source, ": field \"", field, "\" must be a boolean, got ",
             config[field].dump());
    *value = config[field].get<bool>();
  }
  read_init_lora_weights(config, adapter, source);
  const std::string bias = optional_string(config, "bias", "none", source);
  FT_CHECK(bias == "none", source, ": field \"bias\" is \"", bias, "\" but only \"none\" is supported");
  read_patterns(config, result, source);
  for (const char* field : {"fan_in_fan_out", "lora_bias", "layer_replication", "target_parameters",
                            "trainable_token_indices"})
    require_peft_default(config, field, source);
  adapter.base_model_name_or_path = optional_string(config, "base_model_name_or_path", "", source);
  adapter.task_type = optional_string(config, "task_type", "", source);
  adapter.modules_to_save = string_list(config, "modules_to_save", source);
  if (is_set(config, "ensure_weight_tying")) {
    FT_CHECK(config["ensure_weight_tying"].is_boolean(), source, ": field \"ensure_weight_tying\" must be a boolean, "
             "got ", config["ensure_weight_tying"].dump());
    adapter.ensure_weight_tying = config["ensure_weight_tying"].get<bool>();
  }
  return adapter;
}

std::vector<std::pair<std::string, Tensor>> peft_adapter_tensors(LanguageModel& model, Allocator& host) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Parameter& adapter : model.adapters()) {
    Tensor value = Tensor::empty(adapter.value.shape, DType::f32, host, MemCategory::workspace);
    model.backend().copy(value, adapter.value);
    tensors.emplace_back(kKeyPrefix + adapter.name, value);
  }
  // A score head is saved as PEFT's modules_to_save; PPO's value head is not
  // PEFT's (trl saves it beside the adapter).
  const HeadParameters& head = model.output_head();
  if (head.bias) return tensors;
  for (const Parameter* p : {head.weight}) {
    if (!p || !p->trainable()) continue;
    Tensor value = Tensor::empty(p->value.shape, DType::f32, host, MemCategory::workspace);
    model.backend().copy(value, p->value);
    tensors.emplace_back(kKeyPrefix + p->name, value);
  }
  return tensors;
}

void save_peft_adapter(const std::string& folder, LanguageModel& model, const PeftAdapterConfig& peft) {
  HostAllocator host;  // declared before the tensors it backs
  save_peft_adapter(folder, peft_adapter_tensors(model, host), model.options().lora, peft);
}

// init_lora_weights as PEFT writes it: true, false, "gaussian", or the
// string read from an adapter PEFT made otherwise (a PiSSA adapter trained
// further still needs PiSSA's base).
static json init_lora_weights_json(const PeftAdapterConfig& peft) {
  if (!peft.init_lora_weights.empty()) return peft.init_lora_weights;
  if (peft.lora.init_lora_weights == LoraInit::gaussian) return "gaussian";
  return peft.lora.init_lora_weights == LoraInit::kaiming_uniform;
}

void save_peft_adapter(const std::string& folder, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::optional<LoraOptions>& model_lora, const PeftAdapterConfig& peft) {
  const LoraOptions& config = peft.lora;
  check_matches_model(config, model_lora, "save_peft_adapter(" + folder + ")");
  create_folder(folder, "the adapter");
  // PEFT reads only "format"; the checksum is verified by load_peft_adapter.
  save_safetensors_with_checksum((fs::path(folder) / "adapter_model.safetensors").string(), tensors,
                                 {{"format", "pt"}});

  // nlohmann::json keeps keys sorted, as PEFT's json.dumps(sort_keys=True).
  json out;
  out["peft_type"] = "LORA";
  out["r"] = config.r;
  out["lora_alpha"] = peft_number(config.lora_alpha);
  out["lora_dropout"] = config.lora_dropout;
  out["target_modules"] = names_json(config.target_modules, config.target_modules_regex);
  out["exclude_modules"] = names_json(config.exclude_modules, config.exclude_modules_regex);
  out["base_model_name_or_path"] =
      peft.base_model_name_or_path.empty() ? json() : json(peft.base_model_name_or_path);
  out["task_type"] = peft.task_type.empty() ? json() : json(peft.task_type);
  out["bias"] = "none";
  out["fan_in_fan_out"] = false;
  out["use_rslora"] = config.use_rslora;
  out["init_lora_weights"] = init_lora_weights_json(peft);
  out["inference_mode"] = true;
  out["use_dora"] = config.use_dora;
  out["modules_to_save"] = peft.modules_to_save.empty() ? json() : json(peft.modules_to_save);
  out["layers_to_transform"] = layers_json(config.layers_to_transform);
  out["layers_pattern"] = list_or_null(config.layers_pattern);
  out["rank_pattern"] = pattern_json(config.rank_pattern);
  out["alpha_pattern"] = pattern_json(config.alpha_pattern);
  write_file_atomically((fs::path(folder) / "adapter_config.json").string(), out.dump(2));
}

std::string adapter_weights(const std::string& folder) {
  const std::string path = (fs::path(folder) / "adapter_model.safetensors").string();
  std::error_code error;
  FT_CHECK(fs::exists(path, error) || !fs::exists(fs::path(folder) / "adapter_model.bin", error), folder,
           ": holds adapter_model.bin (a PyTorch pickle) but no adapter_model.safetensors; only safetensors files "
           "are read (convert it with PEFT: PeftModel.from_pretrained(base, folder).save_pretrained(folder, "
           "safe_serialization=True))");
  const SafetensorsFile file(path);
  for (const SafetensorsEntry& entry : file.entries())
    FT_CHECK(entry.name.find(".lora_embedding_") == std::string::npos, path, ": tensor \"", entry.name,
             "\" is LoRA on an embedding, which is not supported (LoRA applies to linear modules here; "
             "modules_to_save trains an embedding whole)");
  return path;
}

void load_peft_adapter(const std::string& folder, LanguageModel& model) {
  const PeftAdapterConfig config = read_peft_adapter_config(folder);
  check_matches_model(config.lora, model.options().lora, (fs::path(folder) / "adapter_config.json").string());
  SafetensorsFile file(adapter_weights(folder));
  verify_checksum(file);  // ours carry one; PEFT's do not
  const std::string& path = file.path();

  // modules_to_save; a null parameter is the lm_head of a tied model, untied for it (as merge writes it).
  std::vector<std::pair<Parameter*, const SafetensorsEntry*>> saved;
  for (const auto& [module_tensor, entry] : saved_modules(file, config, model)) {
    Parameter* target = nullptr;
    for (Parameter& p : model.parameters())
      if (p.name == module_tensor) target = &p;
    const bool tied_head = !target && model.config().tie_word_embeddings && module_tensor == model.untied_head_name();
    FT_CHECK(target || tied_head, path, ": tensor \"", entry->name, "\" (modules_to_save): the model has no \"",
             module_tensor, "\", so it is not supported (a score head is a reward model's: objective: reward)");
    const Shape shape = target ? target->value.shape : Shape{model.config().vocab_size, model.config().hidden_size};
    FT_CHECK(entry->shape == shape, path, ": tensor \"", entry->name, "\" has shape ", shape_string(entry->shape),
             " but the model's ", module_tensor, " has ", shape_string(shape));
    saved.emplace_back(target, entry);
  }
  std::map<std::string, const SafetensorsEntry*> by_adapter;  // our adapter name -> saved tensor
  for (const SafetensorsEntry& entry : file.entries()) {
    if (!saved_module_tensor(entry.name, config).empty()) continue;  // saved_modules()'
    const std::string name = adapter_name_of(entry.name);
    FT_CHECK(!name.empty(), path, ": tensor \"", entry.name, "\" is not a LoRA weight (expected names like \"",
             kKeyPrefix, "model.layers.0.self_attn.q_proj.lora_A.weight\")");
    auto [it, inserted] = by_adapter.emplace(name, &entry);
    FT_CHECK(inserted, path, ": tensors \"", it->second->name, "\" and \"", entry.name, "\" are the same adapter");
  }
  std::map<std::string, Parameter*> adapters;
  for (Parameter& adapter : model.adapters()) {
    adapters[adapter.name] = &adapter;
    auto it = by_adapter.find(adapter.name);
    FT_CHECK(it != by_adapter.end(), path, ": missing tensor \"", kKeyPrefix + adapter.name, "\"");
    const SafetensorsEntry& entry = *it->second;
    FT_CHECK(entry.shape == adapter.value.shape, path, ": tensor \"", entry.name, "\" has shape ",
             shape_string(entry.shape), " but the model's adapter needs ", shape_string(adapter.value.shape));
    FT_CHECK(entry.dtype == DType::f32 || entry.dtype == DType::bf16 || entry.dtype == DType::f16, path,
             ": tensor \"", entry.name, "\" must be F32, BF16 or F16");
    require_finite(entry);
  }
  for (const auto& [name, entry] : by_adapter)
    FT_CHECK(adapters.count(name), path, ": unexpected tensor \"", entry->name, "\": the model has no adapter \"",
             name, "\"");

  for (const auto& [name, entry] : by_adapter)
    model.backend().copy(adapters[name]->value,
                         Tensor::view_of(const_cast<void*>(entry->data), entry->shape, entry->dtype));
  for (const auto& [parameter, entry] : saved)
    model.backend().copy(parameter ? parameter->value : model.untie_head().value,
                         Tensor::view_of(const_cast<void*>(entry->data), entry->shape, entry->dtype));
  if (!saved.empty()) model.set_output_head_loaded();
  model.adapters_changed();
}

std::map<std::string, const SafetensorsEntry*> saved_modules(const SafetensorsFile& file,
                                                              const PeftAdapterConfig& config, LanguageModel& model) {
  const std::string& path = file.path();
  std::map<std::string, const SafetensorsEntry*> tensors;
  for (const SafetensorsEntry& entry : file.entries()) {
    const std::string name = saved_module_tensor(entry.name, config);
    if (name.empty()) continue;
    require_finite(entry);
    tensors[model.checkpoint_name(name)] = &entry;  // GPT-NeoX's lm_head (transformers 5) is embed_out
  }
  const bool tied = model.config().tie_word_embeddings;
  const Parameter* embedding = model.lm_head();  // the embedding, when tied
  const auto head = tensors.find(model.untied_head_name());
  if (tied && config.ensure_weight_tying && head != tensors.end()) {
    // PEFT kept the head tied to the embedding's copy and saved both.
    const auto copy = tensors.find(embedding->name);
    FT_CHECK(copy != tensors.end() && same_bytes(*head->second, *copy->second), path, ": tensor \"",
             head->second->name, "\" differs from the embedding \"", kKeyPrefix, embedding->name,
             "\" saved beside it, but adapter_config.json's ensure_weight_tying keeps them tied");
    tensors.erase(head);
  }
  if (tied && embedding) {
    const auto copy = tensors.find(embedding->name);
    FT_CHECK(copy == tensors.end() || config.ensure_weight_tying, path, ": tensor \"", copy->second->name,
             "\" (modules_to_save) replaces an embedding that config.json ties to lm_head, which is not supported "
             "(PEFT keeps the tied lm_head on the original embedding unless ensure_weight_tying)");
  }
  check_saved_modules_complete(model, config, tensors, path);
  return tensors;
}

std::map<std::string, LoraPair> read_lora_pairs(const SafetensorsFile& file, const PeftAdapterConfig& config) {
  const std::string& path = file.path();
  std::map<std::string, LoraPair> pairs;
  for (const SafetensorsEntry& entry : file.entries()) {
    if (!saved_module_tensor(entry.name, config).empty() || !base_layer_copy_of(entry.name).empty())
      continue;  // saved_modules()' and base_layer_copies()'
    const std::string name = adapter_name_of(entry.name);
    FT_CHECK(!name.empty(), path, ": tensor \"", entry.name, "\" is not a LoRA weight (expected names like \"",
             kKeyPrefix, "model.layers.0.self_attn.q_proj.lora_A.weight\")");
    FT_CHECK(entry.dtype == DType::f32 || entry.dtype == DType::bf16 || entry.dtype == DType::f16, path,
             ": tensor \"", entry.name, "\" must be F32, BF16 or F16, got ", dtype_name(entry.dtype));
    require_finite(entry);
    const std::string magnitude = kDoraMagnitudeSuffix;
    if (name.ends_with(magnitude)) {
      FT_CHECK(config.lora.use_dora, path, ": tensor \"", entry.name, "\" is DoRA's magnitude but adapter_config.json ",
               "has no \"use_dora\": true");
      FT_CHECK(entry.shape.size() == 1, path, ": tensor \"", entry.name, "\" must be 1-D, got ",
               shape_string(entry.shape));
      LoraPair& pair = pairs[name.substr(0, name.size() - magnitude.size())];
      FT_CHECK(!pair.magnitude, path, ": tensors \"", pair.magnitude ? pair.magnitude->name : "", "\" and \"",
               entry.name, "\" are the same adapter");
      pair.magnitude = &entry;
      continue;
    }
    FT_CHECK(entry.shape.size() == 2, path, ": tensor \"", entry.name, "\" must be 2-D, got ",
             shape_string(entry.shape));
    // name is <module>.lora_A.weight or <module>.lora_B.weight.
    const size_t suffix = std::string(".lora_A.weight").size();
    const bool is_a = name.compare(name.size() - suffix, suffix, ".lora_A.weight") == 0;
    LoraPair& pair = pairs[name.substr(0, name.size() - suffix)];
    const SafetensorsEntry*& slot = is_a ? pair.A : pair.B;
    FT_CHECK(!slot, path, ": tensors \"", slot ? slot->name : "", "\" and \"", entry.name, "\" are the same adapter");
    slot = &entry;
  }
  FT_CHECK(!pairs.empty(), path, ": holds no LoRA weights");
  for (auto& [module, pair] : pairs) {
    FT_CHECK(pair.A || pair.B, path, ": module \"", module, "\" has DoRA's magnitude but no lora_A or lora_B");
    FT_CHECK(pair.A && pair.B, path, ": module \"", module, "\" has a lora_", pair.A ? "A" : "B",
             " tensor but no lora_", pair.A ? "B" : "A");
    FT_CHECK(!config.lora.use_dora || pair.magnitude, path, ": module \"", module, "\" has no ",
             "lora_magnitude_vector, which adapter_config.json's \"use_dora\": true needs");
    FT_CHECK(!pair.magnitude || pair.magnitude->shape[0] == pair.B->shape[0], path, ": module \"", module,
             "\" has lora_magnitude_vector ", shape_string(pair.magnitude ? pair.magnitude->shape : Shape{}),
             " but lora_B ", shape_string(pair.B->shape), " (expected [out])");
    const ModuleLora own = module_lora(config.lora, module);
    FT_CHECK(pair.A->shape[0] == own.r && pair.B->shape[1] == own.r, path, ": module \"", module, "\" has lora_A ",
             shape_string(pair.A->shape), " and lora_B ", shape_string(pair.B->shape),
             " but adapter_config.json says r = ", own.r, config.lora.rank_pattern.empty() ? "" : " for it");
    pair.scaling = own.scaling;
  }
  return pairs;
}

std::map<std::string, const SafetensorsEntry*> base_layer_copies(const SafetensorsFile& file) {
  std::map<std::string, const SafetensorsEntry*> copies;
  for (const SafetensorsEntry& entry : file.entries()) {
    const std::string weight = base_layer_copy_of(entry.name);
    if (weight.empty()) continue;
    require_finite(entry);
    copies[weight] = &entry;
  }
  return copies;
}

}  // namespace ft
