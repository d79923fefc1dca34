#include "scheduler/executor_book.hpp"

#include <algorithm>

namespace caf_serving::scheduler {

executor_book::executor_book(cost_model_config cost) : cost_(std::move(cost)) {}

void executor_book::dispatched(uint64_t batch_id, uint32_t rows, int64_t now_ns) {
  if (in_flight_.empty())
    oldest_start_ns_ = now_ns;
  in_flight_.push_back({batch_id, rows, now_ns, cost_.predict(rows)});
}

bool executor_book::answered(uint64_t batch_id, int64_t now_ns,
                             std::optional<int64_t> executor_service_ns) {
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                         [&](const sent& s) { return s.batch_id == batch_id; });
  if (it == in_flight_.end())
    return false;
  bool oldest = it == in_flight_.begin();
  if (executor_service_ns) {
    // An executor that measured nothing (0) is timed from here, as before.
    int64_t start = oldest ? oldest_start_ns_ : it->dispatched_ns;
    cost_.observe(it->rows, *executor_service_ns > 0 ? *executor_service_ns : now_ns - start);
  }
  in_flight_.erase(it);
  // The next batch could start once this one was answered (or when it was
  // sent, if that came later); an answer out of order frees nothing earlier.
  if (oldest && !in_flight_.empty())
    oldest_start_ns_ = std::max(in_flight_.front().dispatched_ns, now_ns);
  return true;
}

int64_t executor_book::busy_until_ns() const {
  if (in_flight_.empty())
    return oldest_start_ns_;
  int64_t at = oldest_start_ns_;
  for (const auto& s : in_flight_)
    at += cost_.predict(s.rows);
  return at;
}

executor_load executor_book::load(int64_t now_ns, uint32_t depth) const {
  executor_load l;
  l.cost = &cost_;
  l.depth = depth;
  l.in_flight_rows.reserve(in_flight_.size());
  for (const auto& s : in_flight_)
    l.in_flight_rows.push_back(s.rows);
  if (!in_flight_.empty())
    l.oldest_elapsed_ns = std::max<int64_t>(now_ns - oldest_start_ns_, 0);
  return l;
}

} // namespace caf_serving::scheduler
