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
  // A window of at most a few dozen samples: sorting a copy is cheaper than
  // keeping an order statistic tree, and happens once per batch.
  auto sorted = s.samples;
  auto rank = static_cast<size_t>(
    std::ceil(cfg_.quantile * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size()) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(rank), sorted.end());
  s.estimate = sorted[rank];
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
  if (n == 1) {
    // One size: all of its cost is taken as per-row cost, which prices a larger
    // batch high rather than low until that size has run.
    slope = sy / sx;
  }
  slope = std::max(slope, 0.0);
  double fixed = std::max((sy - slope * sx) / n, 0.0);
  fit_ = {fixed, slope};
}

int64_t batch_cost_model::predict(uint32_t rows) const {
  if (sizes_.empty())
    return 0;
  uint32_t r = run_rows(rows);
  auto above = sizes_.lower_bound(r);
  if (above != sizes_.end() && above->first == r)
    return above->second.estimate;
  auto line = [&](double x) { return fit_.fixed_ns + fit_.per_row_ns * x; };
  if (above == sizes_.end()) {
    // Past the largest measured size: its estimate plus the fit's per-row cost.
    const auto& [last_rows, last] = *sizes_.rbegin();
    return static_cast<int64_t>(static_cast<double>(last.estimate)
                                + fit_.per_row_ns * static_cast<double>(r - last_rows));
  }
  if (above == sizes_.begin()) {
    // Below the smallest measured size: the fit, never above that size's cost.
    double smallest = static_cast<double>(above->second.estimate);
    return static_cast<int64_t>(std::clamp(line(r), 0.0, smallest));
  }
  auto below = std::prev(above);
  double x0 = below->first, x1 = above->first;
  double y0 = static_cast<double>(below->second.estimate);
  double y1 = static_cast<double>(above->second.estimate);
  return static_cast<int64_t>(y0 + (y1 - y0) * (static_cast<double>(r) - x0) / (x1 - x0));
}

std::vector<std::pair<uint32_t, int64_t>> batch_cost_model::curve() const {
  std::vector<std::pair<uint32_t, int64_t>> out;
  out.reserve(sizes_.size());
  for (const auto& [rows, s] : sizes_)
    out.emplace_back(rows, s.estimate);
  return out;
}

} // namespace caf_serving::scheduler
