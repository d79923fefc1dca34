#include "paged_attention.hpp"

#include "vector_exp.hpp"

#include <algorithm>
#include <cmath>
#include <immintrin.h>
#include <vector>

namespace caf_serving::kernels::cpu {

namespace {

/// One kv head's keys (or values) of a row: the cached ones in the blocks, then the new ones.
struct kv_positions {
  const float* pool_at = nullptr; ///< pool + this layer's key or value offset + the head's rows
  const float* fresh = nullptr;   ///< the first new position of this head
  const int32_t* blocks = nullptr;
  int64_t context = 0, block_tokens = 1, block_floats = 0, head_dim = 0, fresh_stride = 0;
};

/// Hands out positions 0, 1, 2, ... of kv_positions in order, walking the
/// blocks without a division per position.
class position_cursor {
public:
  explicit position_cursor(const kv_positions& p) : p_(p) { enter_block(); }

  const float* next() {
    const float* at;
    if (j_ < p_.context) {
      at = block_at_ + in_block_ * p_.head_dim;
      if (++in_block_ == p_.block_tokens) {
        in_block_ = 0;
        ++block_;
        enter_block();
      }
    } else {
      at = p_.fresh + (j_ - p_.context) * p_.fresh_stride;
    }
    ++j_;
    return at;
  }

private:
  void enter_block() {
    if (block_ * p_.block_tokens < p_.context)
      block_at_ = p_.pool_at + static_cast<int64_t>(p_.blocks[block_]) * p_.block_floats;
  }

  const kv_positions& p_;
  int64_t j_ = 0, block_ = 0, in_block_ = 0;
  const float* block_at_ = nullptr;
};

/// Per-thread scratch for the scores (then unnormalised probabilities) of up
/// to four queries, grown to the largest row seen: a steady state allocates nothing.
float* scores_for(int64_t floats) {
  thread_local std::vector<float> scores;
  if (static_cast<int64_t>(scores.size()) < floats)
    scores.resize(static_cast<size_t>(floats));
  return scores.data();
}

/// A kv head's queries: query qi = s * group + g is head hk * group + g at position s.
struct query_set {
  const paged_attention_args& a;
  int64_t hk = 0, group = 1;
  const float* q(int64_t qi) const {
    return a.q + ((qi / group) * a.heads + hk * group + qi % group) * a.head_dim;
  }
  float* y(int64_t qi) const {
    return a.y + ((qi / group) * a.heads + hk * group + qi % group) * a.head_dim;
  }
  /// Positions query qi attends to.
  int64_t length(int64_t qi) const { return a.context + qi / group + 1; }
};

kv_positions positions_of(const paged_attention_args& a, int64_t hk, int64_t offset,
                     const float* fresh) {
  kv_positions p;
  p.pool_at = a.pool ? a.pool + offset + hk * a.block_tokens * a.head_dim : nullptr;
  p.fresh = fresh + hk * a.head_dim;
  p.blocks = a.blocks;
  p.context = a.context;
  p.block_tokens = a.block_tokens;
  p.block_floats = a.block_floats;
  p.head_dim = a.head_dim;
  p.fresh_stride = a.kv_heads * a.head_dim;
  return p;
}

// ---- Portable ------------------------------------------------------------------------

/// The baseline level: per query, four partial sums per dot product (the loop
/// the compiler vectorises for SSE2), the engine's exp, and the value sum.
void paged_attention_baseline(const paged_attention_args& a) {
  const int64_t group = a.heads / a.kv_heads, D = a.head_dim;
  float* e = scores_for(a.context + a.new_positions);
  for (int64_t hk = 0; hk < a.kv_heads; ++hk) {
    const query_set qs{a, hk, group};
    const kv_positions keys = positions_of(a, hk, a.key_offset, a.new_keys);
    const kv_positions values = positions_of(a, hk, a.value_offset, a.new_values);
    for (int64_t qi = 0; qi < group * a.new_positions; ++qi) {
      const float* q = qs.q(qi);
      const int64_t length = qs.length(qi);
      position_cursor k(keys);
      float mx = -INFINITY;
      for (int64_t j = 0; j < length; ++j) {
        const float* key = k.next();
        float p[4] = {0.f, 0.f, 0.f, 0.f};
        int64_t d = 0;
        for (; d + 4 <= D; d += 4)
          for (int i = 0; i < 4; ++i)
            p[i] += q[d + i] * key[d + i];
        for (; d < D; ++d)
          p[0] += q[d] * key[d];
        e[j] = ((p[0] + p[1]) + (p[2] + p[3])) * a.scale;
        mx = std::max(mx, e[j]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < length; ++j) {
        e[j] = exp_nonpositive(e[j] - mx);
        sum += e[j];
      }
      float* y = qs.y(qi);
      std::fill(y, y + D, 0.f);
      position_cursor v(values);
      for (int64_t j = 0; j < length; ++j) {
        const float* value = v.next();
        for (int64_t d = 0; d < D; ++d)
          y[d] += e[j] * value[d];
      }
      const float inv = 1.f / sum;
      for (int64_t d = 0; d < D; ++d)
        y[d] *= inv;
    }
  }
}

// ---- AVX-512 -------------------------------------------------------------------------

/// Lane i of the result is the sum of the 16 lanes of x[i].
__attribute__((target("avx512f"), always_inline)) inline __m512 reduce16(const __m512* x) {
  __m512 a[8], b[4], c[2];
  // Pairs: within each 128-bit lane, [x0+x2, y0+y2, x1+x3, y1+y3].
  for (int i = 0; i < 8; ++i)
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                         _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  // Quads: within each 128-bit lane, one partial sum of each of four inputs.
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Across 128-bit lanes: halves, then the whole.
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

__attribute__((target("avx512f"), always_inline)) inline __mmask16 tail16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

/// Scores of NQ queries (consecutive, from qi0) against positions [0, length)
/// scaled, NK = 16 / NQ positions at a time: 16 accumulators, one reduction.
template <int NQ>
__attribute__((target("avx512f"))) void scores_avx512(const query_set& qs, int64_t qi0,
                                                      const kv_positions& keys, int64_t length,
                                                      float* e, int64_t e_stride) {
  constexpr int NK = 16 / NQ;
  const int64_t D = qs.a.head_dim;
  const float* q[NQ];
  for (int i = 0; i < NQ; ++i)
    q[i] = qs.q(qi0 + i);
  const __m512 scale = _mm512_set1_ps(qs.a.scale);
  position_cursor cursor(keys);
  alignas(64) float lanes[16];
  for (int64_t j0 = 0; j0 < length; j0 += NK) {
    const float* k[NK];
    const int64_t here = std::min<int64_t>(NK, length - j0);
    for (int i = 0; i < NK; ++i)
      k[i] = i < here ? cursor.next() : k[0];
    __m512 acc[16];
    for (int i = 0; i < 16; ++i)
      acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = tail16(D - d);
      __m512 kv[NK];
      for (int i = 0; i < NK; ++i)
        kv[i] = _mm512_maskz_loadu_ps(m, k[i] + d);
      for (int r = 0; r < NQ; ++r) {
        const __m512 qv = _mm512_maskz_loadu_ps(m, q[r] + d);
        for (int i = 0; i < NK; ++i)
          acc[r * NK + i] = _mm512_fmadd_ps(qv, kv[i], acc[r * NK + i]);
      }
    }
    _mm512_store_ps(lanes, _mm512_mul_ps(reduce16(acc), scale));
    for (int r = 0; r < NQ; ++r)
      for (int64_t i = 0; i < here; ++i)
        e[r * e_stride + j0 + i] = lanes[r * NK + i];
  }
}

/// Query qi's scores e[0, length) become exp(score - max), zero on [length,
/// padded); returns their sum.
__attribute__((target("avx512f"))) float exp_scores_avx512(float* e, int64_t length,
                                                           int64_t padded) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 mx = neg_inf;
  for (int64_t j = 0; j < length; j += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail16(length - j), e + j));
  const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; j += 16) {
    const __mmask16 m = tail16(length - j);
    __m512 x = _mm512_maskz_mov_ps(m, exp_nonpositive16(
                                        _mm512_sub_ps(_mm512_maskz_loadu_ps(m, e + j), vmax)));
    _mm512_mask_storeu_ps(e + j, m, x);
    sum = _mm512_add_ps(sum, x);
  }
  std::fill(e + length, e + padded, 0.f);
  return _mm512_reduce_add_ps(sum);
}

/// y of NQ queries for head_dim floats [d0, d0 + 16 * DC), from their
/// probabilities e (rows of e_stride, zero past each query's length) over
/// positions [0, length): each value chunk loaded once for the NQ queries.
template <int NQ, int DC>
__attribute__((target("avx512f"))) void values_avx512(const query_set& qs, int64_t qi0,
                                                      const kv_positions& values,
                                                      int64_t length, const float* e,
                                                      int64_t e_stride, const float* inv,
                                                      int64_t d0) {
  const int64_t D = qs.a.head_dim;
  __mmask16 m[DC];
  for (int c = 0; c < DC; ++c)
    m[c] = tail16(D - d0 - 16 * c);
  __m512 acc[NQ][DC];
  for (int r = 0; r < NQ; ++r)
    for (int c = 0; c < DC; ++c)
      acc[r][c] = _mm512_setzero_ps();
  position_cursor cursor(values);
  for (int64_t j = 0; j < length; ++j) {
    const float* v = cursor.next() + d0;
    __m512 vv[DC];
    for (int c = 0; c < DC; ++c)
      vv[c] = _mm512_maskz_loadu_ps(m[c], v + 16 * c);
    for (int r = 0; r < NQ; ++r) {
      const __m512 p = _mm512_set1_ps(e[r * e_stride + j]);
      for (int c = 0; c < DC; ++c)
        acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NQ; ++r) {
    float* y = qs.y(qi0 + r) + d0;
    const __m512 s = _mm512_set1_ps(inv[r]);
    for (int c = 0; c < DC; ++c)
      _mm512_mask_storeu_ps(y + 16 * c, m[c], _mm512_mul_ps(acc[r][c], s));
  }
}

template <int NQ>
__attribute__((target("avx512f"))) void values_avx512_all(const query_set& qs, int64_t qi0,
                                                          const kv_positions& values,
                                                          int64_t length, const float* e,
                                                          int64_t e_stride, const float* inv) {
  const int64_t D = qs.a.head_dim;
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    switch (std::min<int64_t>(4, (D - d0 + 15) / 16)) {
      case 1: values_avx512<NQ, 1>(qs, qi0, values, length, e, e_stride, inv, d0); break;
      case 2: values_avx512<NQ, 2>(qs, qi0, values, length, e, e_stride, inv, d0); break;
      case 3: values_avx512<NQ, 3>(qs, qi0, values, length, e, e_stride, inv, d0); break;
      default: values_avx512<NQ, 4>(qs, qi0, values, length, e, e_stride, inv, d0); break;
    }
  }
}

/// NQ queries from qi0 of one kv head, all three passes.
template <int NQ>
__attribute__((target("avx512f"))) void tile_avx512(const query_set& qs, int64_t qi0,
                                                    const kv_positions& keys,
                                                    const kv_positions& values, float* e) {
  const int64_t longest = qs.length(qi0 + NQ - 1);
  const int64_t stride = qs.a.context + qs.a.new_positions;
  scores_avx512<NQ>(qs, qi0, keys, longest, e, stride);
  float inv[NQ];
  for (int r = 0; r < NQ; ++r)
    inv[r] = 1.f / exp_scores_avx512(e + r * stride, qs.length(qi0 + r), longest);
  values_avx512_all<NQ>(qs, qi0, values, longest, e, stride, inv);
}

__attribute__((target("avx512f"))) void paged_attention_avx512(const paged_attention_args& a) {
  const int64_t group = a.heads / a.kv_heads, queries = group * a.new_positions;
  float* e = scores_for(4 * (a.context + a.new_positions));
  for (int64_t hk = 0; hk < a.kv_heads; ++hk) {
    const query_set qs{a, hk, group};
    const kv_positions keys = positions_of(a, hk, a.key_offset, a.new_keys);
    const kv_positions values = positions_of(a, hk, a.value_offset, a.new_values);
    int64_t qi = 0;
    for (; qi + 4 <= queries; qi += 4)
      tile_avx512<4>(qs, qi, keys, values, e);
    for (; qi + 2 <= queries; qi += 2)
      tile_avx512<2>(qs, qi, keys, values, e);
    for (; qi < queries; ++qi)
      tile_avx512<1>(qs, qi, keys, values, e);
  }
}

// ---- AVX2 and FMA --------------------------------------------------------------------

/// Lane i of the result is the sum of the 8 lanes of x[i].
__attribute__((target("avx2,fma"), always_inline)) inline __m256 reduce8(const __m256* x) {
  __m256 a[4], b[2];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_add_ps(_mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                         _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                       _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

/// Lanes [0, n) set (all for n >= 8), for _mm256_maskload_ps.
__attribute__((target("avx2,fma"), always_inline)) inline __m256i tail8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2,fma"), always_inline)) inline float sum8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"), always_inline)) inline float max8(__m256 x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int NQ>
__attribute__((target("avx2,fma"))) void scores_avx2(const query_set& qs, int64_t qi0,
                                                     const kv_positions& keys, int64_t length,
                                                     float* e, int64_t e_stride) {
  constexpr int NK = 8 / NQ;
  const int64_t D = qs.a.head_dim;
  const float* q[NQ];
  for (int i = 0; i < NQ; ++i)
    q[i] = qs.q(qi0 + i);
  const __m256 scale = _mm256_set1_ps(qs.a.scale);
  position_cursor cursor(keys);
  alignas(32) float lanes[8];
  for (int64_t j0 = 0; j0 < length; j0 += NK) {
    const float* k[NK];
    const int64_t here = std::min<int64_t>(NK, length - j0);
    for (int i = 0; i < NK; ++i)
      k[i] = i < here ? cursor.next() : k[0];
    __m256 acc[8];
    for (int i = 0; i < 8; ++i)
      acc[i] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
      __m256 kv[NK];
      for (int i = 0; i < NK; ++i)
        kv[i] = _mm256_loadu_ps(k[i] + d);
      for (int r = 0; r < NQ; ++r) {
        const __m256 qv = _mm256_loadu_ps(q[r] + d);
        for (int i = 0; i < NK; ++i)
          acc[r * NK + i] = _mm256_fmadd_ps(qv, kv[i], acc[r * NK + i]);
      }
    }
    if (d < D) {
      const __m256i m = tail8(D - d);
      __m256 kv[NK];
      for (int i = 0; i < NK; ++i)
        kv[i] = _mm256_maskload_ps(k[i] + d, m);
      for (int r = 0; r < NQ; ++r) {
        const __m256 qv = _mm256_maskload_ps(q[r] + d, m);
        for (int i = 0; i < NK; ++i)
          acc[r * NK + i] = _mm256_fmadd_ps(qv, kv[i], acc[r * NK + i]);
      }
    }
    _mm256_store_ps(lanes, _mm256_mul_ps(reduce8(acc), scale));
    for (int r = 0; r < NQ; ++r)
      for (int64_t i = 0; i < here; ++i)
        e[r * e_stride + j0 + i] = lanes[r * NK + i];
  }
}

__attribute__((target("avx2,fma"))) float exp_scores_avx2(float* e, int64_t length,
                                                          int64_t padded) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= length; j += 8)
    mx = _mm256_max_ps(mx, _mm256_loadu_ps(e + j));
  float top = max8(mx);
  for (int64_t t = j; t < length; ++t)
    top = std::max(top, e[t]);
  const __m256 vmax = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= length; j += 8) {
    __m256 x = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(e + j), vmax));
    _mm256_storeu_ps(e + j, x);
    sum = _mm256_add_ps(sum, x);
  }
  float total = sum8(sum);
  for (; j < length; ++j) {
    e[j] = exp_nonpositive(e[j] - top);
    total += e[j];
  }
  std::fill(e + length, e + padded, 0.f);
  return total;
}

template <int NQ, int DC>
__attribute__((target("avx2,fma"))) void values_avx2(const query_set& qs, int64_t qi0,
                                                     const kv_positions& values, int64_t length,
                                                     const float* e, int64_t e_stride,
                                                     const float* inv, int64_t d0) {
  const int64_t D = qs.a.head_dim;
  __m256i m[DC];
  for (int c = 0; c < DC; ++c)
    m[c] = tail8(D - d0 - 8 * c);
  const bool whole = D - d0 >= 8 * DC;
  __m256 acc[NQ][DC];
  for (int r = 0; r < NQ; ++r)
    for (int c = 0; c < DC; ++c)
      acc[r][c] = _mm256_setzero_ps();
  position_cursor cursor(values);
  for (int64_t j = 0; j < length; ++j) {
    const float* v = cursor.next() + d0;
    __m256 vv[DC];
    if (whole)
      for (int c = 0; c < DC; ++c)
        vv[c] = _mm256_loadu_ps(v + 8 * c);
    else
      for (int c = 0; c < DC; ++c)
        vv[c] = _mm256_maskload_ps(v + 8 * c, m[c]);
    for (int r = 0; r < NQ; ++r) {
      const __m256 p = _mm256_broadcast_ss(e + r * e_stride + j);
      for (int c = 0; c < DC; ++c)
        acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NQ; ++r) {
    float* y = qs.y(qi0 + r) + d0;
    const __m256 s = _mm256_set1_ps(inv[r]);
    for (int c = 0; c < DC; ++c)
      _mm256_maskstore_ps(y + 8 * c, m[c], _mm256_mul_ps(acc[r][c], s));
  }
}

template <int NQ>
__attribute__((target("avx2,fma"))) void values_avx2_all(const query_set& qs, int64_t qi0,
                                                         const kv_positions& values,
                                                         int64_t length, const float* e,
                                                         int64_t e_stride, const float* inv) {
  const int64_t D = qs.a.head_dim;
  // Up to 4 chunks of 8 per pass: 4 * NQ accumulators of the 16 registers.
  for (int64_t d0 = 0; d0 < D; d0 += 32) {
    switch (std::min<int64_t>(4, (D - d0 + 7) / 8)) {
      case 1: values_avx2<NQ, 1>(qs, qi0, values, length, e, e_stride, inv, d0); break;
      case 2: values_avx2<NQ, 2>(qs, qi0, values, length, e, e_stride, inv, d0); break;
      case 3: values_avx2<NQ, 3>(qs, qi0, values, length, e, e_stride, inv, d0); break;
      default: values_avx2<NQ, 4>(qs, qi0, values, length, e, e_stride, inv, d0); break;
    }
  }
}

template <int NQ>
__attribute__((target("avx2,fma"))) void tile_avx2(const query_set& qs, int64_t qi0,
                                                   const kv_positions& keys,
                                                   const kv_positions& values, float* e) {
  const int64_t longest = qs.length(qi0 + NQ - 1);
  const int64_t stride = qs.a.context + qs.a.new_positions;
  scores_avx2<NQ>(qs, qi0, keys, longest, e, stride);
  float inv[NQ];
  for (int r = 0; r < NQ; ++r)
    inv[r] = 1.f / exp_scores_avx2(e + r * stride, qs.length(qi0 + r), longest);
  values_avx2_all<NQ>(qs, qi0, values, longest, e, stride, inv);
}

__attribute__((target("avx2,fma"))) void paged_attention_avx2(const paged_attention_args& a) {
  const int64_t group = a.heads / a.kv_heads, queries = group * a.new_positions;
  float* e = scores_for(4 * (a.context + a.new_positions));
  for (int64_t hk = 0; hk < a.kv_heads; ++hk) {
    const query_set qs{a, hk, group};
    const kv_positions keys = positions_of(a, hk, a.key_offset, a.new_keys);
    const kv_positions values = positions_of(a, hk, a.value_offset, a.new_values);
    int64_t qi = 0;
    for (; qi + 4 <= queries; qi += 4)
      tile_avx2<4>(qs, qi, keys, values, e);
    for (; qi + 2 <= queries; qi += 2)
      tile_avx2<2>(qs, qi, keys, values, e);
    for (; qi < queries; ++qi)
      tile_avx2<1>(qs, qi, keys, values, e);
  }
}

} // namespace

void engine_paged_attention(const paged_attention_args& a) {
  if (a.level >= isa_level::avx512)
    paged_attention_avx512(a);
  else if (a.level >= isa_level::avx2)
    paged_attention_avx2(a);
  else
    paged_attention_baseline(a);
}

} // namespace caf_serving::kernels::cpu
