#include "model/quant/formats.h"

#include "kernels/error.h"
#include "model/quant/int8.h"
#include "model/quant/nf4.h"

namespace ft {

const QuantizedFormat& quantized_format(QuantizedBase base) {
  switch (base) {
    case QuantizedBase::int8: return int8_format();
    case QuantizedBase::nf4: return nf4_format();
    case QuantizedBase::none: break;
  }
  fail("quantized_format: an unquantized base has no format");
}

void assign_weight(Backend& backend, Parameter& p, const Tensor& full_precision) {
  if (p.is_quantized()) quantized_format(p.quantized.format).quantize(backend, p, full_precision);
  else backend.copy(p.value, full_precision);
}

void load_parameter(Backend& backend, const Checkpoint& checkpoint, Parameter& p) {
  const SafetensorsEntry& entry = checkpoint.entry(p.name);
  for (QuantizedBase base : kQuantizedBases) {
    if (base == QuantizedBase::none || base == p.quantized.format) continue;
    const QuantizedFormat& other = quantized_format(base);
    FT_CHECK(!other.holds(entry), entry.file, ": tensor \"", p.name, "\" is stored ", other.names.stored,
             " and loads only with quantization.mode ", other.names.mode);
  }
  if (p.is_quantized() && quantized_format(p.quantized.format).holds(entry))
    return quantized_format(p.quantized.format).load(backend, checkpoint, p);
  require_shape(entry, p.name, p.shape());
  const bool floating = entry.dtype == DType::f32 || entry.dtype == DType::bf16 || entry.dtype == DType::f16;
  FT_CHECK(floating, entry.file, ": tensor \"", p.name, "\" is stored as ", dtype_name(entry.dtype),
           "; a weight must be F32, F16 or BF16", p.is_quantized() ? " (it is quantised as it loads)" : "");
  assign_weight(backend, p, checkpoint.view(p.name));
  // Done with the source bytes: drop their pages so the mapped checkpoint
  // holds about one tensor resident, not the whole file, at peak.
  checkpoint.release(p.name);
}

void check_stored_quantization(const StoredQuantization& stored, const ModelOptions& options) {
  if (stored.format == QuantizedBase::none) return;
  const QuantizedFormat& format = quantized_format(stored.format);
  const char* field = stored.format == QuantizedBase::int8 ? "load_in_8bit" : "load_in_4bit";
  const char* run_mode =
      options.quantized_base == QuantizedBase::none ? "none" : quantized_format(options.quantized_base).names.mode;
  FT_CHECK(options.quantized_base == stored.format, stored.source, ": quantization_config.", field,
           " is true: its decoder linears are stored ", format.names.format, " and load only with quantization.mode ",
           format.names.mode, " (this run has ", run_mode, ")");
  const auto on_off = [](bool on) { return on ? "true" : "false"; };
  FT_CHECK(stored.format != QuantizedBase::nf4 || stored.double_quant == options.nf4_double_quant, stored.source,
           ": quantization_config.bnb_4bit_use_double_quant is ", on_off(stored.double_quant),
           " but quantization.double_quant is ", on_off(options.nf4_double_quant), "; set it to ",
           on_off(stored.double_quant));
}

}  // namespace ft
