#include "scheduler/executor_choice.hpp"

#include <algorithm>

namespace caf_serving::scheduler {

int64_t outstanding_ns(const executor_load& load) {
  int64_t outstanding = 0;
  for (auto r : load.in_flight_rows)
    outstanding += load.cost->predict(r);
  return std::max<int64_t>(outstanding - load.oldest_elapsed_ns, 0);
}

int64_t predicted_completion_ns(const executor_load& load, uint32_t rows) {
  return outstanding_ns(load) + load.cost->predict(rows)
         + load.lateness_ns * static_cast<int64_t>(load.in_flight_rows.size() + 1);
}

std::optional<size_t> choose_executor(const std::vector<executor_load>& executors,
                                      uint32_t rows) {
  std::optional<size_t> best;
  int64_t best_at = 0;
  for (size_t i = 0; i < executors.size(); ++i) {
    const auto& e = executors[i];
    if (!e.has_credit())
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

} // namespace caf_serving::scheduler
