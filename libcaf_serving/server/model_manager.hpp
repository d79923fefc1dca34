#pragma once
/// Loads models from the repository into running pipelines (executors, scheduler,
/// post-processor per model version), unloads them, and answers which pipeline
/// serves a request. Safe to call from the ingress thread and from load/unload
/// requests at once: a model's pipeline is published as an immutable snapshot.

#include "core/model_config.hpp"
#include "core/stats.hpp"
#include "scheduler/scheduler_actor.hpp"

#include <caf/actor_system.hpp>

#include <chrono>

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <deque>
#include <thread>
#include <string>
#include <vector>

namespace caf_serving::onnx {
class work_pool;
}

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
};

struct model_manager_config {
  std::filesystem::path repository;
  /// Replaces Triton's max_queue_size 0 ("unbounded") for every model.
  uint32_t max_queue_size = 1024;
  /// Batches each executor may hold at once.
  uint32_t executor_depth = 1;
  /// The process's compute threads (thread_config::executor_threads): the
  /// size of compute_pool, or of a pool per model without one.
  unsigned executor_threads = 1;
  /// The one pool of compute threads that every CPU executor of every model
  /// shares, made by main (one budget for the process). Null: each model
  /// gets a pool of executor_threads for its instances.
  std::shared_ptr<onnx::work_pool> compute_pool;
  /// Spawn each model's executors in this process. Off for a server that only
  /// dispatches to executors on worker nodes (libcaf_serving/cluster/).
  bool local_executors = true;
  /// A local executor silent this long on a batch is taken for hung
  /// (--executor-timeout-ms); 0: never.
  std::chrono::milliseconds executor_timeout{60000};
  /// Largest sum of tensor bytes in one batch (--max-batch-bytes).
  uint64_t max_batch_bytes = max_data_field_bytes;
  /// Loads asked for over the API and not yet started; past it a load answers
  /// 503 at once.
  size_t max_pending_loads = 64;
  /// Triton's --strict-model-config: true requires a complete config.pbtxt
  /// (backend or platform, every input and output with dims); false (Triton
  /// 2.51's default) completes a missing or partial one from the ONNX graph,
  /// max_batch_size and dynamic batching included.
  bool strict_model_config = false;
  /// The max_batch_size auto-complete gives a model whose graph batches and
  /// whose config says none (Triton's --backend-config=
  /// onnxruntime,default-max-batch-size, 4 by default).
  int default_max_batch_size = 4;
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
  std::string state;   ///< READY, UNAVAILABLE or LOADING
  std::string reason;  ///< why it is not READY
};

class model_manager {
public:
  model_manager(caf::actor_system& sys, model_manager_config cfg);
  ~model_manager();

  /// Loads every model of the repository; a broken one is recorded with its
  /// reason and the others load. Fails only when the repository is unreadable.
  std::variant<std::monostate, serving_error> load_all();

  /// Loads (or reloads) one model from the repository. Requests to the version
  /// being replaced finish on the old pipeline.
  std::variant<std::monostate, serving_error> load(const std::string& name);

  /// What load_async reports, on the loader thread, when the load finished.
  using load_done = std::function<void(std::variant<std::monostate, serving_error>)>;

  /// Loads (or reloads) `name` on the manager's loader thread, so that the
  /// caller (the ingress event loop) never waits for an ONNX import, compile or
  /// warm-up. The model is LOADING in the index meanwhile; a version already
  /// served keeps serving until the new one replaces it. Loads run one at a
  /// time in the order asked; with max_pending_loads waiting, `done` gets a 503
  /// at once.
  void load_async(const std::string& name, load_done done);

  /// Stops serving `name`: new requests get 503, queued ones are answered.
  std::variant<std::monostate, serving_error> unload(const std::string& name);

  /// The pipeline for `name` at `version` (0: the newest served), with
  /// Triton's statuses and wording first: 404 "Request for unknown model: 'm'
  /// is not found" for a model the repository does not know, 404 "... has no
  /// available versions" when none is served (not loaded, unloaded, failed),
  /// 404 "... version N is not found" for a version not served, and 503 "...
  /// version N is not at ready state" for one that cannot run now (its
  /// scheduler stopped, or no live and healthy executor: DESIGN.md,
  /// Supervision). The reason follows.
  result<std::shared_ptr<const model_pipeline>> find(const std::string& name,
                                                     int64_t version = 0) const;

  /// Every served version of `name` (empty when none).
  std::vector<std::shared_ptr<const model_pipeline>> versions(const std::string& name) const;

  std::vector<index_row> index() const;

  /// Statistics of every served model version.
  std::vector<std::shared_ptr<model_stats>> all_stats() const;

  /// True when every model the repository holds is served.
  bool all_ready() const;

  /// Drains every pipeline: answers what is queued and in flight, then stops.
  void shutdown();

  void set_cluster_view(cluster_view view);
  /// What /v2 and /metrics show about the cluster (empty strings without one).
  std::string cluster_json() const;
  std::string cluster_prometheus() const;

private:
  struct record {
    std::map<int64_t, std::shared_ptr<const model_pipeline>> served;
    std::string state = "UNAVAILABLE";
    std::string reason;
  };

  void stop(record& r);
  void loader_loop();
  /// A scheduler stopped abnormally: when it still serves `name` at `version`,
  /// the model is loaded again (on the loader thread) with a fresh pipeline.
  void scheduler_stopped(const std::string& name, int64_t version, const caf::actor_addr& addr,
                         const std::string& why);

  /// What a scheduler's exit hook reaches the manager through; cleared when the
  /// manager goes, so that a late hook does nothing.
  struct restart_hook {
    std::mutex mutex;
    model_manager* manager = nullptr;
  };

  caf::actor_system& sys_;
  model_manager_config cfg_;
  mutable std::mutex mutex_;
  std::map<std::string, record> models_;
  /// "model/field" of every ignored config field already logged, so that each
  /// is logged once per model however often it reloads.
  std::set<std::string> logged_ignored_;
  cluster_view cluster_;

  /// The loader thread and its bounded queue (load_async).
  std::mutex load_mutex_;
  std::condition_variable load_cv_;
  std::deque<std::pair<std::string, load_done>> load_queue_;
  bool loader_stopping_ = false;
  std::thread loader_;
  std::shared_ptr<restart_hook> restart_hook_ = std::make_shared<restart_hook>();
};

} // namespace caf_serving::server
