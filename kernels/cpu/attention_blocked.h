// The CPU attention kernels with the sliding-window parameter of the
// attention ops' contract (0: plain causal; W > 0: key j is visible to query
// i iff j <= i and i - j < W). CpuBackend's attention ops call them on
// checked operands; tests call them directly for windows.
#pragma once
#include <cstdint>

#include "kernels/tensor.h"

namespace ft::cpu {

void attention_forward_blocked(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               float scale, int64_t sliding_window);

void attention_backward_blocked(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                                int64_t sliding_window);

}  // namespace ft::cpu
