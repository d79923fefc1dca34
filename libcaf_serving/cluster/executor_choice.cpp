#include "cluster/executor_choice.hpp"

#include <algorithm>
#include <cmath>

namespace caf_serving::cluster {

void batch_cost_model::observe(uint32_t rows, int64_t service_ns) {
  auto sample = static_cast<double>(std::max<int64_t>(service_ns, 0));
  auto [it, inserted] = average_ns_.emplace(rows, sample);
  if (!inserted)
    it->second += (sample - it->second) * 0.25;
}

int64_t batch_cost_model::predict(uint32_t rows) const {
  if (average_ns_.empty())
    return 0;
  if (auto it = average_ns_.find(rows); it != average_ns_.end())
    return static_cast<int64_t>(it->second);
  // The nearest measured size, scaled linearly by rows: a fair first guess for a
  // size not yet seen; it is replaced by the measurement once the size has run.
  auto above = average_ns_.lower_bound(rows);
  auto nearest = above;
  if (above == average_ns_.end()
      || (above != average_ns_.begin() && rows - std::prev(above)->first < above->first - rows))
    nearest = std::prev(above);
  double scaled = nearest->second * static_cast<double>(std::max<uint32_t>(rows, 1))
                  / static_cast<double>(std::max<uint32_t>(nearest->first, 1));
  double floor = average_ns_.begin()->second;
  return static_cast<int64_t>(std::max(scaled, std::min(floor, nearest->second)));
}

int64_t predicted_completion_ns(const executor_load& load, uint32_t rows) {
  int64_t outstanding = 0;
  for (auto r : load.in_flight_rows)
    outstanding += load.cost->predict(r);
  outstanding = std::max<int64_t>(outstanding - load.oldest_elapsed_ns, 0);
  return outstanding + load.cost->predict(rows);
}

std::optional<size_t> choose_executor(const std::vector<executor_load>& executors,
                                      uint32_t rows) {
  std::optional<size_t> best;
  int64_t best_at = 0;
  for (size_t i = 0; i < executors.size(); ++i) {
    const auto& e = executors[i];
    if (e.in_flight_rows.size() >= e.depth)
      continue;
    auto at = predicted_completion_ns(e, rows);
    if (!best || at < best_at
        || (at == best_at
            && e.in_flight_rows.size() < executors[*best].in_flight_rows.size())) {
      best = i;
      best_at = at;
    }
  }
  return best;
}

} // namespace caf_serving::cluster
