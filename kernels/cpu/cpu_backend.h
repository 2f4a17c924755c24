// The CPU backend: the reference every other backend is checked against, and
// a real way to fine-tune small models. OpenMP across rows/heads; f32
// accumulation everywhere. One file per op family in this folder.
#pragma once
#include <memory>

#include "kernels/backend.h"

namespace ft {

class OnednnGemm;

// What runs CpuBackend's matmul and int8_linear_forward's int8 product:
// reference = our BLIS-style kernels (matmul.cpp, int8.cpp), always built;
// onednn = oneDNN's matmul primitives (onednn_gemm.h) where the build has
// oneDNN, falling back to the reference for what oneDNN does not cover.
enum class CpuGemm { reference, onednn };
// FT_CPU_GEMM=reference|onednn when set, else onednn when built with it.
CpuGemm default_cpu_gemm();

class CpuBackend final : public Backend {
 public:
  // CpuGemm::onednn in a build without oneDNN is an error.
  explicit CpuBackend(Allocator& allocator, CpuGemm gemm = default_cpu_gemm());
  ~CpuBackend() override;
  CpuGemm gemm() const;
  const char* name() const override { return "cpu"; }
  Allocator& allocator() override { return allocator_; }

  void copy(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& dst, float value) override;
  void copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                    int64_t width) override;
  void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float alpha,
              float beta) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b) override;
  void add_bias(Tensor& out, const Tensor& bias) override;
  void bias_backward(Tensor& dbias, const Tensor& dout) override;
  void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) override;
  void embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) override;
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) override;
  void rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd) override;
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, float eps) override;
  void layernorm_backward(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& x,
                          const Tensor& weight, const Tensor& mean, const Tensor& rstd) override;
  void add_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& weight, float eps) override;
  void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                             const Tensor& weight, const Tensor& bias, float eps) override;
  void rmsnorm_backward_add(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                            const Tensor& x, const Tensor& weight, const Tensor& rstd) override;
  void layernorm_backward_add(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                              const Tensor& dresidual, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd) override;
  void rope_forward(Tensor& x, const Tensor& positions, int rotary_dim, float theta) override;
  void rope_backward(Tensor& dx, const Tensor& positions, int rotary_dim, float theta) override;
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override;
  void gelu_forward(Tensor& out, const Tensor& x, GeluKind kind) override;
  void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) override;
  void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         float scale) override;
  void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          float scale) override;
  void cross_entropy(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
                     float dloss) override;
  void quantize_rows_int8(Tensor& q, Tensor& scales, const Tensor& x) override;
  void int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                           float threshold, const Int8Epilogue& epilogue = {}) override;
  void int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight, const Tensor& weight_scales,
                            bool accumulate) override;
  void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed) override;
  void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step) override;
  double sum_squares(const Tensor& x) override;
  void adamw_update_many(std::span<const AdamWTensors> tensors, const AdamWStep& step) override;
  double sum_squares_many(std::span<const Tensor* const> tensors) override;

 private:
  Allocator& allocator_;
  std::unique_ptr<OnednnGemm> onednn_;  // null: the reference GEMMs
};

}  // namespace ft
