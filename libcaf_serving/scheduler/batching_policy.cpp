#include "scheduler/batching_policy.hpp"

#include "scheduler/bucket_padding.hpp"

#include <algorithm>
#include <stdexcept>

namespace caf_serving::scheduler {

namespace {

/// `t + us`, saturating at time_point::max() instead of overflowing, so that a
/// huge timeout or delay means "never" rather than "in the past".
time_point add_us(time_point t, uint64_t us) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  const auto room = duration_cast<microseconds>(time_point::max() - t).count();
  if (room <= 0 || us >= static_cast<uint64_t>(room))
    return time_point::max();
  return t + microseconds{static_cast<int64_t>(us)};
}

uint64_t us_between(time_point from, time_point to) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  return to <= from ? 0
                    : static_cast<uint64_t>(
                        duration_cast<microseconds>(to - from).count());
}

std::string level_name(uint32_t level) {
  return level == 0 ? std::string{"the model's queue"}
                    : "the queue of priority level " + std::to_string(level);
}

} // namespace

const char* to_string(reject_reason reason) {
  switch (reason) {
    case reject_reason::queue_full:
      return "queue_full";
    case reject_reason::timed_out:
      return "timed_out";
    case reject_reason::too_many_rows:
      return "too_many_rows";
    case reject_reason::too_large:
      return "too_large";
  }
  return "unknown";
}

serving_error rejection_error(const rejected& r) {
  switch (r.reason) {
    case reject_reason::queue_full:
      return {status_code::unavailable, r.message, failure_reason::queue_full};
    case reject_reason::timed_out:
      return {status_code::unavailable, r.message, failure_reason::timeout};
    case reject_reason::too_many_rows:
      return {status_code::bad_request, r.message, failure_reason::bad_request};
    case reject_reason::too_large:
      return {status_code::payload_too_large, r.message, failure_reason::bad_request};
  }
  return {status_code::internal, r.message, failure_reason::internal};
}

policy_config make_policy_config(const model_config& model,
                                 uint32_t max_queue_size_default,
                                 uint64_t max_batch_bytes) {
  policy_config cfg;
  cfg.max_batch_bytes = max_batch_bytes;
  cfg.max_batch_size = model.max_batch_size;
  cfg.dynamic_batching_enabled = model.dynamic_batching_enabled;
  cfg.dynamic_batching = model.dynamic_batching;
  cfg.max_queue_size_default = max_queue_size_default;
  return cfg;
}

// -- validation -----------------------------------------------------------------

std::optional<serving_error> batching_policy::validate(const policy_config& cfg) {
  if (cfg.max_queue_size_default == 0)
    return bad_request("the engine's default max queue size is 0; it replaces "
                       "every unbounded (0) max_queue_size and must be at least "
                       "1 (set --max-queue-size)");
  if (cfg.max_batch_bytes > max_data_field_bytes)
    return bad_request("the largest batch is " + std::to_string(cfg.max_batch_bytes)
                       + " bytes; a batch's tensors travel in Cap'n Proto Data fields, "
                         "which hold at most "
                       + std::to_string(max_data_field_bytes)
                       + " bytes (set --max-batch-bytes at or below that)");
  if (cfg.max_padding_waste && !(*cfg.max_padding_waste >= 0 && *cfg.max_padding_waste < 1))
    return bad_request("padded_batching_max_waste is " + std::to_string(*cfg.max_padding_waste)
                       + "; it must be in [0, 1)");
  if (cfg.max_batch_size < 0)
    return bad_request("max_batch_size is " + std::to_string(cfg.max_batch_size)
                       + "; it must be 0 (no batching) or positive");
  if (!cfg.dynamic_batching_enabled)
    return std::nullopt;
  const auto& db = cfg.dynamic_batching;
  // The checks below are Triton's ValidateModelConfig for dynamic_batching.
  for (int size : db.preferred_batch_sizes) {
    if (size <= 0 || size > cfg.max_batch_size)
      return bad_request("dynamic_batching.preferred_batch_size " + std::to_string(size)
                         + " is out of range: each preferred size must be in [1, "
                         "max_batch_size = " + std::to_string(cfg.max_batch_size) + "]");
  }
  if (db.priority_levels != 0) {
    if (db.default_priority_level == 0 || db.default_priority_level > db.priority_levels)
      return bad_request("dynamic_batching.default_priority_level is "
                         + std::to_string(db.default_priority_level)
                         + "; it must be in [1, priority_levels = "
                         + std::to_string(db.priority_levels) + "]");
    for (const auto& [level, policy] : db.priority_queue_policy) {
      if (level == 0 || level > db.priority_levels)
        return bad_request("dynamic_batching.priority_queue_policy has key "
                           + std::to_string(level)
                           + "; keys must be priority levels in [1, priority_levels = "
                           + std::to_string(db.priority_levels) + "]");
    }
  }
  if (db.preserve_ordering) {
    if (db.priority_levels > 1)
      return bad_request("dynamic_batching.preserve_ordering is true with "
                         + std::to_string(db.priority_levels)
                         + " priority levels; only one level is allowed when "
                           "ordering is preserved");
    auto delays = [](const queue_policy& p) {
      return p.default_timeout_us != 0 && p.action == timeout_action::delay;
    };
    bool any_delay = delays(db.default_queue_policy);
    for (const auto& [level, policy] : db.priority_queue_policy)
      any_delay = any_delay || delays(policy);
    if (any_delay)
      return bad_request("a queue policy has timeout_action DELAY while "
                         "dynamic_batching.preserve_ordering is true; use REJECT "
                         "or turn preserve_ordering off");
  }
  return std::nullopt;
}

// -- construction ---------------------------------------------------------------

batching_policy::batching_policy(policy_config cfg) : cfg_(std::move(cfg)) {
  if (auto err = validate(cfg_))
    throw std::invalid_argument("batching_policy: " + err->message);
  max_batch_rows_ = static_cast<uint32_t>(std::max(1, cfg_.max_batch_size));
  one_request_per_batch_ = !cfg_.dynamic_batching_enabled;
  auto settings_for = [this](const queue_policy& p) {
    return level_settings{p, p.max_queue_size != 0 ? p.max_queue_size
                                                   : cfg_.max_queue_size_default};
  };
  if (!cfg_.dynamic_batching_enabled) {
    // Triton hands such requests straight to the model instance: no timeouts,
    // no priorities. Our queue only waits for a free executor, and is bounded.
    default_settings_ = settings_for(queue_policy{});
    return;
  }
  const auto& db = cfg_.dynamic_batching;
  // Triton's NormalizeModelConfig: no preferred sizes means {max_batch_size}.
  for (int size : db.preferred_batch_sizes)
    preferred_sizes_.push_back(static_cast<uint32_t>(size));
  if (preferred_sizes_.empty() && cfg_.max_batch_size > 0)
    preferred_sizes_.push_back(static_cast<uint32_t>(cfg_.max_batch_size));
  std::sort(preferred_sizes_.begin(), preferred_sizes_.end());
  preferred_sizes_.erase(std::unique(preferred_sizes_.begin(), preferred_sizes_.end()),
                         preferred_sizes_.end());
  max_preferred_rows_ = preferred_sizes_.empty() ? 0 : preferred_sizes_.back();
  default_settings_ = settings_for(db.default_queue_policy);
  // With one level (priority_levels 0) Triton uses default_queue_policy only.
  if (db.priority_levels != 0)
    for (const auto& [level, policy] : db.priority_queue_policy)
      level_settings_.emplace(level, settings_for(policy));
}

uint32_t batching_policy::level_of(uint32_t requested) const {
  if (!cfg_.dynamic_batching_enabled || cfg_.dynamic_batching.priority_levels == 0)
    return 0;
  const auto& db = cfg_.dynamic_batching;
  // Triton's InferenceRequest::SetPriority: 0 (none) and out-of-range levels
  // both get the default level.
  if (requested == 0 || requested > db.priority_levels)
    return db.default_priority_level;
  return requested;
}

const batching_policy::level_settings&
batching_policy::settings_of(uint32_t level) const {
  auto i = level_settings_.find(level);
  return i != level_settings_.end() ? i->second : default_settings_;
}

std::optional<time_point>
batching_policy::deadline_of(const level_settings& level,
                             const request_info& request, time_point now) const {
  // Triton core (PolicyQueue::Enqueue) replaces the default timeout by the
  // request's only when allow_timeout_override is set and the request's is
  // shorter ("can set a timeout that is less than the default timeout value but
  // may not increase the timeout", model_config.proto). Decision: a default of
  // 0 means "no timeout is set" (proto), i.e. unbounded, so with override
  // allowed a request's own timeout applies. Triton's code instead compares
  // against the literal 0 and ignores the request's timeout in that case; we
  // follow the proto's wording, which honours what the client asked for.
  uint64_t timeout_us = level.policy.default_timeout_us;
  if (level.policy.allow_timeout_override && request.timeout_us != 0
      && (timeout_us == 0 || request.timeout_us < timeout_us))
    timeout_us = request.timeout_us;
  if (timeout_us == 0)
    return std::nullopt;
  return add_us(now, timeout_us);
}

// -- events ---------------------------------------------------------------------

enqueue_result batching_policy::enqueue(const request_info& request, time_point now) {
  // Triton counts a request without a batch dimension as one row; a model
  // without batching (max_batch_size 0) takes whole requests, one per batch.
  uint32_t rows = cfg_.max_batch_size == 0 ? 1 : std::max<uint32_t>(1, request.rows);
  if (rows > max_batch_rows_)
    return rejected{request.id, reject_reason::too_many_rows,
                    "request has " + std::to_string(rows)
                      + " rows but the model's max_batch_size is "
                      + std::to_string(max_batch_rows_)
                      + "; split it into requests of at most that many rows"};
  if (cfg_.max_batch_bytes != 0 && request.bytes > cfg_.max_batch_bytes)
    return rejected{request.id, reject_reason::too_large,
                    "request holds " + std::to_string(request.bytes)
                      + " bytes of input tensors, more than one batch may hold ("
                      + std::to_string(cfg_.max_batch_bytes)
                      + " bytes, --max-batch-bytes); split it into smaller requests"};
  uint32_t level = level_of(request.priority);
  const auto& settings = settings_of(level);
  auto existing = levels_.find(level);
  size_t level_size = existing == levels_.end() ? 0 : existing->second.size();
  if (level_size >= settings.max_queue_size)
    return rejected{request.id, reject_reason::queue_full,
                    level_name(level) + " is full ("
                      + std::to_string(settings.max_queue_size)
                      + " requests); retry later, or raise max_queue_size"};
  auto& queue = levels_[level];
  auto deadline = deadline_of(settings, request, now);
  uint64_t seq = next_seq_++;
  auto where = queue.waiting.insert(queue.waiting.end(),
                                    entry{request.id, rows, seq, now, deadline,
                                          request.shape_class, request.bytes,
                                          request.padded_length});
  if (deadline)
    deadlines_.emplace(deadline_key{*deadline, seq}, deadline_entry{level, where});
  ++queued_;
  queued_rows_ += rows;
  if (last_arrival_) {
    double gap = static_cast<double>(us_between(*last_arrival_, now)) / rows;
    row_gap_us_ = row_gap_us_ == 0 ? gap : 0.75 * row_gap_us_ + 0.25 * gap;
  }
  last_arrival_ = now;
  return admitted{};
}

poll_result batching_policy::poll(time_point now, bool executor_available) {
  poll_result result;
  result.expired = apply_timeouts(now);
  if (queued_ == 0)
    result.next = idle{};
  else if (!executor_available)
    // Only a queue timeout can change anything before an executor frees up.
    result.next = deadlines_.empty()
                    ? next_step{wait_for_executor{}}
                    : next_step{wait_until{deadlines_.begin()->first.first}};
  else
    result.next = form_batch(now);
  return result;
}

std::vector<rejected> batching_policy::apply_timeouts(time_point now) {
  // Triton applies timeouts lazily, only to requests its batch cursor passes;
  // we apply them to the whole queue at every poll so that a REJECT is answered
  // when it falls due. A request expires once `now` reaches its deadline.
  std::vector<rejected> expired;
  while (!deadlines_.empty() && deadlines_.begin()->first.first <= now) {
    auto node = deadlines_.extract(deadlines_.begin());
    auto [level, where] = node.mapped();
    auto& queue = levels_.at(level);
    const auto& settings = settings_of(level);
    if (settings.policy.action == timeout_action::delay) {
      // Moves behind every undelayed request of its level. Deadlines are taken
      // in order, so the delayed list stays in the order requests timed out.
      queue.delayed.splice(queue.delayed.end(), queue.waiting, where);
      continue;
    }
    const entry& e = *where;
    expired.push_back(rejected{
      e.id, reject_reason::timed_out,
      "request waited " + std::to_string(us_between(e.enqueued, now)) + " us in "
        + level_name(level) + ", past its queue timeout of "
        + std::to_string(us_between(e.enqueued, *e.deadline))
        + " us; retry, give it a longer timeout, or add model instances"});
    --queued_;
    queued_rows_ -= e.rows;
    queue.waiting.erase(where);
    if (queue.size() == 0)
      levels_.erase(level);
  }
  return expired;
}

next_step batching_policy::form_batch(time_point now) {
  if (one_request_per_batch_)
    return take(1);
  // Triton's GetDynamicBatch, over the whole queue in priority order. Walk the
  // longest prefix that fits max_batch_size rows ("pending"), remembering the
  // largest prefix whose rows are a preferred size ("best"); if none is, the
  // prefix just before the rows pass the largest preferred size stands in.
  uint32_t pending_rows = 0;
  uint64_t pending_bytes = 0;
  size_t pending_count = 0;
  size_t best_count = 0; // 0: none found
  // The next request would pass max_batch_size or max_batch_bytes, or has
  // another shape: the batch cannot grow.
  bool full = false;
  uint64_t shape_class = 0;
  // Padded batching: sum of rows * length, and the longest length, so far.
  double pending_elements = 0;
  uint64_t longest = 0;
  auto padding_passes_bound = [&](const entry& e) {
    if (!cfg_.max_padding_waste)
      return false;
    uint64_t new_longest = std::max(longest, e.padded_length);
    double elements = pending_elements + double(e.rows) * double(e.padded_length);
    double total = double(pending_rows + e.rows) * double(new_longest);
    return total > 0 && 1.0 - elements / total > *cfg_.max_padding_waste + 1e-12;
  };
  time_point oldest = time_point::max();
  for (auto& [level, queue] : levels_) {
    for (auto* list : {&queue.waiting, &queue.delayed}) {
      for (const entry& e : *list) {
        if (pending_count == 0) {
          shape_class = e.shape_class;
        } else {
          if (e.shape_class != shape_class || padding_passes_bound(e)
              || (cfg_.max_batch_bytes != 0 && pending_bytes + e.bytes > cfg_.max_batch_bytes)) {
            full = true;
            break;
          }
          if (pending_rows + e.rows > max_preferred_rows_ && best_count == 0)
            best_count = pending_count;
          if (pending_rows + e.rows > max_batch_rows_) {
            full = true;
            break;
          }
        }
        pending_elements += double(e.rows) * double(e.padded_length);
        longest = std::max(longest, e.padded_length);
        pending_rows += e.rows;
        pending_bytes += e.bytes;
        ++pending_count;
        oldest = std::min(oldest, e.enqueued);
        if (std::binary_search(preferred_sizes_.begin(), preferred_sizes_.end(),
                               pending_rows))
          best_count = pending_count;
      }
      if (full)
        break;
    }
    if (full)
      break;
  }
  const uint64_t delay_us = cfg_.dynamic_batching.max_queue_delay_us;
  const time_point delay_expiry = add_us(oldest, delay_us);
  const bool delay_exceeded = delay_us != 0 && now >= delay_expiry;
  // A preferred size goes out at once, unless the delay is exceeded: then the
  // whole pending batch goes out (Triton sends "whatever is pending").
  if (best_count != 0 && !delay_exceeded)
    return take(best_count);
  // The batch cannot grow any larger.
  if (full || pending_rows >= max_preferred_rows_)
    return take(pending_count);
  if (delay_exceeded || delay_us == 0)
    return take(pending_count);
  if (!cfg_.captured_batch_sizes.empty()) {
    padding_inputs pad{cfg_.captured_batch_sizes, pending_rows, row_gap_us_,
                       static_cast<uint64_t>(us_between(now, delay_expiry))};
    auto choice = choose_padding(pad);
    if (auto* p = std::get_if<pad_now>(&choice)) {
      auto batch = take(pending_count);
      batch.padded_rows = p->bucket;
      return batch;
    }
  }
  time_point when = delay_expiry;
  if (!deadlines_.empty())
    when = std::min(when, deadlines_.begin()->first.first);
  return wait_until{when};
}

dispatch batching_policy::take(size_t count) {
  dispatch batch;
  batch.ids.reserve(count);
  while (batch.ids.size() < count) {
    auto first = levels_.begin();
    auto& queue = first->second;
    auto& list = queue.waiting.empty() ? queue.delayed : queue.waiting;
    const entry& e = list.front();
    if (e.deadline && &list == &queue.waiting)
      deadlines_.erase(deadline_key{*e.deadline, e.seq});
    batch.ids.push_back(e.id);
    batch.rows += e.rows;
    --queued_;
    queued_rows_ -= e.rows;
    list.pop_front();
    if (queue.size() == 0)
      levels_.erase(first);
  }
  return batch;
}

} // namespace caf_serving::scheduler
