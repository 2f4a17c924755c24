#include "model/quantized_format.h"

#include "kernels/error.h"

namespace ft {

void require_shape(const SafetensorsEntry& entry, const std::string& name, const Shape& expected) {
  FT_CHECK(entry.shape == expected, entry.file, ": tensor \"", name, "\" has shape ", shape_string(entry.shape),
           " but config.json implies ", shape_string(expected));
}

Tensor host_tensor(Backend& backend, const Tensor& t, Allocator& host) {
  if (t.device == Device::cpu) return t;
  Tensor copy = Tensor::empty(t.shape, t.dtype, host, MemCategory::workspace);
  backend.copy(copy, t);
  return copy;
}

}  // namespace ft
