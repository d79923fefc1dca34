#pragma once
/// Which executor gets a batch: the one predicted to finish it first.
///
/// Each executor (local, or remote on a worker node) has a measured cost per batch
/// size (cost_model.hpp): the service time of its batches, that is the time from
/// when it could start a batch (sent, or its previous batch answered, whichever is
/// later) until the answer arrived, so it includes the network and the worker's
/// own queueing for a remote executor. The predicted completion of a new batch of
/// `rows` rows on an executor is the work it still has outstanding (the predicted
/// cost of each batch in flight there, less what the oldest has already run) plus
/// the cost of the new batch. A slower or farther node therefore gets fewer
/// batches. Both policies use it: the dynamic batcher picks an executor for the
/// batch it formed, and the latency-target policy (slo_policy.hpp) also plans
/// when its queued requests will finish.
///
/// A plain object with the clock passed in (STYLE.md): the scheduler actor feeds it
/// measurements and asks `choose`; the unit test drives it by hand.

#include "scheduler/cost_model.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace caf_serving::scheduler {

/// One executor as the choice sees it.
struct executor_load {
  const batch_cost_model* cost = nullptr;
  /// Rows of each batch in flight there, oldest first.
  std::vector<uint32_t> in_flight_rows;
  /// How long the oldest batch in flight has already been running (0: none).
  int64_t oldest_elapsed_ns = 0;
  /// Batches it may hold at once (its credit window).
  uint32_t depth = 1;
  /// How much later than predicted its answers have arrived lately (an upper
  /// quantile, executor_book.hpp), added for each batch it holds or is given:
  /// with a credit window of 1 every batch pays it (the answer's trip back
  /// and the scheduler's turnaround before the next batch goes).
  int64_t lateness_ns = 0;
  /// How long it has held nothing since its last answer (or since it was
  /// added); 0 while it holds a batch.
  int64_t idle_ns = 0;

  /// Whether it may take another batch now.
  bool has_credit() const { return in_flight_rows.size() < depth; }
};

/// Predicted nanoseconds from now until `load` has finished computing what it
/// holds (its busy-until as the scheduler sees it; lateness not included).
int64_t outstanding_ns(const executor_load& load);

/// Predicted nanoseconds from now until the answer to a new batch of `rows`
/// would arrive from `load`: what it holds, the new batch's compute, and the
/// lateness of each of those batches.
int64_t predicted_completion_ns(const executor_load& load, uint32_t rows);

/// The executor with the earliest predicted completion among those with a free
/// credit; ties go to the one with fewer batches in flight, then the lower index.
/// Nothing when every executor is full.
std::optional<size_t> choose_executor(const std::vector<executor_load>& executors,
                                      uint32_t rows);

} // namespace caf_serving::scheduler
