// AdamW over the trainable parameters only. Frozen weights have no gradient
// and no state here, which is where LoRA's memory saving comes from: state is
// 2 moments x 4 bytes per trainable parameter, plus a 4-byte f32 master copy
// when the parameter's compute copy is 16-bit.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/parameter.h"

namespace ft {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to matrices only; norms and biases (1-D) are not decayed
  double max_grad_norm = 1.0;  // global-norm clipping; 0 disables
};

class AdamW {
 public:
  AdamW(Backend& backend, std::vector<Parameter*> parameters, AdamWOptions options);

  // Clips all gradients to max_grad_norm (one global norm), applies one update
  // with learning rate lr, and returns the global gradient norm before clipping.
  // A non-finite norm (a NaN or Inf gradient) is returned without any update.
  double step(double lr);

  Backend& backend() { return backend_; }
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  // First and second moments of parameters()[i], f32, category optimizer.
  Tensor& first_moment(size_t i) { return first_moments_[i]; }
  Tensor& second_moment(size_t i) { return second_moments_[i]; }
  // The f32 master of parameters()[i] (the parameter itself when it is f32).
  Tensor& master(size_t i);
  // Re-derives 16-bit compute copies from the masters (after loading state).
  void sync_compute_copies();

 private:
  Backend& backend_;
  std::vector<Parameter*> parameters_;
  AdamWOptions options_;
  std::vector<Tensor> first_moments_, second_moments_;
  std::vector<Tensor> masters_;  // undefined where the parameter is f32 already
  int64_t steps_taken_ = 0;
};

}  // namespace ft
