#pragma once
/// What the ingresses (HTTP, gRPC) and the cluster see of the models a process
/// serves: a narrow directory, not the composition root that builds them. It
/// finds the pipeline a request goes to, lists versions and the repository
/// index, says whether everything is ready, gives the statistics, and takes
/// load and unload requests. server::model_manager implements it (and links
/// every backend); the libraries that only use it link this one, which links
/// no backend (cmake/CafServingLayering.cmake rules check it).
///
///     server::model_directory& models = manager;        // main wires it
///     auto p = models.find("resnet", 0);                // per request: no lock
///     if (p) send((*p)->scheduler, ...);

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "core/stats.hpp"
#include "executor/executor_actor.hpp"
#include "scheduler/scheduler_actor.hpp"
#include "server/generative_model.hpp"
#include "server/load_files.hpp"

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace caf_serving::server {

/// One served model version and everything a request to it needs.
struct model_pipeline {
  model_config config;
  int64_t version = 0;
  std::shared_ptr<model_stats> stats;
  scheduler::scheduler_actor scheduler;
  /// Bodies of GET /v2/models/{m} and /config, built once at load.
  std::string metadata_json;
  std::string config_json;
  /// The directory of files sent with the load request it came from, if any:
  /// removed once no pipeline needs it.
  std::shared_ptr<const load_directory> files;
  /// The "config" load parameter it was loaded with (JSON), kept by later loads
  /// without parameters; empty when config.pbtxt is its configuration. Part of
  /// what a cluster's server and workers compare (cluster/model_hash.hpp).
  std::string config_override;
  /// The executors spawned in this process at load (none without
  /// local_executors): a worker hands them to its servers (cluster/worker_host).
  std::vector<executor::executor_actor> executors;
  /// A generative model's decoding loop, tokenizer and limits (decoupled:
  /// true); null for a one-shot model. A generative model has no scheduler:
  /// its requests go to generative->actor through the generate endpoints.
  std::shared_ptr<const generative_model> generative;
};

/// Triton's --model-control-mode: who decides which models are served.
enum class model_control_mode {
  /// Every model of the repository is loaded at start and stays; the load and
  /// unload API is refused (Triton's default).
  none,
  /// The --load-model models ("*": all) are loaded at start; then models are
  /// loaded and unloaded only over the API.
  explicit_control,
  /// Every model is loaded at start; then the repository is scanned every
  /// poll_interval, and added, changed and removed models are loaded,
  /// reloaded and unloaded. The API is refused.
  poll,
};

/// "none", "explicit" or "poll" (any case, as Triton reads them).
std::optional<model_control_mode> parse_model_control_mode(std::string_view text);
std::string_view to_string(model_control_mode mode);

/// The parameters of POST /v2/repository/models/{m}/load, as Triton's.
struct load_parameters {
  /// "config": the model's whole configuration as JSON (protobuf's mapping of
  /// ModelConfig), used instead of config.pbtxt. As in Triton it replaces the
  /// file rather than amending it: what it leaves out is completed from the
  /// model file (ONNX) or is a load error.
  std::optional<std::string> config;
  /// "file:<path>" parameters: the model's files (base64). With them, the
  /// model loads from a directory of its own holding only these files, not
  /// from the repository; a "config" must come with them.
  std::vector<load_file> files;
};

/// The parameters of POST /v2/repository/models/{m}/unload.
struct unload_parameters {
  /// Triton's "unload_dependents": also unload the ensembles that use the
  /// model. The engine has no ensembles, so it changes nothing.
  bool unload_dependents = false;
};

/// What the ingress shows about the cluster (/v2 and /metrics); both empty on a
/// server without workers. Set by whoever runs the cluster (the node registry);
/// called from the ingress thread.
struct cluster_view {
  /// A JSON value for /v2's "cluster" member, or empty.
  std::function<std::string()> json;
  /// Prometheus text appended to /metrics, or empty.
  std::function<std::string()> prometheus;
};

/// A model's row in POST /v2/repository/index.
struct index_row {
  std::string name;
  std::string version; ///< empty when nothing is served
  /// READY, UNAVAILABLE or LOADING; empty for a model of the repository that
  /// was never loaded (Triton lists those by name only).
  std::string state;
  std::string reason;  ///< why it is not READY
};

/// What a load reports, on the loader thread, when it finished.
using load_done = std::function<void(std::variant<std::monostate, serving_error>)>;

/// Reads a load request's parameters (parses its body); run on the loader
/// thread, so that a body of large model files is not parsed on the event loop.
/// Its error reaches the load's `done` unchanged.
using read_load_parameters = std::function<result<load_parameters>()>;

class model_directory {
public:
  virtual ~model_directory() = default;

  // -- Requests (the ingress event loops, many at once) ------------------------

  /// The pipeline for `name` at `version` (0: the newest served), with
  /// Triton's statuses and wording first: 404 "Request for unknown model: 'm'
  /// is not found" for a model the repository does not know, 404 "... has no
  /// available versions" when none is served (not loaded, unloaded, failed),
  /// 404 "... version N is not found" for a version not served, and 503 "...
  /// version N is not at ready state" for one that cannot run now (its
  /// scheduler stopped, or no live and healthy executor: DESIGN.md,
  /// Supervision). The reason follows. Takes no lock shared by the process.
  virtual result<std::shared_ptr<const model_pipeline>> find(const std::string& name,
                                                             int64_t version = 0) const = 0;

  /// Every served version of `name` (empty when none), oldest first.
  virtual std::vector<std::shared_ptr<const model_pipeline>>
  versions(const std::string& name) const = 0;

  /// POST /v2/repository/index.
  virtual std::vector<index_row> index() const = 0;

  /// True when every model that was loaded is served and ready; a model
  /// unloaded over the API does not count (Triton's strict readiness).
  virtual bool all_ready() const = 0;

  /// Statistics of every served model version.
  virtual std::vector<std::shared_ptr<model_stats>> all_stats() const = 0;

  /// The repository the models are loaded from.
  virtual const std::filesystem::path& repository() const = 0;

  // -- Loads and unloads ---------------------------------------------------------

  /// Loads (or reloads) `name` on a loader thread, so that the caller (an
  /// event loop) never waits for an import, compile or warm-up. The model is
  /// LOADING in the index meanwhile; a version already served keeps serving
  /// until the new one replaces it. With too many loads waiting, `done` gets a
  /// 503 at once.
  virtual void load_async(const std::string& name, load_done done) = 0;

  /// A load asked for by a client (POST /v2/repository/models/{m}/load), its
  /// parameters read on the loader thread; refused (503, Triton's message)
  /// unless the model control mode is explicit. Failures in Triton's wording
  /// and status; the versions served before a failed load keep serving.
  virtual void request_load(const std::string& name, read_load_parameters read,
                            load_done done) = 0;

  /// The same with parameters at hand.
  void request_load(const std::string& name, load_parameters params, load_done done);

  /// An unload asked for by a client: refused (503) unless the mode is
  /// explicit; a model that is not loaded is no error (as in Triton).
  virtual std::variant<std::monostate, serving_error>
  request_unload(const std::string& name, const unload_parameters& params) = 0;

  /// Stops serving `name` (whatever the mode: a worker unloads what its
  /// server no longer serves): new requests get 503, queued ones are answered.
  virtual std::variant<std::monostate, serving_error> unload(const std::string& name) = 0;

  // -- The cluster, as /v2 and /metrics show it ----------------------------------

  virtual void set_cluster_view(cluster_view view) = 0;
  /// Empty strings without a cluster.
  virtual std::string cluster_json() const = 0;
  virtual std::string cluster_prometheus() const = 0;
};

} // namespace caf_serving::server
