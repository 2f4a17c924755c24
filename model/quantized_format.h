// A quantized base's format: how a frozen decoder linear's weight is held
// (Parameter::value its codes, Parameter::quantized the rest), allocated,
// computed with, quantised, loaded, saved and named. The model, the loader,
// the layer stream and the planner see a format only through this, so each
// lives in one file, model/quant/<format>.cpp, with its ops in kernels/.
// model/quant/formats.h finds a QuantizedBase's format; to add a format: its
// QuantizedBase value and place in kQuantizedBases (model/model_options.h),
// its file, its case in quantized_format() (model/quant/formats.cpp), its
// quantization.mode spelling (trainer/train_config.cpp's enum table, which
// the command line's --quantization reads too) and its Backend ops
// (docs/extending.md).
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/linear.h"
#include "model/model_options.h"
#include "model/safetensors.h"

namespace ft {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class QuantizedFormat {
 public:
  // Its words in messages, files and the plan.
  struct Names {
    const char* format;         // "... is frozen in NF4"
    const char* mode;           // its quantization.mode
    const char* stored;         // a checkpoint tensor saved in it: "... is stored NF4 (bitsandbytes 4-bit)"
    const char* metadata;       // a saved base's __metadata__ kQuantizationMetadataKey value
    const char* codes_row;      // the planner's breakdown: the codes on the device
    const char* constants_row;  // and their constants
  };
  explicit QuantizedFormat(const Names& names) : names(names) {}
  virtual ~QuantizedFormat() = default;
  const Names names;

  // Sets p.value and p.quantized for a weight of shape [out, in], its
  // tensors from allocator (the backend's, or pinned host memory for a
  // streamed layer), category weights.
  virtual void allocate(Parameter& p, const Shape& shape, Allocator& allocator, const ModelOptions& options) const = 0;
  // The frozen linear over an allocated weight; bias null for none.
  virtual std::unique_ptr<Linear> make_linear(Parameter& weight, Parameter* bias,
                                              const ModelOptions& options) const = 0;
  // Quantises a full-precision weight of p's shape (any floating dtype, host
  // or device) into p's tensors.
  virtual void quantize(Backend& backend, Parameter& p, const Tensor& full_precision) const = 0;
  // out [out, in] (any floating dtype) = p dequantised as the format's
  // kernels dequantise it (an adapter merged into a saved quantised base).
  virtual void dequantize(Backend& backend, const Parameter& p, Tensor& out) const = 0;
  // Whether a checkpoint tensor is saved in this format (its codes).
  virtual bool holds(const SafetensorsEntry& entry) const = 0;
  // Loads p from its tensors saved in this format (holds() its entry), taken
  // as they are and each released once copied; a layout that does not match
  // p's is an Error naming the file and the tensor.
  virtual void load(Backend& backend, const Checkpoint& checkpoint, Parameter& p) const = 0;
  // Sets part (allocated for its slice's shape: model/tensor_parallel.h) to
  // its slice of whole, a host weight in this format quantised from the
  // whole tensor as one process holds it, so every shard dequantises to the
  // values one process's weight does there. A slice the format cannot cut
  // is an Error naming the tensor (check_slice says so at build time).
  virtual void cut(Backend& backend, const Parameter& whole, Parameter& part) const = 0;
  virtual void check_slice(const std::string& /*name*/, const Shape& /*whole*/, const TensorSlice& /*slice*/,
                           int64_t /*count*/) const {}
  // Appends the tensors a saved base holds for p, in the layout load()
  // reads, as host tensors (host_tensor). weight_dtype: the model's dense
  // weights'.
  virtual void save(Backend& backend, const Parameter& p, DType weight_dtype, Allocator& host,
                    NamedTensors& tensors) const = 0;
  // Sets its fields of the quantization_config transformers writes in
  // config.json for a model bitsandbytes quantised this way (load_in_8bit or
  // load_in_4bit and their settings), over BitsAndBytesConfig's defaults.
  virtual void describe(nlohmann::json& quantization_config, const ModelOptions& options) const = 0;
};

// A checkpoint tensor's shape must be the one config.json implies.
void require_shape(const SafetensorsEntry& entry, const std::string& name, const Shape& expected);

// t itself when it is in host memory (saved in place), else a copy in host.
Tensor host_tensor(Backend& backend, const Tensor& t, Allocator& host);

// count rows (dim 0: a view) or columns (dim 1: a copy from host) of a host
// [rows, cols] tensor, from offset; of a 1-D one, count elements (a view).
Tensor host_slice(const Tensor& whole, int dim, int64_t offset, int64_t count, Allocator& host);

}  // namespace ft
