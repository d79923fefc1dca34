#include "scheduler/executor_book.hpp"

#include <algorithm>
#include <cmath>

namespace caf_serving::scheduler {

lateness_tracker::lateness_tracker(lateness_config cfg) : cfg_(cfg) {
  cfg_.window = std::max<uint32_t>(cfg_.window, 1);
  cfg_.quantile = std::clamp(cfg_.quantile, 0.0, 1.0);
}

void lateness_tracker::observe(int64_t lateness_ns) {
  if (samples_.size() < cfg_.window) {
    samples_.push_back(lateness_ns);
  } else {
    samples_[next_] = lateness_ns;
    next_ = (next_ + 1) % samples_.size();
  }
  auto& sorted = scratch_;
  sorted.assign(samples_.begin(), samples_.end());
  auto rank = static_cast<size_t>(std::ceil(cfg_.quantile * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size()) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(rank), sorted.end());
  quantile_ns_ = std::max<int64_t>(sorted[rank], 0);
}

executor_book::executor_book(cost_model_config cost, lateness_config lateness)
    : cost_(std::move(cost)), lateness_(lateness) {}

void executor_book::dispatched(uint64_t batch_id, uint32_t rows, int64_t now_ns) {
  if (in_flight_.empty())
    oldest_start_ns_ = now_ns;
  in_flight_.push_back({batch_id, rows, now_ns, cost_.predict(rows)});
}

void executor_book::dispatched_warm_up(uint64_t batch_id, uint32_t rows, int64_t now_ns) {
  dispatched(batch_id, rows, now_ns);
  in_flight_.back().predicted_ns = 0;
}

bool executor_book::answered(uint64_t batch_id, int64_t now_ns,
                             std::optional<int64_t> executor_service_ns) {
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                         [&](const sent& s) { return s.batch_id == batch_id; });
  if (it == in_flight_.end())
    return false;
  bool oldest = it == in_flight_.begin();
  last_answer_ns_ = now_ns;
  if (executor_service_ns) {
    // An executor that measured nothing (0) is timed from here, as before.
    int64_t start = oldest ? oldest_start_ns_ : it->dispatched_ns;
    cost_.observe(it->rows, *executor_service_ns > 0 ? *executor_service_ns : now_ns - start);
    // Lateness against what the plans assumed when it was sent. Only for the
    // oldest batch: a later one's start is not known here.
    if (oldest && it->predicted_ns > 0)
      lateness_.observe(now_ns - (start + it->predicted_ns));
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
  l.lateness_ns = lateness_.quantile_ns();
  l.in_flight_rows.reserve(in_flight_.size());
  for (const auto& s : in_flight_)
    l.in_flight_rows.push_back(s.rows);
  if (!in_flight_.empty())
    l.oldest_elapsed_ns = std::max<int64_t>(now_ns - oldest_start_ns_, 0);
  else
    l.idle_ns = std::max<int64_t>(now_ns - last_answer_ns_, 0);
  return l;
}

} // namespace caf_serving::scheduler
