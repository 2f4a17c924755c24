#include "kernels/meta/meta_backend.h"

#include <cstring>

#include "kernels/cuda/scratch.h"
#include "kernels/error.h"
#include "kernels/int8_tiles.h"

namespace ft {

void* CachingModelAllocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;  // as CachingAllocator: nothing handed out
  const size_t size = cuda::caching_block_bytes(bytes, category);
  size_t& cached = free_blocks_[size];
  if (cuda::caching_caches(category) && cached > 0) {
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
  const size_t size = cuda::caching_block_bytes(bytes, category);
  in_use_ -= size;
  if (cuda::caching_caches(category))
    free_blocks_[size] += 1;
  else
    reserved_ -= size;
}

MetaBackend::MetaBackend(Allocator& allocator, MemoryPolicy policy, size_t gemm_workspace_bytes,
                         bool library_attention, bool library_int8_gemm)
    : allocator_(allocator), policy_(policy), library_attention_(library_attention),
      library_int8_gemm_(library_int8_gemm) {
  FT_CHECK(allocator.device() == Device::meta, "MetaBackend needs a meta allocator");
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

// The modelled CUDA op's scratch (kernels/cuda/scratch.h), held until the op returns.
Tensor MetaBackend::cuda_scratch(const cuda::ScratchTensor& t) {
  if (policy_ != MemoryPolicy::cuda) return {};
  return empty(t.shape, t.dtype, MemCategory::workspace);
}

// Partial column sums of a norm or bias gradient (null when the gradient is
// not wanted); the CPU reduces in registers and host vectors.
Tensor MetaBackend::column_partials(const Tensor* gradient, int64_t rows, int64_t channels) {
  if (!gradient) return {};
  return cuda_scratch(cuda::column_partials_scratch(rows, channels));
}

void MetaBackend::copy_impl(Tensor& dst, const Tensor& src) {
  enter("copy", {&dst, &src});
  if (dst.data) std::memset(dst.data, 0, dst.size_bytes());
  if (const auto staging = cuda::copy_scratch(dst, src)) Tensor staged = cuda_scratch(*staging);
}

void MetaBackend::copy_async_impl(Tensor& dst, const Tensor& src) {
  enter("copy_async", {&dst, &src});
  copy_async_bytes_ += src.size_bytes();
}
StreamEvent MetaBackend::make_event_impl() { return {}; }
void MetaBackend::record_event_impl(StreamEvent&, Stream) {}
void MetaBackend::wait_event_impl(Stream, const StreamEvent&) {}

void MetaBackend::fill_impl(Tensor& dst, float) { enter("fill", {&dst}); }

void MetaBackend::copy_columns_impl(Tensor&, int64_t, const Tensor& src, int64_t, int64_t) {
  enter("copy_columns", {&src});
}

void MetaBackend::matmul_impl(Tensor&, const Tensor& a, const Tensor& b, bool, bool, float, float) {
  enter("matmul", {&b, &a});
  if (const auto widened = cuda::matmul_scratch(a, b)) Tensor wide = cuda_scratch(*widened);
}

void MetaBackend::accumulate_outer_products_impl(Tensor&, const Tensor& a, const Tensor& b, float) {
  enter("accumulate_outer_products", {&a, &b});
}

void MetaBackend::add_impl(Tensor&, const Tensor& a, const Tensor& b) { enter("add", {&a, &b}); }

void MetaBackend::add_bias_impl(Tensor&, const Tensor& bias) { enter("add_bias", {&bias}); }

void MetaBackend::bias_backward_impl(Tensor& dbias, const Tensor& dout) {
  enter("bias_backward", {&dbias});
  Tensor partials = column_partials(&dbias, dout.rows(), dout.cols());
}

void MetaBackend::row_sum_squares_impl(Tensor&, const Tensor& x, bool) { enter("row_sum_squares", {&x}); }

void MetaBackend::dora_scale_forward_impl(Tensor&, const Tensor&, const Tensor& magnitude, const Tensor&,
                                          const Tensor*) {
  enter("dora_scale_forward", {&magnitude});
}

void MetaBackend::dora_scale_backward_impl(Tensor&, Tensor*, Tensor* dmagnitude, const Tensor& dout, const Tensor&,
                                           const Tensor& magnitude, const Tensor&, const Tensor*) {
  enter("dora_scale_backward", {&magnitude});
  Tensor partials = column_partials(dmagnitude, dout.rows(), dout.cols());
}

void MetaBackend::embedding_forward_impl(Tensor&, const Tensor&, const Tensor& table) {
  enter("embedding_forward", {&table});
}

void MetaBackend::embedding_backward_impl(Tensor& dtable, const Tensor&, const Tensor&) {
  enter("embedding_backward", {&dtable});
}

void MetaBackend::rmsnorm_forward_impl(Tensor&, Tensor&, const Tensor&, const Tensor& weight, float) {
  enter("rmsnorm_forward", {&weight});
}

void MetaBackend::rmsnorm_backward_impl(Tensor&, Tensor* dweight, const Tensor&, const Tensor& x,
                                        const Tensor& weight, const Tensor&) {
  enter("rmsnorm_backward", {&weight});
  Tensor partials = column_partials(dweight, x.rows(), x.cols());
}

void MetaBackend::layernorm_forward_impl(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor& weight,
                                         const Tensor&, float) {
  enter("layernorm_forward", {&weight});
}

void MetaBackend::layernorm_backward_impl(Tensor&, Tensor* dweight, Tensor* dbias, const Tensor&, const Tensor& x,
                                          const Tensor& weight, const Tensor&, const Tensor&) {
  enter("layernorm_backward", {&weight});
  Tensor dweight_partials = column_partials(dweight, x.rows(), x.cols());
  Tensor dbias_partials = column_partials(dbias, x.rows(), x.cols());
}

// The fused residual norms: the plain op's scratch (CudaBackend launches the
// same kernels).
void MetaBackend::add_rmsnorm_forward_impl(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                                           const Tensor& weight, float) {
  enter("add_rmsnorm_forward", {&weight});
}

void MetaBackend::add_layernorm_forward_impl(Tensor&, Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                                             const Tensor& weight, const Tensor&, float) {
  enter("add_layernorm_forward", {&weight});
}

void MetaBackend::rmsnorm_backward_add_impl(Tensor&, Tensor* dweight, const Tensor&, const Tensor&, const Tensor& x,
                                            const Tensor& weight, const Tensor&) {
  enter("rmsnorm_backward_add", {&weight});
  Tensor partials = column_partials(dweight, x.rows(), x.cols());
}

void MetaBackend::layernorm_backward_add_impl(Tensor&, Tensor* dweight, Tensor* dbias, const Tensor&,
                                              const Tensor&, const Tensor& x, const Tensor& weight, const Tensor&,
                                              const Tensor&) {
  enter("layernorm_backward_add", {&weight});
  Tensor dweight_partials = column_partials(dweight, x.rows(), x.cols());
  Tensor dbias_partials = column_partials(dbias, x.rows(), x.cols());
}

void MetaBackend::rope_forward_impl(const HeadsView&, const Tensor&, std::span<const float>) {
  enter("rope_forward", {});
}

void MetaBackend::rope_backward_impl(const HeadsView&, const Tensor&, std::span<const float>) {
  enter("rope_backward", {});
}

void MetaBackend::swiglu_forward_impl(Tensor&, const Tensor&, const Tensor&) { enter("swiglu_forward", {}); }

void MetaBackend::swiglu_backward_impl(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  enter("swiglu_backward", {});
}

void MetaBackend::gelu_forward_impl(Tensor&, const Tensor&, GeluKind) { enter("gelu_forward", {}); }

void MetaBackend::gelu_backward_impl(Tensor&, const Tensor&, const Tensor&, GeluKind) {
  enter("gelu_backward", {});
}

// bf16 attention without a sliding window or packed sequences runs on cuDNN SDPA
// (kernels/cuda/attention_engine.h) where
// the build has it (library_attention_), which takes exactly
// sdpa_workspace_budget_bytes of workspace; else on our kernels.
void MetaBackend::attention_forward_impl(Tensor&, Tensor&, const HeadsView& q, const HeadsView& k, const HeadsView&,
                                         float, int64_t sliding_window, const Tensor* cu_seqlens) {
  enter("attention_forward", {});
  const checks::AttentionShape s = checks::attention_shape(q, k);
  if (library_attention_ && q.dtype() == DType::bf16 && sliding_window == 0 && !cu_seqlens)
    Tensor workspace = cuda_scratch(cuda::sdpa_workspace_scratch(s.batch, s.q_heads, s.kv_heads, s.seq, s.head_dim, false));
}

void MetaBackend::attention_backward_impl(const HeadsView&, const HeadsView&, const HeadsView&, const Tensor&,
                                          const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor&,
                                          const Tensor&, float, int64_t sliding_window,
                                          const Tensor* cu_seqlens) {
  enter("attention_backward", {});
  const checks::AttentionShape s = checks::attention_shape(q, k);
  if (library_attention_ && q.dtype() == DType::bf16 && sliding_window == 0 && !cu_seqlens) {
    Tensor workspace = cuda_scratch(cuda::sdpa_workspace_scratch(s.batch, s.q_heads, s.kv_heads, s.seq, s.head_dim, true));
    return;
  }
  const cuda::AttentionBackwardScratch sizes = cuda::attention_backward_scratch(q, k, v);
  Tensor di = cuda_scratch(sizes.di);
  Tensor dq_accum = sizes.dq_accum ? cuda_scratch(*sizes.dq_accum) : Tensor{};
}

void MetaBackend::attention_cached_impl(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                                        int64_t) {
  enter("attention_cached", {});
}

// Our own kernels, no scratch: every block recomputes what it needs.
void MetaBackend::biased_attention_forward_impl(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                const Tensor*, const Tensor*, bool) {
  enter("biased_attention_forward", {});
}

void MetaBackend::biased_attention_backward_impl(Tensor&, Tensor&, Tensor&, Tensor*, const Tensor&, const Tensor&,
                                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor*, const Tensor*, bool) {
  enter("biased_attention_backward", {});
}

void MetaBackend::activation_forward_impl(Tensor&, const Tensor&, const Tensor*, Activation) {
  enter("activation_forward", {});
}

void MetaBackend::activation_backward_impl(Tensor&, Tensor*, const Tensor&, const Tensor&, const Tensor*, Activation) {
  enter("activation_backward", {});
}

void MetaBackend::cross_entropy_impl(Tensor&, Tensor*, const Tensor&, const Tensor&, float, const Tensor*) {
  enter("cross_entropy", {});
}

void MetaBackend::quantize_rows_int8_impl(Tensor&, Tensor&, const Tensor&) { enter("quantize_rows_int8", {}); }

void MetaBackend::int8_outlier_columns_impl(Tensor&, const Tensor&, float) { enter("int8_outlier_columns", {}); }

// Both backends write into the caller's Int8Input: no scratch.
void MetaBackend::int8_quantize_input_impl(Int8Input&, const Tensor&, float, const Tensor*) {
  enter("int8_quantize_input", {});
}

void MetaBackend::int8_row_absmax_impl(Tensor&, const Tensor& x, float, const Tensor*) {
  enter("int8_row_absmax", {});
  Tensor columns = cuda_scratch(cuda::int8_outlier_columns_scratch(x.cols()));
}

void MetaBackend::int8_linear_forward_impl(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor&,
                                           float threshold, const Int8Epilogue& epilogue) {
  enter("int8_linear_forward", {&weight});
  // CpuBackend's scratch is host vectors, outside the allocator.
  const int64_t N = x.rows(), K = weight.dim(1), O = weight.dim(0);
  if (policy_ == MemoryPolicy::cuda && library_int8_gemm_ && cuda::int8_forward_fuses(out, x, epilogue) &&
      cuda::int8_scaled_gemm_takes(K, O)) {
    const int64_t columns = threshold > 0.0f ? std::min(kInt8FusedOutlierColumns, K) : 0;
    const cuda::Int8FusedScratch sizes =
        cuda::int8_fused_scratch(N, K, O, columns, epilogue.lora_h ? epilogue.lora_B->cols() : 0,
                                 epilogue.bias && epilogue.bias->dtype != DType::f32, !epilogue.input);
    Tensor codes = cuda_scratch(sizes.codes), row_scales = cuda_scratch(sizes.row_scales);
    Tensor columns_list = cuda_scratch(sizes.outlier_columns), bias = cuda_scratch(sizes.bias);
    Tensor side_x = cuda_scratch(sizes.side_x), side_w = cuda_scratch(sizes.side_w);
    return;
  }
  const cuda::Int8ForwardScratch sizes = cuda::int8_forward_scratch(N, K, O, int8_forward_chunk_rows(N, O),
                                                                   int8_outlier_gather_columns(K, O), !epilogue.input);
  Tensor columns = cuda_scratch(sizes.outlier_columns);
  Tensor outlier_weights = cuda_scratch(sizes.outlier_weights);
  Tensor codes = cuda_scratch(sizes.codes);
  Tensor row_scales = cuda_scratch(sizes.row_scales);
  Tensor product = cuda_scratch(sizes.product);
}

// The scratch of both backends' column-blocked backward (kernels/int8_tiles.h):
// CpuBackend dequantises a tile into f32 and sums a dx column block in f32;
// CudaBackend dequantises it in dout's dtype and its GEMM writes dx in place.
void MetaBackend::int8_linear_backward_impl(Tensor&, const Tensor& dout, const Tensor& weight, const Tensor&,
                                            bool) {
  enter("int8_linear_backward", {&weight});
  const int64_t N = dout.rows(), O = weight.dim(0), K = weight.dim(1);
  if (N == 0 || K == 0) return;
  if (policy_ == MemoryPolicy::cuda) {
    const int64_t columns = int8_backward_tile_columns(O, K, kInt8DequantTileElementsGpu);
    Tensor w_tile = cuda_scratch(cuda::int8_backward_scratch(O, columns, dout.dtype));
    return;
  }
  const int64_t columns = int8_backward_tile_columns(O, K);
  Tensor w_tile = empty({O, columns}, int8_backward_cpu_tile_dtype(dout.dtype), MemCategory::workspace);
  // Where one tile holds every column the GEMM writes dx itself; else dx an f32 block at a time.
  Tensor dx_block = columns < K ? empty({N, columns}, DType::f32, MemCategory::workspace) : Tensor{};
}

// Scratch-free: it fills the caller's tile.
void MetaBackend::int8_dequantize_impl(Tensor&, const Tensor& weight, const Tensor&, int64_t) {
  enter("int8_dequantize", {&weight});
}

// Scratch-free: the tiles it fills are nf4_linear_*'s, allocated by them.
void MetaBackend::nf4_dequantize_impl(Tensor&, const Nf4Weight& weight, int64_t, int64_t) {
  enter("nf4_dequantize", {weight.codes});
}

void MetaBackend::dropout_forward_impl(Tensor&, const Tensor&, float, uint64_t, int64_t) { enter("dropout_forward", {}); }

void MetaBackend::dropout_backward_impl(Tensor&, const Tensor&, float, uint64_t, int64_t) {
  enter("dropout_backward", {});
}

void MetaBackend::add_uniform_noise_impl(Tensor&, float, uint64_t) { enter("add_uniform_noise", {}); }

void MetaBackend::adamw_update_impl(Tensor& param, const Tensor&, Tensor&, Tensor&, const AdamWStep&) {
  enter("adamw_update", {&param});
}

void MetaBackend::adamw_update_many_impl(std::span<const AdamWTensors> tensors, const AdamWStep&) {
  enter("adamw_update_many", {});
  int64_t entries = 0;
  for (const AdamWTensors& t : tensors) entries += t.param->numel() > 0;
  if (entries > 0) Tensor table = cuda_scratch(cuda::table_scratch<cuda::AdamWEntry>(entries));
}

double MetaBackend::sum_squares_impl(const Tensor& x) {
  enter("sum_squares", {&x});
  if (x.numel() > 0) Tensor partials = cuda_scratch(cuda::sum_squares_scratch(cuda::sum_squares_blocks(x.numel())));
  return 0.0;
}

double MetaBackend::sum_squares_many_impl(std::span<const Tensor* const> tensors) {
  enter("sum_squares_many", {});
  int64_t entries = 0, blocks = 0;
  for (const Tensor* x : tensors) {
    entries += x->numel() > 0;
    blocks += cuda::sum_squares_blocks(x->numel());
  }
  if (entries == 0) return 0.0;
  // The table is still held while the partial sums are.
  Tensor table = cuda_scratch(cuda::table_scratch<cuda::SumSquaresEntry>(entries));
  Tensor partials = cuda_scratch(cuda::sum_squares_scratch(blocks));
  return 0.0;
}

}  // namespace ft
