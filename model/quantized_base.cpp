#include "model/quantized_base.h"

#include "kernels/allocator.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
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

}  // namespace ft
