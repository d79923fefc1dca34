#pragma once
/// The scheduler's supervision decisions as a plain object with the clock
/// passed in (STYLE.md): no CAF, no threads, no clock reads. The scheduler
/// actor feeds it what happens to its executors and batches, with now_ns()
/// (steady-clock nanoseconds), and carries out the decisions it returns:
/// sending, logging, counting, and waking itself at the times it names.
///
/// It decides four things:
///
/// - Executor health. An executor whose batches fail internally (status 500
///   and above: not the request's fault) `quarantine_after_failures` times in a
///   row is quarantined: it gets no batches for a backoff that starts at
///   `quarantine_backoff` and doubles with each quarantine (at most 2^16
///   times), capped at `max_quarantine_backoff`. An attempt that ends without
///   an internal failure clears the count and the backoff.
/// - Respawns. A local executor that stopped is started again at once, unless
///   restarts keep coming less than a second apart with no batch succeeding in
///   between (a crash loop): from the third such restart in a row the next
///   waits 50 ms, doubling with each (at most 2^8 times), capped at 10 s.
/// - Hung executors. A local attempt that has not been answered
///   `local_batch_timeout` after it was sent is given up as hung. One check
///   for all of them, armed for the oldest attempt in flight, not a timer each.
/// - Failed attempts. A batch whose attempt got no answer because its executor
///   was lost (stopped, or timed out) is sent again while it has attempts left
///   (`max_local_attempts` on a local executor, `max_batch_attempts` on a remote
///   one); then its requests get a 503 (remote) or a 500 (local). An attempt
///   whose executor failed while running it gets a 500 at once.
///
/// ## Usage (what the scheduler actor does)
///
/// ```
/// supervision_policy sv{cfg};
/// // an executor joins / leaves:      sv.add_executor(id) / sv.remove_executor(id)
/// // choosing an executor:            skip it while sv.quarantined(id, now)
/// // an attempt ends:                 sv.clear_failures(id), or
///                                     act on sv.internal_failure(id, now)
/// // a batch succeeds:                sv.batch_succeeded()
/// // a local executor stops:          act on sv.local_executor_stopped(now)
/// // a local attempt is sent:         tick at sv.local_attempt_sent(batch, now)
/// // an attempt is over:              sv.attempt_ended(batch)
/// // a tick:                          give up sv.check_hung(now).hung, tick at .next;
///                                     start sv.take_due_respawns(now) executors
/// // an attempt got no answer:        act on sv.attempt_failed(attempt)
/// ```

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

namespace caf_serving::scheduler {

struct supervision_config {
  /// Internal failures in a row after which an executor is quarantined.
  uint32_t quarantine_after_failures = 3;
  /// The first quarantine's length; it doubles with each quarantine up to the cap.
  std::chrono::milliseconds quarantine_backoff{1000};
  std::chrono::milliseconds max_quarantine_backoff{30000};
  /// A local attempt unanswered this long is given up as hung; 0: never.
  std::chrono::milliseconds local_batch_timeout{60000};
  /// Attempts a batch gets on local executors that stop while running it.
  uint32_t max_local_attempts = 2;
  /// Attempts a batch gets on remote executors that are lost while holding it.
  uint32_t max_batch_attempts = 4;
};

// -- decisions out ------------------------------------------------------------

/// Wake the scheduler at `when_ns` (steady clock): a tick is always safe to
/// handle early or twice.
struct wake_at {
  int64_t when_ns = 0;
};

/// The executor keeps getting batches: `failures_in_row` internal failures so far.
struct keep_serving {
  uint32_t failures_in_row = 0;
};

/// The executor gets no batches until `until_ns` (wake then): it failed
/// quarantine_after_failures batches in a row. `backoff` is how long.
struct quarantine {
  int64_t until_ns = 0;
  std::chrono::milliseconds backoff{0};
};

using failure_decision = std::variant<keep_serving, quarantine>;

/// Start `executors` local executors now: every one whose restart was due.
struct respawn_now {
  uint32_t executors = 0;
};

/// Executors keep stopping: the next starts after `delay_ns`, at `at_ns` (wake then).
struct respawn_later {
  int64_t at_ns = 0;
  int64_t delay_ns = 0;
};

using respawn_decision = std::variant<respawn_now, respawn_later>;

/// What the hang check found.
struct hang_check {
  /// Batches whose local attempt ran past local_batch_timeout, ascending: give
  /// each attempt up as timed out (attempt_failed). They are no longer tracked.
  std::vector<uint64_t> hung;
  /// The next check, for the oldest attempt left, when it is armed now.
  std::optional<wake_at> next;
};

/// How an attempt that got no answer ended.
enum class attempt_end {
  /// Its executor stopped or its node was lost.
  stopped,
  /// Its executor did not answer in time (a local one hung, or a remote
  /// proxy's own timeout): taken for lost too.
  timed_out,
  /// Its executor failed while running it and is not lost.
  failed,
};

/// An attempt of a batch that got no answer.
struct failed_attempt {
  /// Attempts the batch has had, this one included.
  uint32_t attempts = 0;
  /// Whether the executor was local (started by this scheduler).
  bool local = false;
  attempt_end how = attempt_end::failed;
};

/// Send the same batch again, before any new batch.
struct send_again {};

/// Answer the batch's requests 503 (retry the request): it was lost with
/// `attempts` remote executors in a row.
struct fail_unavailable {
  uint32_t attempts = 0;
};

/// Answer the batch's requests 500: the executor failed while running it, or
/// `attempts` local executors in a row stopped (or hung) while holding it.
struct fail_internal {
  attempt_end how = attempt_end::failed;
  uint32_t attempts = 0;
};

using attempt_decision = std::variant<send_again, fail_unavailable, fail_internal>;

// -- the policy -----------------------------------------------------------------

class supervision_policy {
public:
  explicit supervision_policy(supervision_config cfg = {});

  const supervision_config& config() const { return cfg_; }

  // Executor health. Executors are named by an id the scheduler gives them.

  void add_executor(uint64_t executor);
  void remove_executor(uint64_t executor);

  /// Whether `executor` is quarantined at `now_ns` (an unknown one is not).
  bool quarantined(uint64_t executor, int64_t now_ns) const;

  /// An attempt on `executor` ended in an internal failure (status 500 and
  /// above, or a remote batch presumed lost).
  failure_decision internal_failure(uint64_t executor, int64_t now_ns);

  /// An attempt on `executor` ended without an internal failure: its failures
  /// in a row and its quarantine backoff start over.
  void clear_failures(uint64_t executor);

  // Respawns of local executors.

  /// A local executor stopped and is to be replaced.
  respawn_decision local_executor_stopped(int64_t now_ns);

  /// How many local executors to start now (their restart is due); they are
  /// no longer waiting.
  uint32_t take_due_respawns(int64_t now_ns);

  /// Whether local executors wait to be started (requests may wait for them).
  bool respawns_waiting() const { return respawns_due_ > 0; }

  /// Forgets the executors waiting to be started (a draining scheduler that
  /// has none left).
  void cancel_respawns() { respawns_due_ = 0; }

  /// A batch came back with a result: executors are not in a crash loop.
  void batch_succeeded() { quick_restarts_ = 0; }

  // The hang check of local attempts.

  /// The attempt of `batch` was sent to a local executor at `now_ns`. Returns
  /// the check to arm when none is armed as soon (nothing when one is, or
  /// local_batch_timeout is 0).
  std::optional<wake_at> local_attempt_sent(uint64_t batch, int64_t now_ns);

  /// The attempt of `batch` in flight is over (answered, given up, or failed).
  void attempt_ended(uint64_t batch);

  /// When the armed check is due by `now_ns`: the local attempts that ran past
  /// local_batch_timeout, and the check armed for the oldest one left.
  hang_check check_hung(int64_t now_ns);

  // Attempts that got no answer.

  attempt_decision attempt_failed(const failed_attempt& attempt) const;

private:
  struct executor_health {
    /// Internal failures in a row.
    uint32_t failures_in_row = 0;
    /// Quarantines since the executor last succeeded: the backoff doubles with each.
    uint32_t quarantines = 0;
    /// No batches until then; 0: never quarantined.
    int64_t quarantined_until_ns = 0;
  };

  std::optional<wake_at> arm_hang_check(int64_t due_ns);

  supervision_config cfg_;
  std::map<uint64_t, executor_health> health_;
  /// When the last quarantine ends (the latest quarantined_until_ns).
  int64_t quarantines_end_ns_ = 0;
  /// Local executors that stopped and are to be started again, and when.
  uint32_t respawns_due_ = 0;
  int64_t respawn_at_ns_ = 0;
  /// Restarts in a row that came soon after the previous one with no batch
  /// succeeding in between.
  uint32_t quick_restarts_ = 0;
  int64_t last_restart_ns_ = 0;
  /// Local attempts in flight, (batch, when it was sent), ordered by batch: a
  /// flat vector, which allocates nothing per batch once it has grown (batch
  /// ids rise, so an attempt is appended and usually ends near the front).
  std::vector<std::pair<uint64_t, int64_t>> local_attempts_;
  /// When the armed hang check is due; none armed when empty.
  std::optional<int64_t> hang_check_ns_;
};

} // namespace caf_serving::scheduler
