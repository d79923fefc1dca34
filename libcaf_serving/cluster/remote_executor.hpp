#pragma once
/// The server-side stand-in for an executor on a worker node. The scheduler talks
/// to it through executor::executor_actor, exactly as to a local executor; it
/// forwards each batch to the remote executor with a timeout and answers with the
/// remote result.
///
/// When the remote executor's node is lost (the monitor's down_msg, which the
/// middleman's heartbeat timeout triggers for a silent node) or a batch is not
/// answered within `request_timeout`, it answers every batch it holds with
/// `cluster_errc::executor_lost` and quits: the scheduler sends those batches to
/// other executors and drops this one. A late answer from the lost node is
/// ignored, so no batch is answered twice.

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
};

struct remote_executor_config {
  caf::actor remote;
  /// For log lines and errors: the worker's name.
  std::string node;
  std::string model;
  std::chrono::milliseconds request_timeout{10000};
  std::shared_ptr<node_counters> counters;
};

executor::executor_actor spawn_remote_executor(caf::actor_system& sys,
                                               remote_executor_config config);

} // namespace caf_serving::cluster
