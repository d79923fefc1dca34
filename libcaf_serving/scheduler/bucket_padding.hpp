#pragma once
/// Whether a batch that would otherwise wait for more requests should go out
/// now, padded up to the next batch size with a captured CUDA graph.
///
/// A GPU executor replays one graph per captured size (cuda/gpu_options.hpp);
/// a batch of 6 rows runs on the graph of 8 at the cost of 8. Waiting buys the
/// two missing rows for free only if they arrive before max_queue_delay runs
/// out; if the arrival rate says they will not, waiting only adds latency, so the
/// batch is padded and sent now. Plain function, clock-free: the policy passes
/// in what it measured.

#include <cstdint>
#include <variant>
#include <vector>

namespace caf_serving::scheduler {

struct padding_inputs {
  /// Captured batch sizes, ascending; empty: no padding decisions at all.
  std::vector<uint32_t> buckets;
  /// Rows of the batch that would go out now.
  uint32_t rows = 0;
  /// Measured mean time between arriving rows in microseconds; 0: not known yet.
  double row_gap_us = 0;
  /// Microseconds until the oldest queued request reaches max_queue_delay.
  uint64_t wait_left_us = 0;
};

/// Send now; the executor runs the graph of `bucket` rows (`bucket - rows`
/// padding rows, discarded).
struct pad_now {
  uint32_t bucket = 0;
};

/// Keep waiting (the policy's usual rule applies).
struct keep_waiting {};

using padding_choice = std::variant<pad_now, keep_waiting>;

/// - rows equal to a bucket: pad_now with no padding (the graph is full; one row
///   more would need the next, larger graph);
/// - rows above every bucket, or arrival rate unknown: keep_waiting;
/// - otherwise pad_now when the missing rows are expected later than
///   `wait_left_us` (missing rows x row gap > wait left), else keep_waiting.
padding_choice choose_padding(const padding_inputs& in);

} // namespace caf_serving::scheduler
