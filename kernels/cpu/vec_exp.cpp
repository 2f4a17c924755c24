// See vec_exp.h.
#include "kernels/cpu/vec_exp.h"

#include <cmath>

#include "kernels/cpu/isa.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace ft::cpu {

namespace {

#ifdef __AVX2__
__m256 exp8(__m256 x) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 lo = _mm256_set1_ps(-87.3365447505f), hi = _mm256_set1_ps(88.7228391117f);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
  r = _mm256_fnmadd_ps(n, ln2_lo, r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n for n in [-126, 128] as 2^(n >> 1) 2^(n - (n >> 1)), both factors
  // normal (2^128 alone is not); the lanes outside are replaced below.
  const __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 scale2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  __m256 out = _mm256_mul_ps(_mm256_mul_ps(y, scale1), scale2);
  out = _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  out = _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(out, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN in, NaN out
}

// exp8's arithmetic sixteen lanes at a time, for CPUs with AVX-512 (picked
// at run time: kernels/cpu/isa.h): the same operations on each lane, so the same values.
#define FT_AVX512_EXP __attribute__((target("avx512f,avx512dq")))

FT_AVX512_EXP __m512 exp16(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __m512 lo = _mm512_set1_ps(-87.3365447505f), hi = _mm512_set1_ps(88.7228391117f);
  // The masked forms with every lane set: GCC 12's unmasked ones pass an
  // undefined source vector, which -Wmaybe-uninitialized reports.
  const __mmask16 all = 0xffff;
  const __m512i zero = _mm512_setzero_si512();
  const __m512 n =
      _mm512_mask_roundscale_ps(x, all, _mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_mask_cvtps_epi32(zero, all, n), half = _mm512_mask_srai_epi32(zero, all, ni, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 scale1 = _mm512_castsi512_ps(_mm512_mask_slli_epi32(zero, all, _mm512_add_epi32(half, bias), 23));
  const __m512 scale2 =
      _mm512_castsi512_ps(_mm512_mask_slli_epi32(zero, all, _mm512_add_epi32(_mm512_sub_epi32(ni, half), bias), 23));
  __m512 out = _mm512_mul_ps(_mm512_mul_ps(y, scale1), scale2);
  out = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), out, _mm512_setzero_ps());
  out = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), out, _mm512_set1_ps(INFINITY));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), out, x);  // NaN in, NaN out
}

// exp_inplace's whole vectors; returns how many elements it did.
FT_AVX512_EXP int64_t exp_inplace16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_loadu_ps(x + i)));
  return i;
}
#endif

}  // namespace

float exp1(float x) {
#ifdef __AVX2__
  return _mm256_cvtss_f32(exp8(_mm256_set1_ps(x)));
#else
  return std::exp(x);
#endif
}

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#ifdef __AVX2__
  if (avx512_enabled()) i = exp_inplace16(x, n);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = exp1(x[i]);
}

}  // namespace ft::cpu
