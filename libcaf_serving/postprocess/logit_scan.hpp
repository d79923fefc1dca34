#pragma once
/// The passes of the sampler (sampling.hpp) over a whole row of logits, one
/// vectorized loop each: the maximum, the first value at least or above a
/// bound, the softmax weights with their sums, masked sums. They are what makes
/// sampling O(V) at a small constant for vocabularies of 32k to 152k ids.
///
/// NaN is never a maximum and never passes a bound; a NaN or -inf logit weighs 0.
#include <cstddef>

namespace caf_serving::postprocess::logit_scan {

/// Below this, e^x counts as 0 (under 2^-125 of the likeliest token's weight).
constexpr float exp_floor = -87.0f;

/// Weights are summed by blocks: in float lanes within one, in double across.
constexpr std::size_t block_size = 1024;

/// The largest of x[0, n), NaNs ignored; -inf when there is none.
float max_of(const float* x, std::size_t n);

/// The first i with x[i] >= bound; n if none.
std::size_t first_at_least(const float* x, std::size_t n, float bound);

/// The first i with x[i] > bound; n if none.
std::size_t first_above(const float* x, std::size_t n, float bound);

/// e^x for x <= 0 to about 1e-7 relative, 0 below exp_floor, for NaN and -inf.
float weight_of(float x);

/// What `weigh` computes: weights[i] = e^((logits[i] - top) * inv_t), set to 0
/// under `floor`, for i < n; block_sums[b] the sum of block b.
struct weigh_args {
  const float* logits = nullptr;
  std::size_t n = 0;
  float top = 0.0f;
  float inv_t = 1.0f;
  float floor = 0.0f;
  float* weights = nullptr;
  /// (n + block_size - 1) / block_size of them.
  double* block_sums = nullptr;
};

/// Fills the weights and block sums; returns the total.
double weigh(const weigh_args& args);

/// The sum of e^(x[i] - top) over i < n.
double exp_sum(const float* x, std::size_t n, float top);

/// The sum of the w[i] >= bound over i < n.
double mass_at_least(const float* w, std::size_t n, float bound);

/// Calls visit(i) for every i < n with x[i] >= bound, in ascending order.
template <class Visit>
void for_each_at_least(const float* x, std::size_t n, float bound, Visit&& visit) {
  for (std::size_t i = first_at_least(x, n, bound); i < n;
       i += 1 + first_at_least(x + i + 1, n - i - 1, bound))
    visit(i);
}

} // namespace caf_serving::postprocess::logit_scan
