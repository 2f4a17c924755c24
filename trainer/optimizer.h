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
  // Applied to matrices and DoRA's magnitudes; norms and biases (the other
  // 1-D parameters) are not decayed, as in transformers' Trainer.
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // global-norm clipping; 0 disables
  // LoRA+ (PEFT's create_loraplus_optimizer): lora_B and the 1-D parameters
  // (DoRA's magnitudes) step at loraplus_lr_ratio x lr, the rest (lora_A)
  // at lr. 1: every parameter at lr.
  double loraplus_lr_ratio = 1.0;
  // Where m, v and the f32 masters live. Null: on the backend's device. A
  // host allocator: there, as ZeRO-Offload splits it (the device keeps only
  // the compute copies and f32 gradients, every parameter gets an f32 master
  // on the host); each step streams them through three device staging
  // buffers (master, m, v: f32, category workspace) of offload_chunk_elements
  // and runs the same update kernel on them, so the values are bit-identical
  // to a resident step's.
  Allocator* host_state = nullptr;
  int64_t offload_chunk_elements = int64_t(1) << 23;  // 3 x 32 MiB of staging
};

// start + the squared norm of the parameters' gradients. With start 0 one
// reduction over all of them; otherwise added one parameter after another,
// so that the stages of a pipeline, each continuing from the previous one's
// sum, add in the order one process does (bit for bit on the CPU).
double add_squared_gradients(Backend& backend, const std::vector<Parameter*>& parameters, double start);

// ZeRO-1's split of the trainable parameters over `ranks` data-parallel
// ranks: each parameter's owner, contiguous in order and balanced by
// elements, so gathering the owners' states in rank order lists the
// parameters in order.
std::vector<int64_t> state_owners(const std::vector<Parameter*>& parameters, int64_t ranks);

class AdamW {
 public:
  AdamW(Backend& backend, std::vector<Parameter*> parameters, AdamWOptions options);

  // Clips all gradients to max_grad_norm (one global norm), applies one update
  // with learning rate lr, and returns the global gradient norm before clipping.
  // A non-finite norm (a NaN or Inf gradient) is returned without any update.
  double step(double lr);
  // The same with the squared global norm given: where the norm spans more
  // parameters than these (a pipeline's other stages, or with a sharded
  // state the other ranks' shares).
  double step(double lr, double squared_grad_norm);

  Backend& backend() { return backend_; }
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  // First and second moments of parameters()[i], f32, category optimizer
  // (host tensors when the state is offloaded).
  Tensor& first_moment(size_t i) { return first_moments_[i]; }
  Tensor& second_moment(size_t i) { return second_moments_[i]; }
  // The f32 master of parameters()[i] (the parameter itself when it is f32
  // and the state is on the device).
  Tensor& master(size_t i);
  // dst = src, both f32 and alike in size, where either may be a state tensor
  // above and the other a host tensor: a plain copy when both are on the
  // host (offloaded state), which no device backend's copy takes.
  void copy_state(Tensor& dst, const Tensor& src);
  // Re-derives 16-bit compute copies from the masters (after loading state).
  void sync_compute_copies();

 private:
  void offload_state(Allocator& host);
  // Calls chunk(first, count) for consecutive element ranges of the
  // concatenated parameters, at most offload_chunk_elements each.
  template <class Chunk>
  void for_each_chunk(const Chunk& chunk);
  // The parts of parameter i's flat elements [offset_i, offset_i + n_i) that
  // fall in [first, first + count): (i, offset within i, offset within the chunk, length).
  struct Overlap {
    size_t index;
    int64_t in_parameter, in_chunk, count;
  };
  std::vector<Overlap> overlaps(int64_t first, int64_t count) const;
  void step_offloaded(const AdamWStep& update, const AdamWStep& faster);
  // Whether parameter p steps at LoRA+'s faster rate.
  bool faster(const Parameter& p) const;
  // adamw_update_many over each group that holds a tensor: groups[0] with
  // update, groups[1] (LoRA+'s faster one) with faster.
  void update_groups(const std::vector<AdamWTensors> (&groups)[2], const AdamWStep& update, const AdamWStep& faster);

  Backend& backend_;
  std::vector<Parameter*> parameters_;
  AdamWOptions options_;
  std::vector<Tensor> first_moments_, second_moments_;
  std::vector<Tensor> masters_;  // undefined where the parameter is f32 already (resident state)
  // Offloaded: master, m and v of all parameters concatenated on the host,
  // and where each parameter starts in them.
  Tensor host_masters_, host_first_moments_, host_second_moments_;
  std::vector<int64_t> offsets_;
  int64_t steps_taken_ = 0;
};

}  // namespace ft
