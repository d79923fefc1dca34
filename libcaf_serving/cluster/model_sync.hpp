#pragma once
/// Which models a worker may serve for a server, and what the server must ask of
/// it: the server's node registry calls plan_model_sync for each ready worker on
/// every sync (a worker greeted, a model loaded, reloaded or unloaded on the
/// server) and carries the plan out (node_registry.cpp).
///
/// A worker serves a model for a server only when both hold the same model: the
/// same hash of its directory (model_hash.hpp). Otherwise the server asks the
/// worker to load the model, once per server hash: from the files it ships when
/// the worker lacks the model or holds a shipped copy, else from the worker's
/// repository (the server reloaded it; the worker's copy may have been updated
/// too). When that load still gives another hash, the worker stays out of that
/// model, and the mismatch is shown in /v2 and /metrics, never served.

#include <map>
#include <set>
#include <string>
#include <vector>

namespace caf_serving::cluster {

struct model_sync_input {
  /// The models the server serves: name -> hash of their directory.
  std::map<std::string, std::string> served;
  /// The models the worker serves: name -> hash of what it loaded.
  std::map<std::string, std::string> worker;
  /// The worker's --models; empty: all.
  std::vector<std::string> placement;
  /// The worker takes shipped files for the models it lacks.
  bool accepts_files = false;
  /// The worker has a repository of its own, and these of its models came
  /// from shipped files instead.
  bool own_repository = false;
  std::set<std::string> shipped;
  /// name -> the server hash a load was already asked for (and answered).
  std::map<std::string, std::string> tried;
  /// Models whose load is under way on the worker.
  std::set<std::string> pending;
};

struct model_sync_plan {
  /// Same model on both: the worker's executors join the server's schedulers.
  std::vector<std::string> attach;
  /// Ship the model's files and load them.
  std::vector<std::string> ship;
  /// The worker loads the model again from its own repository.
  std::vector<std::string> reload;
  /// The worker serves a model the server does not (unloaded): unload it there.
  std::vector<std::string> unload;
  /// name -> why the worker is kept out of it (its hash differs).
  std::map<std::string, std::string> mismatched;
};

model_sync_plan plan_model_sync(const model_sync_input& in);

} // namespace caf_serving::cluster
