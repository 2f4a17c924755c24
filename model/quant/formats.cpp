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

}  // namespace ft
