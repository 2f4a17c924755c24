#include "trainer/adapter_record.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "model/atomic_file.h"
#include "model/json_input.h"

namespace ft {

void write_adapter_record(const std::string& adapter_dir, const AdapterRecord& record) {
  nlohmann::json json = {{"base_quantization", enum_name(record.quantization)},
                         {"double_quant", record.double_quant},
                         {"precision", enum_name(record.precision)},
                         {"chat_template", record.chat_template ? nlohmann::json(enum_name(*record.chat_template))
                                                                : nlohmann::json(nullptr)},
                         {"config", record.config},
                         {"config_fingerprint", record.config_fingerprint}};
  write_file_atomically((std::filesystem::path(adapter_dir) / kAdapterRecordFile).string(), json.dump(2) + "\n");
}

namespace {

// json[key], one of E's spellings.
template <class E>
E spelled(const nlohmann::json& json, const char* key, const std::string& path) {
  FT_CHECK(json.contains(key), path, ": missing \"", key, "\" (one of ", enum_spellings(enum_names(E{})), ")");
  FT_CHECK(json[key].is_string(), path, ": ", key, " must be a string (one of ", enum_spellings(enum_names(E{})), ")");
  const std::optional<E> value = enum_value(json[key].get<std::string>(), enum_names(E{}));
  FT_CHECK(value.has_value(), path, ": ", key, " is \"", json[key].get<std::string>(), "\", expected one of ",
           enum_spellings(enum_names(E{})));
  return *value;
}

}  // namespace

std::optional<AdapterRecord> read_adapter_record(const std::string& adapter_dir) {
  const std::string path = (std::filesystem::path(adapter_dir) / kAdapterRecordFile).string();
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json json = read_json_object(path, "finetune's record of how the adapter was trained");
  AdapterRecord record;
  record.quantization = spelled<QuantizedBase>(json, "base_quantization", path);
  if (json.contains("double_quant")) {
    FT_CHECK(json["double_quant"].is_boolean(), path, ": double_quant must be true or false");
    record.double_quant = json["double_quant"];
  }
  record.precision = spelled<Precision>(json, "precision", path);
  if (json.contains("chat_template") && !json["chat_template"].is_null())
    record.chat_template = spelled<ChatTemplateKind>(json, "chat_template", path);
  if (json.contains("config") && json["config"].is_string()) record.config = json["config"];
  if (json.contains("config_fingerprint") && json["config_fingerprint"].is_string())
    record.config_fingerprint = json["config_fingerprint"];
  return record;
}

}  // namespace ft
