#pragma once
/// The scheduler's books on one executor: the batches it holds, when it is
/// predicted to be free, what its batches cost (cost_model.hpp), and how late
/// its answers arrive compared with that prediction.
///
/// ## Two clocks, kept apart
///
/// - The cost model learns from the time the executor itself measured around
///   the backend call (BatchResult's computeInputNs + computeInferNs +
///   computeOutputNs, set by run_one_batch on a local executor and on a worker
///   alike). Measured at the scheduler instead (answer received less the time
///   the batch could start), a sample also held the executor's mailbox, the
///   hops and the scheduler's own mailbox: on two shared cores those spikes
///   bent the per-row fit and priced every size by the worst turnaround.
/// - What the executor's answers take beyond that (hops, mailboxes, a
///   scheduler that falls behind, a backend slower than predicted because the
///   cores are shared) is kept as each answer's lateness: answer received less
///   its predicted completion (the time the batch could start plus the compute
///   predicted when it was sent). An upper quantile of the recent lateness
///   (executor_load::lateness_ns) is added to every batch the plans lay on
///   the executor: the feedback that keeps admitted requests inside their
///   target when the predictions are too optimistic, and that makes a far or
///   slow node look as late as it answers.
///
/// "Busy until" is the scheduler's own view: each batch starts when it was
/// dispatched or when the batch before it was answered, whichever is later,
/// and runs for its predicted compute time.
///
/// A plain object with the clock passed in (STYLE.md): the scheduler actor
/// tells it what it sent and what came back; the unit test drives it by hand.

#include "scheduler/cost_model.hpp"
#include "scheduler/executor_choice.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace caf_serving::scheduler {

struct lateness_config {
  /// Answers remembered; the oldest leaves when a new one comes.
  uint32_t window = 64;
  /// The quantile of the remembered lateness that is added to predictions,
  /// in (0, 1]. Early answers count as negative lateness, so an executor that
  /// answers on time most of the time adds nothing.
  double quantile = 0.9;
};

/// A window of signed samples and an upper quantile of them, >= 0: how much
/// later than predicted things happen.
class lateness_tracker {
public:
  explicit lateness_tracker(lateness_config cfg = {});

  void observe(int64_t lateness_ns);

  /// The configured quantile of the window, at least 0; 0 when empty.
  int64_t quantile_ns() const { return quantile_ns_; }

  size_t samples() const { return samples_.size(); }

private:
  lateness_config cfg_;
  std::vector<int64_t> samples_;
  size_t next_ = 0;
  int64_t quantile_ns_ = 0;
  /// Working space of observe(), kept so that an answer allocates nothing.
  std::vector<int64_t> scratch_;
};

class executor_book {
public:
  explicit executor_book(cost_model_config cost = {}, lateness_config lateness = {});

  /// Batch `batch_id` of `rows` rows was sent at `now_ns`.
  void dispatched(uint64_t batch_id, uint32_t rows, int64_t now_ns);

  /// A warm-up batch was sent: booked like any batch, but its answer records
  /// no lateness (its prediction, if any, is an extrapolation from the warm-up
  /// before it, and one such sample is the whole window's upper quantile).
  void dispatched_warm_up(uint64_t batch_id, uint32_t rows, int64_t now_ns);

  /// Batch `batch_id` was answered at `now_ns`. `executor_service_ns`: the
  /// executor's own measurement of its compute, fed to the cost model (nothing:
  /// a failed batch, which must not make the executor look fast). The lateness
  /// of a successful answer is recorded when a prediction existed for it.
  /// False when the book does not hold the batch (answered twice, or lost).
  bool answered(uint64_t batch_id, int64_t now_ns, std::optional<int64_t> executor_service_ns);

  /// What executor choice and the latency-target policy see at `now_ns`.
  executor_load load(int64_t now_ns, uint32_t depth) const;

  /// Predicted nanoseconds since the steady clock's epoch when the executor
  /// has finished what it holds (its busy-until; <= now when idle).
  int64_t busy_until_ns() const;

  const batch_cost_model& cost() const { return cost_; }
  /// The quantile of recent lateness, >= 0.
  int64_t lateness_ns() const { return lateness_.quantile_ns(); }
  batch_cost_model& cost() { return cost_; }
  size_t in_flight() const { return in_flight_.size(); }
  bool empty() const { return in_flight_.empty(); }

private:
  struct sent {
    uint64_t batch_id;
    uint32_t rows;
    int64_t dispatched_ns;
    /// Predicted compute at dispatch (0: the cost model knew nothing yet).
    int64_t predicted_ns;
  };

  batch_cost_model cost_;
  lateness_tracker lateness_;
  std::vector<sent> in_flight_;
  /// When the oldest batch held could start: its dispatch, or the previous
  /// answer when that came later.
  int64_t oldest_start_ns_ = 0;
  /// When it last answered (or was first sent a batch); for idle_ns.
  int64_t last_answer_ns_ = 0;
};

} // namespace caf_serving::scheduler
