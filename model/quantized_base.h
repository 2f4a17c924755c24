// Saving a model's quantised base (LLM.int8() or NF4) so later runs skip quantisation.
//
// The file is one safetensors file in bitsandbytes' naming: each int8 weight
// as I8 codes [out, in] under its Hugging Face name, its f32 row absmax [out]
// under "<name>.SCB", and every other base tensor as the model stores it
// (ModelOptions::weight_dtype). LanguageModel::load recognises the I8 + .SCB pair
// and copies both as they are, so a run loading this file holds the same bits
// as one that quantised the 16-bit checkpoint itself. An NF4 base is written
// in bitsandbytes' 4-bit layout as transformers saves a QLoRA model
// (model/nf4_linear.h), which LanguageModel::load reads back the same way.
#pragma once
#include <string>

namespace ft {

class LanguageModel;

// Metadata key and value marking the format in the file's __metadata__.
inline constexpr const char* kQuantizationMetadataKey = "quantization";
inline constexpr const char* kQuantizationInt8 = "llm_int8";
inline constexpr const char* kQuantizationNf4 = "bitsandbytes_nf4";

// Writes the base parameters of model (adapters excluded) to path atomically.
void save_quantized_base(LanguageModel& model, const std::string& path);

}  // namespace ft
