#pragma once
/// What a batch costs on one executor: the measured service time per batch size,
/// as a robust estimate that follows drift.
///
/// For each batch size the model keeps a window of the most recent measurements
/// (a lasting change, such as a neighbour taking the cores, replaces a window
/// within `window` batches). The prediction for any size is a fixed + per-row
/// fit through the windows' medians (GPU-like and CPU curves are close to that),
/// raised by an upper quantile (the 90th by default) of how far the samples of
/// all windows lie above the fit. It never falls as rows grow, prices sizes
/// never formed, and a slow spell in one size's window counts as those few
/// samples, not as a whole size: a per-size upper quantile made joining a batch
/// look dearer than it was, and split batches that should have grown. With one
/// size measured every size is priced like it, so a larger batch can form and
/// be measured.

/// Cheap sizes: an executor that replays captured CUDA graphs runs a batch of n
/// rows at the cost of the next captured size (padded); `run_rows` says which.
///
/// A plain object (STYLE.md): the scheduler actor feeds it measurements (and
/// load-time warm-up runs through `observe` as well); the policies read it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace caf_serving::scheduler {

struct cost_model_config {
  /// Measurements kept per batch size; the oldest leaves when a new one comes.
  uint32_t window = 32;
  /// The quantile of the samples' distance above the fit that is added to it,
  /// in (0, 1]: above the median, so a prediction errs on the late side.
  double quantile = 0.9;
  /// Batch sizes the executor runs as captured graphs, ascending; empty: every
  /// size runs as itself (CPU executors).
  std::vector<uint32_t> captured_sizes;
  /// A size not measured in the last `forget_after` measurements (of any
  /// size) is forgotten, and priced by the fit through the others; 0: never.
  /// A size's window only changes when a batch of that size runs, and a
  /// scheduler does not form a batch it prices too high: a window measured in
  /// a slow spell (a warm-up while other models loaded) kept that size, and
  /// through the fit its neighbours, too dear to ever run again.
  uint32_t forget_after = 256;
};

class batch_cost_model {
public:
  explicit batch_cost_model(cost_model_config cfg = {});

  /// Records that a batch of `rows` rows took `service_ns`.
  void observe(uint32_t rows, int64_t service_ns);

  /// Predicted service time of a batch of `rows` rows (at its run size): the
  /// fit plus the quantile of the samples above it (above); 0 when nothing is
  /// measured (such an executor is tried first, which is how a new one gets
  /// work).
  int64_t predict(uint32_t rows) const;

  /// The size a batch of `rows` rows runs at: the smallest captured size at or
  /// above it, else `rows`.
  uint32_t run_rows(uint32_t rows) const;

  /// Whether nothing is measured yet.
  bool empty() const { return sizes_.empty(); }

  /// The fit through the windows' medians: fixed_ns + per_row_ns * rows (least
  /// squares, neither below 0); both 0 when nothing is measured.
  struct linear_fit {
    double fixed_ns = 0;
    double per_row_ns = 0;
  };
  linear_fit fit() const { return fit_; }

  /// The prediction at each measured size, ascending (for /metrics).
  std::vector<std::pair<uint32_t, int64_t>> curve() const;

private:
  struct size_state {
    /// Ring of the last `window` samples.
    std::vector<int64_t> samples;
    size_t next = 0;
    /// The median of `samples`, kept current by observe().
    int64_t estimate = 0;
    /// observations_ when this size was last measured.
    uint64_t last_seen = 0;
  };

  void refit();

  cost_model_config cfg_;
  std::map<uint32_t, size_state> sizes_;
  linear_fit fit_;
  /// The quantile of the samples above the fit, >= 0.
  double above_fit_ns_ = 0;
  /// Measurements so far.
  uint64_t observations_ = 0;
  /// Working space of observe() and refit(), kept so that a measurement
  /// allocates nothing once the windows are full (one per answered batch).
  std::vector<int64_t> median_scratch_;
  std::vector<double> residual_scratch_;
};

} // namespace caf_serving::scheduler
