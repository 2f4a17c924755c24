#include "trainer/optimizer.h"

#include <cmath>

#include "kernels/error.h"

namespace ft {

AdamW::AdamW(Backend& backend, std::vector<Parameter*> parameters, AdamWOptions options)
    : backend_(backend), parameters_(std::move(parameters)), options_(options) {
  for (Parameter* p : parameters_) {
    FT_CHECK(p->trainable(), "AdamW: parameter \"", p->name, "\" has no gradient (it is frozen)");
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

Tensor& AdamW::master(size_t i) { return masters_[i].storage ? masters_[i] : parameters_[i]->value; }

void AdamW::sync_compute_copies() {
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (masters_[i].storage) backend_.copy(parameters_[i]->value, masters_[i]);
}

// One sum_squares_many and one adamw_update_many over all parameters: on the
// GPU two reductions and one update launch per step rather than a few per
// tensor, with a single device->host sync for the norm.
double AdamW::step(double lr) {
  std::vector<const Tensor*> grads;
  for (Parameter* p : parameters_) grads.push_back(&p->grad);
  const double grad_norm = std::sqrt(backend_.sum_squares_many(grads));
  if (!std::isfinite(grad_norm)) return grad_norm;  // a NaN/Inf gradient would poison every weight and moment
  double grad_scale = 1.0;
  // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when above.
  if (options_.max_grad_norm > 0 && grad_norm > options_.max_grad_norm)
    grad_scale = options_.max_grad_norm / (grad_norm + 1e-6);
  steps_taken_ += 1;
  std::vector<AdamWTensors> tensors;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Parameter* p = parameters_[i];
    const bool decayed = p->value.ndim() >= 2;
    tensors.push_back({&master(i), &p->grad, &first_moments_[i], &second_moments_[i], decayed});
  }
  AdamWStep update{float(lr), float(options_.beta1), float(options_.beta2), float(options_.eps),
                   float(options_.weight_decay), float(grad_scale), steps_taken_};
  backend_.adamw_update_many(tensors, update);
  sync_compute_copies();
  return grad_norm;
}

}  // namespace ft
