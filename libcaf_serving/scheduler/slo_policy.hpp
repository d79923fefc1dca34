#pragma once
/// The latency-target policy of one model version (docs/latency-target.md): the
/// scheduler meets a target by choosing batch sizes and dispatch times itself,
/// and sheds at once what it cannot serve in time.
///
/// Chosen instead of batching_policy when config.pbtxt sets the model parameter
/// `latency_target_ms`; max_queue_delay_microseconds and preferred_batch_size are
/// then ignored. A plain object with the clock passed in, like batching_policy:
/// the scheduler actor feeds it requests, ticks and the executors' state
/// (`executor_load`, with each executor's cost model) and carries out what it
/// decides; the unit tests drive it by hand and by long random event sequences.
///
/// ## What it decides
///
/// - Deadlines. A request's deadline is its arrival at the server plus the
///   target, or plus its own `timeout` parameter (or its level's
///   default_timeout_microseconds) when that is tighter.
/// - Order. Priority level first (1 is highest), earliest deadline first within
///   a level. Only requests of one shape class share a batch (as in
///   batching_policy); a batch holds at most max_batch_size rows and
///   max_batch_bytes bytes.
/// - The plan. The queue, in that order, is cut greedily into batches (each
///   request joins the open batch of its class while it has room), and the
///   batches are laid onto the executors, each on the one that finishes it
///   first given its outstanding work and its cost model (executor_choice.hpp).
///   That gives every queued request a predicted completion. The cut is kept
///   as requests arrive (a request at the end of the queue joins its class's
///   open batch or opens one) and made again from the queue only after
///   requests left it or one was queued ahead of others; laying it visits
///   batches, not requests.
/// - Growth. Near and above capacity (the rows offered per second lately, over
///   what the executors serve in full batches), the open batch of each class
///   is priced at the rows it is expected to hold when it starts: those it
///   holds plus those arriving meanwhile. Priced at its rows of the moment,
///   its first members were admitted with slack for a small batch only, and
///   every later arrival that would have filled it was shed for making them
///   late: under overload the executors ran small batches at a fixed cost
///   each.
/// - Dispatch. The first batch of the plan on an executor goes out when it is
///   full (the size that maximises throughput: the cost per row falls with size
///   on every backend we have), or when the executor is free, or one `margin`
///   before it is predicted to be free (an executor with a credit window over
///   1). Waiting on a free executor for a fuller batch wastes its capacity and
///   delays every later batch; under load batches grow by themselves while
///   the executor is busy. Otherwise the policy asks to be polled again then.
/// - Admission. A new request is planned in (it joins the open batch of its
///   class while that has room: batches are never split to make room, which
///   cost a fixed batch cost each time and left the queue in small batches);
///   it is shed at once (HTTP 503 with Retry-After) when it would finish past
///   its deadline, or when it would make more queued requests late than were
///   late without it (both less the margin). At the end of the queue (the
///   common case) that costs two layings of the batches and a look at the
///   members of the batches laid after the one it joins; queued ahead of
///   others (its own tighter deadline, a higher priority) it cuts the queue
///   again and counts every queued request, as the first version did for
///   every arrival. Requests that can no longer
///   finish by their deadline, even alone on the executor that would finish
///   them first, are shed from the queue at poll (poll_result.expired) instead
///   of being served late (the scan of a level stops at the first request a
///   full batch would still serve in time); so is a member of a batch about
///   to go that would finish it too late.
/// - Feedback. Every batch laid on an executor also pays that executor's
///   lateness (executor_load::lateness_ns: an upper quantile of how much later
///   than predicted its recent answers arrived, executor_book.hpp), in
///   admission, in the shedding of expired requests and in the last guard
///   before dispatch: on shared cores, where answers come back later than the
///   executor's own compute time says, admitted requests still finish in time.
/// - While an executor has not been measured at all, the policy cannot predict:
///   it admits every request (up to the queue bound) and sends batches as soon
///   as an executor is free, which measures it. (The scheduler actor first
///   runs two synthetic warm-up batches on each new executor when the model's
///   inputs have fixed shapes.)

#include "scheduler/batching_policy.hpp"
#include "scheduler/executor_choice.hpp"

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

namespace caf_serving::scheduler {

struct slo_policy_config {
  /// Rows, bytes, priority levels and queue bounds, as for batching_policy (the
  /// delays and preferred sizes in it are not used).
  policy_config base;
  /// The latency target: received to answered.
  std::chrono::microseconds target{0};
  /// Held back from every deadline for what the plan does not see: a timer that
  /// fires late (up to ~0.4 ms on our VMs), the hops to the executor and back,
  /// post-processing and writing the response.
  std::chrono::microseconds margin{0};
  /// A request that would be shed is served anyway, as a probe, when the
  /// queue is empty and every executor has been idle this long, at most one
  /// such request per this interval; 0: never. Predictions only change when
  /// batches run: a cost model or lateness that says "too slow" for every
  /// request (measured in a slow spell) would otherwise shed everything for
  /// good. A probe can be late; it is what keeps the model measured.
  std::chrono::microseconds probe_interval{1'000'000};
  /// The most the prediction-error feedback (executor_load::lateness_ns, paid
  /// by each batch) adds to one predicted completion; 0: a quarter of the
  /// target. On cores so starved that answers come back tens of milliseconds
  /// late, an uncapped feedback priced even a lone request past the target and
  /// shed everything; capped, it widens the margins and the rest is shed by
  /// what the queue really holds.
  std::chrono::microseconds max_feedback{0};
};

/// The model's `latency_target_ms` parameter: nothing when it is not set; an
/// error saying what is wrong with it when it is not a positive number of
/// milliseconds.
result<std::optional<std::chrono::microseconds>> read_latency_target(const model_config& model);

/// The margin for a target: a twentieth of it, at least 1 ms, at most half of it.
std::chrono::microseconds default_slo_margin(std::chrono::microseconds target);

/// A request the policy will not serve because it would finish past its deadline.
struct shed {
  uint64_t id = 0;
  /// "request shed: predicted completion 63 ms > latency target 50 ms (queue 12
  /// requests ahead)".
  std::string message;
  /// How long the client should wait before retrying (HTTP Retry-After), >= 1.
  uint32_t retry_after_s = 1;
};

using slo_enqueue_result = std::variant<admitted, rejected, shed>;

/// A batch to send now to executor `executor` (an index into the loads the
/// poll was given; it has a free credit).
struct slo_dispatch {
  std::vector<uint64_t> ids;
  uint32_t rows = 0;
  size_t executor = 0;
  /// Its predicted service time there (0 when the executor is not measured).
  int64_t predicted_ns = 0;
};

using slo_next_step = std::variant<slo_dispatch, wait_until, wait_for_executor, idle>;

struct slo_poll_result {
  /// Queued requests that can no longer finish in time; answer them.
  std::vector<shed> expired;
  slo_next_step next;
};

class slo_policy {
public:
  /// Throws std::invalid_argument for a config batching_policy::validate
  /// refuses or a target that is not positive (the loader checks first).
  explicit slo_policy(slo_policy_config cfg);

  /// Queues a request that the server received at `received` and the scheduler
  /// got at `now`, or answers it at once: rejected (too many rows, too large,
  /// queue full) or shed (it would finish too late). Call poll() afterwards.
  slo_enqueue_result enqueue(const request_info& request, time_point received, time_point now,
                             const std::vector<executor_load>& executors);

  /// Sheds what can no longer finish in time, then decides what to do next.
  /// `executors`: every executor that may take batches (quarantined ones left
  /// out), with what it holds.
  slo_poll_result poll(time_point now, const std::vector<executor_load>& executors);

  size_t queued() const { return queue_.size(); }

  /// Queued requests visited so far to cut the queue into batches and to find
  /// expired ones: what a decision costs as the queue grows (for the tests;
  /// admission at the end of the queue visits none).
  uint64_t entries_visited() const { return entries_visited_; }

  const slo_policy_config& config() const { return cfg_; }

private:
  struct entry {
    uint64_t id;
    uint32_t rows;
    uint32_t level;
    /// Arrival order among queued requests; breaks deadline ties.
    uint64_t seq;
    time_point received;
    time_point deadline;
    /// The deadline's budget from receipt, and whether it is the request's own
    /// timeout (for the shed message).
    std::chrono::microseconds budget;
    bool own_deadline;
    /// Admitted against the prediction to measure the executor (probe_interval):
    /// neither shed from the queue nor trimmed from its batch.
    bool probe = false;
    /// Requests with equal keys may share a batch.
    std::pair<uint64_t, uint64_t> batch_class;
    uint64_t bytes;
  };

  /// Queue order: level, deadline, arrival.
  using key = std::tuple<uint32_t, time_point, uint64_t>;

  /// One batch of the cut: the queue, in its order, cut greedily into
  /// batches (each request joins the open batch of its class while that has
  /// room). Kept up to date as requests arrive at the end of the queue (the
  /// common case: one target, so arrival order is deadline order), and cut
  /// again from the queue only after requests left it or one was queued ahead
  /// of others: admission no longer visits the queued requests.
  struct cut_batch {
    std::pair<uint64_t, uint64_t> batch_class;
    std::vector<const entry*> members;
    uint32_t rows = 0;
    uint64_t bytes = 0;
    time_point earliest_deadline = time_point::max();
  };

  /// Where the plan lays a batch of the cut, and when it is predicted to complete.
  struct laid_batch {
    time_point completion{};
    size_t executor = 0;
  };

  /// What add_to_cut changed, so that a shed request can be taken out again.
  struct cut_undo {
    size_t batch = 0;
    bool opened = false;
    std::optional<size_t> previous_open;
    time_point previous_earliest{};
  };

  uint32_t level_of(uint32_t requested) const;
  uint32_t max_queue_size_of(uint32_t level) const;
  /// Adds queued request `e` (the last in queue order) to the cut.
  cut_undo add_to_cut(const entry& e);
  void undo_add_to_cut(const cut_undo& u);
  /// Cuts the whole queue again when requests left it since the last cut.
  void refresh_cut();
  /// Lays the batches of the cut onto the executors in order, each where it
  /// finishes first given their outstanding work: every batch's completion.
  /// The open batch of each class (the one new requests join) is priced at
  /// the rows it is expected to hold when it starts (expected_rows), not at
  /// the rows it holds now.
  std::vector<laid_batch> lay(time_point now, const std::vector<executor_load>& executors) const;
  /// Queued requests predicted to finish past their deadline less the margin.
  size_t late_requests(const std::vector<laid_batch>& laid, std::chrono::nanoseconds margin) const;
  /// Takes a queued request out of the queue (the cut is redone when next needed).
  void remove(const entry& e);
  /// Admission when the request was queued ahead of others: the cut is redone
  /// and every queued request's lateness counted, as the first version did for
  /// every request.
  slo_enqueue_result admit_reordered(std::map<key, entry>::iterator where, time_point now,
                                     const std::vector<executor_load>& executors);
  shed make_shed(const entry& e, time_point predicted, size_t ahead, time_point drained,
                 time_point now) const;
  /// A queued request shed because it can no longer finish in time.
  shed late_shed(const entry& e, time_point done, time_point now) const;

  slo_policy_config cfg_;
  uint32_t max_batch_rows_;
  std::map<key, entry> queue_;
  std::map<uint32_t, size_t> per_level_;
  uint64_t next_seq_ = 0;
  std::vector<cut_batch> cut_;
  /// The open batch of each class: the last one cut for it.
  std::map<std::pair<uint64_t, uint64_t>, size_t> open_;
  /// Requests left the queue since the cut was made.
  bool cut_stale_ = false;
  uint64_t entries_visited_ = 0;
  /// When the last probe was admitted.
  std::optional<time_point> last_probe_;
  /// The last `arrival_window` requests offered (admitted or not) within the
  /// last four targets, oldest first: when they came and how many rows, and
  /// the sum of those rows (so that the rate costs no scan).
  struct arrival {
    time_point at;
    uint32_t rows;
  };
  static constexpr size_t arrival_window = 256;
  std::deque<arrival> arrivals_;
  uint64_t arrival_rows_ = 0;
  /// Counts an arrival of `rows` at `now`.
  void note_arrival(time_point now, uint32_t rows);
  /// Forgets the arrivals older than four targets before `now`.
  void forget_arrivals(time_point now);
  /// Rows offered per nanosecond lately: the rows of the arrivals kept after the
  /// oldest, over the time since it (0 with fewer than two).
  double arrival_rate(time_point now) const;
  /// The share (0 to 1) of the expected arrivals the open batches are priced
  /// with: none up to the executors' full-batch capacity, all from 120% of it.
  double growth_share(double rate, const std::vector<executor_load>& executors) const;
  /// Rows the open batch `b` is priced at when it starts `start_ns` from now:
  /// its rows and those arriving meanwhile at `rate`, up to a full batch.
  uint32_t expected_rows(const cut_batch& b, size_t k, double rate, int64_t start_ns) const;
  /// Whether the request at `where` (about to be shed) may go as a probe;
  /// marks it so when it may.
  bool take_as_probe(entry& e, time_point now, const std::vector<executor_load>& executors);
  /// The feedback `batches` batches on `x` pay, capped at max_feedback.
  int64_t feedback_ns(const executor_load& x, int64_t batches) const;
  /// Predicted completion of a new batch of `rows` on `x` from now: what it
  /// holds, the batch, and the (capped) feedback.
  int64_t completion_ns(const executor_load& x, uint32_t rows) const;
};

} // namespace caf_serving::scheduler
