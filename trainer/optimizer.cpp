#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/error.h"
#include "model/lora_linear.h"

namespace ft {

// transformers' Trainer decays every parameter but biases and norms (by
// name); here the 1-D ones, except DoRA's magnitude, which is neither.
static bool decayed(const Parameter& p) {
  return p.value.ndim() >= 2 || p.name.ends_with(kDoraMagnitudeSuffix);
}

bool AdamW::faster(const Parameter& p) const {
  // As create_loraplus_optimizer's group B: "lora_B" in the name, or 1-D.
  return options_.loraplus_lr_ratio != 1.0 && (p.name.find(".lora_B.") != std::string::npos || p.value.ndim() == 1);
}

void AdamW::update_groups(const std::vector<AdamWTensors> (&groups)[2], const AdamWStep& update,
                          const AdamWStep& faster) {
  if (!groups[0].empty()) backend_.adamw_update_many(groups[0], update);
  if (!groups[1].empty()) backend_.adamw_update_many(groups[1], faster);
}

AdamW::AdamW(Backend& backend, std::vector<Parameter*> parameters, AdamWOptions options)
    : backend_(backend), parameters_(std::move(parameters)), options_(options) {
  for (Parameter* p : parameters_)
    FT_CHECK(p->trainable(), "AdamW: parameter \"", p->name, "\" has no gradient (it is frozen)");
  FT_CHECK(options_.offload_chunk_elements > 0, "AdamW: offload_chunk_elements must be > 0, got ",
           options_.offload_chunk_elements);
  if (options_.host_state) {
    offload_state(*options_.host_state);
    return;
  }
  for (Parameter* p : parameters_) {
    Tensor m = backend_.empty(p->value.shape, DType::f32, MemCategory::optimizer);
    Tensor v = backend_.empty(p->value.shape, DType::f32, MemCategory::optimizer);
    backend_.fill(m, 0.0f);
    backend_.fill(v, 0.0f);
    first_moments_.push_back(m);
    second_moments_.push_back(v);
    Tensor master;
    if (p->value.dtype != DType::f32) {
      master = backend_.empty(p->value.shape, DType::f32, MemCategory::optimizer);
      backend_.copy(master, p->value);
    }
    masters_.push_back(master);
  }
}

// Three host tensors for all parameters, each parameter's state a view into
// them; the masters start as the compute copies, widened on the device and
// brought over through the staging buffers as a step does.
void AdamW::offload_state(Allocator& host) {
  int64_t total = 0;
  for (Parameter* p : parameters_) {
    offsets_.push_back(total);
    total += p->value.numel();
  }
  host_masters_ = Tensor::empty({total}, DType::f32, host, MemCategory::optimizer);
  host_first_moments_ = Tensor::empty({total}, DType::f32, host, MemCategory::optimizer);
  host_second_moments_ = Tensor::empty({total}, DType::f32, host, MemCategory::optimizer);
  for (Tensor* moments : {&host_first_moments_, &host_second_moments_})
    if (moments->data) std::memset(moments->data, 0, moments->size_bytes());  // 0.0f is all zero bits
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Shape& shape = parameters_[i]->value.shape;
    const int64_t n = parameters_[i]->value.numel();
    masters_.push_back(host_masters_.slice_rows(offsets_[i], n).reshaped(shape));
    first_moments_.push_back(host_first_moments_.slice_rows(offsets_[i], n).reshaped(shape));
    second_moments_.push_back(host_second_moments_.slice_rows(offsets_[i], n).reshaped(shape));
  }
  for_each_chunk([&](int64_t first, int64_t count) {
    Tensor staged = backend_.empty({count}, DType::f32, MemCategory::workspace);
    for (const Overlap& o : overlaps(first, count)) {
      Tensor widened = staged.slice_rows(o.in_chunk, o.count);
      const Parameter& p = *parameters_[o.index];
      backend_.copy(widened, p.value.reshaped({p.value.numel()}).slice_rows(o.in_parameter, o.count));
    }
    Tensor destination = host_masters_.slice_rows(first, count);
    backend_.copy(destination, staged);
  });
}

template <class Chunk>
void AdamW::for_each_chunk(const Chunk& chunk) {
  const int64_t total = host_masters_.numel(), most = options_.offload_chunk_elements;
  for (int64_t first = 0; first < total; first += most) chunk(first, std::min(most, total - first));
}

std::vector<AdamW::Overlap> AdamW::overlaps(int64_t first, int64_t count) const {
  std::vector<Overlap> found;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const int64_t begin = std::max(first, offsets_[i]);
    const int64_t end = std::min(first + count, offsets_[i] + parameters_[i]->value.numel());
    if (begin < end) found.push_back({i, begin - offsets_[i], begin - first, end - begin});
  }
  return found;
}

Tensor& AdamW::master(size_t i) { return masters_[i].storage ? masters_[i] : parameters_[i]->value; }

void AdamW::copy_state(Tensor& dst, const Tensor& src) {
  if (dst.device != Device::cpu || src.device != Device::cpu) return backend_.copy(dst, src);
  FT_CHECK(dst.dtype == DType::f32 && src.dtype == DType::f32 && dst.numel() == src.numel(),
           "AdamW::copy_state: expected f32 tensors of equal size, got ", dtype_name(dst.dtype), " ",
           shape_string(dst.shape), " and ", dtype_name(src.dtype), " ", shape_string(src.shape));
  std::memcpy(dst.data, src.data, src.size_bytes());
}

void AdamW::sync_compute_copies() {
  if (!options_.host_state) {
    for (size_t i = 0; i < parameters_.size(); ++i)
      if (masters_[i].storage) backend_.copy(parameters_[i]->value, masters_[i]);
    return;
  }
  for_each_chunk([&](int64_t first, int64_t count) {
    Tensor staged = backend_.empty({count}, DType::f32, MemCategory::workspace);
    backend_.copy(staged, host_masters_.slice_rows(first, count));
    for (const Overlap& o : overlaps(first, count)) {
      Parameter& p = *parameters_[o.index];
      Tensor compute = p.value.reshaped({p.value.numel()}).slice_rows(o.in_parameter, o.count);
      backend_.copy(compute, staged.slice_rows(o.in_chunk, o.count));
    }
  });
}

// Each chunk: master, m and v to the device, the update on them and the
// chunk's gradients, the three back, and the compute copies from the masters.
void AdamW::step_offloaded(const AdamWStep& update, const AdamWStep& faster_update) {
  for_each_chunk([&](int64_t first, int64_t count) {
    Tensor staged[3], host[3] = {host_masters_.slice_rows(first, count), host_first_moments_.slice_rows(first, count),
                                 host_second_moments_.slice_rows(first, count)};
    for (int k = 0; k < 3; ++k) {
      staged[k] = backend_.empty({count}, DType::f32, MemCategory::workspace);
      backend_.copy(staged[k], host[k]);
    }
    const std::vector<Overlap> parts = overlaps(first, count);
    std::vector<Tensor> views;  // master, grad, m, v per part; AdamWTensors points into it
    views.reserve(4 * parts.size());
    std::vector<AdamWTensors> groups[2];
    for (const Overlap& o : parts) {
      const Parameter& p = *parameters_[o.index];
      views.push_back(staged[0].slice_rows(o.in_chunk, o.count));
      views.push_back(p.grad.reshaped({p.grad.numel()}).slice_rows(o.in_parameter, o.count));
      views.push_back(staged[1].slice_rows(o.in_chunk, o.count));
      views.push_back(staged[2].slice_rows(o.in_chunk, o.count));
      Tensor* v = &views[views.size() - 4];
      groups[faster(p)].push_back({&v[0], &v[1], &v[2], &v[3], decayed(p)});
    }
    update_groups(groups, update, faster_update);
    for (int k = 0; k < 3; ++k) backend_.copy(host[k], staged[k]);
    for (const Overlap& o : parts) {
      Parameter& p = *parameters_[o.index];
      Tensor compute = p.value.reshaped({p.value.numel()}).slice_rows(o.in_parameter, o.count);
      backend_.copy(compute, staged[0].slice_rows(o.in_chunk, o.count));
    }
  });
}

// One sum_squares_many and one adamw_update_many over all parameters (per
// chunk when offloaded): on the GPU two reductions and one update launch per
// step rather than a few per tensor, with a single device->host sync for the norm.
double add_squared_gradients(Backend& backend, const std::vector<Parameter*>& parameters, double start) {
  std::vector<const Tensor*> grads;
  for (Parameter* p : parameters) grads.push_back(&p->grad);
  if (start == 0.0) return backend.sum_squares_many(grads);
  for (const Tensor* grad : grads) start += backend.sum_squares_many({&grad, 1});
  return start;
}

std::vector<int64_t> state_owners(const std::vector<Parameter*>& parameters, int64_t ranks) {
  int64_t total = 0;
  for (const Parameter* p : parameters) total += p->value.numel();
  std::vector<int64_t> owners;
  int64_t offset = 0;
  for (const Parameter* p : parameters) {
    // The rank whose equal share of the elements holds the parameter's first element.
    owners.push_back(std::min(ranks - 1, int64_t(double(offset) * double(ranks) / double(std::max<int64_t>(total, 1)))));
    offset += p->value.numel();
  }
  return owners;
}

double AdamW::step(double lr) { return step(lr, add_squared_gradients(backend_, parameters_, 0.0)); }

double AdamW::step(double lr, double squared_grad_norm) {
  const double grad_norm = std::sqrt(squared_grad_norm);
  if (!std::isfinite(grad_norm)) return grad_norm;  // a NaN/Inf gradient would poison every weight and moment
  double grad_scale = 1.0;
  // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when above.
  if (options_.max_grad_norm > 0 && grad_norm > options_.max_grad_norm)
    grad_scale = options_.max_grad_norm / (grad_norm + 1e-6);
  steps_taken_ += 1;
  if (parameters_.empty()) return grad_norm;  // a data-parallel rank whose share of a sharded state is empty
  AdamWStep update{float(lr), float(options_.beta1), float(options_.beta2), float(options_.eps),
                   float(options_.weight_decay), float(grad_scale), steps_taken_};
  AdamWStep faster_update = update;
  faster_update.lr = float(lr * options_.loraplus_lr_ratio);
  if (options_.host_state) {
    step_offloaded(update, faster_update);
    return grad_norm;
  }
  std::vector<AdamWTensors> groups[2];
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Parameter* p = parameters_[i];
    groups[faster(*p)].push_back({&master(i), &p->grad, &first_moments_[i], &second_moments_[i], decayed(*p)});
  }
  update_groups(groups, update, faster_update);
  sync_compute_copies();
  return grad_norm;
}

}  // namespace ft
