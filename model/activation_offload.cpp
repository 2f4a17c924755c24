#include "model/activation_offload.h"

#include "kernels/error.h"

namespace ft {

ActivationOffload::Slot& ActivationOffload::slot(size_t layer) {
  if (slots_.size() <= layer) slots_.resize(layer + 1);
  return slots_[layer];
}

Tensor ActivationOffload::host_view(Slot& s) const { return Tensor::view_of(s.host.data, s.shape, s.dtype); }

void ActivationOffload::store(size_t layer, Tensor& input) {
  FT_CHECK(input.defined() && int64_t(layer) > leaving_, "ActivationOffload: layer ", layer,
           " stored out of order or without a checkpoint");
  if (leaving_ >= 0) {  // its copy has had layer `layer`'s work to overlap with
    Slot& previous = slots_[size_t(leaving_)];
    backend_.wait_event(Stream::compute, previous.copied);
    previous.device = Tensor{};
  }
  Slot& s = slot(layer);
  const size_t bytes = input.size_bytes();
  if (!s.host.defined() || s.host.size_bytes() < bytes)
    s.host = Tensor::empty({int64_t(bytes)}, DType::u8, backend_.pinned_host_allocator(), MemCategory::activations);
  s.shape = input.shape;
  s.dtype = input.dtype;
  if (!s.issued.handle) s.issued = backend_.make_event(), s.copied = backend_.make_event();
  backend_.record_event(s.issued, Stream::compute);  // layer `layer` has been issued: its input is complete
  backend_.wait_event(Stream::copy, s.issued);
  Tensor host = host_view(s);
  backend_.copy_async(host, input);
  backend_.record_event(s.copied, Stream::copy);
  s.device = std::move(input);
  input = Tensor{};
  leaving_ = int64_t(layer);
  copied_out_bytes_ += bytes;
}

void ActivationOffload::finish_forward() {
  if (leaving_ < 0) return;
  Slot& last = slots_[size_t(leaving_)];
  backend_.wait_event(Stream::compute, last.copied);
  last.device = Tensor{};
  leaving_ = -1;
}

void ActivationOffload::copy_in(size_t layer) {
  Slot& s = slot(layer);
  FT_CHECK(s.host.defined() && leaving_ < 0, "ActivationOffload: layer ", layer,
           " fetched before its checkpoint was stored and the forward finished");
  s.device = backend_.empty(s.shape, s.dtype, MemCategory::activations);
  // The fresh tensor's memory may be what compute released last: the copy
  // waits for compute to have issued everything before the allocation.
  backend_.record_event(s.issued, Stream::compute);
  backend_.wait_event(Stream::copy, s.issued);
  const Tensor host = host_view(s);
  backend_.copy_async(s.device, host);
  backend_.record_event(s.copied, Stream::copy);
  copied_in_bytes_ += s.device.size_bytes();
}

void ActivationOffload::prefetch(size_t layer) {
  if (!slot(layer).device.defined()) copy_in(layer);
}

Tensor ActivationOffload::fetch(size_t layer) {
  Slot& s = slot(layer);
  if (!s.device.defined()) copy_in(layer);
  backend_.wait_event(Stream::compute, s.copied);
  Tensor device = std::move(s.device);
  s.device = Tensor{};
  return device;
}

size_t ActivationOffload::host_bytes() const {
  size_t bytes = 0;
  for (const Slot& s : slots_) bytes += s.host.defined() ? s.host.size_bytes() : 0;
  return bytes;
}

}  // namespace ft
