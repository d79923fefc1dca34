#pragma once
/// The worker side of a cluster: executors for the models of a repository, and the
/// worker actor that servers greet (protocol.hpp). Runs in caf-serving-worker.
///
///   auto host = cluster::start_worker(sys, {repository, secret, name, ...});
///   caf::io::publish(host->actor, port, "127.0.0.1");
///   // optional: host joins a server that listens for workers (join_to)
///
/// Only a server that proved the secret gets the executors' handles, and each
/// executor checks that a batch comes from such a server's node; anything else is
/// refused and logged.

#include "cluster/protocol.hpp"
#include "core/error.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::cluster {

struct host_port {
  std::string host;
  uint16_t port = 0;
};

/// "HOST:PORT" to its parts; an error says what is wrong.
result<host_port> parse_host_port(const std::string& text);

struct worker_config {
  std::filesystem::path repository;
  std::string secret;
  /// Shown by servers in /v2 and /metrics; unique per cluster.
  std::string name;
  /// Executors per model version where config.pbtxt's instance_group gives none.
  uint32_t default_instances = 1;
  /// Join this server's cluster port, and join again whenever it is lost.
  std::optional<host_port> join_to;
  std::chrono::milliseconds retry_interval{1000};
  std::chrono::milliseconds request_timeout{5000};
};

struct worker_host {
  /// Greeted by servers; publish it on the worker's port.
  caf::actor actor;
  /// Every executor, to stop at shutdown.
  std::vector<caf::actor> executors;
  /// Models loaded and their executor counts, for the start-up log.
  std::vector<std::string> loaded;
  /// Models that failed to load, with the reason.
  std::vector<std::string> failed;
};

/// Loads every model of the repository and spawns its executors and the worker
/// actor. Fails only when the repository cannot be read.
result<worker_host> start_worker(caf::actor_system& sys, worker_config config);

} // namespace caf_serving::cluster
