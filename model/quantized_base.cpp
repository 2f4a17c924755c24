#include "model/quantized_base.h"

#include <nlohmann/json.hpp>

#include "kernels/allocator.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/model_config.h"
#include "model/quant/formats.h"

namespace ft {

void save_quantized_base(LanguageModel& model, const std::string& path) {
  FT_CHECK(model.options().quantized_base != QuantizedBase::none, "save_quantized_base: the model has no "
           "quantised base to save (it needs quantization.mode int8 or nf4)");
  const QuantizedFormat& format = quantized_format(model.options().quantized_base);
  Backend& backend = model.backend();
  // On the CPU backend the parameters are host memory already and are written
  // in place; elsewhere each is copied down once.
  HostAllocator host;
  NamedTensors tensors;
  for (const Parameter& p : model.parameters()) {
    if (p.is_quantized()) format.save(backend, p, model.options().weight_dtype, host, tensors);
    else tensors.emplace_back(p.name, host_tensor(backend, p.value, host));
  }
  save_safetensors(path, tensors, {{"format", "pt"}, {kQuantizationMetadataKey, format.names.metadata}});
}

nlohmann::json quantized_base_config(const std::string& source, const ModelOptions& options) {
  FT_CHECK(options.quantized_base != QuantizedBase::none, "quantized_base_config: the model has no quantised base");
  nlohmann::json config = config_saved_as(source, options.weight_dtype);
  // BitsAndBytesConfig() as transformers 5's to_dict writes it (the private
  // _load_in_* copies included).
  nlohmann::json quantization = {{"quant_method", "bitsandbytes"},
                                 {"load_in_8bit", false},
                                 {"_load_in_8bit", false},
                                 {"load_in_4bit", false},
                                 {"_load_in_4bit", false},
                                 {"llm_int8_threshold", 6.0},
                                 {"llm_int8_skip_modules", nullptr},
                                 {"llm_int8_enable_fp32_cpu_offload", false},
                                 {"llm_int8_has_fp16_weight", false},
                                 {"bnb_4bit_compute_dtype", "float32"},
                                 {"bnb_4bit_quant_type", "fp4"},
                                 {"bnb_4bit_use_double_quant", false},
                                 {"bnb_4bit_quant_storage", "uint8"}};
  quantized_format(options.quantized_base).describe(quantization, options);
  config["quantization_config"] = quantization;
  return config;
}

}  // namespace ft
