#pragma once
/// The engine's exp for softmax arguments x - max <= 0, scalar and on 8 and 16
/// lanes, shared by the kernels of kernels/cpu that normalise scores (the row
/// softmax, paged attention), and its clamped form on 8 and 16 lanes for
/// arguments of either sign (the tanh GELU). All compute the same arithmetic:
/// Cody-Waite reduction to r in [-ln2/2, ln2/2] and Cephes' degree-6
/// polynomial (relative error about 2e-7), scaled by 2^n through the exponent
/// bits; 0 below exp_zero_below (the clamped form: arguments clamped to
/// [-87, 88] instead).
///
///     __m512 e = exp_nonpositive16(_mm512_sub_ps(scores, max)); // in a target("avx512f") function
///
/// Internal to kernels/cpu: the vector forms need their callers compiled for
/// the matching target (a function with __attribute__((target(...)))).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace caf_serving::kernels::cpu {

/// Below this, the softmax's exp is 0. A masked score (torch writes
/// finfo(float32).min, about -3.4e38) used to come out as exp(-87) = 1.6e-38,
/// which the normalisation turns into a subnormal; the matmul with V then
/// runs on subnormals, at a fraction of its speed (a BERT at 160 tokens with
/// 40 of them masked took 2.5x as long). e^-69 = 1e-30 stays a normal number
/// after dividing by any row sum up to 1e8, and what it drops is far below
/// fp32's resolution of the sum.
constexpr float exp_zero_below = -69.0f;

/// exp(x) for x <= 0, one lane. Plain arithmetic, so the loops that call it
/// vectorise (libm's expf does not without -ffast-math).
inline float exp_nonpositive(float x) {
  bool zero = x < exp_zero_below;
  x = std::max(x, -87.0f);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return zero ? 0.0f : y * scale;
}

/// exp(x) on 16 lanes for x clamped to [-87, 88], where 2^n stays a normal
/// float: exp_nonpositive()'s reduction and polynomial without its cut to 0.
/// exp(88) = 1.7e38 keeps a quotient like v / (1 + e) finite (the tanh GELU).
/// GCC leaves a scalar loop of it unvectorised (its AVX-512 clone runs scalar
/// FMAs), so the kernels have these explicit paths.
__attribute__((target("avx512f"))) inline __m512 exp_clamped16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  __m512 n = _mm512_roundscale_ps(
    _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  __m512i bits = _mm512_slli_epi32(
    _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

/// exp_clamped16() on 8 lanes, with AVX2 and FMA.
__attribute__((target("avx2,fma"))) inline __m256 exp_clamped8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  __m256 n = _mm256_floor_ps(
    _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_slli_epi32(
    _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

/// exp_nonpositive() on 16 lanes.
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive16(__m512 x) {
  __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(exp_zero_below), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(keep, exp_clamped16(x));
}

/// exp_nonpositive() on 8 lanes, with AVX2 and FMA.
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive8(__m256 x) {
  __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(exp_zero_below), _CMP_GE_OQ);
  return _mm256_and_ps(keep, exp_clamped8(x));
}

} // namespace caf_serving::kernels::cpu
