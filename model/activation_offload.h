// Checkpoint offload (offload.activations: host): under per-layer
// checkpointing the forward keeps one tensor per decoder layer, its input
// [B, T, C], for the layer's recomputation before its backward. At long
// contexts these alone fill the device (Llama-3.1-8B: 32 x T x 4096 x 2 B,
// 8 GiB at 32K tokens), so each goes to pinned host memory as the forward
// leaves its layer and comes back ahead of the layer's recomputation, on
// the copy stream (Backend::copy_async), ordered by events as
// model/layer_stream.h orders the weights:
//   - out: the copy of layer k's input waits for compute to have issued
//     layer k; the device tensor is released once layer k + 1 has been
//     issued too and compute has waited for the copy, so the copy overlaps
//     layer k + 1 and the host never waits;
//   - back: before layer k's backward, layer k - 1's copy back is issued
//     into a fresh device tensor (the copy waiting for compute to have
//     issued everything before its allocation), and compute waits for a
//     copy only before it reads the tensor.
// Copies move bytes, so the offloaded step equals the resident one bit for
// bit. The host buffers live as long as the model (cudaFreeHost would
// synchronise the device every step) and grow to the largest step seen.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/backend.h"

namespace ft {

class ActivationOffload {
 public:
  explicit ActivationOffload(Backend& backend) : backend_(backend) {}

  // After layer k's forward is issued: moves `input` (its checkpoint) out;
  // `input` is left undefined. Layers arrive in order from the first (the
  // caller keeps the last layer's: the backward starts with it).
  void store(size_t layer, Tensor& input);
  // After the forward: releases the last device tensor still being copied
  // out (compute waits for its copy).
  void finish_forward();
  // Issues the copy of layer k's checkpoint back to the device, unless it is
  // on its way already: before the backward of the layer after it.
  void prefetch(size_t layer);
  // Before layer k's recomputation: its checkpoint on the device, ready for
  // compute (copied back now if it was not prefetched).
  Tensor fetch(size_t layer);

  // Pinned host bytes the checkpoints occupy (capacity, for the planner).
  size_t host_bytes() const;
  // Bytes copied each way since construction.
  size_t copied_out_bytes() const { return copied_out_bytes_; }
  size_t copied_in_bytes() const { return copied_in_bytes_; }

 private:
  struct Slot {
    Tensor host;            // pinned, capacity bytes as u8
    Shape shape;            // the checkpoint's
    DType dtype = DType::u8;
    Tensor device;          // on its way out (store) or in (prefetch)
    StreamEvent issued;     // recorded on compute before a copy that must follow its work
    StreamEvent copied;     // recorded on the copy stream after its last copy
  };
  Slot& slot(size_t layer);
  Tensor host_view(Slot& s) const;
  // Issues the copy of layer's checkpoint back to a fresh device tensor.
  void copy_in(size_t layer);

  Backend& backend_;
  std::vector<Slot> slots_;
  int64_t leaving_ = -1;  // the layer whose device tensor is still being copied out
  size_t copied_out_bytes_ = 0, copied_in_bytes_ = 0;
};

}  // namespace ft
