#include "model/layer_stream.h"

#include <algorithm>

#include "kernels/error.h"

namespace ft {

namespace {

// cudaMalloc's alignment: every streamed tensor starts where a kernel's
// vector loads expect a fresh allocation to.
constexpr size_t kSlotAlignBytes = 256;

// t's shape and dtype at byte offset of slot's memory (no data on the meta device).
Tensor view_in(const Tensor& slot, size_t offset, const Tensor& t) {
  Tensor view;
  view.storage = slot.storage;
  view.data = slot.data ? static_cast<char*>(slot.data) + offset : nullptr;
  view.shape = t.shape;
  view.dtype = t.dtype;
  view.device = slot.device;
  return view;
}

}  // namespace

LayerStream::LayerStream(Backend& backend, std::vector<std::vector<Parameter*>> layers, int64_t slots)
    : backend_(backend) {
  FT_CHECK(slots >= 1 && size_t(slots) <= layers.size(), "LayerStream: ", slots, " slots for ", layers.size(),
           " streamed layers (need 1 to ", layers.size(), ")");
  for (const std::vector<Parameter*>& parameters : layers) {
    Layer layer;
    size_t offset = 0;
    for (Parameter* p : parameters)
      for (Tensor* bound : weight_tensors(*p)) {
        const Tensor& host = *bound;
        FT_CHECK(host.device == Device::cpu, "LayerStream: \"", p->name, "\" is not in host memory");
        layer.tensors.push_back({bound, host, offset});
        layer.bytes += host.size_bytes();
        offset += (host.size_bytes() + kSlotAlignBytes - 1) / kSlotAlignBytes * kSlotAlignBytes;
      }
    slot_bytes_ = std::max(slot_bytes_, offset);
    layers_.push_back(std::move(layer));
  }
  for (int64_t s = 0; s < slots; ++s) {
    slots_.push_back(backend_.empty({int64_t(slot_bytes_)}, DType::u8, MemCategory::weights));
    slot_layer_.push_back(-1);
    copied_.push_back(backend_.make_event());
    released_.push_back(backend_.make_event());
  }
}

size_t LayerStream::host_bytes() const {
  size_t bytes = 0;
  for (const Layer& layer : layers_) bytes += layer.bytes;
  return bytes;
}

void LayerStream::prefetch(size_t layer) {
  const size_t s = slot_of(layer);
  if (slot_layer_[s] == int64_t(layer)) return;
  backend_.wait_event(Stream::copy, released_[s]);
  for (const StreamedTensor& t : layers_[layer].tensors) {
    Tensor destination = view_in(slots_[s], t.offset, t.host);
    backend_.copy_async(destination, t.host);
  }
  backend_.record_event(copied_[s], Stream::copy);
  slot_layer_[s] = int64_t(layer);
  copied_bytes_ += layers_[layer].bytes;
}

void LayerStream::acquire(size_t layer, int direction) {
  FT_CHECK(layer < layers_.size() && (direction == 1 || direction == -1) && bound_ < 0,
           "LayerStream::acquire: layer ", layer, " of ", layers_.size(), ", direction ", direction,
           bound_ < 0 ? "" : ", while another layer is acquired");
  prefetch(layer);
  // The slots after this one in the pass: each was last used by a layer
  // already released.
  for (int64_t ahead = 1; ahead < slot_count(); ++ahead) {
    const int64_t next = int64_t(layer) + direction * ahead;
    if (next < 0 || next >= int64_t(layers_.size())) break;
    prefetch(size_t(next));
  }
  const size_t s = slot_of(layer);
  backend_.wait_event(Stream::compute, copied_[s]);
  for (const StreamedTensor& t : layers_[layer].tensors) *t.bound = view_in(slots_[s], t.offset, t.host);
  bound_ = int64_t(layer);
}

void LayerStream::release(size_t layer) {
  FT_CHECK(bound_ == int64_t(layer), "LayerStream::release: layer ", layer, " is not the acquired one");
  backend_.record_event(released_[slot_of(layer)], Stream::compute);
  for (const StreamedTensor& t : layers_[layer].tensors) *t.bound = t.host;
  bound_ = -1;
}

}  // namespace ft
