// exp over arrays of f32 on the vector units: the softmax of attention and
// of cross-entropy, and SiLU's sigmoid, take one exponential per element,
// and a scalar expf call per element cost those loops most of their time
// (attention at 1,024 tokens spent more in expf than in its tile products).
// Cephes' expf: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2
// split in two for an exact-enough r), exp(r) by a degree-7 polynomial, then
// 2^n into the exponent bits; within 2 ulp of exp in float64 (tests/test_ops.cpp
// measures it over the whole range it computes). Below -87.33 (where 2^n would need a subnormal) the
// result is 0, as a softmax of -inf wants; above 88.72 it is +inf; a NaN
// stays NaN. Sixteen lanes with AVX-512 where the CPU has it (chosen at run
// time), eight with AVX2 + FMA (the kernels' x86-64-v3 baseline), the same
// operations on every lane; a scalar expf on builds without AVX2. Compiled
// in vec_exp.cpp with the kernels' -march, so every caller (tests included)
// gets the same arithmetic.
#pragma once
#include <cstdint>

namespace ft::cpu {

// x[i] = exp(x[i]) for i < n; each element's value does not depend on its
// position (a vector lane or the scalar tail compute it alike).
void exp_inplace(float* x, int64_t n);
// One value, as exp_inplace computes it.
float exp1(float x);

}  // namespace ft::cpu
