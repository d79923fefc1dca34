#include "scheduler/step_cost.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace caf_serving::scheduler {

void step_cost::observe(uint32_t tokens, clock_type::duration took) {
  const double x = tokens, y = std::chrono::duration<double>(took).count();
  weight_ = weight_ * decay_ + 1;
  sx_ = sx_ * decay_ + x;
  sxx_ = sxx_ * decay_ + x * x;
  sy_ = sy_ * decay_ + y;
  sxy_ = sxy_ * decay_ + x * y;
  if (seen_ == 0)
    first_tokens_ = tokens;
  else if (tokens != first_tokens_)
    varied_ = true;
  ++seen_;
}

bool step_cost::known() const { return (seen_ >= 8 && varied_) || seen_ >= 32; }

double step_cost::per_token_seconds() const {
  if (weight_ <= 0)
    return 0;
  const double mx = sx_ / weight_, my = sy_ / weight_;
  const double var = sxx_ / weight_ - mx * mx;
  // All steps of one size (or nearly): the whole time is per token, which
  // overprices larger steps rather than underpricing them.
  if (var <= 1e-9 * std::max(1.0, mx * mx))
    return mx > 0 ? my / mx : 0;
  const double slope = (sxy_ / weight_ - mx * my) / var;
  if (slope <= 0)
    return mx > 0 ? my / mx : 0;
  // A line through the means must not start below zero.
  return std::min(slope, mx > 0 ? my / mx : slope);
}

double step_cost::fixed_seconds() const {
  if (weight_ <= 0)
    return 0;
  const double mx = sx_ / weight_, my = sy_ / weight_;
  return std::max(0.0, my - per_token_seconds() * mx);
}

clock_type::duration step_cost::predict(uint32_t tokens) const {
  double s = fixed_seconds() + per_token_seconds() * tokens;
  return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
}

uint32_t step_cost::tokens_within(clock_type::duration limit, uint32_t cap) const {
  const double room = std::chrono::duration<double>(limit).count() - fixed_seconds();
  const double per = per_token_seconds();
  if (per <= 0)
    return cap;
  if (room <= per)
    return 1;
  return static_cast<uint32_t>(std::min<double>(cap, std::floor(room / per + 1e-6)));
}

} // namespace caf_serving::scheduler
