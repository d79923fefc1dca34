#include "engine_kernels.hpp"

#include "cpu_isa.hpp"
#include "vector_exp.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <vector>

namespace caf_serving::kernels::cpu {

namespace {

__attribute__((target("avx512f"))) void softmax_row_avx512(float* p, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 mx = neg_inf;
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, m, p + i));
  }
  const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + i), vmax));
    e = _mm512_maskz_mov_ps(m, e);
    _mm512_mask_storeu_ps(p + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(p + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + i), inv));
  }
}

/// The portable softmax: the loops vectorise for whatever the caller is compiled for.
__attribute__((always_inline)) inline void softmax_row_loops(float* p, int64_t n) {
  float mx = p[0];
#pragma omp simd reduction(max : mx)
  for (int64_t i = 1; i < n; ++i)
    mx = std::max(mx, p[i]);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    p[i] = exp_nonpositive(p[i] - mx);
    sum += p[i];
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    p[i] *= inv;
}

/// The same loops compiled for AVX2 (no FMA: the same arithmetic as the baseline's).
__attribute__((target("avx2"))) void softmax_row_avx2(float* p, int64_t n) {
  softmax_row_loops(p, n);
}

void softmax_row_baseline(float* p, int64_t n) { softmax_row_loops(p, n); }

/// The softmax of engine_isa_level(), so that ONEDNN_MAX_CPU_ISA caps it as it
/// caps oneDNN (target_clones would pick by the CPU alone).
void softmax_row(float* p, int64_t n) {
  static const isa_level level = engine_isa_level();
  if (level >= isa_level::avx512)
    softmax_row_avx512(p, n);
  else if (level >= isa_level::avx2)
    softmax_row_avx2(p, n);
  else
    softmax_row_baseline(p, n);
}

// ---- GELU's tanh approximation ----------------------------------------------------
// 0.5 v (1 + tanh(u)) = v sigmoid(2u) = v / (1 + exp(-2u)), u = sqrt(2/pi) (v + 0.044715 v^3):
// one exp and one division, and no cancellation of 1 + tanh(u) near -1 (for v < -3
// the float form 0.5 v (1 + tanhf(u)) keeps only a few correct bits).

constexpr float gelu_minus_2k = -2.0f * 0.79788456080286536f;             // -2 sqrt(2/pi)
constexpr float gelu_minus_2kc = -2.0f * 0.79788456080286536f * 0.044715f; // times 0.044715

/// x86-64's baseline (SSE2) form, 4 lanes: exp(z) with z clamped to [-87, 88],
/// where 2^n stays a normal float, by the reduction and polynomial of
/// exp_nonpositive() (relative error about 2e-7) without its cut to 0;
/// exp(88) = 1.7e38 keeps v / (1 + e) finite and about 0. Intrinsics, since
/// GCC does not vectorise the clamp of a plain loop (a float comparison may
/// trap), and SSE2 has no floor: truncation, less 1 where it rounded up.
inline __m128 gelu_tanh4(__m128 v) {
  __m128 z = _mm_mul_ps(v, _mm_add_ps(_mm_mul_ps(_mm_mul_ps(v, v), _mm_set1_ps(gelu_minus_2kc)),
                                      _mm_set1_ps(gelu_minus_2k)));
  z = _mm_min_ps(_mm_max_ps(z, _mm_set1_ps(-87.0f)), _mm_set1_ps(88.0f));
  __m128 t = _mm_add_ps(_mm_mul_ps(z, _mm_set1_ps(1.44269504088896341f)), _mm_set1_ps(0.5f));
  __m128i ti = _mm_cvttps_epi32(t);
  // -1 (all bits) in the lanes where truncation rounded up.
  ti = _mm_add_epi32(ti, _mm_castps_si128(_mm_cmpgt_ps(_mm_cvtepi32_ps(ti), t)));
  __m128 n = _mm_cvtepi32_ps(ti);
  __m128 r = _mm_sub_ps(z, _mm_mul_ps(n, _mm_set1_ps(0.693359375f)));
  r = _mm_add_ps(r, _mm_mul_ps(n, _mm_set1_ps(2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.9875691500e-4f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
  __m128 y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), _mm_set1_ps(1.0f));
  __m128i bits = _mm_slli_epi32(_mm_add_epi32(ti, _mm_set1_epi32(127)), 23);
  __m128 e = _mm_mul_ps(y, _mm_castsi128_ps(bits));
  return _mm_div_ps(v, _mm_add_ps(_mm_set1_ps(1.0f), e));
}

__attribute__((target("avx512f"))) inline __m512 gelu_tanh16(__m512 v) {
  __m512 z = _mm512_mul_ps(v, _mm512_fmadd_ps(_mm512_mul_ps(v, v), _mm512_set1_ps(gelu_minus_2kc),
                                              _mm512_set1_ps(gelu_minus_2k)));
  return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_clamped16(z)));
}

__attribute__((target("avx2,fma"))) inline __m256 gelu_tanh8(__m256 v) {
  __m256 z = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_mul_ps(v, v), _mm256_set1_ps(gelu_minus_2kc),
                                              _mm256_set1_ps(gelu_minus_2k)));
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_clamped8(z)));
}

/// One row of `width`: y = gelu_tanh(x + bias) (bias may be null).
__attribute__((target("avx512f"))) void gelu_tanh_row_avx512(const float* x, const float* bias,
                                                             int64_t width, float* y) {
  for (int64_t i = 0; i < width; i += 16) {
    __mmask16 m = width - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (width - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    if (bias)
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + i));
    _mm512_mask_storeu_ps(y + i, m, gelu_tanh16(v));
  }
}

__attribute__((target("avx2,fma"))) void gelu_tanh_row_avx2(const float* x, const float* bias,
                                                            int64_t width, float* y) {
  int64_t i = 0;
  for (; i + 8 <= width; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (bias)
      v = _mm256_add_ps(v, _mm256_loadu_ps(bias + i));
    _mm256_storeu_ps(y + i, gelu_tanh8(v));
  }
  for (; i < width; ++i) // the tail: the same arithmetic, one lane at a time
    y[i] = _mm256_cvtss_f32(gelu_tanh8(_mm256_set1_ps(x[i] + (bias ? bias[i] : 0.f))));
}

void gelu_tanh_row_baseline(const float* x, const float* bias, int64_t width, float* y) {
  int64_t i = 0;
  for (; i + 4 <= width; i += 4) {
    __m128 v = _mm_loadu_ps(x + i);
    if (bias)
      v = _mm_add_ps(v, _mm_loadu_ps(bias + i));
    _mm_storeu_ps(y + i, gelu_tanh4(v));
  }
  for (; i < width; ++i) // the tail: the same arithmetic, one lane at a time
    y[i] = _mm_cvtss_f32(gelu_tanh4(_mm_set1_ps(x[i] + (bias ? bias[i] : 0.f))));
}

/// The row of engine_isa_level(), as softmax_row.
void gelu_tanh_row(const float* x, const float* bias, int64_t width, float* y) {
  static const isa_level level = engine_isa_level();
  if (level >= isa_level::avx512)
    gelu_tanh_row_avx512(x, bias, width, y);
  else if (level >= isa_level::avx2)
    gelu_tanh_row_avx2(x, bias, width, y);
  else
    gelu_tanh_row_baseline(x, bias, width, y);
}

} // namespace

void engine_layer_norm(const layer_norm_args& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.width;
    float* y = a.y + r * a.width;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < a.width; ++i)
      sum += x[i];
    float mean = sum / static_cast<float>(a.width);
    float sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < a.width; ++i)
      sq += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / std::sqrt(sq / static_cast<float>(a.width) + a.epsilon);
    if (a.beta) {
#pragma omp simd
      for (int64_t i = 0; i < a.width; ++i)
        y[i] = (x[i] - mean) * inv * a.gamma[i] + a.beta[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < a.width; ++i)
        y[i] = (x[i] - mean) * inv * a.gamma[i];
    }
  }
}

void engine_gelu(const float* x, const float* bias, int64_t width, int64_t n, float* y,
                 int threads) {
  int64_t rows = n / width;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) {
      float v = x[r * width + i] + (bias ? bias[i] : 0.f);
      y[r * width + i] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    }
}

void engine_gelu_tanh(const float* x, const float* bias, int64_t width, int64_t n, float* y,
                      int threads) {
  int64_t rows = n / width;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    gelu_tanh_row(x + r * width, bias, width, y + r * width);
}

void engine_softmax(float* x, int64_t rows, int64_t width, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    softmax_row(x + r * width, width);
}

void engine_attention(const attention_args& a) {
  const int64_t s = a.seq, d = a.head_dim, hd = a.heads * a.head_dim;
  const int64_t first = a.first_job, last = a.last_job < 0 ? a.batch * a.heads : a.last_job;
#pragma omp parallel num_threads(a.threads)
  {
    std::vector<float> scores(static_cast<size_t>(s * s));
#pragma omp for schedule(static)
    for (int64_t job = first; job < last; ++job) {
      int64_t b = job / a.heads, h = job % a.heads;
      const float* q = a.q + b * s * hd + h * d;
      const float* k = a.k + b * s * hd + h * d;
      const float* v = a.v + b * s * hd + h * d;
      // scores = scale * q_h k_h^T, reading the heads in place through the leading dimension.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s),
                  static_cast<int>(s), static_cast<int>(d), a.scale, q, static_cast<int>(hd), k,
                  static_cast<int>(hd), 0.0f, scores.data(), static_cast<int>(s));
      for (int64_t i = 0; i < s; ++i) {
        float* row = scores.data() + i * s;
        if (a.mask) {
          const float* m = a.mask + b * a.mask_strides[0] + h * a.mask_strides[1]
                           + i * a.mask_strides[2];
          const int64_t ms = a.mask_strides[3];
          if (ms == 1) {
#pragma omp simd
            for (int64_t j = 0; j < s; ++j)
              row[j] += m[j];
          } else {
            for (int64_t j = 0; j < s; ++j)
              row[j] += m[j * ms];
          }
        }
        softmax_row(row, s);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s),
                  static_cast<int>(d), static_cast<int>(s), 1.0f, scores.data(),
                  static_cast<int>(s), v, static_cast<int>(hd), 0.0f,
                  a.out + b * s * hd + h * d, static_cast<int>(hd));
    }
  }
}

} // namespace caf_serving::kernels::cpu
