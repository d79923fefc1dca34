#include "engine_kernels.hpp"

#include "cpu_isa.hpp"

#include <algorithm>
#include <array>
#include <immintrin.h>
#include <utility>

namespace caf_serving::kernels::cpu {

namespace {

/// Output channels of one tile (a group): four blocks of 16, four vectors.
constexpr int64_t group_oc = 64;

/// Most output pixels of one tile: 4 x 6 accumulators, 4 weight vectors and a
/// broadcast are 29 of the 32 registers.
constexpr int64_t tile_pixels = 6;

/// Input bytes of one chunk of output pixels: small enough that the input it
/// reads stays in a core's L2 cache while every weight group passes over it.
constexpr int64_t chunk_bytes = 512 * 1024;

/// Weight bytes of one pass (its input channels, all taps, one group): they
/// stay in L1 while every tile of the chunk uses them.
constexpr int64_t pass_bytes = 32 * 1024;

/// What one input pixel reads where the kernel window leaves the image.
alignas(64) constexpr float zeros[16] = {};

/// The geometry every tile of one call shares.
struct geometry {
  const float* x;   ///< the image
  int64_t xcs;      ///< floats between input channel blocks
  int64_t ycs;      ///< floats between output channel blocks
  int64_t ih, iw, ow, kh, kw, sh, sw, pt, pl;
  int64_t wbs;      ///< floats between the weights of two blocks of 16 output channels
};

/// The FMAs of one tile at one tap: `cbs` blocks of 16 input channels. xq:
/// each pixel's input at the first block; step: to the next block (0 for a
/// pixel reading the padding), or, with Inside, every pixel steps by the
/// distance between channel blocks. wt: the weights of the first block at
/// this tap. Prefetches `per_block` of `pf_lines` lines (from pf, in each of
/// the four blocks of output channels) per channel block.
template <int NP, bool Inside>
__attribute__((target("avx512f"), always_inline)) inline void
blocks(__m512 (&acc)[4][NP], const float* const (&xq0)[NP], const int64_t (&step)[NP],
       const float* wt, int64_t taps, int64_t cbs, const geometry& g, const char* pf,
       int64_t per_block, int64_t pf_lines) {
  constexpr int NB = 4;
  const float* xq[NP];
  for (int p = 0; p < NP; ++p)
    xq[p] = xq0[p];
  int64_t at = 0, pf_next = 0;
  for (int64_t cb = 0; cb < cbs; ++cb) {
    for (int64_t q = 0; q < per_block && pf_next < pf_lines; ++q, ++pf_next)
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b)
        _mm_prefetch(pf + 4 * b * g.wbs + 64 * pf_next, _MM_HINT_T1);
    const float* wc = wt + cb * taps * 256;
#pragma GCC unroll 2
    for (int j = 0; j < 16; ++j) {
      __m512 wv[NB];
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b)
        wv[b] = _mm512_loadu_ps(wc + b * g.wbs + j * 16);
#pragma GCC unroll 6
      for (int p = 0; p < NP; ++p) {
        __m512 xv = _mm512_set1_ps(xq[p][at + j]);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b)
          acc[b][p] = _mm512_fmadd_ps(wv[b], xv, acc[b][p]);
      }
    }
    if constexpr (Inside) {
      at += g.xcs;
    } else {
#pragma GCC unroll 6
      for (int p = 0; p < NP; ++p)
        xq[p] += step[p];
    }
  }
}

/// One tile: 64 output channels (one weight group) x NP consecutive output
/// pixels (row-major, so a tile may wrap to the next row), over input channel
/// blocks [cb0, cb1) and every tap of the window. Per tap and input channel it
/// loads 4 weight vectors and broadcasts NP input values; a pixel whose tap
/// falls in the padding reads zeros.
///   p0: the tile's first output pixel; w: the weights of the group's first
///   block of 16 output channels at input channel block cb0 and tap 0; y, res:
///   the tile's first output pixel in the group's first channel block.
///   first: start from the bias (else from y, the sum of earlier input
///   channels); last: add the residual and apply Relu.
///   pf, pf_lines: the next weights to fetch into L2 meanwhile: pf_lines cache
///   lines from pf in each of the group's four blocks of output channels.
template <int NP>
__attribute__((target("avx512f"))) void tile(const geometry& g, int64_t p0, int64_t cb0,
                                             int64_t cb1, const float* w, const float* bias,
                                             const float* res, float* y, bool first, bool last,
                                             bool relu, const char* pf, int64_t pf_lines) {
  constexpr int NB = group_oc / 16;
  __m512 acc[NB][NP];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    __m512 init = bias ? _mm512_loadu_ps(bias + 16 * b) : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int p = 0; p < NP; ++p)
      acc[b][p] = first ? init : _mm512_loadu_ps(y + b * g.ycs + p * 16);
  }
  // The top-left input pixel of each output pixel's window.
  int64_t iy0[NP], ix0[NP];
  for (int64_t p = 0, oy = p0 / g.ow, ox = p0 % g.ow; p < NP; ++p) {
    iy0[p] = oy * g.sh - g.pt;
    ix0[p] = ox * g.sw - g.pl;
    if (++ox == g.ow) {
      ox = 0;
      ++oy;
    }
  }
  const int64_t taps = g.kh * g.kw;
  // The prefetches spread over the channel blocks of every tap: a burst of
  // them at the start of a tile stalled it.
  const int64_t pf_per_block = (pf_lines + taps * (cb1 - cb0) - 1) / (taps * (cb1 - cb0));
  int64_t pf_next = 0;
  for (int64_t ky = 0; ky < g.kh; ++ky)
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      // Each pixel's input at this tap and the first channel block, and the
      // step to the next block (0 for a pixel reading the padding).
      const float* xq[NP];
      int64_t step[NP];
      bool any = false, all = true;
      for (int p = 0; p < NP; ++p) {
        int64_t iy = iy0[p] + ky, ix = ix0[p] + kx;
        bool in = iy >= 0 && iy < g.ih && ix >= 0 && ix < g.iw;
        xq[p] = in ? g.x + cb0 * g.xcs + (iy * g.iw + ix) * 16 : zeros;
        step[p] = in ? g.xcs : 0;
        any = any || in;
        all = all && in;
      }
      if (!any)
        continue;
      const float* wt = w + (ky * g.kw + kx) * 256;
      // Where every pixel is inside the image (all 1x1 layers) one offset
      // steps all of them, which costs a twentieth less than stepping each
      // pixel's pointer.
      const char* pf_here = pf + 64 * pf_next;
      const int64_t pf_here_lines = std::min(pf_lines - pf_next, pf_per_block * (cb1 - cb0));
      pf_next += pf_here_lines;
      if (all)
        blocks<NP, true>(acc, xq, step, wt, taps, cb1 - cb0, g, pf_here, pf_per_block,
                         pf_here_lines);
      else
        blocks<NP, false>(acc, xq, step, wt, taps, cb1 - cb0, g, pf_here, pf_per_block,
                          pf_here_lines);
    }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 6
    for (int p = 0; p < NP; ++p) {
      __m512 v = acc[b][p];
      if (last && res)
        v = _mm512_add_ps(v, _mm512_loadu_ps(res + b * g.ycs + p * 16));
      if (last && relu)
        v = _mm512_max_ps(v, zero);
      _mm512_storeu_ps(y + b * g.ycs + p * 16, v);
    }
}

using tile_fn = void (*)(const geometry&, int64_t, int64_t, int64_t, const float*, const float*,
                         const float*, float*, bool, bool, bool, const char*, int64_t);

template <int... NP>
constexpr std::array<tile_fn, sizeof...(NP)> tiles_of(std::integer_sequence<int, NP...>) {
  return {&tile<NP + 1>...};
}

/// tiles[np - 1]: a tile of np pixels.
constexpr std::array<tile_fn, tile_pixels> tiles =
  tiles_of(std::make_integer_sequence<int, tile_pixels>{});

} // namespace

bool engine_conv_supported() { return engine_isa_level() >= isa_level::avx512; }

void engine_conv(const conv_args& a) {
  const int64_t taps = a.kh * a.kw;
  const int64_t wbs = a.ic / 16 * taps * 256;
  const geometry geo{a.x, a.ih * a.iw * 16, a.oh * a.ow * 16, a.ih, a.iw, a.ow, a.kh, a.kw,
                     a.stride_h, a.stride_w, a.pad_top, a.pad_left, wbs};
  const int64_t row1 = a.row_end > 0 ? a.row_end : a.oh;
  const int64_t pixel0 = a.row_begin * a.ow, pixel1 = row1 * a.ow;
  const int64_t chunk_pixels = std::max<int64_t>(tile_pixels, chunk_bytes / (a.ic * 4));
  const int64_t pass_ic = std::max<int64_t>(16, pass_bytes / (taps * group_oc * 4) / 16 * 16);
  const int64_t g0 = a.oc_begin / group_oc;
  const int64_t g1 = a.oc_end > 0 ? a.oc_end / group_oc : a.oc / group_oc;
  for (int64_t c0 = pixel0; c0 < pixel1; c0 += chunk_pixels) {
    const int64_t c1 = std::min(pixel1, c0 + chunk_pixels);
    // Tiles of at most tile_pixels, as even as they come (49 pixels: 4 x 6 + 5 x 5).
    const int64_t tiles_here = (c1 - c0 + tile_pixels - 1) / tile_pixels;
    const int64_t base = (c1 - c0) / tiles_here, wider = (c1 - c0) % tiles_here;
    for (int64_t gr = g0; gr < g1; ++gr) {
      const float* wg = a.w + gr * (group_oc / 16) * wbs;
      float* yg = a.y + gr * (group_oc / 16) * geo.ycs;
      const float* rg = a.residual ? a.residual + gr * (group_oc / 16) * geo.ycs : nullptr;
      for (int64_t k0 = 0; k0 < a.ic; k0 += pass_ic) {
        const int64_t k1 = std::min(a.ic, k0 + pass_ic);
        const bool first = k0 == 0, last = k1 == a.ic;
        const float* w = wg + k0 / 16 * taps * 256;
        const float* bias = first && a.bias ? a.bias + gr * group_oc : nullptr;
        // The weights of the next pass (the next input channels, or the next
        // group's first): fetch them while these run, a share per tile. Cold
        // weights from memory had cost a third of the speed.
        const bool more = !last || gr + 1 < g1;
        const char* next = reinterpret_cast<const char*>(
          last ? wg + (group_oc / 16) * wbs : wg + k1 / 16 * taps * 256);
        const int64_t next_lines = more ? std::min(last ? a.ic : a.ic - k1, pass_ic) * taps : 0;
        const int64_t per_tile = (next_lines + tiles_here - 1) / tiles_here;
        int64_t p = c0;
        for (int64_t t = 0; t < tiles_here; ++t) {
          const int64_t np = base + (t < wider ? 1 : 0);
          const int64_t pf0 = std::min(next_lines, t * per_tile);
          const int64_t pf1 = std::min(next_lines, pf0 + per_tile);
          tiles[np - 1](geo, p, k0 / 16, k1 / 16, w, bias, rg ? rg + p * 16 : nullptr,
                        yg + p * 16, first, last, a.relu, next + 64 * pf0, pf1 - pf0);
          p += np;
        }
      }
    }
  }
}

} // namespace caf_serving::kernels::cpu
