#pragma once
/// The server-side stand-in for an executor on a worker node. The scheduler talks
/// to it through executor::executor_actor, exactly as to a local executor; it
/// forwards each batch to the remote executor and answers with the remote result.
///
/// When a batch is far past its predicted completion it is presumed lost: the
/// proxy answers it with `cluster_errc::executor_lost`, so the scheduler runs it
/// elsewhere at once, and keeps the batch's id. Should the slow-but-alive worker
/// answer it later, that answer is dropped and counted
/// (`caf_serving_worker_late_answers_dropped_total`): each request is answered
/// exactly once. The prediction is the proxy's own cost model of the round trip
/// (scheduler/cost_model.hpp, fed with every answered batch): the batches ahead
/// of this one on the worker plus this one, times `timeout_factor`, at least
/// `timeout_floor`; before anything is measured, `request_timeout`.
///
/// When the remote executor's node is lost (the monitor's down_msg, which the
/// middleman's heartbeat timeout triggers for a silent node) it answers every
/// batch it holds with executor_lost and quits: the scheduler sends those batches
/// to other executors and drops this one.

#include "cluster/bulk_channel.hpp"
#include "executor/executor_actor.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

namespace caf_serving::cluster {

/// Counters of one worker node, shared by its executors' proxies and read by
/// /metrics.
struct node_counters {
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> lost{0};
  /// Batches presumed lost because they were far past their predicted completion.
  std::atomic<uint64_t> timed_out{0};
  /// Answers that came after their batch had been presumed lost (and re-run).
  std::atomic<uint64_t> late_dropped{0};
  /// Batches sent over the bulk channel (bulk_channel.hpp) instead of CAF's link.
  std::atomic<uint64_t> bulk_batches{0};
};

/// When a remote batch counts as lost: max(factor x predicted, floor).
struct remote_timeout_config {
  /// Before the proxy has measured a round trip (a new worker's first batches).
  std::chrono::milliseconds unmeasured{10000};
  /// How far past its predicted completion a batch may be.
  double factor = 4.0;
  /// Never sooner than this after it was sent (timer lateness, scheduling noise).
  std::chrono::milliseconds floor{500};
};

struct remote_executor_config {
  caf::actor remote;
  /// For log lines and errors: the worker's name.
  std::string node;
  std::string model;
  remote_timeout_config timeout;
  std::shared_ptr<node_counters> counters;
  /// The worker's bulk channel (null: none); batches whose CAF message would be
  /// at least `bulk_threshold` bytes go over it while it is connected.
  std::shared_ptr<bulk_client> bulk;
  uint64_t bulk_threshold = 0;
};

/// The deadline of a batch, in ns after it was sent, given the predicted service
/// time of the batches ahead of it on the worker and its own (0 when unmeasured).
int64_t remote_deadline_ns(const remote_timeout_config& cfg, int64_t ahead_ns,
                           int64_t own_ns);

executor::executor_actor spawn_remote_executor(caf::actor_system& sys,
                                               remote_executor_config config);

} // namespace caf_serving::cluster
