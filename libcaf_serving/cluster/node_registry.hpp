#pragma once
/// The server side of a cluster: which workers there are, their state, and the
/// proxies (remote_executor.hpp) that put their executors into the schedulers.
///
/// It connects to each worker given with --worker (and again, every
/// `retry_interval`, after the worker is lost or refuses), accepts workers that
/// join (publish `actor` on the cluster port), proves the secret to every worker,
/// and for each model version a worker serves that this server also serves, hands
/// that version's scheduler one proxy per remote executor. It checks every
/// `sync_interval` for schedulers that appeared since (a model loaded or reloaded).
/// A worker whose node goes down is marked lost; its proxies fail their batches
/// back to the schedulers on their own.

#include "cluster/protocol.hpp"
#include "cluster/remote_executor.hpp"
#include "cluster/worker_host.hpp"
#include "server/model_directory.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace caf_serving::cluster {

struct registry_config {
  /// Workers to connect to (--worker, repeatable).
  std::vector<host_port> workers;
  std::string secret;
  /// This server's name, told to workers that join.
  std::string server_name;
  /// Batches each remote executor may hold at once (its credit window).
  uint32_t credits = 2;
  /// Connects and handshakes not answered in this time fail.
  std::chrono::milliseconds request_timeout{10000};
  /// When a remote batch is presumed lost and re-run elsewhere (remote_executor.hpp).
  remote_timeout_config remote_timeout;
  std::chrono::milliseconds retry_interval{1000};
  std::chrono::milliseconds sync_interval{500};
  /// Largest model (sum of its files) shipped to a worker without a repository
  /// (--max-ship-bytes).
  uint64_t max_ship_bytes = 1ull << 30;
  /// Batches whose CAF message is at least this many bytes go over the worker's
  /// bulk channel (bulk_channel.hpp), their results too; 0: never (the channel
  /// is not opened). Set to 0 when the cluster runs TLS.
  uint64_t bulk_threshold = 1 << 20;
  bulk_config bulk;
  /// A load asked of a worker (shipping and compiling included) may take this long.
  std::chrono::milliseconds load_timeout{300000};
};

/// One worker as /v2 and /metrics show it.
struct worker_status {
  std::string name;
  std::string address;
  /// connecting, ready, lost or refused.
  std::string state;
  std::string reason;
  std::vector<std::string> models; ///< "name:version"
  /// Models the worker is kept out of, each "name: why" (model_sync.hpp).
  std::vector<std::string> models_refused;
  std::shared_ptr<node_counters> counters;
};

/// The registry's view, readable from any thread.
class cluster_status {
public:
  void set(const std::string& key, worker_status s);
  std::vector<worker_status> workers() const;
  /// {"workers":[{"name":..,"address":..,"state":..,"models":[..],"batches_in_flight":..}]}
  std::string json() const;
  /// caf_serving_worker_up / _batches_in_flight / _batches_total / _batches_lost_total /
  /// _batches_timed_out_total / _late_answers_dropped_total.
  std::string prometheus() const;

private:
  mutable std::mutex mutex_;
  std::map<std::string, worker_status> workers_;
};

struct node_registry {
  /// Publish on the cluster port for workers to join.
  caf::actor actor;
  std::shared_ptr<cluster_status> status;
};

node_registry start_registry(caf::actor_system& sys, server::model_directory& models,
                             registry_config config);

} // namespace caf_serving::cluster
