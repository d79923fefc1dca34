#include "scheduler/supervision_policy.hpp"

#include <algorithm>
#include <utility>

namespace caf_serving::scheduler {

namespace {

/// Restarts closer together than this, with no batch succeeding in between,
/// count as quick.
constexpr int64_t quick_restart_ns = 1'000'000'000;
/// Quick restarts in a row that still start at once.
constexpr uint32_t free_quick_restarts = 3;
/// The first delayed restart waits this long, doubling up to the cap.
constexpr int64_t first_respawn_delay_ns = 50'000'000;
constexpr uint32_t max_respawn_doublings = 8;
constexpr int64_t max_respawn_delay_ns = 10'000'000'000;
/// The quarantine backoff doubles at most this often (then the cap applies anyway).
constexpr uint32_t max_quarantine_doublings = 16;

} // namespace

supervision_policy::supervision_policy(supervision_config cfg) : cfg_(std::move(cfg)) {}

// -- executor health ------------------------------------------------------------

void supervision_policy::add_executor(uint64_t executor) {
  health_.emplace(executor, executor_health{});
}

void supervision_policy::remove_executor(uint64_t executor) {
  health_.erase(executor);
}

bool supervision_policy::quarantined(uint64_t executor, int64_t now_ns) const {
  if (now_ns >= quarantines_end_ns_) // none is: the common case, with no lookup
    return false;
  auto it = health_.find(executor);
  return it != health_.end() && it->second.quarantined_until_ns > now_ns;
}

failure_decision supervision_policy::internal_failure(uint64_t executor, int64_t now_ns) {
  auto& h = health_[executor];
  if (++h.failures_in_row < cfg_.quarantine_after_failures)
    return keep_serving{h.failures_in_row};
  h.failures_in_row = 0;
  auto backoff = cfg_.quarantine_backoff
                 * (int64_t{1} << std::min(h.quarantines, max_quarantine_doublings));
  backoff = std::min(backoff, cfg_.max_quarantine_backoff);
  ++h.quarantines;
  h.quarantined_until_ns = now_ns + std::chrono::nanoseconds(backoff).count();
  quarantines_end_ns_ = std::max(quarantines_end_ns_, h.quarantined_until_ns);
  return quarantine{h.quarantined_until_ns, backoff};
}

void supervision_policy::clear_failures(uint64_t executor) {
  auto it = health_.find(executor);
  if (it == health_.end())
    return;
  it->second.failures_in_row = 0;
  it->second.quarantines = 0;
}

// -- respawns -------------------------------------------------------------------

respawn_decision supervision_policy::local_executor_stopped(int64_t now_ns) {
  bool quick = now_ns - last_restart_ns_ < quick_restart_ns;
  quick_restarts_ = quick ? quick_restarts_ + 1 : 0;
  last_restart_ns_ = now_ns;
  ++respawns_due_;
  if (quick_restarts_ < free_quick_restarts) {
    respawn_at_ns_ = now_ns;
    return respawn_now{std::exchange(respawns_due_, 0)};
  }
  int64_t delay = std::min<int64_t>(
    first_respawn_delay_ns
      << std::min<uint32_t>(quick_restarts_ - free_quick_restarts, max_respawn_doublings),
    max_respawn_delay_ns);
  respawn_at_ns_ = now_ns + delay;
  return respawn_later{respawn_at_ns_, delay};
}

uint32_t supervision_policy::take_due_respawns(int64_t now_ns) {
  if (respawns_due_ == 0 || now_ns < respawn_at_ns_)
    return 0;
  return std::exchange(respawns_due_, 0);
}

// -- hang check -----------------------------------------------------------------

std::optional<wake_at> supervision_policy::arm_hang_check(int64_t due_ns) {
  if (hang_check_ns_ && *hang_check_ns_ <= due_ns)
    return std::nullopt;
  hang_check_ns_ = due_ns;
  return wake_at{due_ns};
}

std::optional<wake_at> supervision_policy::local_attempt_sent(uint64_t batch, int64_t now_ns) {
  if (cfg_.local_batch_timeout.count() <= 0)
    return std::nullopt;
  auto it = std::lower_bound(local_attempts_.begin(), local_attempts_.end(), batch,
                             [](const auto& a, uint64_t b) { return a.first < b; });
  if (it != local_attempts_.end() && it->first == batch)
    it->second = now_ns;
  else
    local_attempts_.insert(it, {batch, now_ns});
  return arm_hang_check(now_ns + std::chrono::nanoseconds(cfg_.local_batch_timeout).count());
}

void supervision_policy::attempt_ended(uint64_t batch) {
  auto it = std::lower_bound(local_attempts_.begin(), local_attempts_.end(), batch,
                             [](const auto& a, uint64_t b) { return a.first < b; });
  if (it != local_attempts_.end() && it->first == batch)
    local_attempts_.erase(it);
}

hang_check supervision_policy::check_hung(int64_t now_ns) {
  hang_check out;
  if (!hang_check_ns_ || now_ns < *hang_check_ns_)
    return out;
  hang_check_ns_.reset();
  int64_t limit = std::chrono::nanoseconds(cfg_.local_batch_timeout).count();
  std::optional<int64_t> next;
  for (auto it = local_attempts_.begin(); it != local_attempts_.end();) {
    int64_t sent = it->second;
    if (now_ns - sent >= limit) {
      out.hung.push_back(it->first);
      it = local_attempts_.erase(it);
      continue;
    }
    if (!next || sent + limit < *next)
      next = sent + limit;
    ++it;
  }
  if (next)
    out.next = arm_hang_check(*next);
  return out;
}

// -- failed attempts ----------------------------------------------------------------

attempt_decision supervision_policy::attempt_failed(const failed_attempt& a) const {
  bool lost = a.how != attempt_end::failed;
  uint32_t max_attempts = a.local ? cfg_.max_local_attempts : cfg_.max_batch_attempts;
  if (lost && a.attempts < max_attempts)
    return send_again{};
  if (lost && !a.local)
    return fail_unavailable{a.attempts};
  return fail_internal{a.how, a.attempts};
}

} // namespace caf_serving::scheduler
