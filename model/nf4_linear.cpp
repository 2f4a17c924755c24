#include "model/nf4_linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/error.h"
#include "kernels/nf4.h"
#include "model/json_input.h"

namespace ft {

Nf4Linear::Nf4Linear(Parameter& weight, Parameter* bias) : weight_(weight), bias_(bias) {
  FT_CHECK(weight.value.dtype == DType::u8 && weight.nf4_shape.size() == 2 && weight.scales.defined(),
           "Nf4Linear: \"", weight.name, "\" is not an NF4 weight (call allocate_nf4_parameter first)");
  FT_CHECK(!weight.trainable(), "Nf4Linear: \"", weight.name, "\" is NF4 and cannot be trainable");
}

Nf4Weight nf4_weight(const Parameter& p) {
  Nf4Weight w;
  w.codes = &p.value;
  w.absmax = &p.scales;
  if (p.nested_map.defined()) {
    w.nested_absmax = &p.nested_absmax;
    w.nested_map = &p.nested_map;
    w.nested_offset = p.nested_offset;
  }
  w.out_features = p.nf4_shape[0];
  w.in_features = p.nf4_shape[1];
  return w;
}

void Nf4Linear::forward(Backend& backend, Tensor& out, const Tensor& x) {
  backend.nf4_linear_forward(out, x, nf4_weight(weight_));
  add_linear_bias(backend, out, bias_);
}

void Nf4Linear::backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor&, bool accumulate_dx) {
  if (dx) backend.nf4_linear_backward(*dx, dout, nf4_weight(weight_), accumulate_dx);
  linear_bias_backward(backend, bias_, dout);
}

void allocate_nf4_parameter(Allocator& allocator, Parameter& p, int64_t out_features, int64_t in_features,
                            bool double_quant) {
  const int64_t elements = out_features * in_features, blocks = nf4_blocks(elements);
  p.nf4_shape = {out_features, in_features};
  p.value = Tensor::empty({nf4_packed_bytes(elements), 1}, DType::u8, allocator, MemCategory::weights);
  p.scales = Tensor::empty({blocks}, double_quant ? DType::u8 : DType::f32, allocator, MemCategory::weights);
  if (!double_quant) return;
  p.nested_absmax = Tensor::empty({nf4_nested_blocks(blocks)}, DType::f32, allocator, MemCategory::weights);
  p.nested_map = Tensor::empty({256}, DType::f32, allocator, MemCategory::weights);
}

void quantize_nf4_parameter(Backend& backend, Parameter& p, const Tensor& full_precision) {
  FT_CHECK(full_precision.shape == p.nf4_shape, "quantize_nf4_parameter: \"", p.name, "\" has shape ",
           shape_string(full_precision.shape), ", expected ", shape_string(p.nf4_shape));
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
  backend.copy(p.value, packed);
  if (!p.nested_map.defined()) {
    backend.copy(p.scales, absmax);
    return;
  }
  std::vector<float> map = dynamic_map_8bit();
  Nf4DoubleQuant q = nf4_double_quantize(absmax.ptr<const float>(), blocks, map);
  p.nested_offset = q.offset;
  auto upload = [&](Tensor& dst, void* data, const Shape& shape, DType dtype) {
    backend.copy(dst, Tensor::view_of(data, shape, dtype));
  };
  upload(p.scales, q.codes.data(), {blocks}, DType::u8);
  upload(p.nested_absmax, q.nested_absmax.data(), {int64_t(q.nested_absmax.size())}, DType::f32);
  upload(p.nested_map, map.data(), {256}, DType::f32);
}

namespace {

const char* torch_dtype_name(DType dtype) {
  return dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
}

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
  FT_CHECK(field("shape") == nlohmann::json(p.nf4_shape), entry.file, ": \"", name, "\" has shape ",
           field("shape").dump(), " but config.json implies ", shape_string(p.nf4_shape));
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

}  // namespace

void load_nf4_parameter(Backend& backend, const Checkpoint& checkpoint, Parameter& p) {
  const SafetensorsEntry& entry = checkpoint.entry(p.name);
  if (entry.dtype != DType::u8) {
    FT_CHECK(entry.shape == p.nf4_shape, entry.file, ": tensor \"", p.name, "\" has shape ",
             shape_string(entry.shape), " but config.json implies ", shape_string(p.nf4_shape));
    quantize_nf4_parameter(backend, p, checkpoint.view(p.name));
    checkpoint.release(p.name);
    return;
  }
  const bool double_quant = p.nested_map.defined();
  p.nested_offset = read_quant_state(checkpoint, p, double_quant);
  const Tensor quant_map = checkpoint.view(p.name + ".quant_map");
  FT_CHECK(quant_map.dtype == DType::f32 && quant_map.numel() == 16, entry.file, ": \"", p.name,
           ".quant_map\" must be F32 [16]");
  // Copied out: tensors in a safetensors file need not be 4-byte aligned.
  float codes[16];
  std::memcpy(codes, quant_map.data, sizeof(codes));
  for (int i = 0; i < 16; ++i)
    FT_CHECK(codes[i] == kNf4Codes[i], entry.file, ": \"", p.name,
             ".quant_map\" is not bitsandbytes' NF4 code table (value ", i, " is ", codes[i], ")");
  load_exact(backend, checkpoint, p.name, p.value);
  load_exact(backend, checkpoint, p.name + ".absmax", p.scales);
  if (!double_quant) return;
  load_exact(backend, checkpoint, p.name + ".nested_absmax", p.nested_absmax);
  load_exact(backend, checkpoint, p.name + ".nested_quant_map", p.nested_map);
}

std::vector<std::pair<std::string, Tensor>> nf4_state_dict(Backend& backend, const Parameter& p, DType weight_dtype,
                                                           Allocator& host) {
  auto on_host = [&](const Tensor& t) {
    Tensor copy = Tensor::empty(t.shape, t.dtype, host, MemCategory::workspace);
    backend.copy(copy, t);
    return copy;
  };
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.emplace_back(p.name, on_host(p.value));
  tensors.emplace_back(p.name + ".absmax", on_host(p.scales));
  Tensor quant_map = Tensor::empty({16}, DType::f32, host, MemCategory::workspace);
  for (int i = 0; i < 16; ++i) quant_map.ptr<float>()[i] = kNf4Codes[i];
  tensors.emplace_back(p.name + ".quant_map", quant_map);
  nlohmann::json state = {{"quant_type", "nf4"},
                          {"blocksize", kNf4BlockSize},
                          {"dtype", torch_dtype_name(weight_dtype)},
                          {"shape", p.nf4_shape}};
  if (p.nested_map.defined()) {
    tensors.emplace_back(p.name + ".nested_absmax", on_host(p.nested_absmax));
    tensors.emplace_back(p.name + ".nested_quant_map", on_host(p.nested_map));
    state["nested_blocksize"] = kNf4NestedBlockSize;
    state["nested_dtype"] = "float32";
    state["nested_offset"] = double(p.nested_offset);
  }
  const std::string text = state.dump();
  Tensor bytes = Tensor::empty({int64_t(text.size())}, DType::u8, host, MemCategory::workspace);
  std::copy(text.begin(), text.end(), bytes.ptr<char>());
  tensors.emplace_back(p.name + ".quant_state.bitsandbytes__nf4", bytes);
  return tensors;
}

}  // namespace ft
