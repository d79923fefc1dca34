#pragma once
/// The composition root of the models: loads them from the repository into
/// running pipelines (executors on the CPU or CUDA backend, scheduler,
/// post-processor per model version), unloads them, and answers which pipeline
/// serves a request (model_directory, what the ingresses and the cluster see).
/// Safe to call from the ingress threads and from load/unload requests at
/// once: the models are published as an immutable snapshot that find() reads
/// without a lock shared by the process.

#include "core/model_config.hpp"
#include "core/stats.hpp"
#include "scheduler/scheduler_actor.hpp"
#include "server/load_files.hpp"
#include "server/model_directory.hpp"

#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <condition_variable>
#include <deque>
#include <thread>
#include <string>
#include <vector>

namespace caf_serving::onnx {
class work_pool;
}

namespace caf_serving::server {

struct model_manager_config {
  std::filesystem::path repository;
  /// Replaces Triton's max_queue_size 0 ("unbounded") for every model.
  uint32_t max_queue_size = 1024;
  /// Batches each executor may hold at once (--executor-depth). An
  /// asynchronous backend's executor gets at least the backend's pipeline
  /// depth (executor::backend::pipeline_depth), so that it overlaps batches.
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
  /// --model-control-mode.
  model_control_mode control_mode = model_control_mode::none;
  /// --load-model: the models that explicit mode loads at start; "*" alone
  /// means all of them.
  std::vector<std::string> startup_models;
  /// --repository-poll-secs: how often poll mode scans the repository; 0
  /// scans only at start.
  std::chrono::seconds poll_interval{15};
  /// Where files sent with a load request are written, and their size limit.
  load_files_config load_files;
  /// A reload replaces a model's pipelines at once, but the old ones keep
  /// taking requests this long before they drain: a request that found the
  /// old pipeline just before the swap (its body still arriving, or parsed)
  /// is served by it instead of refused. 0: drain at once.
  std::chrono::milliseconds reload_grace{5000};
  /// The KV cache budget of each generative model (--kv-cache-bytes); 0: its
  /// own default (server/generative_loader.hpp).
  uint64_t kv_cache_bytes = 0;
};

class model_manager final : public model_directory {
public:
  model_manager(caf::actor_system& sys, model_manager_config cfg);
  ~model_manager();

  /// Loads what the control mode serves at start (every model, or the
  /// --load-model ones), and in poll mode starts scanning the repository. A
  /// broken model is recorded with its reason and the others load. Fails only
  /// when the repository is unreadable.
  std::variant<std::monostate, serving_error> start();

  /// Loads every model of the repository; a broken one is recorded with its
  /// reason and the others load. Fails only when the repository is unreadable.
  std::variant<std::monostate, serving_error> load_all();

  /// Loads (or reloads) one model from the repository. Requests to the version
  /// being replaced finish on the old pipeline.
  std::variant<std::monostate, serving_error> load(const std::string& name);

  /// Loads (or reloads) `name` on the manager's loader thread (model_directory).
  /// Loads run one at a time in the order asked; with max_pending_loads
  /// waiting, `done` gets a 503 at once.
  void load_async(const std::string& name, load_done done) override;

  // -- The model control API (POST /v2/repository/models/{m}/load, /unload) ---

  /// A load asked for by a client, run on the loader thread as load_async
  /// (model_directory). Failures in Triton's wording and status: "failed to
  /// load 'm', failed to poll from model repository: ..." (500) when the model
  /// or its configuration cannot be read, "load failed for model 'm': ..."
  /// (400) when the model itself cannot be loaded; the engine's reason follows.
  void request_load(const std::string& name, read_load_parameters read, load_done done) override;
  using model_directory::request_load;

  std::variant<std::monostate, serving_error>
  request_unload(const std::string& name, const unload_parameters& params) override;

  model_control_mode control_mode() const { return cfg_.control_mode; }

  const std::filesystem::path& repository() const override { return cfg_.repository; }

  /// One scan of the repository (poll mode does it every poll_interval): a
  /// model directory that appeared or changed is loaded on the loader thread,
  /// the served version answering until the new one is ready; one that
  /// disappeared is unloaded (its queued requests answered) and forgotten.
  void poll_repository();

  std::variant<std::monostate, serving_error> unload(const std::string& name) override;

  result<std::shared_ptr<const model_pipeline>> find(const std::string& name,
                                                     int64_t version = 0) const override;
  std::vector<std::shared_ptr<const model_pipeline>>
  versions(const std::string& name) const override;
  std::vector<index_row> index() const override;
  std::vector<std::shared_ptr<model_stats>> all_stats() const override;
  bool all_ready() const override;

  /// Drains every pipeline: answers what is queued and in flight, then stops.
  void shutdown();

  void set_cluster_view(cluster_view view) override;
  std::string cluster_json() const override;
  std::string cluster_prometheus() const override;

private:
  /// A config override (and its files) that the served versions came from.
  /// A later load without parameters keeps it while the repository directory
  /// is unchanged, as Triton does; an unload forgets it.
  struct override_state {
    std::string config;
    std::shared_ptr<const load_directory> files;
    uint64_t repository_fingerprint = 0;
  };

  struct record {
    std::map<int64_t, std::shared_ptr<const model_pipeline>> served;
    std::string state = "UNAVAILABLE";
    std::string reason;
    std::optional<override_state> override_config;
  };

  /// Where a load failed: in its parameters (answered as they are), in the
  /// files sent (bad base64, too large), in
  /// reading the model and its configuration (Triton's "failed to poll"), or
  /// in loading it (Triton's "load failed").
  enum class load_stage { parameters, request, repository, backend };
  struct load_failure {
    serving_error error;
    load_stage stage = load_stage::backend;
  };
  using load_outcome = std::variant<std::monostate, load_failure>;

  struct load_job {
    std::string name;
    /// Empty: a load without parameters.
    read_load_parameters params;
    std::function<void(const load_outcome&)> done;
  };

  /// find()'s view of the models: what it reads of each (served versions, why
  /// it is not ready, the pipelines retiring after a reload), published anew
  /// under mutex_ after every change (publish_view) and read without it.
  struct find_entry {
    std::map<int64_t, std::shared_ptr<const model_pipeline>> served;
    std::string reason;
    std::vector<std::pair<std::shared_ptr<const model_pipeline>,
                          std::chrono::steady_clock::time_point>>
      retiring;
  };
  using find_view = std::map<std::string, find_entry>;
  /// Builds view_ from models_ and retiring_ and bumps view_generation_.
  /// Called with mutex_ held.
  void publish_view();
  /// This thread's copy of view_: taken under mutex_ only when a change was
  /// published since this thread last looked (each thread keeps a weak copy).
  std::shared_ptr<const find_view> current_view() const;

  /// A load in three steps: resolve_config (the parameters, the files sent,
  /// the kept override, config.pbtxt, completion), build_backends (every
  /// version's backend, labels, the batching policy and its checks), then
  /// wire_pipelines (executors, post-processor and scheduler per version, and
  /// their supervision); then the record serves the new pipelines.
  struct resolved_model;
  struct built_model;
  load_outcome load_model(const std::string& name, const load_parameters* params);
  std::variant<resolved_model, load_failure> resolve_config(const std::string& name,
                                                            const load_parameters* params);
  std::variant<built_model, load_failure> build_backends(const std::string& name,
                                                         const resolved_model& model);
  std::map<int64_t, std::shared_ptr<const model_pipeline>>
  wire_pipelines(const std::string& name, const resolved_model& model, const built_model& built);
  /// The record of a failed load: its reason, or the versions served before.
  load_outcome record_failure(const std::string& name, const load_failure& f);
  /// Takes a record's pipelines out of service after a reload: they drain
  /// after reload_grace (at once on shutdown). Called with mutex_ held.
  void retire(record& r);
  void enqueue(load_job job);
  void stop(record& r);
  /// Stops a pipeline: its scheduler drains, or its generation actor ends.
  void drain(const model_pipeline& p);
  void loader_loop();
  void poll_loop();
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
  /// Pipelines replaced by a reload and not yet drained, with when they drain.
  /// A server without local executors still answers from them while its new
  /// pipeline waits for its workers' executors (find()).
  std::vector<std::pair<std::shared_ptr<const model_pipeline>, std::chrono::steady_clock::time_point>>
    retiring_;
  cluster_view cluster_;
  std::shared_ptr<const find_view> view_ = std::make_shared<const find_view>();
  std::atomic<uint64_t> view_generation_{1};
  /// Tells this manager's view from another's in a thread's cache.
  const uint64_t instance_id_;

  /// The loader thread and its bounded queue (load_async).
  std::mutex load_mutex_;
  std::condition_variable load_cv_;
  std::deque<load_job> load_queue_;
  bool loader_stopping_ = false;
  std::thread loader_;

  /// Poll mode: each model directory's fingerprint at its last scan, and the
  /// thread that scans.
  std::mutex poll_mutex_;
  std::condition_variable poll_cv_;
  std::map<std::string, uint64_t> polled_;
  bool poll_stopping_ = false;
  std::thread poller_;
  std::shared_ptr<restart_hook> restart_hook_ = std::make_shared<restart_hook>();
};

} // namespace caf_serving::server
