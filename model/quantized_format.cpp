#include "model/quantized_format.h"

#include <cstring>

#include "kernels/allocator.h"
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

Tensor host_slice(const Tensor& whole, int dim, int64_t offset, int64_t count, Allocator& host) {
  FT_CHECK(whole.device == Device::cpu && (whole.ndim() == 2 || (whole.ndim() == 1 && dim == 0)) &&
               (dim == 0 || dim == 1) && offset >= 0 && offset + count <= whole.dim(dim),
           "host_slice: [", offset, ", ", offset + count, ") of dim ", dim, " of a host ", shape_string(whole.shape));
  if (dim == 0) return whole.slice_rows(offset, count);
  const int64_t rows = whole.dim(0), element_bytes = int64_t(dtype_size_bytes(whole.dtype));
  Tensor part = Tensor::empty({rows, count}, whole.dtype, host, MemCategory::workspace);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(part.ptr<char>() + r * count * element_bytes,
                static_cast<const char*>(whole.data) + (r * whole.dim(1) + offset) * element_bytes,
                size_t(count * element_bytes));
  return part;
}

}  // namespace ft
