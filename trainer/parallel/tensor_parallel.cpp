#include "trainer/parallel/tensor_parallel.h"

#include <cstring>

#include "kernels/error.h"
#include "model/families.h"
#include "trainer/optimizer.h"
#include "trainer/parallel/data_parallel.h"

namespace ft {

void check_tensor_parallel_model(const TrainConfig& config, const ModelConfig& model) {
  const int64_t ranks = config.parallel.tensor;
  if (ranks == 1) return;
  const std::string where = parallel_field(config, "tensor", ranks);
  FT_CHECK(model_family(model.model_type).pipeline, where, "tensor parallelism splits a decoder-only model's "
           "layers; model_type ", model.model_type, " is an encoder-decoder model (run it data parallel)");
  check_tensor_split(model, ranks, where);  // as the layers do, here naming the config file
  FT_CHECK(config.objective == Objective::sft, where, "tensor parallelism covers objective: sft");
  FT_CHECK(config.trainable == Trainable::lora, where, "tensor parallelism trains LoRA adapters (trainable: lora)");
  FT_CHECK(config.offload_base == OffloadTarget::device, where, "the ranks split every layer over their devices; "
           "leave offload.base at device");
}

void check_tensor_parallel_run(const TrainConfig& config, const ModelConfig& model) {
  check_tensor_parallel_model(config, model);
  if (config.parallel.tensor == 1) return;
  const std::string where = parallel_field(config, "tensor", config.parallel.tensor);
  FT_CHECK(config.task_metric == TaskMetric::none, where, "task_metric: rouge generates with the whole model, "
           "which no rank holds; set task_metric: none and score the saved adapter with `finetune generate`");
  FT_CHECK(config.quantization.save_base.empty(), where, "quantization.save_base writes the whole quantized "
           "base, which no rank holds; save it from a one-process run");
}

namespace {

// A slice held by `replicas` neighbouring ranks (GQA's key/value heads on
// more ranks than heads): each rank's gradient is its share of the slice's,
// summed among those ranks. Through one sum over the whole group of a
// buffer holding every part in its place (zeros elsewhere): such slices are
// LoRA's small B factors, so the extra bytes cost less than groups of their own.
void sum_replicated_slice(Collectives& tensor, Backend& backend, Allocator& host, Parameter& p) {
  const int64_t replicas = p.slice.replicas, parts = tensor.world_size() / replicas, n = p.grad.numel();
  Tensor parts_grad = backend.empty({parts, n}, DType::f32, MemCategory::workspace);
  backend.fill(parts_grad, 0.0f);
  Tensor mine = parts_grad.slice_rows(tensor.rank() / replicas, 1);
  Tensor flat = p.grad.reshaped({1, n});
  backend.copy(mine, flat);
  tensor.sum_in_place(backend, host, {&parts_grad});
  backend.copy(flat, mine);
}

}  // namespace

void sum_partial_gradients(Collectives& tensor, Backend& backend, Allocator& host,
                           const std::vector<Parameter*>& trainable) {
  if (tensor.world_size() == 1) return;
  std::vector<Tensor*> partial;
  for (Parameter* p : trainable)
    if (p->partial_grad) partial.push_back(&p->grad);
  tensor.sum_in_place(backend, host, partial);
  for (Parameter* p : trainable)
    if (p->slice.replicas > 1) sum_replicated_slice(tensor, backend, host, *p);
}

double tensor_squared_grad_norm(Collectives& tensor, Backend& backend, const std::vector<Parameter*>& trainable) {
  std::vector<Parameter*> sliced, whole;
  for (Parameter* p : trainable) {
    if (p->slice.whole()) whole.push_back(p);
    else if (tensor.rank() % p->slice.replicas == 0) sliced.push_back(p);  // a replicated slice once
  }
  const double shards = sliced.empty() ? 0.0 : add_squared_gradients(backend, sliced, 0.0);
  const double replicated = whole.empty() ? 0.0 : add_squared_gradients(backend, whole, 0.0);
  return tensor.sum(shards) + replicated;
}

namespace {

// The pieces side by side along dim: rows stacked (dim 0) or each row's
// columns in rank order (dim 1).
Tensor concatenate(const std::vector<Tensor>& pieces, int dim, Allocator& host) {
  Shape shape = pieces[0].shape;
  int64_t total = 0;
  for (const Tensor& piece : pieces) total += piece.dim(dim);
  shape[size_t(dim)] = total;
  Tensor whole = Tensor::empty(shape, pieces[0].dtype, host, MemCategory::workspace);
  const int64_t element_bytes = int64_t(dtype_size_bytes(whole.dtype));
  const int64_t rows = dim == 0 ? 1 : whole.dim(0);
  char* out = whole.ptr<char>();
  for (int64_t r = 0; r < rows; ++r)
    for (const Tensor& piece : pieces) {
      const int64_t bytes = (dim == 0 ? piece.numel() : piece.dim(1)) * element_bytes;
      std::memcpy(out, static_cast<const char*>(piece.data) + r * bytes, size_t(bytes));
      out += bytes;
    }
  return whole;
}

}  // namespace

NamedTensors gather_tensor_shards(Collectives& tensor, Backend& backend, Allocator& host, NamedTensors mine,
                                  const std::vector<TensorSlice>& slices) {
  FT_CHECK(mine.size() == slices.size(), "gather_tensor_shards: ", mine.size(), " tensors but ", slices.size(),
           " slices");
  if (tensor.world_size() == 1) return mine;
  const size_t count = mine.size();
  NamedTensors all = gather_on_rank_zero(tensor, backend, host, mine);
  if (tensor.rank() != 0) return mine;
  NamedTensors whole;
  for (size_t i = 0; i < count; ++i) {
    if (slices[i].whole()) {
      whole.push_back(all[i]);
      continue;
    }
    std::vector<Tensor> pieces;  // one from each slice's first holder
    for (int r = 0; r < tensor.world_size(); r += int(slices[i].replicas))
      pieces.push_back(all[size_t(r) * count + i].second);
    whole.emplace_back(all[i].first, concatenate(pieces, slices[i].dim, host));
  }
  return whole;
}

IdentityField tensor_identity(int64_t ranks) {
  return {"parallel.tensor", "the tensor-parallel ranks (parallel.tensor)", std::to_string(ranks), false};
}

}  // namespace ft
