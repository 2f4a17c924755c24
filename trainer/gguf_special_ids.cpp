#include "trainer/gguf_special_ids.h"

#include <algorithm>
#include <filesystem>

#include "model/json_input.h"
#include "trainer/data/jinja/value.h"
#include "tokenizer/load_tokenizer.h"

namespace ft {
namespace fs = std::filesystem;
using json = jinja::Json;  // the chat templates' JSON, whose truthy() is Python's, as gguf-py tests values

namespace {

// The rules below are gguf-py's, written in Python: its truth value of a JSON value.
bool truthy(const json& value) { return jinja::truthy(jinja::Value(value)); }

json field(const json& object, const char* key) {
  return object.is_object() && object.contains(key) ? object[key] : json();
}

// A post-processor template item's special-token id ({"SpecialToken": {"id": "<s>"}}), or null.
json special_id(const json& item) { return field(field(item, "SpecialToken"), "id"); }
json sequence_id(const json& item) { return field(field(item, "Sequence"), "id"); }

json read_if_exists(const fs::path& path, const char* expected) {
  return fs::is_regular_file(path) ? read_ordered_json_object(path.string(), expected) : json();
}

struct Names {
  json& config;  // tokenizer_config.json, completed as the converter completes it
  std::vector<std::string>& types;
  bool has_config;
};

// RobertaProcessing names cls and sep where tokenizer_config.json does not.
void roberta_names(const json& processor, Names& names) {
  for (const char* type : {"cls", "sep"}) {
    const std::string key = std::string(type) + "_token";
    if (truthy(field(names.config, key.c_str())) || !names.has_config) continue;
    const json named = field(processor, type);
    names.config[key] = named.is_array() && !named.empty()
                            ? named[0]
                            : field(names.config, std::string(type) == "cls" ? "bos_token" : "eos_token");
  }
}

// TemplateProcessing: only the parts that change an id (the converter also reads add_bos / add_eos from it).
void template_names(const json& processor, Names& names) {
  if (!names.has_config) return;
  const json single = field(processor, "single"), pair = field(processor, "pair");
  json first, last;
  if (single.is_array() && single.size() > 1) {
    first = special_id(single.front());
    last = special_id(single.back());
    if (truthy(last) && last != field(names.config, "eos_token")) {
      for (const char* type : {"eot", "eom"})
        if (std::find(names.types.begin(), names.types.end(), type) == names.types.end()) {
          names.types.push_back(type);
          names.config[std::string(type) + "_token"] = field(names.config, "eos_token");
          break;
        }
      names.config["eos_token"] = last;
    }
  }
  if (!truthy(pair) || !pair.is_array()) return;
  const size_t begin = truthy(first) && special_id(pair.front()) == first ? 1 : 0;
  const size_t end = truthy(last) && special_id(pair.back()) == last ? pair.size() - 1 : pair.size();
  if (end < begin + 3 || sequence_id(pair[begin]) != "A" || sequence_id(pair[end - 1]) != "B") return;
  const json sep = field(names.config, "sep_token"), eos = field(names.config, "eos_token");
  const auto separates = [&](const json& id) { return truthy(id) && (id == sep || id == eos); };
  const bool add_sep = (separates(special_id(pair[begin + 1])) && !truthy(last)) ||
                       (end - begin == 4 && separates(special_id(pair[begin + 2])));
  if (add_sep && !truthy(sep)) names.config["sep_token"] = eos;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> gguf_special_ids(const std::string& tokenizer_path,
                                                              const std::string& model_config_path,
                                                              int64_t vocab_size) {
  const fs::path folder = fs::path(tokenizer_path).parent_path();
  const json tokenizer = is_tokenizer_json(tokenizer_path)
                             ? read_ordered_json_object(tokenizer_path, "a tokenizer.json")
                             : read_if_exists(folder / "tokenizer.json", "a tokenizer.json");
  json config = read_if_exists(folder / "tokenizer_config.json", "a tokenizer_config.json");
  std::vector<std::string> types = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  Names names{config, types, truthy(config)};
  if (tokenizer.is_object()) {
    for (const auto& [fallback, from] : {std::pair{"bos_token", "cls_token"}, {"eos_token", "sep_token"}})
      if (!truthy(field(config, fallback)) && truthy(field(config, from)) && names.has_config)
        config[fallback] = config[from];
    const json post = field(tokenizer, "post_processor");
    const json processors = post.is_object() && post.contains("processors") ? post["processors"] : json::array({post});
    for (const json& processor : truthy(post) ? processors : json::array()) {
      if (field(processor, "type") == "RobertaProcessing") roberta_names(processor, names);
      if (field(processor, "type") == "TemplateProcessing") template_names(processor, names);
    }
  }
  std::vector<std::pair<std::string, int64_t>> ids;  // (type, id), first found wins
  const auto add = [&](const std::string& type, const json& id) {
    const bool found = std::any_of(ids.begin(), ids.end(), [&](const auto& entry) { return entry.first == type; });
    if (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size && !found)
      ids.emplace_back(type, id.get<int64_t>());
  };
  const json added = field(tokenizer, "added_tokens");
  for (const std::string& type : names.has_config ? types : std::vector<std::string>{}) {
    json content = field(config, (type + "_token").c_str());
    if (content.is_object()) content = field(content, "content");
    if (!content.is_string()) continue;
    for (const json& token : added.is_array() ? added : json::array())
      if (field(token, "content") == content) {
        add(type, field(token, "id"));
        break;
      }
  }
  const json model_config = read_ordered_json_object(model_config_path, "the model's config.json");
  for (const std::string& type : types) {
    json id = field(model_config, (type + "_token_id").c_str());
    if (id.is_null()) id = field(field(model_config, "text_config"), (type + "_token_id").c_str());
    add(type, id);
  }
  std::vector<std::pair<std::string, int64_t>> keyed;
  const std::pair<const char*, const char*> keys[] = {{"bos", "bos_token_id"},     {"eos", "eos_token_id"},
                                                      {"unk", "unknown_token_id"}, {"sep", "seperator_token_id"},
                                                      {"pad", "padding_token_id"}, {"mask", "mask_token_id"},
                                                      {"eot", "eot_token_id"},     {"eom", "eom_token_id"}};
  for (const auto& [type, id] : ids)
    for (const auto& [name, key] : keys)
      if (type == name) keyed.emplace_back(std::string("tokenizer.ggml.") + key, id);
  return keyed;
}

}  // namespace ft
