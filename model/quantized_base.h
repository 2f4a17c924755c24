// Saving a model's quantised base so later runs skip quantisation.
//
// The folder is what transformers + bitsandbytes save for the model
// quantised the same way: model.safetensors with each quantized weight in
// its format's saved layout (QuantizedFormat::save: for int8 the I8 codes
// [out, in] under "<module>.weight" plus the f32 row absmax [out] under
// "<module>.SCB" and "<module>.weight_format", for NF4 the 4-bit layout
// transformers saves a QLoRA model in) and every other base tensor as the
// model stores it (ModelOptions::weight_dtype); config.json with the
// quantization_config transformers writes, so transformers loads the folder
// as the quantised model it is rather than reading codes as weights.
// LanguageModel::load recognises the format's layout and takes it as it is,
// so a run loading this folder holds the same bits as one that quantised the
// 16-bit checkpoint itself.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/model_options.h"

namespace ft {

class LanguageModel;

// Metadata key marking the format in the file's __metadata__ (its value:
// QuantizedFormat::Names::metadata).
inline constexpr const char* kQuantizationMetadataKey = "quantization";

// Writes the base parameters of model (adapters excluded) to path atomically.
void save_quantized_base(LanguageModel& model, const std::string& path);

// The config.json of a saved base: the model's, at source, as saved beside
// weights of options.weight_dtype (config_saved_as), with the
// quantization_config transformers writes for it (every key of
// BitsAndBytesConfig.to_dict, its defaults where the format sets none).
nlohmann::json quantized_base_config(const std::string& source, const ModelOptions& options);

}  // namespace ft
