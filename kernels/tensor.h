// A Tensor is a contiguous row-major block of one dtype on one device. It
// either owns its bytes (through a shared Storage that returns them to the
// allocator they came from) or views bytes owned elsewhere (a slice of another
// tensor, or a memory-mapped checkpoint). Copies of a Tensor share storage.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/dtype.h"

namespace ft {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

struct Storage {
  Allocator* allocator = nullptr;
  void* data = nullptr;
  size_t bytes = 0;
  MemCategory category = MemCategory::activations;
  Storage(Allocator& allocator, size_t bytes, MemCategory category);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct Tensor {
  std::shared_ptr<Storage> storage;  // null for views of foreign memory
  void* data = nullptr;              // null on the meta device
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  static Tensor empty(const Shape& shape, DType dtype, Allocator& allocator, MemCategory category);
  // A non-owning view of memory that outlives the tensor (e.g. an mmap).
  static Tensor view_of(void* data, const Shape& shape, DType dtype, Device device = Device::cpu);

  bool defined() const { return !shape.empty() || data != nullptr || storage != nullptr; }
  int ndim() const { return int(shape.size()); }
  int64_t numel() const { return shape_numel(shape); }
  size_t size_bytes() const { return size_t(numel()) * dtype_size_bytes(dtype); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  // Product of all dimensions but the last: the row count of a 2-D view.
  int64_t rows() const {
    int64_t count = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) count *= shape[i];
    return count;
  }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }

  // Same bytes, another shape of equal element count.
  Tensor reshaped(const Shape& new_shape) const;
  // Rows [first, first + count) of the leading dimension, sharing storage.
  Tensor slice_rows(int64_t first, int64_t count) const;
};

// The heads of an attention operand, [..., H, width], read or written in
// place: columns [first_column, first_column + width) of each row of `rows`,
// a contiguous [..., H, pitch] tensor. A contiguous operand is its own view
// (pitch = width, hence the implicit conversion); GPT-NeoX's fused
// query_key_value output, [B, T, H, 3 * D], holds q, k and v at columns 0, D
// and 2 * D, which attention and rope use there without copies.
struct HeadsView {
  Tensor rows;
  int64_t first_column = 0;
  int64_t width = 0;

  HeadsView() = default;
  // Implicit on purpose: a contiguous [..., H, D] tensor is its own view.
  HeadsView(const Tensor& contiguous) : rows(contiguous), width(contiguous.cols()) {}
  HeadsView(const Tensor& rows_, int64_t first_column_, int64_t width_)
      : rows(rows_), first_column(first_column_), width(width_) {}

  // The operand's shape: rows' with the last extent width.
  Shape shape() const;
  int64_t dim(int i) const { return i == -1 || i == rows.ndim() - 1 ? width : rows.dim(i); }
  int ndim() const { return rows.ndim(); }
  int64_t pitch() const { return rows.cols(); }
  DType dtype() const { return rows.dtype; }
  Device device() const { return rows.device; }
  bool contiguous() const { return first_column == 0 && width == pitch(); }
  // Element offset (from rows.data) of the view's first element in head row r.
  int64_t offset(int64_t r) const { return r * pitch() + first_column; }
  // Address of the view's first element (null on the meta device).
  void* data() const;
};

}  // namespace ft
