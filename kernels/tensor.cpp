#include "kernels/tensor.h"

#include <sstream>

#include "kernels/checked_mul.h"
#include "kernels/error.h"

namespace ft {

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t product = 0;
  FT_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &product), "size ", a, " x ", b,
           (a < 0 || b < 0) ? " is negative" : " overflows a 64-bit count");
  return product;
}

int64_t shape_numel(const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count = checked_mul(count, extent);
  return count;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream text;
  text << "[";
  for (size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << "]";
  return text.str();
}

Storage::Storage(Allocator& allocator_, size_t bytes_, MemCategory category_)
    : allocator(&allocator_), bytes(bytes_), category(category_) {
  data = allocator->allocate(bytes, category);
}

Storage::~Storage() { allocator->deallocate(data, bytes, category); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& allocator, MemCategory category) {
  for (int64_t extent : shape) FT_CHECK(extent >= 0, "negative extent in shape ", shape_string(shape));
  Tensor tensor;
  tensor.shape = shape;
  tensor.dtype = dtype;
  tensor.device = allocator.device();
  const int64_t bytes = checked_mul(shape_numel(shape), int64_t(dtype_size_bytes(dtype)));
  tensor.storage = std::make_shared<Storage>(allocator, size_t(bytes), category);
  tensor.data = tensor.storage->data;
  return tensor;
}

Tensor Tensor::view_of(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor tensor;
  tensor.data = data;
  tensor.shape = shape;
  tensor.dtype = dtype;
  tensor.device = device;
  return tensor;
}

int64_t Tensor::dim(int i) const {
  int index = i < 0 ? ndim() + i : i;
  FT_CHECK(index >= 0 && index < ndim(), "dimension ", i, " out of range for shape ", shape_string(shape));
  return shape[size_t(index)];
}

Tensor Tensor::reshaped(const Shape& new_shape) const {
  FT_CHECK(shape_numel(new_shape) == numel(), "cannot reshape ", shape_string(shape), " to ",
           shape_string(new_shape));
  Tensor view = *this;
  view.shape = new_shape;
  return view;
}

Tensor Tensor::slice_rows(int64_t first, int64_t count) const {
  FT_CHECK(ndim() >= 1 && first >= 0 && count >= 0 && first + count <= shape[0], "row slice [", first, ", ",
           first + count, ") out of range for shape ", shape_string(shape));
  Tensor view = *this;
  view.shape[0] = count;
  size_t row_bytes = size_bytes() / size_t(shape[0] ? shape[0] : 1);
  if (data) view.data = static_cast<char*>(data) + size_t(first) * row_bytes;
  return view;
}

Shape HeadsView::shape() const {
  Shape view = rows.shape;
  if (!view.empty()) view.back() = width;
  return view;
}

void* HeadsView::data() const {
  return rows.data ? static_cast<char*>(rows.data) + size_t(first_column) * dtype_size_bytes(rows.dtype) : nullptr;
}

}  // namespace ft
