#include "model/quant/nf4.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/error.h"
#include "kernels/nf4.h"
#include "model/json_input.h"

namespace ft {

namespace {

// Its constants are the absmax codes, the nested absmax and the nested map.
bool double_quantised(const Parameter& p) { return p.quantized.constants.size() == 3; }

// The quant_state JSON of a saved NF4 weight, checked against p.
float read_quant_state(const Checkpoint& checkpoint, const Parameter& p, bool double_quant) {
  const std::string name = p.name + ".quant_state.bitsandbytes__nf4";
  const SafetensorsEntry& entry = checkpoint.entry(name);
  FT_CHECK(entry.dtype == DType::u8, entry.file, ": tensor \"", name, "\" must be U8 (JSON bytes), got ",
           dtype_name(entry.dtype));
  const Tensor bytes = checkpoint.view(name);
  const nlohmann::json state =
      parse_json(std::string(static_cast<const char*>(bytes.data), size_t(bytes.numel())), entry.file + " " + name);
  auto field = [&](const char* key) -> const nlohmann::json& {
    FT_CHECK(state.is_object() && state.contains(key), entry.file, ": \"", name, "\" has no field \"", key, "\"");
    return state[key];
  };
  FT_CHECK(field("quant_type") == "nf4", entry.file, ": \"", name, "\" has quant_type ", field("quant_type").dump(),
           ", expected \"nf4\" (FP4 is not supported)");
  FT_CHECK(field("blocksize") == kNf4BlockSize, entry.file, ": \"", name, "\" has blocksize ",
           field("blocksize").dump(), ", expected 64");
  FT_CHECK(field("shape") == nlohmann::json(p.quantized.shape), entry.file, ": \"", name, "\" has shape ",
           field("shape").dump(), " but config.json implies ", shape_string(p.quantized.shape));
  FT_CHECK(state.contains("nested_offset") == double_quant, entry.file, ": \"", p.name, "\" is saved ",
           double_quant ? "without" : "with", " double quantisation but quantization.double_quant is ",
           double_quant ? "true" : "false");
  if (!double_quant) return 0.0f;
  FT_CHECK(field("nested_blocksize") == kNf4NestedBlockSize, entry.file, ": \"", name, "\" has nested_blocksize ",
           field("nested_blocksize").dump(), ", expected 256");
  FT_CHECK(field("nested_offset").is_number(), entry.file, ": \"", name, "\" nested_offset must be a number");
  return float(field("nested_offset").get<double>());
}

// dst = the checkpoint's tensor `name`, which must have dst's dtype and size.
void load_exact(Backend& backend, const Checkpoint& checkpoint, const std::string& name, Tensor& dst) {
  const SafetensorsEntry& entry = checkpoint.entry(name);
  FT_CHECK(entry.dtype == dst.dtype && shape_numel(entry.shape) == dst.numel(), entry.file, ": tensor \"", name,
           "\" must be ", dtype_name(dst.dtype), " with ", dst.numel(), " elements, got ",
           dtype_name(entry.dtype), " ", shape_string(entry.shape));
  backend.copy(dst, checkpoint.view(name));
  checkpoint.release(name);
}

class Nf4Format final : public QuantizedFormat {
 public:
  Nf4Format()
      : QuantizedFormat({"NF4", "nf4", "NF4 (bitsandbytes 4-bit)", kQuantizationNf4,
                         "frozen NF4 linear weights (4-bit codes)",
                         "their block absmax (double-quantised: 8-bit + nested)"}) {}

  void allocate(Parameter& p, const Shape& shape, Allocator& allocator, const ModelOptions& options) const override {
    allocate_nf4_parameter(allocator, p, shape.at(0), shape.at(1), options.nf4_double_quant);
  }

  std::unique_ptr<Linear> make_linear(Parameter& weight, Parameter* bias, const ModelOptions&) const override {
    return std::make_unique<Nf4Linear>(weight, bias);
  }

  void quantize(Backend& backend, Parameter& p, const Tensor& full_precision) const override {
    quantize_nf4_parameter(backend, p, full_precision);
  }

  void dequantize(Backend& backend, const Parameter& p, Tensor& out) const override {
    backend.nf4_dequantize(out, nf4_weight(p), 0, 0);
  }

  bool holds(const SafetensorsEntry& entry) const override { return entry.dtype == DType::u8; }

  void load(Backend& backend, const Checkpoint& checkpoint, Parameter& p) const override {
    const SafetensorsEntry& entry = checkpoint.entry(p.name);
    const bool double_quant = double_quantised(p);
    p.quantized.offset = read_quant_state(checkpoint, p, double_quant);
    const Tensor quant_map = checkpoint.view(p.name + ".quant_map");
    FT_CHECK(quant_map.dtype == DType::f32 && quant_map.numel() == 16, entry.file, ": \"", p.name,
             ".quant_map\" must be F32 [16]");
    // Copied out: tensors in a safetensors file need not be 4-byte aligned.
    float codes[16];
    std::memcpy(codes, quant_map.data, sizeof(codes));
    for (int i = 0; i < 16; ++i)
      FT_CHECK(codes[i] == kNf4Codes[i], entry.file, ": \"", p.name,
               ".quant_map\" is not bitsandbytes' NF4 code table (value ", i, " is ", codes[i], ")");
    std::vector<Tensor>& constants = p.quantized.constants;
    load_exact(backend, checkpoint, p.name, p.value);
    load_exact(backend, checkpoint, p.name + ".absmax", constants[0]);
    if (!double_quant) return;
    load_exact(backend, checkpoint, p.name + ".nested_absmax", constants[1]);
    load_exact(backend, checkpoint, p.name + ".nested_quant_map", constants[2]);
  }

  // A shard holds its blocks' absmax in f32 (allocated without double
  // quantisation): the whole weight's, recovered from its double
  // quantisation as the kernels do, since the nested blocks and offset span
  // the whole tensor.
  void cut(Backend& backend, const Parameter& whole, Parameter& part) const override {
    FT_CHECK(!double_quantised(part), "nf4 cut: \"", part.name, "\" must be allocated without double quantisation");
    const TensorSlice& slice = part.slice;
    const int64_t K = whole.quantized.shape.at(1), blocks = nf4_blocks(whole.quantized.shape.at(0) * K);
    check_slice(part.name, whole.quantized.shape, slice, part.quantized.shape.at(slice.dim));
    std::vector<float> absmax(static_cast<size_t>(blocks));
    const Tensor& codes = whole.quantized.constants.at(0);
    if (double_quantised(whole))
      nf4_dequantize_absmax(absmax.data(), codes.ptr<uint8_t>(), blocks, whole.quantized.constants[1].ptr<float>(),
                            whole.quantized.constants[2].ptr<float>(), whole.quantized.offset);
    else
      std::copy_n(codes.ptr<float>(), blocks, absmax.data());
    // The part's elements in order: runs of whole blocks of the whole's flat layout.
    const int64_t rows = part.quantized.shape.at(0), cols = part.quantized.shape.at(1);
    const bool by_rows = slice.dim == 0;
    const int64_t runs = by_rows ? 1 : rows, run_elements = by_rows ? rows * cols : cols;
    std::vector<uint8_t> packed;
    std::vector<float> part_absmax;
    for (int64_t run = 0; run < runs; ++run) {
      const int64_t first = by_rows ? slice.offset * K : run * K + slice.offset;
      const uint8_t* bytes = whole.value.ptr<uint8_t>() + first / 2;
      packed.insert(packed.end(), bytes, bytes + run_elements / 2);
      part_absmax.insert(part_absmax.end(), absmax.begin() + first / kNf4BlockSize,
                         absmax.begin() + (first + run_elements) / kNf4BlockSize);
    }
    backend.copy(part.value, Tensor::view_of(packed.data(), part.value.shape, DType::u8));
    backend.copy(part.quantized.constants[0],
                 Tensor::view_of(part_absmax.data(), {int64_t(part_absmax.size())}, DType::f32));
  }

  // Whole 64-element blocks only: a row slice starting and ending on a
  // block, a column slice of whole blocks of rows that are whole blocks.
  void check_slice(const std::string& name, const Shape& whole, const TensorSlice& slice,
                   int64_t count) const override {
    const int64_t K = whole.at(1);
    const bool aligned = slice.dim == 0 ? (slice.offset * K) % kNf4BlockSize == 0 && (count * K) % kNf4BlockSize == 0
                                        : K % kNf4BlockSize == 0 && slice.offset % kNf4BlockSize == 0 &&
                                              count % kNf4BlockSize == 0;
    FT_CHECK(aligned, name, ": its tensor-parallel share (", slice.dim == 0 ? "rows" : "columns", " [", slice.offset,
             ", ", slice.offset + count, ") of ", shape_string(whole), ") does not cut whole 64-element NF4 blocks; ",
             "use fewer parallel.tensor ranks or quantization.mode int8");
  }

  // weight_dtype: the quant state's dtype.
  void save(Backend& backend, const Parameter& p, DType weight_dtype, Allocator& host,
            NamedTensors& tensors) const override {
    const std::vector<Tensor>& constants = p.quantized.constants;
    tensors.emplace_back(p.name, host_tensor(backend, p.value, host));
    tensors.emplace_back(p.name + ".absmax", host_tensor(backend, constants[0], host));
    Tensor quant_map = Tensor::empty({16}, DType::f32, host, MemCategory::workspace);
    for (int i = 0; i < 16; ++i) quant_map.ptr<float>()[i] = kNf4Codes[i];
    tensors.emplace_back(p.name + ".quant_map", quant_map);
    nlohmann::json state = {{"quant_type", "nf4"},
                            {"blocksize", kNf4BlockSize},
                            {"dtype", torch_dtype_name(weight_dtype)},
                            {"shape", p.quantized.shape}};
    if (double_quantised(p)) {
      tensors.emplace_back(p.name + ".nested_absmax", host_tensor(backend, constants[1], host));
      tensors.emplace_back(p.name + ".nested_quant_map", host_tensor(backend, constants[2], host));
      state["nested_blocksize"] = kNf4NestedBlockSize;
      state["nested_dtype"] = "float32";
      state["nested_offset"] = double(p.quantized.offset);
    }
    const std::string text = state.dump();
    Tensor bytes = Tensor::empty({int64_t(text.size())}, DType::u8, host, MemCategory::workspace);
    std::copy(text.begin(), text.end(), bytes.ptr<char>());
    tensors.emplace_back(p.name + ".quant_state.bitsandbytes__nf4", bytes);
  }

  // The compute dtype: the one each tile is dequantised in for its GEMM.
  void describe(nlohmann::json& quantization_config, const ModelOptions& options) const override {
    quantization_config["load_in_4bit"] = quantization_config["_load_in_4bit"] = true;
    quantization_config["bnb_4bit_quant_type"] = "nf4";
    quantization_config["bnb_4bit_use_double_quant"] = options.nf4_double_quant;
    quantization_config["bnb_4bit_compute_dtype"] = torch_dtype_name(options.activation_dtype);
  }
};

}  // namespace

const QuantizedFormat& nf4_format() {
  static const Nf4Format format;
  return format;
}

Nf4Linear::Nf4Linear(Parameter& weight, Parameter* bias) : weight_(weight), bias_(bias) {
  FT_CHECK(weight.quantized.format == QuantizedBase::nf4, "Nf4Linear: \"", weight.name,
           "\" is not an NF4 weight (call allocate_nf4_parameter first)");
  FT_CHECK(!weight.trainable(), "Nf4Linear: \"", weight.name, "\" is NF4 and cannot be trainable");
}

Nf4Weight nf4_weight(const Parameter& p) {
  const std::vector<Tensor>& constants = p.quantized.constants;
  Nf4Weight w;
  w.codes = &p.value;
  w.absmax = &constants.at(0);
  if (double_quantised(p)) {
    w.nested_absmax = &constants[1];
    w.nested_map = &constants[2];
    w.nested_offset = p.quantized.offset;
  }
  w.out_features = p.quantized.shape.at(0);
  w.in_features = p.quantized.shape.at(1);
  return w;
}

void Nf4Linear::forward(Backend& backend, Tensor& out, const Tensor& x) {
  backend.nf4_linear_forward(out, x, nf4_weight(weight_));
  add_linear_bias(backend, out, bias_);
}

void Nf4Linear::weight_columns(Backend& backend, Tensor& tile, int64_t col0) {
  backend.nf4_dequantize(tile, nf4_weight(weight_), 0, col0);
}

void Nf4Linear::backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor&, bool accumulate_dx) {
  if (dx) backend.nf4_linear_backward(*dx, dout, nf4_weight(weight_), accumulate_dx);
  linear_bias_backward(backend, bias_, dout);
}

void allocate_nf4_parameter(Allocator& allocator, Parameter& p, int64_t out_features, int64_t in_features,
                            bool double_quant) {
  const int64_t elements = out_features * in_features, blocks = nf4_blocks(elements);
  p.value = Tensor::empty({nf4_packed_bytes(elements), 1}, DType::u8, allocator, MemCategory::weights);
  p.quantized = {QuantizedBase::nf4,
                 {out_features, in_features},
                 {Tensor::empty({blocks}, double_quant ? DType::u8 : DType::f32, allocator, MemCategory::weights)}};
  if (!double_quant) return;
  p.quantized.constants.push_back(
      Tensor::empty({nf4_nested_blocks(blocks)}, DType::f32, allocator, MemCategory::weights));
  p.quantized.constants.push_back(Tensor::empty({256}, DType::f32, allocator, MemCategory::weights));
}

void quantize_nf4_parameter(Backend& backend, Parameter& p, const Tensor& full_precision) {
  FT_CHECK(full_precision.shape == p.quantized.shape, "quantize_nf4_parameter: \"", p.name, "\" has shape ",
           shape_string(full_precision.shape), ", expected ", shape_string(p.quantized.shape));
  HostAllocator host;
  const int64_t n = full_precision.numel(), blocks = nf4_blocks(n);
  Tensor values = Tensor::empty({n}, DType::f32, host, MemCategory::workspace);
  // A host source (a checkpoint, init_random's values) is widened here: a
  // device backend's copy takes no host-to-host copy.
  if (full_precision.device == Device::cpu) {
    for (int64_t i = 0; i < n; ++i) values.ptr<float>()[i] = load_as_f32(full_precision.data, full_precision.dtype, i);
  } else {
    backend.copy(values, full_precision);
  }
  Tensor packed = Tensor::empty({nf4_packed_bytes(n), 1}, DType::u8, host, MemCategory::workspace);
  Tensor absmax = Tensor::empty({blocks}, DType::f32, host, MemCategory::workspace);
  nf4_quantize(values.ptr<const float>(), n, packed.ptr<uint8_t>(), absmax.ptr<float>());
  std::vector<Tensor>& constants = p.quantized.constants;
  backend.copy(p.value, packed);
  if (!double_quantised(p)) {
    backend.copy(constants[0], absmax);
    return;
  }
  std::vector<float> map = dynamic_map_8bit();
  Nf4DoubleQuant q = nf4_double_quantize(absmax.ptr<const float>(), blocks, map);
  p.quantized.offset = q.offset;
  auto upload = [&](Tensor& dst, void* data, const Shape& shape, DType dtype) {
    backend.copy(dst, Tensor::view_of(data, shape, dtype));
  };
  upload(constants[0], q.codes.data(), {blocks}, DType::u8);
  upload(constants[1], q.nested_absmax.data(), {int64_t(q.nested_absmax.size())}, DType::f32);
  upload(constants[2], map.data(), {256}, DType::f32);
}

}  // namespace ft
