// Saving a model's quantised base so later runs skip quantisation.
//
// The file is one safetensors file in bitsandbytes' naming: each quantized
// weight in its format's saved layout (QuantizedFormat::save: for int8 the
// I8 codes [out, in] under the weight's Hugging Face name plus its f32 row
// absmax [out] under "<name>.SCB", for NF4 the 4-bit layout transformers
// saves a QLoRA model in), and every other base tensor as the model stores
// it (ModelOptions::weight_dtype). LanguageModel::load recognises the
// format's layout and takes it as it is, so a run loading this file holds
// the same bits as one that quantised the 16-bit checkpoint itself.
#pragma once
#include <string>

namespace ft {

class LanguageModel;

// Metadata key marking the format in the file's __metadata__ (its value:
// QuantizedFormat::Names::metadata).
inline constexpr const char* kQuantizationMetadataKey = "quantization";

// Writes the base parameters of model (adapters excluded) to path atomically.
void save_quantized_base(LanguageModel& model, const std::string& path);

}  // namespace ft
