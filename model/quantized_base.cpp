#include "model/quantized_base.h"

#include <utility>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/nf4_linear.h"
#include "model/safetensors.h"

namespace ft {

void save_quantized_base(LanguageModel& model, const std::string& path) {
  const QuantizedBase base = model.options().quantized_base;
  FT_CHECK(base != QuantizedBase::none, "save_quantized_base: the model has no "
           "quantised base to save (it needs quantization.mode int8 or nf4)");
  Backend& backend = model.backend();
  HostAllocator host;
  // On the CPU backend the parameters are host memory already and are written
  // in place; elsewhere each is copied down once.
  auto on_host = [&](const Tensor& t) {
    if (t.device == Device::cpu) return t;
    Tensor copy = Tensor::empty(t.shape, t.dtype, host, MemCategory::workspace);
    backend.copy(copy, t);
    return copy;
  };
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Parameter& p : model.parameters()) {
    if (p.value.dtype == DType::u8) {
      for (auto& named : nf4_state_dict(backend, p, model.options().weight_dtype, host)) tensors.push_back(std::move(named));
      continue;
    }
    tensors.emplace_back(p.name, on_host(p.value));
    if (p.value.dtype == DType::i8) tensors.emplace_back(p.name + ".SCB", on_host(p.scales));
  }
  save_safetensors(path, tensors, {{"format", "pt"}, {kQuantizationMetadataKey, base == QuantizedBase::nf4 ? kQuantizationNf4 : kQuantizationInt8}});
}

}  // namespace ft
