#pragma once
/// The worker side of a cluster: a model manager (the server's, with the same
/// backends: builtin, ONNX on the CPU, CUDA where built and present) that loads
/// the worker's models, and the worker actor that servers greet (protocol.hpp).
/// Runs in caf-serving-worker.
///
///   auto host = cluster::start_worker(sys, {repository, secret, name, ...});
///   caf::io::publish(host->actor, port, "127.0.0.1");
///   // optional: host joins a server that listens for workers (join_to)
///
/// The models come from the worker's own repository, or, without one, from the
/// server, which ships their files into `cache_dir` (model_sync.hpp). Servers
/// load, reload and unload models on the worker as they do on themselves.
///
/// Only a server that proved the secret gets the executors' handles, and each
/// handle (a gate in front of a local executor) checks that a batch comes from
/// such a server's node; anything else is refused and logged.

#include "cluster/bulk_channel.hpp"
#include "cluster/protocol.hpp"
#include "core/error.hpp"
#include "server/model_directory.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <filesystem>
#include <functional>
#include <memory>
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
  /// The worker's own repository; empty: the server ships the models' files.
  std::filesystem::path repository;
  /// Where shipped models are written (one directory per model): the models
  /// a server ships because the worker lacks them. Empty beside a repository:
  /// nothing is shipped.
  std::filesystem::path cache_dir;
  /// The models this worker serves (--models); empty: all of them.
  std::vector<std::string> placement;
  /// Largest sum of bytes of one shipped model this worker accepts.
  uint64_t max_model_bytes = 1ull << 30;
  std::string secret;
  /// Shown by servers in /v2 and /metrics; unique per cluster.
  std::string name;
  /// Join this server's cluster port, and join again whenever it is lost.
  std::optional<host_port> join_to;
  std::chrono::milliseconds retry_interval{1000};
  std::chrono::milliseconds request_timeout{5000};
  /// The bulk channel's listener (null: no bulk channel, as under TLS), and the
  /// address servers that this worker joins reach it at (empty: they cannot).
  std::shared_ptr<bulk_listener> bulk;
  std::string bulk_host;
  /// Builds and starts the worker's models over a directory (its repository,
  /// or the cache of shipped models): loading `startup_models` ("*": all) at
  /// start, then loading and unloading on the servers' word. Main's
  /// server::model_manager, which links the backends that this library does
  /// not; main stops them before the actor system goes.
  std::function<result<std::shared_ptr<server::model_directory>>(
    const std::filesystem::path& repository, const std::vector<std::string>& startup_models)>
    make_models;
};

struct worker_host {
  /// Greeted by servers; publish it on the worker's port.
  caf::actor actor;
  /// The models of the repository (or of the cache, without one).
  std::shared_ptr<server::model_directory> models;
  /// Beside a repository of its own: the shipped models (null without).
  std::shared_ptr<server::model_directory> shipped;
  /// Models loaded and those that failed with the reason, for the start-up log.
  std::vector<std::string> loaded;
  std::vector<std::string> failed;
};

/// Loads the placed models of the repository (every model by default) and
/// spawns the worker actor. Fails only when the repository cannot be read.
result<worker_host> start_worker(caf::actor_system& sys, worker_config config);

} // namespace caf_serving::cluster
