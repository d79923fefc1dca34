#pragma once
/// The dynamic batching policy of one model version: Triton's dynamic batcher as
/// a plain object, with the clock passed in.
///
/// No CAF, no threads, no clock reads: the scheduler actor feeds it events with
/// timestamps and carries out the decisions it returns, and the unit tests drive
/// it by hand with synthetic time points.
///
/// ## Usage (what the scheduler actor does)
///
/// ```
/// batching_policy policy{make_policy_config(model, server_max_queue_size)};
/// // a request arrives:
///   if (auto* r = std::get_if<rejected>(&policy.enqueue(info, now))) answer(*r);
///   react(policy.poll(now, executor_free()));
/// // an executor finishes a batch: react(policy.poll(now, true));
/// // a wait_until timer fires:      react(policy.poll(now, executor_free()));
///
/// react(poll_result r):
///   answer every r.expired with its message (HTTP 503 / KServe error body);
///   dispatch d        -> send d.ids to a free executor, then poll again at
///                        once if another executor is still free;
///   wait_until w      -> arm one timer for w.when (replacing any earlier one);
///   wait_for_executor -> nothing; the next executor that frees up calls poll;
///   idle              -> nothing; the next request calls poll.
/// ```
///
/// Calling poll() earlier or more often than asked is always safe: it decides
/// from the queue and `now` alone, so a stale timer costs one extra call.
///
/// ## Triton semantics reproduced (see batching_policy.cpp for the details)
///
/// - Batch formation follows Triton core's DynamicBatchScheduler::GetDynamicBatch:
///   the candidate batch is the longest prefix of the queue that fits
///   max_batch_size rows; a preferred size reachable by a prefix goes out at once
///   (the largest such prefix); a prefix reaching the largest preferred size goes
///   out at once; when the oldest request in the candidate has waited
///   max_queue_delay_microseconds the whole candidate goes out; with
///   max_queue_delay 0 whatever is queued goes out at once.
/// - No preferred sizes configured means {max_batch_size}, as Triton normalises.
/// - Queue order: priority level 1 first; within a level FIFO, and requests
///   delayed by a DELAY timeout after all undelayed requests of their level (but
///   still before lower levels: model_config.proto's "same (or higher) priority").
/// - Only requests of equal non-batch shapes share a batch: the candidate
///   prefix ends at the first request of another shape, and then goes out at
///   once (Triton's dynamic batcher does the same when a request's shape
///   differs from the pending batch's).
/// - With padded batching (max_padding_waste set) the shape class leaves the
///   padded dimensions out, and the prefix also ends before the request that
///   would make the batch's padding pass the bound; it then goes out at once.
/// - A batch never holds more than max_batch_bytes of tensors: the prefix also
///   ends before the request that would pass it, and goes out at once.
/// - Without a dynamic_batching block each request is its own batch, dispatched in
///   arrival order as soon as an executor is free; priorities and timeouts do not
///   apply (Triton sends such requests straight to the model instance).

#include "core/error.hpp"
#include "core/limits.hpp"
#include "core/model_config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace caf_serving::scheduler {

using clock_type = std::chrono::steady_clock;
using time_point = clock_type::time_point;

// -- configuration ------------------------------------------------------------

/// What the policy needs from a model's configuration, plus the engine-wide
/// bound that replaces Triton's "max_queue_size 0 = unbounded".
struct policy_config {
  /// The model's max_batch_size. 0: the model has no batch dimension; every
  /// request then counts as one row and batches hold one request.
  int max_batch_size = 0;
  /// Whether config.pbtxt had a dynamic_batching block.
  bool dynamic_batching_enabled = false;
  dynamic_batching_config dynamic_batching;
  /// Replaces every max_queue_size of 0 (Triton: no limit), and bounds the
  /// queue of a model without dynamic batching. Must be > 0.
  uint32_t max_queue_size_default = 0;
  /// Batch sizes the executors run as captured CUDA graphs, ascending (empty for
  /// CPU models). When set, a batch that would wait is sent at once, padded up to
  /// the next captured size, if the missing rows are not expected before
  /// max_queue_delay runs out (bucket_padding.hpp); a batch that fills a captured
  /// size exactly goes out at once.
  std::vector<uint32_t> captured_batch_sizes;
  /// Largest sum of the requests' tensor bytes in one batch; 0: no cap. A batch
  /// closes before it would pass the cap, and a request over it alone is
  /// rejected (HTTP 413). A batch's inputs travel in Cap'n Proto `Data` fields,
  /// which hold less than 512 MiB (max_data_field_bytes).
  uint64_t max_batch_bytes = 0;
  /// Padded batching (padded_batching.hpp): set, requests of one shape class
  /// whose padded lengths differ share a batch while the fraction of padding in
  /// it (1 - sum(rows * length) / (rows * longest)) stays at or below this. The
  /// request that would pass it closes the batch, which goes out at once.
  std::optional<double> max_padding_waste;
};

/// Copies the policy's fields out of a model's configuration.
policy_config make_policy_config(const model_config& model,
                                 uint32_t max_queue_size_default,
                                 uint64_t max_batch_bytes = max_data_field_bytes);

// -- events in ----------------------------------------------------------------

/// One inference request as the policy sees it.
struct request_info {
  /// Chosen by the caller, unique among queued requests; echoed in decisions.
  uint64_t id = 0;
  /// Rows (the client's batch dimension); counts towards max_batch_size.
  /// 0 counts as 1, as in Triton. Ignored (counts 1) when max_batch_size is 0.
  uint32_t rows = 1;
  /// Priority level; 0 = none given. 0 or a level above priority_levels gets
  /// default_priority_level (Triton's InferenceRequest::SetPriority).
  uint32_t priority = 0;
  /// The request's `timeout` parameter in microseconds; 0 = none given.
  uint64_t timeout_us = 0;
  /// The request's non-batch input shapes, as a key: only requests with equal
  /// keys share a batch (Triton batches only equal shapes; ragged batching is
  /// an opt-in it has and we do not). 0 for every request of a model whose
  /// shapes cannot vary. The scheduler hashes the shapes; gather_batch checks
  /// the shapes themselves, so a hash collision is an error, never a wrong answer.
  uint64_t shape_class = 0;
  /// Bytes of the request's input tensors, against max_batch_bytes.
  uint64_t bytes = 0;
  /// With padded batching: the request's length along the padded dimensions
  /// (shape_class then leaves those dimensions out). Ignored otherwise.
  uint64_t padded_length = 0;
};

// -- decisions out ------------------------------------------------------------

enum class reject_reason {
  /// The request's priority level already holds max_queue_size requests.
  queue_full,
  /// The request waited past its queue timeout under timeout_action REJECT.
  timed_out,
  /// The request has more rows than max_batch_size.
  too_many_rows,
  /// The request alone holds more tensor bytes than max_batch_bytes.
  too_large,
};

const char* to_string(reject_reason reason);

/// The request is queued; it will leave in a dispatch or in poll().expired.
struct admitted {};

/// The request is answered with an error now and is not (or no longer) queued.
struct rejected {
  uint64_t id = 0;
  reject_reason reason = reject_reason::queue_full;
  /// Says what happened and what the client can do about it.
  std::string message;
};

using enqueue_result = std::variant<admitted, rejected>;

/// The answer a rejected request gets, with the policy's message: 503 for a full
/// queue (reason queue_full) and for a queue timeout (reason timeout), 400 for
/// more rows than max_batch_size and 413 for more bytes than max_batch_bytes
/// (reason bad_request). Both policies reject with it.
serving_error rejection_error(const rejected& r);

/// A batch to send to the free executor now, in queue order.
struct dispatch {
  std::vector<uint64_t> ids;
  /// Sum of the requests' rows; never more than max(1, max_batch_size).
  uint32_t rows = 0;
  /// The captured batch size this batch was padded up to (bucket_padding.hpp);
  /// 0 when the policy made no padding decision.
  uint32_t padded_rows = 0;
};

/// Requests are queued and an executor is free, but no batch is due yet (or
/// no executor is free and a queue timeout falls due): call poll() at `when`,
/// or earlier on the next event. `when` is always later than the poll's `now`.
struct wait_until {
  time_point when;
};

/// Requests are queued but no executor is free and nothing falls due in the
/// meantime: call poll() when an executor frees up (or a request arrives).
struct wait_for_executor {};

/// Nothing is queued.
struct idle {};

using next_step = std::variant<dispatch, wait_until, wait_for_executor, idle>;

struct poll_result {
  /// Requests that timed out under REJECT since the last poll; answer them.
  std::vector<rejected> expired;
  next_step next;
};

// -- the policy -----------------------------------------------------------------

class batching_policy {
public:
  /// Checks a configuration the way Triton's model-config validation does, plus
  /// the engine's own bound. Returns the first problem found, if any.
  static std::optional<serving_error> validate(const policy_config& cfg);

  /// Throws std::invalid_argument with validate()'s message when `cfg` is
  /// invalid: the repository loader validates first, so that is a bug.
  explicit batching_policy(policy_config cfg);

  /// Queues a request that arrived at `now`, or rejects it at once (full queue,
  /// too many rows). Does not form batches: call poll() afterwards.
  enqueue_result enqueue(const request_info& request, time_point now);

  /// Applies queue timeouts due by `now`, then decides what to do next. Only
  /// dispatches when `executor_available`.
  poll_result poll(time_point now, bool executor_available);

  /// Requests queued, delayed ones included.
  size_t queued() const { return queued_; }

  /// Rows queued, delayed ones included.
  size_t queued_rows() const { return queued_rows_; }

  /// Largest number of rows a dispatch may carry: max(1, max_batch_size).
  uint32_t max_batch_rows() const { return max_batch_rows_; }

private:
  struct entry {
    uint64_t id;
    uint32_t rows;
    /// Arrival order, unique; breaks ties between equal deadlines.
    uint64_t seq;
    time_point enqueued;
    std::optional<time_point> deadline;
    uint64_t shape_class;
    uint64_t bytes;
    uint64_t padded_length;
  };

  struct level_queue {
    std::list<entry> waiting;
    /// Timed out under DELAY, in the order they timed out.
    std::list<entry> delayed;
    size_t size() const { return waiting.size() + delayed.size(); }
  };

  struct level_settings {
    queue_policy policy;
    /// max_queue_size with 0 replaced by max_queue_size_default.
    uint32_t max_queue_size;
  };

  using deadline_key = std::pair<time_point, uint64_t>;

  struct deadline_entry {
    uint32_t level;
    std::list<entry>::iterator where;
  };

  uint32_t level_of(uint32_t requested_priority) const;
  const level_settings& settings_of(uint32_t level) const;
  std::optional<time_point> deadline_of(const level_settings& level,
                                        const request_info& request,
                                        time_point now) const;
  std::vector<rejected> apply_timeouts(time_point now);
  next_step form_batch(time_point now);
  dispatch take(size_t count);

  policy_config cfg_;
  uint32_t max_batch_rows_;
  /// The largest preferred size (after Triton's normalisation), 0 if none.
  uint32_t max_preferred_rows_ = 0;
  std::vector<uint32_t> preferred_sizes_;
  bool one_request_per_batch_;
  level_settings default_settings_;
  std::map<uint32_t, level_settings> level_settings_;
  /// Non-empty levels only; begin() is the highest priority (1, or 0 when the
  /// model has no priority levels).
  std::map<uint32_t, level_queue> levels_;
  /// Queue timeouts of waiting (not delayed) requests, earliest first.
  std::map<deadline_key, deadline_entry> deadlines_;
  uint64_t next_seq_ = 0;
  /// Mean microseconds between arriving rows (exponentially weighted); 0 until
  /// two requests have arrived. Feeds the padding decision.
  double row_gap_us_ = 0;
  std::optional<time_point> last_arrival_;
  size_t queued_ = 0;
  size_t queued_rows_ = 0;
};

} // namespace caf_serving::scheduler
