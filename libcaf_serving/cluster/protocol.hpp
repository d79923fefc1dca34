#pragma once
/// The worker protocol: the messages between a server and its worker nodes, and
/// the settings both sides share.
///
/// ```
/// server                                   worker (published on its port)
///   connect (middleman)          ------->
///   challenge_atom               ------->  nonce (remembered per server node)
///   hello_atom, proof            ------->  checks HMAC(secret, "server|"+nonce);
///                                <-------  worker_info: its models and executors,
///                                          its bulk port and a token for this server
///   run_batch (to an executor)   ------->  executor checks the sender's node
///                                <-------  batch_result_message
///   (batches from --bulk-threshold-bytes up, and their answers, go over the
///    bulk channel instead: bulk_channel.hpp)
/// ```
/// A worker can also join a server that listens for workers (`--cluster-port`):
/// it proves the secret to the server the same way (role "worker", join_atom with
/// its own handle and its name), and the server then greets it as above. The
/// server keys joined workers by name, so a worker that joins again (restarted,
/// or after its link was cut) takes its old row back; a second live worker with
/// a name already connected from another node is refused until that one is lost.
///
/// Data-plane messages (run_batch, batch_result_message) are declared with the
/// pipeline's other messages in core/pipeline_messages.hpp.

#include "core/pipeline_messages.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::cluster {

using challenge_atom = caf::atom_constant<caf::atom("challenge")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
/// Server to worker: load (or reload) a model, optionally from shipped files.
using load_model_atom = caf::atom_constant<caf::atom("wload")>;
/// Server to worker: stop serving a model.
using unload_model_atom = caf::atom_constant<caf::atom("wunload")>;

/// One model version a worker serves and its executors (typed as
/// executor::executor_actor; carried untyped).
struct worker_model {
  std::string name;
  int64_t version = 0;
  std::vector<caf::actor> executors;
  /// model_hash.hpp's hash of the model's directory (config and files), and of
  /// the config override it was loaded with, as the worker loaded it; the
  /// server uses the executors only when it is the hash of what the server serves.
  std::string hash;
  /// Loaded from files the server shipped (not from the worker's repository).
  bool shipped = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_model& x) {
  return f(caf::meta::type_name("worker_model"), x.name, x.version, x.executors, x.hash,
           x.shipped);
}

/// One file of a model directory shipped to a worker (path relative to it).
struct model_file {
  std::string path;
  std::string bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_file& x) {
  return f(caf::meta::type_name("model_file"), x.path, x.bytes);
}

/// A load asked of a worker: with `files`, the model's whole directory, which
/// the worker writes into its cache and checks against `hash`; without, the
/// worker (re)loads the model from its own repository. With `config` (the
/// "config" load parameter the server's copy was loaded with), the worker loads
/// with the same parameter, and it is part of the hash.
struct model_shipment {
  std::string name;
  std::string hash;
  std::vector<model_file> files;
  std::string config;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_shipment& x) {
  return f(caf::meta::type_name("model_shipment"), x.name, x.hash, x.files, x.config);
}

/// A worker's answer to a server that proved the secret.
struct worker_info {
  /// The worker's name (--name, default host:port).
  std::string name;
  std::vector<worker_model> models;
  /// The models this worker may serve (--models); empty: any.
  std::vector<std::string> placement;
  /// The worker takes shipped files for the models it lacks.
  bool accepts_files = false;
  /// The worker has a repository of its own (--model-repository): a model it
  /// holds otherwise than the server is reloaded from there, not shipped.
  bool own_repository = false;
  /// The worker's bulk channel (bulk_channel.hpp): its port (0: none), the host
  /// to reach it at when the server did not dial the worker (empty: unknown),
  /// and the 16-byte token made for this server, which admits one connection.
  uint16_t bulk_port = 0;
  std::string bulk_host;
  std::string bulk_token;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_info& x) {
  return f(caf::meta::type_name("worker_info"), x.name, x.models, x.placement,
           x.accepts_files, x.own_repository, x.bulk_port, x.bulk_host, x.bulk_token);
}

/// Timing of failure detection; the same on servers and workers.
struct liveness_config {
  /// The middleman's heartbeat interval (CAF leaves heartbeats off by default).
  std::chrono::milliseconds heartbeat{200};
  /// A connection silent this long is closed; monitors then see the node down.
  std::chrono::milliseconds node_timeout{1000};
};

/// Registers the types that cross nodes and turns the middleman's heartbeats on.
/// Call before the actor_system is constructed; loads the middleman module.
void configure_actor_system(caf::actor_system_config& cfg, const liveness_config& live);

} // namespace caf_serving::cluster
