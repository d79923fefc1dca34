#pragma once
/// What one decoding step of a generative model costs (issue 35): a line in
/// the tokens it computes, fixed + per_token * tokens, fitted online by least
/// squares over the steps seen, the older ones weighing less (each new step
/// multiplies the older weights by `decay`). On a CPU a step streams every
/// weight once whatever its rows (the fixed part) and computes each token's
/// matmuls and attention (the per-token part), which the line captures well
/// enough to price a step before it runs.
///
/// A plain object; generation_policy holds one and the scheduler actor feeds
/// it each step's tokens and wall time (plan sent to samples back).
#include "scheduler/batching_policy.hpp"

#include <cstdint>

namespace caf_serving::scheduler {

class step_cost {
public:
  explicit step_cost(double decay = 0.98) : decay_(decay) {}

  /// A step of `tokens` took `took`.
  void observe(uint32_t tokens, clock_type::duration took);

  /// Whether enough steps were seen to predict (8, of at least two sizes, or 32).
  bool known() const;

  /// The predicted time of a step of `tokens` (zero while nothing is known).
  clock_type::duration predict(uint32_t tokens) const;

  /// The most tokens a step may compute and still take at most `limit`
  /// (at least 1; `cap` when even that many fit).
  uint32_t tokens_within(clock_type::duration limit, uint32_t cap) const;

  /// The fitted line, in seconds and seconds per token.
  double fixed_seconds() const;
  double per_token_seconds() const;

private:
  double decay_;
  double weight_ = 0, sx_ = 0, sxx_ = 0, sy_ = 0, sxy_ = 0;
  uint32_t seen_ = 0;
  uint32_t first_tokens_ = 0;
  bool varied_ = false;
};

} // namespace caf_serving::scheduler
