#include "postprocess/logit_scan.hpp"

#include <cstdint>
#include <cstring>
#include <limits>

namespace caf_serving::postprocess::logit_scan {

namespace {

// GCC's and Clang's vector extensions, four lanes: one SSE register on the
// x86-64 baseline (wider vectors are split there, and slowly). Plain loops do
// not vectorize here: a float select with NaNs in play is control flow to GCC.
using v4f = float __attribute__((vector_size(16)));
using v4i = int32_t __attribute__((vector_size(16)));
constexpr std::size_t lanes = 4;
constexpr float infinity = std::numeric_limits<float>::infinity();

v4f load(const float* x) {
  v4f v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

void store(float* x, v4f v) {
  std::memcpy(x, &v, sizeof v);
}

v4f splat(float x) {
  return v4f{} + x;
}

bool any(v4i mask) {
  uint64_t words[2];
  std::memcpy(words, &mask, sizeof words);
  return (words[0] | words[1]) != 0;
}

v4f select(v4i mask, v4f yes, v4f no) {
  return (v4f) ((mask & (v4i) yes) | (~mask & (v4i) no));
}

float sum_of(v4f v) {
  float s = 0.0f;
  for (std::size_t j = 0; j < lanes; ++j)
    s += v[j];
  return s;
}

/// e^x for exp_floor <= x <= 0; x = n ln2 + r with |r| <= ln2 / 2, n rounded to
/// nearest by adding and subtracting 1.5 * 2^23, e^r by Taylor to r^7 (its
/// remainder is under 1e-8 relative), 2^n from the exponent bits.
v4f exp4(v4f x) {
  x = select(x < exp_floor, splat(exp_floor), x);
  const v4f t = x * 1.44269504088896341f;
  const v4f n = (t + 12582912.0f) - 12582912.0f;
  v4f r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  v4f p = splat(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const v4i bits = (__builtin_convertvector(n, v4i) + 127) << 23;
  return p * (v4f) bits;
}

/// e^x, and 0 below exp_floor, for NaN and for -inf.
v4f weight4(v4f x) {
  const v4i keep = x >= exp_floor;
  return (v4f) (keep & (v4i) exp4(x));
}

} // namespace

float weight_of(float x) {
  return weight4(splat(x))[0];
}

float max_of(const float* x, std::size_t n) {
  // Four running maxima, so that the selects do not wait on each other.
  v4f top[4] = {splat(-infinity), splat(-infinity), splat(-infinity), splat(-infinity)};
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes)
    for (std::size_t k = 0; k < 4; ++k) {
      const v4f v = load(x + i + k * lanes);
      top[k] = select(v > top[k], v, top[k]); // a NaN compares false
    }
  float best = -infinity;
  for (const auto& t : top)
    for (std::size_t j = 0; j < lanes; ++j)
      best = t[j] > best ? t[j] : best;
  for (; i < n; ++i)
    best = x[i] > best ? x[i] : best;
  return best;
}

std::size_t first_at_least(const float* x, std::size_t n, float bound) {
  const v4f b = splat(bound);
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes)
    if (any((load(x + i) >= b) | (load(x + i + lanes) >= b) | (load(x + i + 2 * lanes) >= b)
            | (load(x + i + 3 * lanes) >= b)))
      break;
  for (; i < n; ++i)
    if (x[i] >= bound)
      return i;
  return n;
}

std::size_t first_above(const float* x, std::size_t n, float bound) {
  const v4f b = splat(bound);
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes)
    if (any((load(x + i) > b) | (load(x + i + lanes) > b) | (load(x + i + 2 * lanes) > b)
            | (load(x + i + 3 * lanes) > b)))
      break;
  for (; i < n; ++i)
    if (x[i] > bound)
      return i;
  return n;
}

// The sums below keep four running sums, so that the additions do not wait on
// each other; block_size is a multiple of their 16 values.

double weigh(const weigh_args& a) {
  double total = 0.0;
  const v4f top = splat(a.top);
  const v4f floor = splat(a.floor);
  for (std::size_t from = 0, b = 0; from < a.n; from += block_size, ++b) {
    const std::size_t to = from + block_size < a.n ? from + block_size : a.n;
    v4f sum[4] = {};
    std::size_t i = from;
    for (; i + 4 * lanes <= to; i += 4 * lanes)
      for (std::size_t k = 0; k < 4; ++k) {
        v4f w = weight4((load(a.logits + i + k * lanes) - top) * a.inv_t);
        w = (v4f) ((w >= floor) & (v4i) w);
        store(a.weights + i + k * lanes, w);
        sum[k] += w;
      }
    double block = sum_of(sum[0] + sum[1] + sum[2] + sum[3]);
    for (; i < to; ++i) {
      float w = weight_of((a.logits[i] - a.top) * a.inv_t);
      w = w >= a.floor ? w : 0.0f;
      a.weights[i] = w;
      block += w;
    }
    a.block_sums[b] = block;
    total += block;
  }
  return total;
}

double exp_sum(const float* x, std::size_t n, float top) {
  double total = 0.0;
  const v4f t = splat(top);
  for (std::size_t from = 0; from < n; from += block_size) {
    const std::size_t to = from + block_size < n ? from + block_size : n;
    v4f sum[4] = {};
    std::size_t i = from;
    for (; i + 4 * lanes <= to; i += 4 * lanes)
      for (std::size_t k = 0; k < 4; ++k)
        sum[k] += weight4(load(x + i + k * lanes) - t);
    total += sum_of(sum[0] + sum[1] + sum[2] + sum[3]);
    for (; i < to; ++i)
      total += weight_of(x[i] - top);
  }
  return total;
}

double mass_at_least(const float* w, std::size_t n, float bound) {
  double total = 0.0;
  const v4f b = splat(bound);
  for (std::size_t from = 0; from < n; from += block_size) {
    const std::size_t to = from + block_size < n ? from + block_size : n;
    v4f sum[4] = {};
    std::size_t i = from;
    for (; i + 4 * lanes <= to; i += 4 * lanes)
      for (std::size_t k = 0; k < 4; ++k) {
        const v4f v = load(w + i + k * lanes);
        sum[k] += (v4f) ((v >= b) & (v4i) v);
      }
    total += sum_of(sum[0] + sum[1] + sum[2] + sum[3]);
    for (; i < to; ++i)
      total += w[i] >= bound ? w[i] : 0.0f;
  }
  return total;
}

} // namespace caf_serving::postprocess::logit_scan
