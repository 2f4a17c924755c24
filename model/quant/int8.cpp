#include "model/quant/int8.h"

#include <string_view>

#include <nlohmann/json.hpp>

#include "kernels/allocator.h"
#include "kernels/error.h"

namespace ft {

namespace {

// bitsandbytes' weight_format code for row-major int8 codes
// (LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING["row"]), the only layout it saves.
constexpr uint8_t kInt8RowFormat = 0;

// The module a weight belongs to ("...q_proj" of "...q_proj.weight"), whose
// name bitsandbytes gives the row scales.
std::string int8_module_name(const std::string& weight_name) {
  const std::string_view suffix = ".weight";
  return weight_name.ends_with(suffix) ? weight_name.substr(0, weight_name.size() - suffix.size()) : weight_name;
}

// p's codes [out, in] and row scales [out], from allocator.
void allocate_int8(Parameter& p, const Shape& shape, Allocator& allocator) {
  p.value = Tensor::empty(shape, DType::i8, allocator, MemCategory::weights);
  p.quantized = {QuantizedBase::int8, shape, {Tensor::empty({shape[0]}, DType::f32, allocator, MemCategory::weights)}};
}

class Int8Format final : public QuantizedFormat {
 public:
  Int8Format()
      : QuantizedFormat({"int8", "int8", "int8 (a quantised base)", kQuantizationInt8, "frozen int8 linear weights",
                         "their f32 row scales"}) {}

  void allocate(Parameter& p, const Shape& shape, Allocator& allocator, const ModelOptions&) const override {
    allocate_int8(p, shape, allocator);
  }

  std::unique_ptr<Linear> make_linear(Parameter& weight, Parameter* bias,
                                      const ModelOptions& options) const override {
    TensorParallelGroup* group = options.tensor_parallel;
    const bool row_parallel = weight.slice.dim == 1 && group && group->ranks() > 1;
    return std::make_unique<Int8Linear>(weight, options.int8_threshold, bias, row_parallel ? group : nullptr);
  }

  void quantize(Backend& backend, Parameter& p, const Tensor& full_precision) const override {
    quantize_parameter(backend, p, full_precision);
  }

  void dequantize(Backend& backend, const Parameter& p, Tensor& out) const override {
    backend.int8_dequantize(out, p.value, int8_scales(p), 0);
  }

  bool holds(const SafetensorsEntry& entry) const override { return entry.dtype == DType::i8; }

  // Codes plus their row scales as bitsandbytes saves a Linear8bitLt (and
  // save_quantized_base does): "<module>.SCB", and "<module>.weight_format"
  // 0, its row-major layout. Bases saved by earlier versions of this program
  // name the scales "<module>.weight.SCB" and have no weight_format.
  void load(Backend& backend, const Checkpoint& checkpoint, Parameter& p) const override {
    const SafetensorsEntry& codes = checkpoint.entry(p.name);
    require_shape(codes, p.name, p.value.shape);
    const std::string module = int8_module_name(p.name);
    const std::string scb = checkpoint.contains(module + ".SCB") ? module + ".SCB" : p.name + ".SCB";
    FT_CHECK(checkpoint.contains(scb), codes.file, ": int8 tensor \"", p.name, "\" has no row scales: expected \"",
             module, ".SCB\" (bitsandbytes' name) or \"", p.name, ".SCB\"");
    Tensor& scales = p.quantized.constants.at(0);
    const SafetensorsEntry& stored = checkpoint.entry(scb);
    FT_CHECK(stored.dtype == DType::f32 && stored.shape == scales.shape, stored.file, ": tensor \"", scb,
             "\" must be F32 ", shape_string(scales.shape), ", got ", dtype_name(stored.dtype), " ",
             shape_string(stored.shape));
    const std::string format = module + ".weight_format";
    if (checkpoint.contains(format)) {
      const SafetensorsEntry& entry = checkpoint.entry(format);
      FT_CHECK(entry.dtype == DType::u8 && shape_numel(entry.shape) == 1, entry.file, ": tensor \"", format,
               "\" must be one U8 (bitsandbytes' layout code), got ", dtype_name(entry.dtype), " ",
               shape_string(entry.shape));
      const int layout = *static_cast<const uint8_t*>(checkpoint.view(format).data);
      FT_CHECK(layout == kInt8RowFormat, entry.file, ": tensor \"", format, "\" is ", layout,
               ": only bitsandbytes' row-major layout (0, \"row\") is supported");
    }
    backend.copy(p.value, checkpoint.view(p.name));
    backend.copy(scales, checkpoint.view(scb));
    checkpoint.release(scb);
    checkpoint.release(p.name);
  }

  // The codes' slice; the row scales of a column slice are the whole rows'.
  void cut(Backend& backend, const Parameter& whole, Parameter& part) const override {
    HostAllocator host;
    const TensorSlice& slice = part.slice;
    const int64_t count = part.value.dim(slice.dim);
    backend.copy(part.value, host_slice(whole.value, slice.dim, slice.offset, count, host));
    const Tensor& scales = int8_scales(whole);
    backend.copy(part.quantized.constants.at(0), slice.dim == 0 ? host_slice(scales, 0, slice.offset, count, host)
                                                                : scales);
  }

  void save(Backend& backend, const Parameter& p, DType, Allocator& host, NamedTensors& tensors) const override {
    tensors.emplace_back(p.name, host_tensor(backend, p.value, host));
    const std::string module = int8_module_name(p.name);
    tensors.emplace_back(module + ".SCB", host_tensor(backend, int8_scales(p), host));
    Tensor format = Tensor::empty({}, DType::u8, host, MemCategory::workspace);
    *format.ptr<uint8_t>() = kInt8RowFormat;
    tensors.emplace_back(module + ".weight_format", format);
  }

  void describe(nlohmann::json& quantization_config, const ModelOptions& options) const override {
    quantization_config["load_in_8bit"] = quantization_config["_load_in_8bit"] = true;
    quantization_config["llm_int8_threshold"] = double(options.int8_threshold);
  }
};

}  // namespace

const QuantizedFormat& int8_format() {
  static const Int8Format format;
  return format;
}

Int8Linear::Int8Linear(Parameter& weight, float threshold, Parameter* bias, TensorParallelGroup* row_group)
    : weight_(weight), threshold_(threshold), bias_(bias), row_group_(row_group) {
  FT_CHECK(weight.quantized.format == QuantizedBase::int8 && weight.value.ndim() == 2, "Int8Linear: \"",
           weight.name, "\" is not a quantised weight (call quantize_parameter first)");
  FT_CHECK(!weight.trainable(), "Int8Linear: \"", weight.name, "\" is int8 and cannot be trainable");
}

void Int8Linear::forward(Backend& backend, Tensor& out, const Tensor& x) { forward_fused(backend, out, x, {}); }

void Int8Linear::forward_with_lora(Backend& backend, Tensor& out, const Tensor& x, const Tensor& h, const Tensor& B,
                                   float scaling) {
  forward_fused(backend, out, x, {nullptr, &h, &B, scaling});
}

void Int8Linear::share_input(SharedInput* shared) {
  FT_CHECK(!shared || !row_group_, "Int8Linear: \"", weight_.name,
           "\" is row-parallel: its x is a column shard, not an input to share");
  shared_ = shared;
}

// The shared input's quantisation at this layer's threshold (and scanned
// outlier columns), made by the first of the sharing linears to run.
const Int8Input& Int8Linear::shared_input(Backend& backend, const Tensor& x) {
  return shared_->get<Int8Input>([&] {
    const int64_t N = x.rows(), K = x.cols();
    Int8Input input{backend.empty({N, K}, DType::i8, MemCategory::workspace),
                    backend.empty({N}, DType::f32, MemCategory::workspace),
                    backend.empty({int8_outlier_list_elements(K)}, DType::i32, MemCategory::workspace)};
    backend.int8_quantize_input(input, x, threshold_, outlier_flags_.defined() ? &outlier_flags_ : nullptr);
    return input;
  });
}

// The op with the bias (if any) added to the given epilogue: x's quantisation
// shared with the other linears reading it, or made by the op, for a
// row-parallel shard with the whole rows' scales (each rank's absmax over
// its columns, their maximum over the group).
void Int8Linear::forward_fused(Backend& backend, Tensor& out, const Tensor& x, Int8Epilogue epilogue) {
  if (bias_) epilogue.bias = &bias_->value;
  Tensor row_absmax;
  if (shared_ && shared_->holds(x)) {
    epilogue.input = &shared_input(backend, x);
  } else if (outlier_flags_.defined()) {
    epilogue.outlier_flags = &outlier_flags_;
  }
  if (row_group_) {  // never shared (share_input)
    row_absmax = backend.empty({x.rows()}, DType::f32, MemCategory::workspace);
    backend.int8_row_absmax(row_absmax, x, threshold_, epilogue.outlier_flags);
    row_group_->max(backend, row_absmax);
    epilogue.row_absmax = &row_absmax;
  }
  backend.int8_linear_forward(out, x, weight_.value, int8_scales(weight_), threshold_, epilogue);
}

void Int8Linear::scan_rows(Backend& backend, const Tensor& x_rows) {
  if (!scans_rows()) return;
  if (!outlier_flags_.defined()) {
    outlier_flags_ = backend.empty({x_rows.cols()}, DType::i32, MemCategory::workspace);
    backend.fill(outlier_flags_, 0.0f);
  }
  backend.int8_outlier_columns(outlier_flags_, x_rows, threshold_);
}

void Int8Linear::backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor&, bool accumulate_dx) {
  if (dx) backend.int8_linear_backward(*dx, dout, weight_.value, int8_scales(weight_), accumulate_dx);
  linear_bias_backward(backend, bias_, dout);
}

void quantize_parameter(Backend& backend, Parameter& p, const Tensor& full_precision) {
  FT_CHECK(full_precision.ndim() == 2, "quantize_parameter: \"", p.name, "\" must be 2-D [out, in], got ",
           shape_string(full_precision.shape));
  Tensor source = full_precision;
  if (full_precision.device != backend.allocator().device()) {
    source = backend.empty(full_precision.shape, full_precision.dtype, MemCategory::workspace);
    backend.copy(source, full_precision);
  }
  if (p.quantized.format != QuantizedBase::int8 || p.value.shape != full_precision.shape)
    allocate_int8(p, full_precision.shape, backend.allocator());
  backend.quantize_rows_int8(p.value, p.quantized.constants.at(0), source);
}

}  // namespace ft
