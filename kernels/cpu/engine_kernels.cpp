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
