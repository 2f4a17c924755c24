// Layer streaming of a frozen quantized base (offload.base: host): the
// decoder layers' quantized tensors (codes and constants, whatever the
// format) live in pinned host memory, and the device holds a ring of K
// layer buffers (slots). Layer l always uses slot l % K, so a pass that runs
// the layers in order, forwards or backwards, finds the next K - 1 layers in
// the other slots: acquire(l) issues their copies on the copy stream
// (Backend::copy_async) before layer l computes, and a layer already in its
// slot (the last K of a forward are the first K of the backward) is not
// copied again. Two events per slot order the streams, and the host never
// waits: a copy into a slot waits for the compute stream's release of the
// layer that last used it, and compute waits for the copy before it reads.
// While a layer is acquired its Parameters' tensors are views of its slot;
// otherwise they are the host tensors, which no device op accepts. The slots
// are long-lived weights, never returned to CachingAllocator's cache, so the
// copy stream writing them does not break its one-stream reuse order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/parameter.h"

namespace ft {

class LayerStream {
 public:
  // layers[l]: the parameters of decoder layer l whose tensors are streamed
  // (pinned_host_allocator tensors); slots: K >= 1 (at most layers.size()).
  LayerStream(Backend& backend, std::vector<std::vector<Parameter*>> layers, int64_t slots);

  size_t layer_count() const { return layers_.size(); }
  int64_t slot_count() const { return int64_t(slots_.size()); }
  // One slot: the largest layer's tensors, each at a 256-byte offset.
  size_t slot_bytes() const { return slot_bytes_; }
  // Bytes of one layer's streamed tensors (what one copy moves).
  size_t layer_bytes(size_t layer) const { return layers_[layer].bytes; }
  // Every streamed layer's bytes: what the pinned host memory holds.
  size_t host_bytes() const;
  // Host-to-device bytes copied since construction.
  size_t copied_bytes() const { return copied_bytes_; }

  // Before layer `layer` computes: prefetches the next K - 1 layers in
  // `direction` (+1 forward, -1 backward), makes compute wait for this
  // layer's copy and binds its parameters to its slot. One layer at a time.
  void acquire(size_t layer, int direction);
  // After the layer's last op is issued: the slot is free for the next copy
  // once compute has done that work; the parameters are host tensors again.
  void release(size_t layer);

 private:
  struct StreamedTensor {
    Tensor* bound;  // one of its parameter's weight_tensors
    Tensor host;
    size_t offset;  // in the slot
  };
  struct Layer {
    std::vector<StreamedTensor> tensors;
    size_t bytes = 0;  // without the alignment padding
  };
  // Issues layer's copy into its slot unless the slot holds it already.
  void prefetch(size_t layer);
  size_t slot_of(size_t layer) const { return layer % slots_.size(); }

  Backend& backend_;
  std::vector<Layer> layers_;
  size_t slot_bytes_ = 0;
  std::vector<Tensor> slots_;           // u8 [slot_bytes] on the device, category weights
  std::vector<int64_t> slot_layer_;     // the layer each slot holds (or is receiving); -1: none
  std::vector<StreamEvent> copied_;     // per slot: recorded on copy after its last copy
  std::vector<StreamEvent> released_;   // per slot: recorded on compute after its layer's last op
  int64_t bound_ = -1;                  // the acquired layer
  size_t copied_bytes_ = 0;
};

}  // namespace ft
