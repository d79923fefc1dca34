#include "scheduler/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace caf_serving::scheduler {

batch_cost_model::batch_cost_model(cost_model_config cfg) : cfg_(std::move(cfg)) {
  cfg_.window = std::max<uint32_t>(cfg_.window, 1);
  cfg_.quantile = std::clamp(cfg_.quantile, 0.0, 1.0);
  std::sort(cfg_.captured_sizes.begin(), cfg_.captured_sizes.end());
}

uint32_t batch_cost_model::run_rows(uint32_t rows) const {
  rows = std::max<uint32_t>(rows, 1);
  auto it = std::lower_bound(cfg_.captured_sizes.begin(), cfg_.captured_sizes.end(), rows);
  return it == cfg_.captured_sizes.end() ? rows : *it;
}

void batch_cost_model::observe(uint32_t rows, int64_t service_ns) {
  auto& s = sizes_[std::max<uint32_t>(rows, 1)];
  int64_t sample = std::max<int64_t>(service_ns, 0);
  if (s.samples.size() < cfg_.window) {
    s.samples.push_back(sample);
  } else {
    s.samples[s.next] = sample;
    s.next = (s.next + 1) % s.samples.size();
  }
  // The median of the window: what the fit goes through.
  auto& sorted = median_scratch_;
  sorted.assign(s.samples.begin(), s.samples.end());
  auto mid = sorted.begin() + static_cast<long>((sorted.size() - 1) / 2);
  std::nth_element(sorted.begin(), mid, sorted.end());
  s.estimate = *mid;
  s.last_seen = ++observations_;
  if (cfg_.forget_after > 0)
    for (auto it = sizes_.begin(); it != sizes_.end();)
      it = observations_ - it->second.last_seen > cfg_.forget_after ? sizes_.erase(it)
                                                                    : std::next(it);
  refit();
}

void batch_cost_model::refit() {
  fit_ = {};
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [rows, s] : sizes_) {
    double x = rows, y = static_cast<double>(s.estimate);
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  if (n == 0)
    return;
  double denom = n * sxx - sx * sx;
  double slope = denom > 0 ? (n * sxy - sx * sy) / denom : 0;
  slope = std::max(slope, 0.0);
  double fixed = std::max((sy - slope * sx) / n, 0.0);
  fit_ = {fixed, slope};
  // The margin: the configured quantile of how far every sample in the windows
  // lies above the fit. Pooled over all sizes, so that one size's noisy window
  // weighs as much as its samples, not as a whole size.
  auto& residuals = residual_scratch_;
  residuals.clear();
  for (const auto& [rows, s] : sizes_)
    for (auto sample : s.samples)
      residuals.push_back(static_cast<double>(sample) - (fixed + slope * rows));
  auto rank = static_cast<size_t>(std::ceil(cfg_.quantile * static_cast<double>(residuals.size())));
  rank = std::clamp<size_t>(rank, 1, residuals.size()) - 1;
  std::nth_element(residuals.begin(), residuals.begin() + static_cast<long>(rank), residuals.end());
  above_fit_ns_ = std::max(residuals[rank], 0.0);
}

int64_t batch_cost_model::predict(uint32_t rows) const {
  if (sizes_.empty())
    return 0;
  uint32_t r = run_rows(rows);
  // With one size measured the fit is flat: every size is priced like it.
  // Pricing larger batches per row instead kept them from ever forming (a
  // scheduler does not grow a batch it prices too high), so the curve was
  // never learned; a flat guess lets a larger batch run and be measured.
  // The fit plus the largest amount by which a measured size's estimate lies
  // above it: one prediction per size that never falls as rows grow, so a
  // request joining a batch never looks dearer than it is in a larger batch,
  // and the noise of one size's window does not make it look special.
  return static_cast<int64_t>(fit_.fixed_ns + fit_.per_row_ns * static_cast<double>(r)
                              + above_fit_ns_);
}

std::vector<std::pair<uint32_t, int64_t>> batch_cost_model::curve() const {
  std::vector<std::pair<uint32_t, int64_t>> out;
  out.reserve(sizes_.size());
  for (const auto& [rows, s] : sizes_)
    out.emplace_back(rows, predict(rows));
  return out;
}

} // namespace caf_serving::scheduler
