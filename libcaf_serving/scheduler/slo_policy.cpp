#include "scheduler/slo_policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace caf_serving::scheduler {

namespace {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

/// Milliseconds, with one decimal below 10 ms ("2.5 ms", "63 ms").
std::string ms_text(nanoseconds d) {
  double ms = static_cast<double>(d.count()) / 1e6;
  char buf[32];
  if (ms < 10)
    std::snprintf(buf, sizeof buf, "%.1f ms", std::max(ms, 0.0));
  else
    std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  return buf;
}

time_point add_saturating(time_point t, microseconds d) {
  if (time_point::max() - t <= d)
    return time_point::max();
  return t + d;
}

} // namespace

result<std::optional<microseconds>> read_latency_target(const model_config& model) {
  auto it = model.parameters.find("latency_target_ms");
  if (it == model.parameters.end())
    return std::optional<microseconds>{};
  const std::string& text = it->second;
  char* end = nullptr;
  double ms = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(ms) || ms <= 0
      || ms > 3'600'000)
    return bad_request("model '" + model.name + "': parameter latency_target_ms is '" + text
                       + "'; it must be a positive number of milliseconds (at most one hour), "
                         "for example parameters { key: \"latency_target_ms\" value: "
                         "{ string_value: \"50\" } }");
  return std::optional<microseconds>{microseconds{static_cast<int64_t>(ms * 1000)}};
}

microseconds default_slo_margin(microseconds target) {
  return std::min(std::max(target / 20, microseconds{1000}), target / 2);
}

slo_policy::slo_policy(slo_policy_config cfg) : cfg_(std::move(cfg)) {
  if (auto problem = batching_policy::validate(cfg_.base))
    throw std::invalid_argument(problem->message);
  if (cfg_.target.count() <= 0)
    throw std::invalid_argument("slo_policy: the latency target must be positive");
  max_batch_rows_ = static_cast<uint32_t>(std::max(cfg_.base.max_batch_size, 1));
  if (cfg_.max_feedback.count() <= 0)
    cfg_.max_feedback = cfg_.target / 4;
}

uint32_t slo_policy::level_of(uint32_t requested) const {
  const auto& db = cfg_.base.dynamic_batching;
  if (!cfg_.base.dynamic_batching_enabled || db.priority_levels == 0)
    return 0;
  if (requested == 0 || requested > db.priority_levels)
    return db.default_priority_level;
  return requested;
}

uint32_t slo_policy::max_queue_size_of(uint32_t level) const {
  const auto& db = cfg_.base.dynamic_batching;
  const queue_policy* p = &db.default_queue_policy;
  if (auto it = db.priority_queue_policy.find(level); it != db.priority_queue_policy.end())
    p = &it->second;
  if (!cfg_.base.dynamic_batching_enabled || p->max_queue_size == 0)
    return cfg_.base.max_queue_size_default;
  return p->max_queue_size;
}

slo_policy::cut_undo slo_policy::add_to_cut(const entry& e) {
  cut_undo u;
  auto it = open_.find(e.batch_class);
  if (it != open_.end()) {
    u.previous_open = it->second;
    auto& b = cut_[it->second];
    const uint64_t max_bytes = cfg_.base.max_batch_bytes;
    if (b.rows + e.rows <= max_batch_rows_ && (max_bytes == 0 || b.bytes + e.bytes <= max_bytes)) {
      u.batch = it->second;
      u.previous_earliest = b.earliest_deadline;
      b.members.push_back(&e);
      b.rows += e.rows;
      b.bytes += e.bytes;
      b.earliest_deadline = std::min(b.earliest_deadline, e.deadline);
      return u;
    }
  }
  cut_batch b;
  b.batch_class = e.batch_class;
  b.members.push_back(&e);
  b.rows = e.rows;
  b.bytes = e.bytes;
  b.earliest_deadline = e.deadline;
  u.batch = cut_.size();
  u.opened = true;
  open_[e.batch_class] = cut_.size();
  cut_.push_back(std::move(b));
  return u;
}

void slo_policy::undo_add_to_cut(const cut_undo& u) {
  auto& b = cut_[u.batch];
  const entry& e = *b.members.back();
  if (u.opened) {
    if (u.previous_open)
      open_[e.batch_class] = *u.previous_open;
    else
      open_.erase(e.batch_class);
    cut_.pop_back();
    return;
  }
  b.members.pop_back();
  b.rows -= e.rows;
  b.bytes -= e.bytes;
  b.earliest_deadline = u.previous_earliest;
}

void slo_policy::refresh_cut() {
  if (!cut_stale_)
    return;
  cut_.clear();
  open_.clear();
  for (const auto& [k, e] : queue_)
    add_to_cut(e);
  entries_visited_ += queue_.size();
  cut_stale_ = false;
}

void slo_policy::remove(const entry& e) {
  --per_level_[e.level];
  queue_.erase(key{e.level, e.deadline, e.seq});
  cut_stale_ = true;
}

int64_t slo_policy::feedback_ns(const executor_load& x, int64_t batches) const {
  return std::min(x.lateness_ns * batches, nanoseconds{cfg_.max_feedback}.count());
}

int64_t slo_policy::completion_ns(const executor_load& x, uint32_t rows) const {
  return outstanding_ns(x) + x.cost->predict(rows)
         + feedback_ns(x, static_cast<int64_t>(x.in_flight_rows.size()) + 1);
}

void slo_policy::note_arrival(time_point now, uint32_t rows) {
  forget_arrivals(now);
  arrivals_.push_back({now, rows});
  arrival_rows_ += rows;
  if (arrivals_.size() > arrival_window) {
    arrival_rows_ -= arrivals_.front().rows;
    arrivals_.pop_front();
  }
}

void slo_policy::forget_arrivals(time_point now) {
  // Four targets: long enough to hold about a hundred arrivals near capacity,
  // short enough that the silence between bursts is forgotten.
  const time_point since = now - 4 * cfg_.target;
  while (!arrivals_.empty() && arrivals_.front().at < since) {
    arrival_rows_ -= arrivals_.front().rows;
    arrivals_.pop_front();
  }
}

double slo_policy::arrival_rate(time_point now) const {
  // A silence since the last arrival lowers it.
  if (arrivals_.empty() || now <= arrivals_.front().at)
    return 0;
  uint64_t rows = arrival_rows_ - arrivals_.front().rows;
  if (rows == 0)
    return 0;
  return static_cast<double>(rows) / static_cast<double>((now - arrivals_.front().at).count());
}

uint32_t slo_policy::expected_rows(const cut_batch& b, size_t k, double rate,
                                   int64_t start_ns) const {
  if (rate <= 0 || b.rows >= max_batch_rows_)
    return b.rows;
  auto open = open_.find(b.batch_class);
  if (open == open_.end() || open->second != k)
    return b.rows;
  double grown = static_cast<double>(b.rows) + rate * static_cast<double>(std::max<int64_t>(start_ns, 0));
  uint32_t rows = static_cast<uint32_t>(std::min<double>(grown, max_batch_rows_));
  // A byte bound stops it first when requests are large.
  if (cfg_.base.max_batch_bytes != 0 && b.bytes != 0) {
    double per_row = static_cast<double>(b.bytes) / static_cast<double>(b.rows);
    rows = std::min<uint32_t>(rows, static_cast<uint32_t>(static_cast<double>(cfg_.base.max_batch_bytes) / per_row));
  }
  return std::max(rows, b.rows);
}

double slo_policy::growth_share(double rate, const std::vector<executor_load>& executors) const {
  double capacity = 0; // rows per ns in full batches
  for (const auto& x : executors)
    if (!x.cost->empty())
      capacity += static_cast<double>(max_batch_rows_)
                  / static_cast<double>(std::max<int64_t>(x.cost->predict(max_batch_rows_), 1));
  if (capacity <= 0)
    return 0;
  return std::clamp((rate / capacity - 1.0) / 0.2, 0.0, 1.0);
}

std::vector<slo_policy::laid_batch>
slo_policy::lay(time_point now, const std::vector<executor_load>& executors) const {
  std::vector<laid_batch> out;
  out.reserve(cut_.size());
  // Compute chains on each executor; each batch there (those it holds as
  // well) also pays its lateness, up to max_feedback in all.
  std::vector<int64_t> free_at;
  std::vector<int64_t> batches;
  free_at.reserve(executors.size());
  batches.reserve(executors.size());
  for (const auto& x : executors) {
    free_at.push_back(outstanding_ns(x));
    batches.push_back(static_cast<int64_t>(x.in_flight_rows.size()));
  }
  // The open batches grow by the arrivals expected before they start: none
  // at the executors' full-batch capacity, all of them from 120% of it
  // (growth_share): under overload, a batch priced at the rows it holds now
  // admitted its first members with slack for those rows only, and every
  // later arrival that would have filled it was shed as "making them late",
  // which left the executors running small batches at a fixed cost each (a
  // simulation of on/off bursts at 3x: batches of 1 to 15 rows, 0.74 of the
  // goodput possible; priced at its expected size, 0.87). Below capacity the
  // batches are not the bottleneck, and a prediction of growth only sheds
  // requests that later arrivals would otherwise have given way to.
  double rate = arrival_rate(now);
  if (rate > 0)
    rate *= growth_share(rate, executors);
  for (size_t k = 0; k < cut_.size(); ++k) {
    const auto& b = cut_[k];
    int64_t best = 0, best_compute = 0;
    size_t where = 0;
    bool found = false;
    for (size_t i = 0; i < executors.size(); ++i) {
      int64_t compute = free_at[i] + executors[i].cost->predict(expected_rows(b, k, rate, free_at[i]));
      int64_t done = compute + feedback_ns(executors[i], batches[i] + 1);
      if (!found || done < best) {
        found = true;
        best = done;
        best_compute = compute;
        where = i;
      }
    }
    if (found) {
      free_at[where] = best_compute;
      ++batches[where];
    }
    out.push_back({now + nanoseconds{best}, where});
  }
  return out;
}

size_t slo_policy::late_requests(const std::vector<laid_batch>& laid, nanoseconds margin) const {
  size_t late = 0;
  for (size_t k = 0; k < cut_.size(); ++k)
    for (const auto* e : cut_[k].members)
      late += laid[k].completion + margin > e->deadline ? 1 : 0;
  return late;
}

shed slo_policy::make_shed(const entry& e, time_point predicted, size_t ahead,
                           time_point drained, time_point now) const {
  shed s;
  s.id = e.id;
  s.message = "request shed: predicted completion " + ms_text(predicted - e.received)
              + (e.own_deadline ? " > request timeout " : " > latency target ")
              + ms_text(e.budget) + " (queue " + std::to_string(ahead) + " request"
              + (ahead == 1 ? "" : "s") + " ahead); retry later";
  // Retry once the work planned now has drained, in whole seconds.
  auto wait = std::max<int64_t>((drained - now).count(), 0);
  s.retry_after_s = static_cast<uint32_t>(std::max<int64_t>(1, (wait + 999'999'999) / 1'000'000'000));
  return s;
}

shed slo_policy::late_shed(const entry& e, time_point done, time_point now) const {
  auto s = make_shed(e, done, 0, done, now);
  s.message = "request shed: it can no longer finish in time (predicted completion "
              + ms_text(done - e.received)
              + (e.own_deadline ? " > request timeout " : " > latency target ")
              + ms_text(e.budget) + "); retry later";
  return s;
}

slo_enqueue_result slo_policy::enqueue(const request_info& request, time_point received,
                                       time_point now,
                                       const std::vector<executor_load>& executors) {
  uint32_t rows = cfg_.base.max_batch_size > 0 ? std::max<uint32_t>(request.rows, 1) : 1;
  if (rows > max_batch_rows_)
    return rejected{request.id, reject_reason::too_many_rows,
                    "the request has " + std::to_string(rows) + " rows but the model's "
                      "max_batch_size is " + std::to_string(max_batch_rows_)
                      + "; split it into requests of at most that many rows"};
  if (cfg_.base.max_batch_bytes != 0 && request.bytes > cfg_.base.max_batch_bytes)
    return rejected{request.id, reject_reason::too_large,
                    "the request's tensors hold " + std::to_string(request.bytes)
                      + " bytes, more than a batch may hold ("
                      + std::to_string(cfg_.base.max_batch_bytes)
                      + "); send smaller requests or raise --max-batch-bytes"};
  uint32_t level = level_of(request.priority);
  auto limit = max_queue_size_of(level);
  if (per_level_[level] >= limit)
    return rejected{request.id, reject_reason::queue_full,
                    (level == 0 ? std::string("the model's queue")
                                : "the queue of priority level " + std::to_string(level))
                      + " is full (" + std::to_string(limit)
                      + " requests); retry later, or raise max_queue_size"};
  // The deadline: the target, or a tighter timeout of the request or its level.
  microseconds budget = cfg_.target;
  bool own = false;
  const auto& db = cfg_.base.dynamic_batching;
  const queue_policy* qp = &db.default_queue_policy;
  if (auto it = db.priority_queue_policy.find(level); it != db.priority_queue_policy.end())
    qp = &it->second;
  if (cfg_.base.dynamic_batching_enabled && qp->default_timeout_us != 0
      && qp->default_timeout_us < static_cast<uint64_t>(budget.count())) {
    budget = microseconds{static_cast<int64_t>(qp->default_timeout_us)};
    own = true;
  }
  if (request.timeout_us != 0 && request.timeout_us < static_cast<uint64_t>(budget.count())) {
    budget = microseconds{static_cast<int64_t>(request.timeout_us)};
    own = true;
  }
  note_arrival(now, rows);
  uint64_t seq = next_seq_++;
  entry e{request.id, rows, level, seq, received, add_saturating(received, budget), budget, own,
          false, {request.shape_class, cfg_.base.max_padding_waste ? request.padded_length : 0},
          request.bytes};
  key k{level, e.deadline, seq};
  bool measured = !executors.empty();
  for (const auto& x : executors)
    measured = measured && !x.cost->empty();
  if (!measured) {
    auto at = queue_.emplace(k, e).first;
    ++per_level_[level];
    if (std::next(at) == queue_.end() && !cut_stale_)
      add_to_cut(at->second);
    else
      cut_stale_ = true;
    return admitted{};
  }
  refresh_cut();
  auto where = queue_.emplace(k, e).first;
  ++per_level_[level];
  if (std::next(where) != queue_.end())
    return admit_reordered(where, now, executors);
  // At the end of the queue (the common case): only the batch it joins and
  // those laid after it can change, and nothing queued is visited.
  const nanoseconds margin = cfg_.margin;
  auto before = lay(now, executors);
  auto undo = add_to_cut(where->second);
  auto after = lay(now, executors);
  auto completion = after[undo.batch].completion;
  // Queued requests that were on time and would not be: only in the batch it
  // joins and those laid after it on the same executor.
  size_t made_late = 0;
  for (size_t j = 0; j < before.size(); ++j) {
    if (after[j].completion == before[j].completion)
      continue;
    for (const auto* m : cut_[j].members)
      made_late += m != &where->second && before[j].completion + margin <= m->deadline
                       && after[j].completion + margin > m->deadline
                     ? 1
                     : 0;
  }
  bool late = completion + margin > e.deadline;
  if (!late && made_late == 0)
    return admitted{};
  if (take_as_probe(where->second, now, executors))
    return admitted{};
  size_t ahead = cut_[undo.batch].members.size() - 1;
  for (size_t j = 0; j < undo.batch; ++j)
    ahead += cut_[j].members.size();
  time_point drained = now;
  for (const auto& l : after)
    drained = std::max(drained, l.completion);
  auto s = make_shed(where->second, completion, ahead, drained, now);
  if (!late)
    s.message = "request shed: serving it would make " + std::to_string(made_late)
                + " queued request(s) miss their deadline (latency target "
                + ms_text(cfg_.target) + ", queue " + std::to_string(ahead)
                + " requests ahead); retry later";
  undo_add_to_cut(undo);
  --per_level_[level];
  queue_.erase(where);
  return s;
}

bool slo_policy::take_as_probe(entry& e, time_point now,
                               const std::vector<executor_load>& executors) {
  if (cfg_.probe_interval.count() <= 0 || queue_.size() != 1)
    return false;
  const int64_t interval = nanoseconds{cfg_.probe_interval}.count();
  for (const auto& x : executors)
    if (!x.in_flight_rows.empty() || x.idle_ns < interval)
      return false;
  if (last_probe_ && now - *last_probe_ < cfg_.probe_interval)
    return false;
  last_probe_ = now;
  e.probe = true;
  return true;
}

slo_enqueue_result slo_policy::admit_reordered(std::map<key, entry>::iterator where,
                                               time_point now,
                                               const std::vector<executor_load>& executors) {
  const nanoseconds margin = cfg_.margin;
  // The cut is still that of the queue without the new request.
  size_t late_before = late_requests(lay(now, executors), margin);
  cut_stale_ = true;
  refresh_cut();
  auto with = lay(now, executors);
  size_t late_after = late_requests(with, margin);
  size_t ahead = 0;
  time_point completion{}, drained = now;
  bool found = false;
  for (size_t j = 0; j < cut_.size(); ++j) {
    drained = std::max(drained, with[j].completion);
    for (size_t i = 0; !found && i < cut_[j].members.size(); ++i) {
      if (cut_[j].members[i] != &where->second) {
        ++ahead;
        continue;
      }
      found = true;
      completion = with[j].completion;
    }
  }
  const entry& e = where->second;
  bool late = completion + margin > e.deadline;
  if (!late && late_after <= late_before)
    return admitted{};
  auto s = make_shed(e, completion, ahead, drained, now);
  if (!late)
    s.message = "request shed: serving it would make " + std::to_string(late_after - late_before)
                + " queued request(s) miss their deadline (latency target "
                + ms_text(cfg_.target) + ", queue " + std::to_string(ahead)
                + " requests ahead); retry later";
  remove(e);
  return s;
}

slo_poll_result slo_policy::poll(time_point now, const std::vector<executor_load>& executors) {
  forget_arrivals(now);
  slo_poll_result out;
  if (queue_.empty()) {
    out.next = idle{};
    return out;
  }
  if (executors.empty()) {
    // Every executor is quarantined or being started: nothing to plan on.
    out.next = wait_for_executor{};
    return out;
  }
  bool measured = !executors.empty();
  for (const auto& x : executors)
    measured = measured && !x.cost->empty();
  const nanoseconds margin = cfg_.margin;
  if (measured) {
    // Shed what cannot finish in time even alone on the executor that would
    // finish it first: serving it late helps no one. Against the deadline
    // itself: the margin is what a batch sent at its latest start (a timer
    // that fires a little late) may use up. Within a level the queue is in
    // deadline order, and no request costs more than a full batch: the scan
    // of a level stops at the first request that a full batch would still
    // finish in time, so it visits the expired ones and one more.
    auto best_ns = [&](uint32_t rows) {
      int64_t best = INT64_MAX;
      for (const auto& x : executors)
        best = std::min(best, completion_ns(x, rows));
      return best;
    };
    const auto safe_after = now + nanoseconds{best_ns(max_batch_rows_)};
    for (auto it = queue_.begin(); it != queue_.end();) {
      const auto& e = it->second;
      ++entries_visited_;
      if (e.probe) {
        ++it;
        continue;
      }
      if (e.deadline >= safe_after) {
        // The rest of this level is safe: on to the next level.
        it = queue_.lower_bound(key{e.level + 1, time_point::min(), 0});
        continue;
      }
      auto done = now + nanoseconds{best_ns(e.rows)};
      if (done <= e.deadline) {
        ++it;
        continue;
      }
      out.expired.push_back(late_shed(e, done, now));
      --per_level_[e.level];
      cut_stale_ = true;
      it = queue_.erase(it);
    }
    if (queue_.empty()) {
      out.next = idle{};
      return out;
    }
  }
  refresh_cut();
  auto laid = lay(now, executors);
  // Each executor runs the batches the plan puts on it in order: only the
  // first of them may go now.
  std::vector<std::optional<size_t>> first_on(executors.size());
  for (size_t k = 0; k < laid.size(); ++k)
    if (!first_on[laid[k].executor])
      first_on[laid[k].executor] = k;
  std::optional<time_point> wake;
  for (size_t k = 0; k < laid.size(); ++k) {
    const auto& b = cut_[k];
    size_t x = laid[k].executor;
    if (first_on[x] != k || !executors[x].has_credit())
      continue;
    // Full (the cheapest size per row), or the executor is free or about to
    // be. An executor's idle time is capacity lost, and under load batches
    // grow by themselves (the queue fills while the executor is busy): waiting
    // for a fuller batch on a free executor delayed every later batch by the
    // wait, which at high load left the next batch no room inside the target.
    // A batch sent into a busy executor's pipeline (depth > 1) early is locked
    // at its size while it could still grow, so it goes one margin before the
    // executor is predicted to be free (the margin covers the hop).
    int64_t busy_ns = measured ? outstanding_ns(executors[x]) : 0;
    bool free_soon = executors[x].in_flight_rows.empty() || busy_ns <= margin.count();
    if (!measured || b.rows >= max_batch_rows_ || free_soon) {
      auto members = b.members;
      uint32_t rows = b.rows;
      if (measured) {
        // The last guard: a member the batch would finish too late for is shed
        // now rather than served late (a plan can shift when requests arrive
        // or executors free up); a smaller batch is cheaper, so repeat.
        for (bool trimmed = true; trimmed && !members.empty();) {
          trimmed = false;
          auto done = now + nanoseconds{completion_ns(executors[x], rows)};
          for (auto it = members.begin(); it != members.end();) {
            if (done <= (*it)->deadline || (*it)->probe) {
              ++it;
              continue;
            }
            const entry& e = **it;
            out.expired.push_back(late_shed(e, done, now));
            rows -= e.rows;
            it = members.erase(it);
            trimmed = true;
          }
        }
      }
      slo_dispatch d;
      d.rows = rows;
      d.executor = x;
      d.predicted_ns = executors[x].cost->predict(rows);
      for (const auto* m : b.members)
        if (std::find(members.begin(), members.end(), m) != members.end())
          d.ids.push_back(m->id);
      for (const auto* m : b.members)
        remove(*m); // the cut is made again at the next decision
      if (d.ids.empty()) {
        // Every member was shed: decide again over what is left.
        auto again = poll(now, executors);
        out.expired.insert(out.expired.end(), std::make_move_iterator(again.expired.begin()),
                           std::make_move_iterator(again.expired.end()));
        out.next = std::move(again.next);
        return out;
      }
      out.next = std::move(d);
      return out;
    }
    auto at = now + nanoseconds{busy_ns - margin.count()};
    wake = wake ? std::min(*wake, at) : at;
  }
  if (wake)
    out.next = wait_until{*wake};
  else
    out.next = wait_for_executor{};
  return out;
}

} // namespace caf_serving::scheduler
