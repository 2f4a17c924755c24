#include "kernels/meta/meta_backend.h"

#include <cstring>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm.h"
#include "kernels/error.h"
#include "kernels/int8_tiles.h"
#include "kernels/op_checks.h"

namespace ft {

void* CachingModelAllocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;  // as CachingAllocator: nothing handed out
  const size_t size = CachingAllocator::block_bytes(bytes, category);
  size_t& cached = free_blocks_[size];
  if (CachingAllocator::caches(category) && cached > 0) {
    cached -= 1;
  } else {
    reserved_ += size;
  }
  in_use_ += size;
  if (in_use_ > peak_) peak_ = in_use_;
  return nullptr;
}

void CachingModelAllocator::deallocate(void*, size_t bytes, MemCategory category) {
  if (bytes == 0) return;
  const size_t size = CachingAllocator::block_bytes(bytes, category);
  in_use_ -= size;
  if (CachingAllocator::caches(category))
    free_blocks_[size] += 1;
  else
    reserved_ -= size;
}

namespace {

using checks::check_dtype;
using checks::check_float;
using checks::check_numel;
using checks::check_shape;
constexpr Device kMeta = Device::meta;

}  // namespace

MetaBackend::MetaBackend(Allocator& allocator, MemoryPolicy policy, size_t gemm_workspace_bytes)
    : allocator_(allocator), policy_(policy) {
  FT_CHECK(allocator.device() == kMeta, "MetaBackend needs a meta allocator");
  // CudaBackend's constructor builds cuBLASLt, which allocates its workspace first.
  if (policy == MemoryPolicy::cuda && gemm_workspace_bytes > 0)
    cublaslt_workspace_ = empty({int64_t(gemm_workspace_bytes)}, DType::i8, MemCategory::workspace);
}

void MetaBackend::enter(const char* op, std::initializer_list<const Tensor*> operands) {
  cursor_.op = op;
  cursor_.backward |= std::strstr(op, "_backward") != nullptr;
  for (const Tensor* t : operands) {
    const Storage* s = t->storage.get();
    if (s && (s->category == MemCategory::weights || s->category == MemCategory::adapters)) {
      cursor_.parameter = s;
      return;
    }
  }
}

void MetaBackend::copy(Tensor& dst, const Tensor& src) {
  enter("copy", {&dst, &src});
  FT_CHECK(dst.numel() == src.numel(), "copy: dst ", shape_string(dst.shape), " and src ", shape_string(src.shape),
           " differ in element count");
  if (dst.data) std::memset(dst.data, 0, dst.size_bytes());
  // CudaBackend::copy converts dtypes on the device: a host source is staged
  // there first, a host destination is converted there first.
  if (policy_ == MemoryPolicy::cuda && dst.dtype != src.dtype) {
    if (src.device == Device::cpu) empty(src.shape, src.dtype, MemCategory::workspace);
    if (dst.device == Device::cpu) empty(dst.shape, dst.dtype, MemCategory::workspace);
  }
}

// CudaBackend's deterministic column sums: one f32 row of partials per block
// (cuda::kMaxPartialRows); the CPU reduces in registers and host vectors.
Tensor MetaBackend::column_partials(int64_t rows, int64_t channels) {
  if (policy_ != MemoryPolicy::cuda) return {};
  return empty({std::min(rows, cuda::kMaxPartialRows), channels}, DType::f32, MemCategory::workspace);
}

void MetaBackend::fill(Tensor& dst, float) {
  enter("fill", {&dst});
  checks::check_on(dst, kMeta, "fill", "dst");
}

void MetaBackend::copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                               int64_t width) {
  enter("copy_columns", {&src});
  FT_CHECK(dst.rows() == src.rows() && dst_offset + width <= dst.cols() && src_offset + width <= src.cols(),
           "copy_columns: dst ", shape_string(dst.shape), " [", dst_offset, ", +", width, ") and src ",
           shape_string(src.shape), " [", src_offset, ", +", width, ") do not fit");
}

void MetaBackend::matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float,
                         float) {
  enter("matmul", {&b, &a});
  checks::check_matmul(out, a, b, transpose_a, transpose_b, kMeta);
  // CudaBackend::matmul widens the bf16 operand of a mixed product to f32 scratch.
  if (policy_ == MemoryPolicy::cuda && a.dtype != b.dtype)
    empty((a.dtype == DType::bf16 ? a : b).shape, DType::f32, MemCategory::workspace);
}

void MetaBackend::add(Tensor& out, const Tensor& a, const Tensor& b) {
  enter("add", {&a, &b});
  check_float(out, kMeta, "add", "out");
  check_numel(a, out.numel(), "add", "a");
  check_numel(b, out.numel(), "add", "b");
}

void MetaBackend::add_bias(Tensor& out, const Tensor& bias) {
  enter("add_bias", {&bias});
  check_float(out, kMeta, "add_bias", "out");
  check_numel(bias, out.cols(), "add_bias", "bias");
}

void MetaBackend::bias_backward(Tensor& dbias, const Tensor& dout) {
  enter("bias_backward", {&dbias});
  check_numel(dbias, dout.cols(), "bias_backward", "dbias");
  Tensor partials = column_partials(dout.rows(), dout.cols());
}

void MetaBackend::embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) {
  enter("embedding_forward", {&table});
  check_dtype(ids, DType::i32, kMeta, "embedding_forward", "ids");
  check_shape(out, {ids.numel(), table.cols()}, "embedding_forward", "out");
}

void MetaBackend::embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
  enter("embedding_backward", {&dtable});
  check_dtype(ids, DType::i32, kMeta, "embedding_backward", "ids");
  check_shape(dout, {ids.numel(), dtable.cols()}, "embedding_backward", "dout");
}

void MetaBackend::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float) {
  enter("rmsnorm_forward", {&weight});
  check_shape(out, x.shape, "rmsnorm_forward", "out");
  check_numel(rstd, x.rows(), "rmsnorm_forward", "rstd");
  check_numel(weight, x.cols(), "rmsnorm_forward", "weight");
}

void MetaBackend::rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                   const Tensor& weight, const Tensor& rstd) {
  enter("rmsnorm_backward", {&weight});
  check_shape(dx, x.shape, "rmsnorm_backward", "dx");
  check_shape(dout, x.shape, "rmsnorm_backward", "dout");
  check_numel(rstd, x.rows(), "rmsnorm_backward", "rstd");
  if (dweight) check_shape(*dweight, weight.shape, "rmsnorm_backward", "dweight");
  Tensor partials = dweight ? column_partials(x.rows(), x.cols()) : Tensor();
}

void MetaBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                                    const Tensor& bias, float) {
  enter("layernorm_forward", {&weight});
  check_shape(out, x.shape, "layernorm_forward", "out");
  check_numel(mean, x.rows(), "layernorm_forward", "mean");
  check_numel(rstd, x.rows(), "layernorm_forward", "rstd");
  check_numel(weight, x.cols(), "layernorm_forward", "weight");
  check_numel(bias, x.cols(), "layernorm_forward", "bias");
}

void MetaBackend::layernorm_backward(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& x,
                                     const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  enter("layernorm_backward", {&weight});
  check_shape(dx, x.shape, "layernorm_backward", "dx");
  check_shape(dout, x.shape, "layernorm_backward", "dout");
  check_numel(mean, x.rows(), "layernorm_backward", "mean");
  check_numel(rstd, x.rows(), "layernorm_backward", "rstd");
  if (dweight) check_shape(*dweight, weight.shape, "layernorm_backward", "dweight");
  if (dbias) check_shape(*dbias, weight.shape, "layernorm_backward", "dbias");
  Tensor dweight_partials = dweight ? column_partials(x.rows(), x.cols()) : Tensor();
  Tensor dbias_partials = dbias ? column_partials(x.rows(), x.cols()) : Tensor();
}

// The fused residual norms: the plain op's checks and scratch (CudaBackend
// launches the same kernels), plus the residual operands' shapes.
void MetaBackend::add_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                                      const Tensor& weight, float) {
  const char* op = "add_rmsnorm_forward";
  enter(op, {&weight});
  for (auto [t, name] : {std::pair{&out, "out"}, std::pair{&sum, "sum"}}) check_shape(*t, a.shape, op, name);
  check_shape(b, a.shape, op, "b");
  check_numel(rstd, a.rows(), op, "rstd");
  check_numel(weight, a.cols(), op, "weight");
}

void MetaBackend::add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                                        const Tensor& b, const Tensor& weight, const Tensor& bias, float) {
  const char* op = "add_layernorm_forward";
  enter(op, {&weight});
  for (auto [t, name] : {std::pair{&out, "out"}, std::pair{&sum, "sum"}}) check_shape(*t, a.shape, op, name);
  check_shape(b, a.shape, op, "b");
  check_numel(mean, a.rows(), op, "mean");
  check_numel(rstd, a.rows(), op, "rstd");
  check_numel(weight, a.cols(), op, "weight");
  check_numel(bias, a.cols(), op, "bias");
}

void MetaBackend::rmsnorm_backward_add(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                                       const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward_add";
  enter(op, {&weight});
  check_shape(dx, x.shape, op, "dx");
  check_shape(dout, x.shape, op, "dout");
  check_shape(dresidual, x.shape, op, "dresidual");
  check_numel(rstd, x.rows(), op, "rstd");
  if (dweight) check_shape(*dweight, weight.shape, op, "dweight");
  Tensor partials = dweight ? column_partials(x.rows(), x.cols()) : Tensor();
}

void MetaBackend::layernorm_backward_add(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                         const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                                         const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward_add";
  enter(op, {&weight});
  check_shape(dx, x.shape, op, "dx");
  check_shape(dout, x.shape, op, "dout");
  check_shape(dresidual, x.shape, op, "dresidual");
  check_numel(mean, x.rows(), op, "mean");
  check_numel(rstd, x.rows(), op, "rstd");
  if (dweight) check_shape(*dweight, weight.shape, op, "dweight");
  if (dbias) check_shape(*dbias, weight.shape, op, "dbias");
  Tensor dweight_partials = dweight ? column_partials(x.rows(), x.cols()) : Tensor();
  Tensor dbias_partials = dbias ? column_partials(x.rows(), x.cols()) : Tensor();
}

// x [N, H, D], positions [N], rotary_dim even and <= D.
static void check_rope(const Tensor& x, const Tensor& positions, int rotary_dim, const char* op) {
  FT_CHECK(x.ndim() == 3, op, ": x must be [N, H, D], got ", shape_string(x.shape));
  check_dtype(positions, DType::i32, kMeta, op, "positions");
  check_numel(positions, x.dim(0), op, "positions");
  FT_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= x.dim(2), op, ": rotary_dim ", rotary_dim,
           " must be even and at most the head size ", x.dim(2));
}

void MetaBackend::rope_forward(Tensor& x, const Tensor& positions, int rotary_dim, float) {
  enter("rope_forward", {});
  check_rope(x, positions, rotary_dim, "rope_forward");
}

void MetaBackend::rope_backward(Tensor& dx, const Tensor& positions, int rotary_dim, float) {
  enter("rope_backward", {});
  check_rope(dx, positions, rotary_dim, "rope_backward");
}

void MetaBackend::swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  enter("swiglu_forward", {});
  check_shape(gate, out.shape, "swiglu_forward", "gate");
  check_shape(up, out.shape, "swiglu_forward", "up");
}

void MetaBackend::swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                                  const Tensor& up) {
  enter("swiglu_backward", {});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dgate, &dup, &gate, &up}) check_shape(*t, dout.shape, "swiglu_backward", "operand");
}

void MetaBackend::gelu_forward(Tensor& out, const Tensor& x, GeluKind) {
  enter("gelu_forward", {});
  check_shape(out, x.shape, "gelu_forward", "out");
}

void MetaBackend::gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind) {
  enter("gelu_backward", {});
  check_shape(dx, x.shape, "gelu_backward", "dx");
  check_shape(dout, x.shape, "gelu_backward", "dout");
}

// q [B, T, Hq, D], k and v [B, T, Hkv, D] with Hq % Hkv == 0.
void MetaBackend::attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                    float) {
  enter("attention_forward", {});
  checks::check_attention(kMeta, "attention_forward", q, k, v, out, lse);
}

void MetaBackend::attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                     const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float) {
  enter("attention_backward", {});
  checks::check_attention(kMeta, "attention_backward", q, k, v, out, lse);
  checks::check_attention_gradients(kMeta, "attention_backward", dq, dk, dv, dout, q, k);
  // CudaBackend's Di = rowsum(dO * O), f32 [B, Hq, T].
  if (policy_ == MemoryPolicy::cuda) Tensor di = empty(lse.shape, DType::f32, MemCategory::workspace);
}

void MetaBackend::cross_entropy(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
                                float) {
  enter("cross_entropy", {});
  check_float(logits, kMeta, "cross_entropy", "logits");
  check_dtype(targets, DType::i32, kMeta, "cross_entropy", "targets");
  check_numel(targets, logits.rows(), "cross_entropy", "targets");
  check_numel(losses, logits.rows(), "cross_entropy", "losses");
  if (dlogits) check_shape(*dlogits, logits.shape, "cross_entropy", "dlogits");
}

void MetaBackend::quantize_rows_int8(Tensor& q, Tensor& scales, const Tensor& x) {
  enter("quantize_rows_int8", {});
  check_dtype(q, DType::i8, kMeta, "quantize_rows_int8", "q");
  check_shape(q, x.shape, "quantize_rows_int8", "q");
  check_numel(scales, x.rows(), "quantize_rows_int8", "scales");
}

// weight i8 [O, K], scales [O].
static void check_int8_weight(const Tensor& weight, const Tensor& scales, const char* op) {
  check_dtype(weight, DType::i8, kMeta, op, "weight");
  FT_CHECK(weight.ndim() == 2, op, ": weight must be [out, in], got ", shape_string(weight.shape));
  check_numel(scales, weight.dim(0), op, "weight_scales");
}

void MetaBackend::int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight,
                                      const Tensor& weight_scales, float, const Int8Epilogue& epilogue) {
  enter("int8_linear_forward", {&weight});
  check_int8_weight(weight, weight_scales, "int8_linear_forward");
  check_numel(x, x.rows() * weight.dim(1), "int8_linear_forward", "x");
  check_shape(out, {x.rows(), weight.dim(0)}, "int8_linear_forward", "out");
  checks::check_int8_epilogue(epilogue, x.rows(), weight.dim(0), kMeta);
  if (policy_ == MemoryPolicy::cpu) return;  // CpuBackend's scratch is host vectors, outside the allocator
  // CudaBackend's scratch (kernels/cuda/int8_linear.cu): the outlier column
  // list (count first), the codes and row scales of x, one block of the int32
  // product. The outlier product reads x and W in place: no data-dependent
  // buffers, so the plan does not depend on how many outliers a batch has;
  // the epilogue reads its bias and LoRA operands in place too.
  const int64_t N = x.rows(), K = weight.dim(1), O = weight.dim(0);
  Tensor columns = empty({K + 1}, DType::i32, MemCategory::workspace);
  Tensor codes = empty({N, K}, DType::i8, MemCategory::workspace);
  Tensor row_scales = empty({N}, DType::f32, MemCategory::workspace);
  Tensor product = empty({int8_forward_chunk_rows(N, O), O}, DType::i32, MemCategory::workspace);
}

// The scratch of both backends' column-blocked backward (kernels/int8_tiles.h):
// CpuBackend dequantises a tile into f32 and sums a dx column block in f32;
// CudaBackend dequantises it in dout's dtype and its GEMM writes dx in place.
void MetaBackend::int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight,
                                       const Tensor& weight_scales, bool) {
  enter("int8_linear_backward", {&weight});
  check_int8_weight(weight, weight_scales, "int8_linear_backward");
  const int64_t N = dout.rows(), O = weight.dim(0), K = weight.dim(1);
  check_shape(dout, {N, O}, "int8_linear_backward", "dout");
  check_numel(dx, N * K, "int8_linear_backward", "dx");
  if (N == 0 || K == 0) return;
  const int64_t columns = int8_backward_tile_columns(O, K);
  if (policy_ == MemoryPolicy::cuda) {
    Tensor w_tile = empty({O, columns}, dout.dtype, MemCategory::workspace);
    return;
  }
  Tensor w_tile = empty({O, columns}, DType::f32, MemCategory::workspace);
  Tensor dx_block = empty({N, columns}, DType::f32, MemCategory::workspace);
}

void MetaBackend::dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t) {
  enter("dropout_forward", {});
  check_shape(out, x.shape, "dropout_forward", "out");
  FT_CHECK(p >= 0.0f && p < 1.0f, "dropout_forward: p must be in [0, 1), got ", p);
}

void MetaBackend::dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t) {
  enter("dropout_backward", {});
  check_shape(dx, dout.shape, "dropout_backward", "dx");
  FT_CHECK(p >= 0.0f && p < 1.0f, "dropout_backward: p must be in [0, 1), got ", p);
}

static void check_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const char* op) {
  check_dtype(param, DType::f32, kMeta, op, "param");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&grad, &m, &v}) check_shape(*t, param.shape, op, "grad/m/v");
}

void MetaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep&) {
  enter("adamw_update", {&param});
  check_adamw(param, grad, m, v, "adamw_update");
}

void MetaBackend::adamw_update_many(std::span<const AdamWTensors> tensors, const AdamWStep&) {
  enter("adamw_update_many", {});
  int64_t entries = 0;
  for (const AdamWTensors& t : tensors) {
    check_adamw(*t.param, *t.grad, *t.m, *t.v, "adamw_update_many");
    entries += t.param->numel() > 0;
  }
  // CudaBackend's device table, one entry per non-empty tensor.
  if (policy_ == MemoryPolicy::cuda && entries > 0)
    empty({entries * int64_t(sizeof(cuda::AdamWEntry))}, DType::i8, MemCategory::workspace);
}

double MetaBackend::sum_squares(const Tensor& x) {
  enter("sum_squares", {&x});
  check_float(x, kMeta, "sum_squares", "x");
  // CudaBackend's partial sums: doubles, carved from i8 scratch.
  if (policy_ == MemoryPolicy::cuda && x.numel() > 0)
    empty({cuda::sum_squares_blocks(x.numel()) + 1, 8}, DType::i8, MemCategory::workspace);
  return 0.0;
}

double MetaBackend::sum_squares_many(std::span<const Tensor* const> tensors) {
  enter("sum_squares_many", {});
  int64_t entries = 0, blocks = 0;
  for (const Tensor* x : tensors) {
    check_float(*x, kMeta, "sum_squares_many", "x");
    entries += x->numel() > 0;
    blocks += cuda::sum_squares_blocks(x->numel());
  }
  if (policy_ == MemoryPolicy::cpu || entries == 0) return 0.0;
  // CudaBackend's device table, then its partial sums and total (doubles)
  // while the table is still held.
  Tensor table = empty({entries * int64_t(sizeof(cuda::SumSquaresEntry))}, DType::i8, MemCategory::workspace);
  Tensor partials = empty({blocks + 1, 8}, DType::i8, MemCategory::workspace);
  return 0.0;
}

}  // namespace ft
