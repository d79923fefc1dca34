#pragma once
/// Which executor gets a batch: the one predicted to finish it first.
///
/// Each executor (local, or remote on a worker node) has a measured cost per batch
/// size: the service time of its batches, that is the time from when it could
/// start a batch (sent, or its previous batch answered, whichever is later) until
/// the answer arrived, so it includes the network and the worker's own queueing
/// for a remote executor. The predicted completion of a new batch of `rows` rows on
/// an executor is the work it still has outstanding (the predicted cost of each
/// batch in flight there, less what the oldest has already run) plus the cost of
/// the new batch. A slower or farther node therefore gets fewer batches.
///
/// A plain object with the clock passed in (STYLE.md): the scheduler actor feeds it
/// measurements and asks `choose`; the unit test drives it by hand.

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace caf_serving::cluster {

/// Measured service time by batch size of one executor.
class batch_cost_model {
public:
  /// Records that a batch of `rows` rows took `service_ns`.
  void observe(uint32_t rows, int64_t service_ns);

  /// Predicted service time of a batch of `rows` rows: the average measured for
  /// that size, else the nearest measured size scaled by rows (never below the
  /// smallest measured cost), else 0 (nothing measured: such an executor is
  /// tried first, which is how a new or returning worker gets work).
  int64_t predict(uint32_t rows) const;

  bool empty() const { return average_ns_.empty(); }

private:
  /// Exponentially weighted average per batch size, weight 1/4 for a new sample.
  std::map<uint32_t, double> average_ns_;
};

/// One executor as the choice sees it.
struct executor_load {
  const batch_cost_model* cost = nullptr;
  /// Rows of each batch in flight there, oldest first.
  std::vector<uint32_t> in_flight_rows;
  /// How long the oldest batch in flight has already been running (0: none).
  int64_t oldest_elapsed_ns = 0;
  /// Batches it may hold at once (its credit window).
  uint32_t depth = 1;
};

/// Predicted nanoseconds from now until `load` would finish a new batch of `rows`.
int64_t predicted_completion_ns(const executor_load& load, uint32_t rows);

/// The executor with the earliest predicted completion among those with a free
/// credit; ties go to the one with fewer batches in flight, then the lower index.
/// Nothing when every executor is full.
std::optional<size_t> choose_executor(const std::vector<executor_load>& executors,
                                      uint32_t rows);

} // namespace caf_serving::cluster
