#include "model/lora_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/error.h"

namespace ft {

LoraLinear::LoraLinear(std::unique_ptr<Linear> base, Parameter& lora_A, Parameter& lora_B, float scaling,
                       float dropout, Parameter* magnitude, const Parameter* base_bias)
    : base_(std::move(base)),
      A_(lora_A),
      B_(lora_B),
      scaling_(scaling),
      dropout_(dropout),
      magnitude_(magnitude),
      base_bias_(base_bias) {
  FT_CHECK(lora_A.value.ndim() == 2 && lora_B.value.ndim() == 2 && lora_B.value.dim(1) == lora_A.value.dim(0),
           "LoraLinear: lora_A ", shape_string(lora_A.value.shape), " and lora_B ", shape_string(lora_B.value.shape),
           " are not [r, in] and [out, r]");
  FT_CHECK(dropout >= 0.0f && dropout < 1.0f, "LoraLinear: dropout must be in [0, 1), got ", dropout);
  FT_CHECK(!magnitude || magnitude->value.shape == Shape{lora_B.value.dim(0)}, "LoraLinear: DoRA's magnitude is ",
           shape_string(magnitude->value.shape), ", expected [out] = [", lora_B.value.dim(0), "]");
}

// The adapter computes in x's dtype, as PEFT under bf16 autocast: with bf16
// activations A and B are used through bf16 copies of their f32 masters and
// h, g and the dropped input are bf16 (products still accumulate in f32 and
// the gradients of A and B are f32). With f32 activations all of it is f32.
Tensor LoraLinear::compute_copy(Backend& backend, const Parameter& p, DType dtype) {
  if (p.value.dtype == dtype) return p.value;
  Tensor copy = backend.empty(p.value.shape, dtype, MemCategory::workspace);
  backend.copy(copy, p.value);
  return copy;
}

// dropout(x), or x itself when there is no dropout.
Tensor LoraLinear::adapter_input(Backend& backend, const Tensor& x) {
  if (!dropout_active()) return x;
  Tensor xd = backend.empty(x.shape, x.dtype, MemCategory::activations);
  backend.dropout_forward(xd, x, dropout_, rows_seed(x), row_stride());
  return xd;
}

// h = xd A^T over the dropped input xd; A's compute copy is freed on return.
Tensor LoraLinear::adapter_hidden(Backend& backend, const Tensor& xd) {
  Tensor A = compute_copy(backend, A_, xd.dtype);
  Tensor h = backend.empty({xd.rows(), A.dim(0)}, xd.dtype, MemCategory::activations);
  backend.matmul(h, xd, A, false, true);
  return h;
}

// Columns of W per tile when W is read a tile at a time: at most
// kTileElements values (16 MiB in f32), a multiple of 64 (NF4's block).
static int64_t weight_tile_columns(int64_t out, int64_t in) {
  constexpr int64_t kTileElements = int64_t(1) << 22;
  return std::min(in, std::max<int64_t>(kTileElements / out / 64 * 64, 64));  // in < 64: one tile
}

// weight_sum_squares_ = ||W + scaling B A||^2 per row, in f32 (PEFT's
// dequantised weight plus lora_B @ lora_A), from column tiles of W so no
// [out, in] copy of it is ever held.
void LoraLinear::update_weight_norms(Backend& backend) {
  if (norms_current_) return;
  const int64_t out = B_.value.dim(0), in = A_.value.dim(1), r = A_.value.dim(0);
  if (!weight_sum_squares_.defined()) weight_sum_squares_ = backend.empty({out}, DType::f32, MemCategory::adapters);
  const Tensor A = compute_copy(backend, A_, DType::f32), B = compute_copy(backend, B_, DType::f32);
  const int64_t width = weight_tile_columns(out, in);
  for (int64_t col0 = 0; col0 < in; col0 += width) {
    const int64_t columns = std::min(width, in - col0);
    Tensor tile = backend.empty({out, columns}, DType::f32, MemCategory::workspace);
    Tensor A_columns = backend.empty({r, columns}, DType::f32, MemCategory::workspace);
    base_->weight_columns(backend, tile, col0);
    backend.copy_columns(A_columns, 0, A, col0, columns);
    backend.matmul(tile, B, A_columns, false, false, scaling_, 1.0f);
    backend.row_sum_squares(weight_sum_squares_, tile, col0 > 0);
  }
  norms_current_ = true;
}

void LoraLinear::init_magnitude(Backend& backend) {
  if (!magnitude_) return;
  norms_current_ = false;
  update_weight_norms(backend);
  std::vector<float> norms(size_t(weight_sum_squares_.numel()));
  Tensor host = Tensor::view_of(norms.data(), weight_sum_squares_.shape, DType::f32);
  backend.copy(host, weight_sum_squares_);
  for (float& norm : norms) norm = std::sqrt(norm);
  backend.copy(magnitude_->value, host);
}

// z [shape] = xd W^T + scaling h B^T, no bias: PEFT's DoRA branch under
// dropout, F.linear(dropout(x), dequantised W) + lora_B(lora_A(...)), W read
// a column tile at a time as its own backward reads it (so over LLM.int8()
// the activations are not quantised, as in PEFT).
Tensor LoraLinear::dropped_branch(Backend& backend, const Shape& shape, const Tensor& xd, const Tensor& h,
                                  const Tensor& B) {
  const int64_t out = B.dim(0), in = xd.cols(), width = weight_tile_columns(out, in);
  Tensor z = backend.empty(shape, xd.dtype, MemCategory::activations);
  for (int64_t col0 = 0; col0 < in; col0 += width) {
    const int64_t columns = std::min(width, in - col0);
    Tensor tile = backend.empty({out, columns}, xd.dtype, MemCategory::workspace);
    Tensor x_columns = backend.empty({xd.rows(), columns}, xd.dtype, MemCategory::workspace);
    base_->weight_columns(backend, tile, col0);
    backend.copy_columns(x_columns, 0, xd, col0, columns);
    backend.matmul(z, x_columns, tile, false, true, 1.0f, col0 > 0 ? 1.0f : 0.0f);
  }
  backend.matmul(z, h, B, false, true, scaling_, 1.0f);
  return z;
}

// h first, so the base can add scaling * h B^T in its own output pass
// (Int8Linear's epilogue) rather than out being re-read by a second matmul.
// DoRA then adds (g - 1) times its branch: out itself without dropout.
void LoraLinear::forward(Backend& backend, Tensor& out, const Tensor& x) {
  if (!enabled_) return base_->forward(backend, out, x);
  if (magnitude_) update_weight_norms(backend);
  Tensor xd = adapter_input(backend, x);
  const Tensor h = adapter_hidden(backend, xd);
  // The dropped input is freed before the base's pass unless DoRA's branch reads it too.
  if (!magnitude_ || !dropout_active()) xd = Tensor{};
  Tensor B = compute_copy(backend, B_, x.dtype);
  base_->forward_with_lora(backend, out, x, h, B, scaling_);
  if (!magnitude_) return;
  if (!dropout_active()) return backend.dora_scale_forward(out, out, magnitude_->value, weight_sum_squares_, base_bias());
  const Tensor z = dropped_branch(backend, out.shape, xd, h, B);
  backend.dora_scale_forward(out, z, magnitude_->value, weight_sum_squares_, nullptr);
}

// DoRA's branch z recomputed (forward's), then dz = g dout (the gradient at
// the adapter's output), dbase = (g - 1) dout (at the base's product over
// the dropped input; with dropout only) and m's gradient += column sums of
// dout * (z - bias) / ||W + scaling B A||.
void LoraLinear::dora_gradients(Backend& backend, Tensor& dz, Tensor* dbase, const Tensor& dout, const Tensor& x) {
  const Tensor xd = adapter_input(backend, x);
  const Tensor h = adapter_hidden(backend, xd);
  const Tensor B = compute_copy(backend, B_, x.dtype);
  Tensor z;
  if (dropout_active()) {
    z = dropped_branch(backend, dout.shape, xd, h, B);
  } else {
    z = backend.empty(dout.shape, dout.dtype, MemCategory::activations);
    base_->forward_with_lora(backend, z, x, h, B, scaling_);
  }
  backend.dora_scale_backward(dz, dbase, magnitude_->trainable() ? &magnitude_->grad : nullptr, dout, z,
                              magnitude_->value, weight_sum_squares_, dropout_active() ? nullptr : base_bias());
}

// Plain LoRA: the base's backward of dout, then the adapter's. DoRA without
// dropout is the same with dz = g dout; with dropout, x's own product takes
// dout and the dropped input's takes dz (adapter) and dbase (base).
void LoraLinear::backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) {
  if (!enabled_) return base_->backward(backend, dx, dout, x, accumulate_dx);
  norms_current_ = false;  // an optimizer step may change A and B before the next forward
  if (!magnitude_) {
    base_->backward(backend, dx, dout, x, accumulate_dx);
    return adapter_backward(backend, dx, dout, nullptr, x);
  }
  Tensor dz = backend.empty(dout.shape, dout.dtype, MemCategory::activations);
  Tensor dbase = dropout_active() && dx ? backend.empty(dout.shape, dout.dtype, MemCategory::activations) : Tensor{};
  dora_gradients(backend, dz, dbase.defined() ? &dbase : nullptr, dout, x);
  base_->backward(backend, dx, dropout_active() ? dout : dz, x, accumulate_dx);
  adapter_backward(backend, dx, dz, dbase.defined() ? &dbase : nullptr, x);
}

// With xd = dropout(x), h = xd A^T and y += scaling * h B^T:
//   dB += scaling * dout^T h,  g = scaling * dout B (the gradient at h),
//   dA += g^T xd,              dx += dropout_backward(g A [+ dbase W]).
void LoraLinear::adapter_backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor* dbase,
                                  const Tensor& x) {
  const int64_t N = x.rows(), r = A_.value.dim(0);
  Tensor A = compute_copy(backend, A_, x.dtype), B = compute_copy(backend, B_, x.dtype);
  Tensor xd = adapter_input(backend, x);
  if (B_.trainable()) {
    Tensor h = backend.empty({N, r}, x.dtype, MemCategory::activations);
    backend.matmul(h, xd, A, false, true);
    backend.accumulate_outer_products(B_.grad, dout, h, scaling_);
  }
  Tensor g = backend.empty({N, r}, x.dtype, MemCategory::activations);
  backend.matmul(g, dout, B, false, false, scaling_);
  if (A_.trainable()) backend.accumulate_outer_products(A_.grad, g, xd, 1.0f);
  if (!dx) return;
  if (!dropout_active()) {
    backend.matmul(*dx, g, A, false, false, 1.0f, 1.0f);
    return;
  }
  Tensor dxd = backend.empty(x.shape, x.dtype, MemCategory::activations);
  if (dbase) base_->backward(backend, &dxd, *dbase, xd, false);
  backend.matmul(dxd, g, A, false, false, 1.0f, dbase ? 1.0f : 0.0f);
  backend.dropout_backward(dxd, dxd, dropout_, rows_seed(x), row_stride());
  backend.add(*dx, *dx, dxd);
}

LoraShapes lora_shapes(int64_t out_features, int64_t in_features, int64_t r) {
  return LoraShapes{{r, in_features}, {out_features, r}};
}

float lora_scaling(double lora_alpha, int64_t r, bool use_rslora) {
  return float(use_rslora ? lora_alpha / std::sqrt(double(r)) : lora_alpha / double(r));
}

namespace {

// p's elements set to value(i), i the element's index in the whole tensor: a
// tensor-parallel shard (of A's columns, B's rows) draws the whole tensor's
// values at its place.
template <class Value>
void fill_by_whole_index(Backend& backend, Parameter& p, Value value) {
  // The planner's meta tensors hold no values: it models the copy alone (a
  // 33B model's adapters would take it half a minute to draw per mode).
  if (backend.device() == Device::meta) {
    backend.copy(p.value, Tensor::view_of(nullptr, p.value.shape, DType::f32));
    return;
  }
  const int64_t rows = p.value.rows(), cols = p.value.cols(), whole_cols = whole_shape(p).at(1);
  const int64_t first_row = p.slice.dim == 0 ? p.slice.offset : 0, first_col = p.slice.dim == 1 ? p.slice.offset : 0;
  std::vector<float> values(size_t(p.value.numel()));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      values[size_t(r * cols + c)] = value(uint64_t((first_row + r) * whole_cols + first_col + c));
  backend.copy(p.value, Tensor::view_of(values.data(), p.value.shape, DType::f32));
}

// kaiming_uniform_(W, a = sqrt(5)), nn.Linear's default, with fan_in = W's
// columns: gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), std = gain / sqrt(fan_in),
// bound = sqrt(3) * std = 1 / sqrt(fan_in).
void fill_kaiming_uniform(Backend& backend, Parameter& p, uint64_t seed) {
  const double bound = 1.0 / std::sqrt(double(whole_shape(p).at(1)));
  fill_by_whole_index(backend, p, [&](uint64_t i) {  // in [-bound, bound)
    return float(bound * (2.0 * double(hash_uniform(seed, i)) - 1.0));
  });
}

// normal_(W, std = stddev): Box-Muller on two uniforms of element i's own
// (2i, 2i + 1).
void fill_normal(Backend& backend, Parameter& p, uint64_t seed, double stddev) {
  fill_by_whole_index(backend, p, [&](uint64_t i) {
    const double u1 = 1.0 - double(hash_uniform(seed, 2 * i));  // in (0, 1]: its log is finite
    const double u2 = double(hash_uniform(seed, 2 * i + 1));
    return float(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  });
}

}  // namespace

void init_lora_parameters(Backend& backend, Parameter& A, Parameter& B, LoraInit init, uint64_t seed) {
  if (init == LoraInit::gaussian)
    fill_normal(backend, A, seed, 1.0 / double(A.value.rows()));  // std 1 / r
  else
    fill_kaiming_uniform(backend, A, seed);
  if (init == LoraInit::random)
    fill_kaiming_uniform(backend, B, splitmix64(seed, 1));  // fan_in r
  else
    backend.fill(B.value, 0.0f);
}

}  // namespace ft
