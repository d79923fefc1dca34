#include "engine_kernels.hpp"

#include <algorithm>
#include <array>
#include <immintrin.h>
#include <utility>

namespace caf_serving::kernels::cpu {

namespace {

/// Output channels a weight group packs (conv1x1_args::w): four vectors.
constexpr int64_t group_oc = 64;

/// Output pixels of one tile: 4 x 6 accumulators are 24 of the 32 registers.
constexpr int64_t tile_pixels = 6;

/// Input bytes of one chunk of pixels: small enough that the chunk stays in a
/// core's L2 cache while every weight group passes over it.
constexpr int64_t chunk_bytes = 512 * 1024;

/// Input channels per pass over a chunk: 128 x 64 weights (32 KB) stay in L1
/// while every tile of the chunk uses them.
constexpr int64_t pass_ic = 128;

/// One tile: 64 output channels (one weight group) x NP output pixels, over
/// `cblocks` blocks of 16 input channels. Per input channel it loads 4 weight
/// vectors and broadcasts NP input values.
///   x: the tile's first input pixel; xcs: floats between input channel blocks;
///   xps: floats between the tile's input pixels (16 * stride).
///   w: the group's weights for these input channels, rows of 64 floats.
///   y, res: the tile's first output pixel in the group's first channel block;
///   ycs: floats between output channel blocks.
///   first: start from the bias (else from y, the sum of earlier input
///   channels); last: add the residual and apply Relu.
///   pf, pf_lines: cache lines of the next weights to fetch into L2 meanwhile.
template <int NP>
__attribute__((target("avx512f"))) void tile(const float* x, int64_t xcs, int64_t xps,
                                             const float* w, int64_t cblocks, const float* bias,
                                             const float* res, float* y, int64_t ycs, bool first,
                                             bool last, bool relu, const char* pf,
                                             int64_t pf_lines) {
  constexpr int NB = group_oc / 16;
  __m512 acc[NB][NP];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    __m512 init = bias ? _mm512_loadu_ps(bias + 16 * b) : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int p = 0; p < NP; ++p)
      acc[b][p] = first ? init : _mm512_loadu_ps(y + b * ycs + p * 16);
  }
  const int64_t pf_per_block = (pf_lines + cblocks - 1) / cblocks;
  for (int64_t cb = 0; cb < cblocks; ++cb) {
    for (int64_t q = cb * pf_per_block; q < std::min(pf_lines, (cb + 1) * pf_per_block); ++q)
      _mm_prefetch(pf + 64 * q, _MM_HINT_T1);
    const float* xc = x + cb * xcs;
    const float* wc = w + cb * 16 * group_oc;
#pragma GCC unroll 2
    for (int j = 0; j < 16; ++j) {
      __m512 wv[NB];
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b)
        wv[b] = _mm512_loadu_ps(wc + j * group_oc + 16 * b);
#pragma GCC unroll 6
      for (int p = 0; p < NP; ++p) {
        __m512 xv = _mm512_set1_ps(xc[p * xps + j]);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b)
          acc[b][p] = _mm512_fmadd_ps(wv[b], xv, acc[b][p]);
      }
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 6
    for (int p = 0; p < NP; ++p) {
      __m512 v = acc[b][p];
      if (last && res)
        v = _mm512_add_ps(v, _mm512_loadu_ps(res + b * ycs + p * 16));
      if (last && relu)
        v = _mm512_max_ps(v, zero);
      _mm512_storeu_ps(y + b * ycs + p * 16, v);
    }
}

using tile_fn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, const float*,
                         const float*, float*, int64_t, bool, bool, bool, const char*, int64_t);

template <int... NP>
constexpr std::array<tile_fn, sizeof...(NP)> tiles_of(std::integer_sequence<int, NP...>) {
  return {&tile<NP + 1>...};
}

/// tiles[np - 1]: a tile of np pixels.
constexpr std::array<tile_fn, tile_pixels> tiles =
  tiles_of(std::make_integer_sequence<int, tile_pixels>{});

} // namespace

bool engine_conv1x1_supported() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

void engine_conv1x1(const conv1x1_args& a) {
  const int64_t s = a.stride;
  const int64_t oh = (a.ih - 1) / s + 1, ow = (a.iw - 1) / s + 1;
  const int64_t xcs = a.ih * a.iw * 16, ycs = oh * ow * 16;
  const int64_t row0 = a.row_end > 0 ? a.row_begin : 0, row1 = a.row_end > 0 ? a.row_end : oh;
  // Stride 1 reads the rows as one run of pixels; otherwise row by row.
  const int64_t rows = s == 1 ? 1 : row1 - row0, cols = s == 1 ? (row1 - row0) * ow : ow;
  const int64_t first_pixel = row0 * ow;
  const int64_t chunk_pixels = std::max<int64_t>(tile_pixels, chunk_bytes / (a.ic * 4));
  const int64_t chunk_rows = s == 1 ? 1 : std::max<int64_t>(1, chunk_pixels / cols);
  const int64_t chunk_cols = s == 1 ? chunk_pixels / tile_pixels * tile_pixels : cols;
  const int64_t groups = a.oc / group_oc;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r1 = std::min(rows, r0 + chunk_rows);
    for (int64_t c0 = 0; c0 < cols; c0 += chunk_cols) {
      const int64_t c1 = std::min(cols, c0 + chunk_cols);
      const int64_t tiles_here = (r1 - r0) * ((c1 - c0 + tile_pixels - 1) / tile_pixels);
      for (int64_t g = 0; g < groups; ++g) {
        const float* wg = a.w + g * group_oc * a.ic;
        for (int64_t k0 = 0; k0 < a.ic; k0 += pass_ic) {
          const int64_t k1 = std::min(a.ic, k0 + pass_ic);
          const bool first = k0 == 0, last = k1 == a.ic;
          const float* w = wg + k0 * group_oc;
          const float* bias = first && a.bias ? a.bias + g * group_oc : nullptr;
          // The weights of the next pass follow these in memory (the next
          // input channels, or the next group's first): fetch them while
          // these run, a share per tile. Cold weights from memory had cost a
          // third of the speed.
          const bool more = !last || g + 1 < groups;
          const char* next = reinterpret_cast<const char*>(wg + k1 * group_oc);
          const int64_t next_lines =
            more ? std::min(last ? a.ic : a.ic - k1, pass_ic) * group_oc * 4 / 64 : 0;
          const int64_t per_tile = (next_lines + tiles_here - 1) / tiles_here;
          int64_t t = 0;
          for (int64_t r = r0; r < r1; ++r) {
            const float* xrow = a.x + (k0 / 16) * xcs
                                + (s == 1 ? first_pixel * 16 : (row0 + r) * s * a.iw * 16);
            const int64_t yrow = g * (group_oc / 16) * ycs + first_pixel * 16 + r * cols * 16;
            for (int64_t c = c0; c < c1; c += tile_pixels, ++t) {
              const int np = static_cast<int>(std::min(tile_pixels, c1 - c));
              const int64_t pf0 = std::min(next_lines, t * per_tile);
              const int64_t pf1 = std::min(next_lines, pf0 + per_tile);
              tiles[np - 1](xrow + c * s * 16, xcs, s * 16, w, (k1 - k0) / 16, bias,
                            a.residual ? a.residual + yrow + c * 16 : nullptr,
                            a.y + yrow + c * 16, ycs, first, last, a.relu, next + 64 * pf0,
                            pf1 - pf0);
            }
          }
        }
      }
    }
  }
}

} // namespace caf_serving::kernels::cpu
