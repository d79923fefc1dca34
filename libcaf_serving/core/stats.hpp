#pragma once
/// Per-model statistics: what `/v2/models/{m}/stats` reports (the fields Triton's
/// perf_analyzer reads) and the Prometheus text on `/metrics`.
///
/// Every counter is an atomic written by the stage that owns the moment it counts
/// (ingress: success/fail and request time; post-processor: queue and compute) and
/// read by the ingress when a client asks. No locks on the request path.

#include "core/error.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace caf_serving {

/// A count and a total duration, as Triton's StatisticDuration.
struct duration_stat {
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> ns{0};
  void add(uint64_t duration_ns) {
    count.fetch_add(1, std::memory_order_relaxed);
    ns.fetch_add(duration_ns, std::memory_order_relaxed);
  }
};

/// A Prometheus histogram with fixed upper bounds.
class histogram {
public:
  explicit histogram(std::vector<double> upper_bounds);
  void observe(double value);
  /// Appends `<name>_bucket{...,le="..."}`, `_sum` and `_count` lines.
  void render(std::string& out, const std::string& name, const std::string& labels) const;

private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_; // bounds_.size() + 1 (+Inf)
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> sum_micro_{0}; // sum of values times 1e3, to keep it integral
};

const char* to_string(failure_reason r);

/// The latency-target scheduler's figures for one model (docs/latency-target.md);
/// rendered on /metrics only while target_us is set.
struct slo_stats {
  slo_stats();

  /// The model's latency target, microseconds; 0: the model has none.
  std::atomic<uint64_t> target_us{0};
  /// Successful answers within the request's deadline (the target, or its
  /// tighter `timeout`), counted by the ingress when it sends them.
  std::atomic<uint64_t> goodput{0};
  /// Successful answers past that deadline.
  std::atomic<uint64_t> deadline_miss{0};
  /// Requests shed: refused at admission, or dropped from the queue when they
  /// could no longer finish in time (HTTP 503 with Retry-After).
  std::atomic<uint64_t> shed{0};
  /// Rows of each batch the policy dispatched.
  histogram batch_size;
  /// Time each dispatched request waited in the queue, microseconds.
  histogram wait_us;

  /// Replaces the published cost curve: predicted microseconds per batch size.
  void publish_cost_curve(std::vector<std::pair<uint32_t, int64_t>> curve_ns);
  std::vector<std::pair<uint32_t, int64_t>> cost_curve_ns() const;

private:
  /// Written by the scheduler after a batch, read by /metrics: a lock, not on
  /// any request's path.
  mutable std::mutex curve_mutex_;
  std::vector<std::pair<uint32_t, int64_t>> curve_ns_;
};

struct model_stats {
  model_stats(std::string model_name, int64_t model_version);

  std::string name;
  int64_t version;

  std::atomic<uint64_t> inference_count{0}; ///< rows inferred (Triton counts batch rows)
  std::atomic<uint64_t> execution_count{0}; ///< batches executed
  std::atomic<uint64_t> last_inference_ms{0}; ///< wall-clock ms of the last response
  std::atomic<int64_t> pending{0};           ///< accepted, not yet answered
  std::atomic<int64_t> queued{0};    ///< in the scheduler's queue, waiting for a batch
  std::atomic<int64_t> executing{0}; ///< in batches sent to executors, not yet answered

  duration_stat success;        ///< received -> response sent, successful requests
  duration_stat fail;           ///< received -> error sent
  duration_stat queue;          ///< enqueued -> batch formed
  duration_stat compute_input;  ///< batch formed -> compute start (gather, staging)
  duration_stat compute_infer;  ///< compute start -> compute end
  duration_stat compute_output; ///< compute end -> response built
  /// Response cache (ingress/response_cache.hpp), as Triton counts it: a hit
  /// is the lookup and the answer taken from the cache; a miss is the lookup
  /// plus storing the answer, counted when the request succeeded. Hits count
  /// in success (and in queue, with no time) but not in inference_count,
  /// execution_count or compute_*.
  duration_stat cache_hit;
  duration_stat cache_miss;
  std::array<std::atomic<uint64_t>, failure_reason_count> failures{};
  /// KIND_GPU instances: bytes the version holds on its GPUs (every instance's
  /// one device allocation: weights, activations, I/O slots, workspace) and in
  /// page-locked host staging; both 0 for other backends. Set once at load.
  std::atomic<uint64_t> gpu_memory_bytes{0};
  std::atomic<uint64_t> gpu_pinned_bytes{0};

  // -- supervision (written by the scheduler actor) --------------------------
  /// Whether the model version's scheduler runs; false once it stopped.
  std::atomic<bool> scheduler_running{false};
  /// Executors the scheduler holds that are alive and not quarantined. The
  /// version is ready only while this is at least 1 (DESIGN.md, Supervision).
  std::atomic<uint32_t> healthy_executors{0};
  /// Executors the scheduler holds (alive, quarantined ones included).
  std::atomic<uint32_t> live_executors{0};
  /// Executors that stopped (crashed) and were started again.
  std::atomic<uint64_t> executor_restarts{0};
  /// Batches that failed inside an executor (an internal error, not bad input).
  std::atomic<uint64_t> executor_failures{0};
  /// Times an executor was taken out of rotation after failing repeatedly.
  std::atomic<uint64_t> executor_quarantines{0};
  /// Post-processors (and other stages) that stopped and were started again.
  std::atomic<uint64_t> stage_restarts{0};
  /// Batches sent again after their executor stopped without answering.
  std::atomic<uint64_t> batch_retries{0};
  /// Batches that held requests of different padded lengths (padded batching).
  std::atomic<uint64_t> padded_batches{0};

  histogram request_us;  ///< received -> sent, microseconds
  histogram queue_us;    ///< time in the queue, microseconds
  histogram compute_us;  ///< compute_infer per request, microseconds
  histogram batch_size;  ///< rows per executed batch
  slo_stats slo;         ///< the latency-target scheduler's figures

  void record_failure(failure_reason reason, uint64_t duration_ns);
};

/// Triton's `/v2/models/stats` body for the given models.
std::string stats_json(const std::vector<std::shared_ptr<model_stats>>& models);

/// `text` escaped for a Prometheus label value (backslash, quote, newline).
std::string prometheus_label_value(std::string_view text);

/// Prometheus text exposition for the given models.
std::string prometheus_text(const std::vector<std::shared_ptr<model_stats>>& models);

} // namespace caf_serving
