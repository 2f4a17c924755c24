// LLM.int8(), the int8 quantized base: a frozen weight stored as i8 codes
// [out, in] in weight.value plus its one constant, the f32 row scales [out]
// (W ~ value * scales / 127), saved as bitsandbytes saves a Linear8bitLt:
// the codes under the weight's name "<module>.weight", the scales under
// "<module>.SCB", and "<module>.weight_format", a U8 0 (row-major).
//
// Int8Linear's forward routes the outlier input columns (any |x| >=
// threshold) through an f32 product and the rest through int8 x int8 ->
// int32; backward yields dx only (no weight gradient: the weight never
// trains). An optional bias stays in 16/32 bits, as bitsandbytes keeps it;
// it and a LoRA update are added in the op's epilogue
// (Backend::int8_linear_forward), so out is written once.
//
// Linears that read the same x (q/k/v, gate/up, under an InputShare) take
// its outlier columns, row scales and codes from one int8_quantize_input:
// x is quantised once per layer input, the outputs unchanged bit for bit.
//
// A row-parallel shard (model/tensor_parallel.h) sees only its columns of x,
// whose absmax is not the whole row's: it quantises x with the maximum over
// the group of the shards' int8_row_absmax, the row scales one process uses.
#pragma once
#include "model/linear.h"
#include "model/quantized_format.h"
#include "model/tensor_parallel.h"

namespace ft {

// A saved int8 base's __metadata__ kQuantizationMetadataKey value.
inline constexpr const char* kQuantizationInt8 = "llm_int8";

const QuantizedFormat& int8_format();

// An int8 weight's f32 row scales [out].
inline const Tensor& int8_scales(const Parameter& p) { return p.quantized.constants.at(0); }

class Int8Linear final : public Linear {
 public:
  // threshold: bitsandbytes' llm_int8_threshold (transformers' default 6.0; 0
  // disables the outlier path). bias: null for none. row_group: the tensor
  // group of a row-parallel weight (its slice.dim == 1) over more than one
  // rank, else null.
  Int8Linear(Parameter& weight, float threshold, Parameter* bias = nullptr, TensorParallelGroup* row_group = nullptr);
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void forward_with_lora(Backend& backend, Tensor& out, const Tensor& x, const Tensor& h, const Tensor& B,
                         float scaling) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;
  void weight_columns(Backend& backend, Tensor& tile, int64_t col0) override {
    backend.int8_dequantize(tile, weight_.value, int8_scales(weight_), col0);
  }
  // Outlier columns over the scanned rows (Backend::int8_outlier_columns),
  // used by every forward until end_scan.
  bool scans_rows() const override { return threshold_ > 0.0f; }
  void scan_rows(Backend& backend, const Tensor& x_rows) override;
  void end_scan() override { outlier_flags_ = Tensor{}; }
  // x quantised once for the linears sharing it (Backend::int8_quantize_input).
  void share_input(SharedInput* shared) override;

 private:
  void forward_fused(Backend& backend, Tensor& out, const Tensor& x, Int8Epilogue epilogue);
  const Int8Input& shared_input(Backend& backend, const Tensor& x);

  Parameter& weight_;
  float threshold_;
  Parameter* bias_;
  TensorParallelGroup* row_group_;
  Tensor outlier_flags_;  // i32 [in] while scanned, else undefined
  SharedInput* shared_ = nullptr;
};

// Sets p's codes and row scales from a full-precision [out, in] weight
// (host or device). Reuses them when the model already allocated them (an
// int8 weight of that shape), else allocates both on the backend as weights.
void quantize_parameter(Backend& backend, Parameter& p, const Tensor& full_precision);

}  // namespace ft
