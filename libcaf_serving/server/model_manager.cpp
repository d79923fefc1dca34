#include "server/model_manager.hpp"
#include "server/generative_loader.hpp"

#include "executor/builtin_backend.hpp"
#include "cuda/gpu_options.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#ifdef CAF_SERVING_HAS_CUDA_BACKEND
#include "cuda/cuda_backend.hpp"
#endif
#include "postprocess/postprocessor_actor.hpp"
#include "repository/config_json.hpp"
#include "repository/model_repository.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <optional>
#include <functional>
#include <iostream>
#include <iterator>
#include <set>
#include <utility>

namespace caf_serving::server {

namespace {

bool is_onnx(const model_config& cfg) {
  return cfg.platform == "onnxruntime_onnx" || cfg.backend == "onnxruntime";
}

/// The file of a version that holds the model: Triton's default_model_filename,
/// or model.onnx.
std::filesystem::path model_file(const model_config& cfg,
                                 const std::filesystem::path& version_dir) {
  return version_dir / (cfg.default_model_filename.empty() ? std::string("model.onnx")
                                                           : cfg.default_model_filename);
}

/// Makes a backend for each executor instance of one model version.
using backend_factory = std::function<std::shared_ptr<executor::backend>()>;

/// A version's backends and what they hold outside the process's heap.
struct loaded_backend {
  backend_factory make_instance;
  uint64_t gpu_memory_bytes = 0; ///< every GPU instance's device allocation
  uint64_t gpu_pinned_bytes = 0;
};

/// An ONNX model with KIND_GPU instance groups: every instance is built (its
/// graphs captured) here, before the model is published as ready; the factory
/// then hands them out in the order model_manager::load asks.
result<loaded_backend> make_gpu_backend(model_config& cfg,
                                        const std::filesystem::path& version_dir) {
  for (const auto* list : {&cfg.inputs, &cfg.outputs})
    for (const auto& t : *list)
      if (t.reshape)
        return serving_error{status_code::bad_request,
                             "model '" + cfg.name + "': '" + t.name
                               + "' has a reshape, which KIND_GPU instances do not carry out "
                                 "yet; use instance_group { kind: KIND_CPU } or drop the "
                                 "reshape"};
#ifdef CAF_SERVING_HAS_CUDA_BACKEND
  cuda::cuda_model_config cc;
  cc.model_file = model_file(cfg, version_dir);
  cc.config = cfg;
  auto model = cuda::load_cuda_model(cc);
  if (!model)
    return model.error();
  cfg = model->config;
  auto instances = std::make_shared<std::vector<std::shared_ptr<executor::backend>>>();
  loaded_backend loaded;
  for (const auto& p : model->options.placements) {
    auto inst = model->make_instance(p);
    if (!inst)
      return inst.error();
    std::cout << "model " << cfg.name << " (" << version_dir.filename().string() << ") GPU "
              << p.device << " instance " << p.index_on_device << ": " << inst->report.arena
              << ", " << inst->report.steps << " steps (" << inst->report.host_steps
              << " on the host)" << std::endl;
    instances->push_back(inst->backend);
    loaded.gpu_memory_bytes += inst->report.device_bytes;
    loaded.gpu_pinned_bytes += inst->report.pinned_bytes;
  }
  std::cout << "model " << cfg.name << ": " << model->summary << std::endl;
  auto next = std::make_shared<size_t>(0);
  loaded.make_instance = [instances, next] {
    return (*instances)[(*next)++ % instances->size()];
  };
  return loaded;
#else
  (void)version_dir;
  return serving_error{status_code::unavailable,
                       "model '" + cfg.name + "' asks for instance_group { kind: KIND_GPU }, "
                       "but this server was built without the CUDA backend "
                       "(-DCAF_SERVING_CUDA=OFF or no cuDNN); use kind: KIND_CPU or rebuild "
                       "with CUDA"};
#endif
}

/// The backend of one version. An ONNX model also completes `cfg` (inputs,
/// outputs, dims) from its graph, as Triton's auto-complete does.
result<loaded_backend> make_backend(model_config& cfg, const std::filesystem::path& version_dir,
                                    const model_manager_config& manager) {
  if (cfg.backend == "builtin") {
    if (cfg.inputs.empty() || cfg.outputs.empty())
      return serving_error{status_code::bad_request,
                           "model '" + cfg.name + "': the builtin backend needs its inputs and "
                           "outputs declared in config.pbtxt; add input [ ... ] and output [ ... ]"};
    auto backend = executor::make_builtin_backend(cfg);
    if (!backend)
      return backend.error();
    auto shared = *backend;
    return loaded_backend{[shared] { return shared; }};
  }
  if (is_onnx(cfg) && cuda::wants_gpu(cfg))
    return make_gpu_backend(cfg, version_dir);
  if (is_onnx(cfg)) {
    onnx::onnx_model_config oc;
    oc.model_file = model_file(cfg, version_dir);
    oc.config = cfg;
    oc.auto_complete = !manager.strict_model_config;
    oc.default_max_batch_size = manager.default_max_batch_size;
    // Every ONNX model shares the process's compute threads (the plans are
    // compiled for the pool's size); without one, the model's instances
    // share a pool of executor_threads.
    oc.pool = manager.compute_pool;
    oc.threads = std::max(manager.executor_threads, 1u);
    auto model = onnx::load_onnx_model(oc);
    if (!model)
      return model.error();
    cfg = model->config;
    std::cout << "model " << cfg.name << " (" << version_dir.filename().string()
              << "): " << model->summary << std::endl;
    for (const auto& w : model->warnings)
      std::cout << "warning: " << w << std::endl;
    return loaded_backend{model->make_instance};
  }
  if (cfg.platform.empty() && cfg.backend.empty())
    return serving_error{status_code::bad_request,
                         "model '" + cfg.name + "': neither backend nor platform is set and "
                         "there is no " + model_file(cfg, version_dir).string()
                           + "; add backend: \"onnxruntime\" for an ONNX model or backend: "
                             "\"builtin\" for a built-in function"};
  return serving_error{status_code::bad_request,
                       "model '" + cfg.name + "': unknown backend '" + cfg.backend
                         + "' / platform '" + cfg.platform
                         + "'; supported: backend \"builtin\", backend \"onnxruntime\" "
                           "(platform \"onnxruntime_onnx\")"};
}

result<std::map<std::string, std::vector<std::string>>>
read_labels(const repository::model_entry& entry) {
  std::map<std::string, std::vector<std::string>> labels;
  for (const auto& [output, file] : entry.config->label_filenames) {
    std::ifstream in(entry.model_dir / file);
    if (!in)
      return serving_error{status_code::bad_request, "model '" + entry.name
                                                       + "': cannot read label file '"
                                                       + file + "' of output '" + output + "'"};
    std::string line;
    auto& v = labels[output];
    while (std::getline(in, line))
      v.push_back(line);
  }
  return labels;
}

/// Why a loaded pipeline cannot serve now, if it cannot (readiness tells the
/// truth: a live scheduler and at least one live, healthy executor).
std::optional<std::string> not_ready_reason(const model_pipeline& p) {
  const auto& s = *p.stats;
  if (!s.scheduler_running.load())
    return "its scheduler stopped; load the model again";
  if (s.healthy_executors.load() > 0)
    return std::nullopt;
  if (s.live_executors.load() > 0)
    return "every executor of it failed repeatedly and is quarantined for a while; the "
           "server log says why";
  return "it has no executor that can run it (none was started, every one stopped, or "
         "no worker that serves it has joined)";
}

/// A name that may be joined onto the repository path (no '/', no leading '.').
bool plain_model_name(const std::string& name) {
  return !name.empty() && name.front() != '.' && name.find_first_of("/\\") == std::string::npos
         && name.find('\0') == std::string::npos;
}

/// Triton's refusal of the model control API outside explicit mode, and how
/// to get what the client wanted.
serving_error control_refused(model_control_mode mode) {
  std::string how = mode == model_control_mode::poll
                      ? "this server polls its repository (--model-control-mode poll): add, "
                        "change or remove the model's directory there instead, or start it "
                        "with --model-control-mode explicit"
                      : "this server loads its repository once at start (--model-control-mode "
                        "none, the default): start it with --model-control-mode explicit "
                        "(and --load-model NAME or '*' for what to load at start) to load "
                        "and unload models over the API";
  return {status_code::unavailable,
          "explicit model load / unload is not allowed if polling is enabled; " + how,
          failure_reason::unavailable};
}

} // namespace

namespace {

std::atomic<uint64_t> next_instance_id{1};

} // namespace

model_manager::model_manager(caf::actor_system& sys, model_manager_config cfg)
    : sys_(sys), cfg_(std::move(cfg)), instance_id_(next_instance_id.fetch_add(1)) {
  restart_hook_->manager = this;
}

model_manager::~model_manager() {
  {
    std::lock_guard<std::mutex> guard(poll_mutex_);
    poll_stopping_ = true;
  }
  poll_cv_.notify_all();
  if (poller_.joinable())
    poller_.join();
  {
    std::lock_guard<std::mutex> guard(restart_hook_->mutex);
    restart_hook_->manager = nullptr;
  }
  {
    std::lock_guard<std::mutex> guard(load_mutex_);
    loader_stopping_ = true;
  }
  load_cv_.notify_all();
  if (loader_.joinable())
    loader_.join();
  shutdown();
}

void model_manager::load_async(const std::string& name, load_done done) {
  enqueue({name, nullptr, [done = std::move(done)](const load_outcome& r) {
             if (auto* f = std::get_if<load_failure>(&r))
               done(f->error);
             else
               done(std::monostate{});
           }});
}

void model_manager::request_load(const std::string& name, read_load_parameters read,
                                 load_done done) {
  if (cfg_.control_mode != model_control_mode::explicit_control) {
    done(control_refused(cfg_.control_mode));
    return;
  }
  enqueue({name, std::move(read), [name, done = std::move(done)](const load_outcome& r) {
             auto* f = std::get_if<load_failure>(&r);
             if (!f) {
               done(std::monostate{});
               return;
             }
             // Triton's wording first (clients match on it), the engine's reason after.
             switch (f->stage) {
               case load_stage::parameters:
                 done(f->error);
                 break;
               case load_stage::request:
                 done(serving_error{f->error.status,
                                    "failed to load '" + name + "': " + f->error.message});
                 break;
               case load_stage::repository:
                 done(serving_error{status_code::internal,
                                    "failed to load '" + name
                                      + "', failed to poll from model repository: "
                                      + f->error.message});
                 break;
               case load_stage::backend:
                 done(bad_request("load failed for model '" + name + "': " + f->error.message));
                 break;
             }
           }});
}

void model_manager::enqueue(load_job job) {
  const std::string name = job.name;
  // The row reads LOADING before the loader thread can see the job: marked
  // after the push, a load that failed fast could set the row back first and
  // then be overwritten, leaving a served model LOADING in the index for good.
  std::optional<std::string> before;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = models_.find(name);
    if (it != models_.end())
      before = std::exchange(it->second.state, "LOADING");
  }
  std::optional<serving_error> refused;
  {
    std::lock_guard<std::mutex> guard(load_mutex_);
    if (loader_stopping_ || load_queue_.size() >= cfg_.max_pending_loads) {
      refused = serving_error{status_code::unavailable,
                              loader_stopping_
                                ? "the server is shutting down; model '" + name + "' was not loaded"
                                : std::to_string(load_queue_.size())
                                    + " model loads are already waiting; retry the load of '"
                                    + name + "' later",
                              failure_reason::unavailable};
    } else {
      load_queue_.push_back(std::move(job));
      if (!loader_.joinable())
        loader_ = std::thread([this] { loader_loop(); });
    }
  }
  if (!refused) {
    load_cv_.notify_one();
    return;
  }
  if (before) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = models_.find(name);
    if (it != models_.end() && it->second.state == "LOADING")
      it->second.state = *before;
  }
  job.done(load_failure{std::move(*refused), load_stage::request});
}

std::variant<std::monostate, serving_error> model_manager::load_all() {
  auto entries = repository::scan_repository(cfg_.repository, {});
  if (!entries)
    return entries.error();
  for (const auto& e : *entries)
    load(e.name);
  return {};
}

void model_manager::loader_loop() {
  for (;;) {
    load_job next;
    {
      std::unique_lock<std::mutex> lock(load_mutex_);
      load_cv_.wait(lock, [&] { return loader_stopping_ || !load_queue_.empty(); });
      if (load_queue_.empty())
        return;
      next = std::move(load_queue_.front());
      load_queue_.pop_front();
    }
    if (loader_stopping_) {
      next.done(load_failure{serving_error{status_code::unavailable,
                                           "the server is shutting down; model '" + next.name
                                             + "' was not loaded",
                                           failure_reason::unavailable},
                             load_stage::request});
      continue;
    }
    std::optional<load_parameters> params;
    if (next.params) {
      auto read = next.params();
      if (!read) {
        next.done(load_failure{read.error(), load_stage::parameters});
        continue;
      }
      if (read->config || !read->files.empty())
        params = std::move(*read);
    }
    next.done(load_model(next.name, params ? &*params : nullptr));
  }
}

std::variant<std::monostate, serving_error> model_manager::start() {
  std::error_code ec;
  if (!std::filesystem::is_directory(cfg_.repository, ec))
    return not_found("model repository " + cfg_.repository.string()
                     + " is no directory; pass the directory that holds one subdirectory "
                       "per model");
  if (cfg_.control_mode == model_control_mode::explicit_control) {
    auto all = std::find(cfg_.startup_models.begin(), cfg_.startup_models.end(), "*");
    if (all != cfg_.startup_models.end())
      return load_all();
    for (const auto& name : cfg_.startup_models)
      if (auto r = load(name); std::holds_alternative<serving_error>(r))
        std::cerr << "caf-serving: --load-model " << name << ": "
                  << std::get<serving_error>(r).message << std::endl;
    return {};
  }
  if (cfg_.control_mode == model_control_mode::poll) {
    // Taken before the loads, so that a change made while they run is seen
    // by the next scan.
    std::lock_guard<std::mutex> guard(poll_mutex_);
    for (const auto& name : repository::list_model_names(cfg_.repository))
      polled_[name] = repository::model_fingerprint(cfg_.repository / name);
  }
  auto loaded = load_all();
  if (cfg_.control_mode == model_control_mode::poll && cfg_.poll_interval.count() > 0)
    poller_ = std::thread([this] { poll_loop(); });
  return loaded;
}

void model_manager::poll_loop() {
  std::unique_lock<std::mutex> lock(poll_mutex_);
  while (!poll_cv_.wait_for(lock, cfg_.poll_interval, [&] { return poll_stopping_; })) {
    lock.unlock();
    poll_repository();
    lock.lock();
  }
}

void model_manager::poll_repository() {
  std::error_code ec;
  // A repository that cannot be read now (unmounted, renamed) is not a
  // repository whose models were all removed: nothing changes until it is back.
  if (!std::filesystem::is_directory(cfg_.repository, ec)) {
    std::cerr << "caf-serving: cannot read the model repository " << cfg_.repository.string()
              << "; the served models stay as they are" << std::endl;
    return;
  }
  auto names = repository::list_model_names(cfg_.repository);
  std::vector<std::string> changed, removed;
  {
    std::lock_guard<std::mutex> guard(poll_mutex_);
    std::set<std::string> present(names.begin(), names.end());
    for (const auto& name : names) {
      auto fingerprint = repository::model_fingerprint(cfg_.repository / name);
      auto [it, added] = polled_.emplace(name, fingerprint);
      if (added || it->second != fingerprint) {
        it->second = fingerprint;
        changed.push_back(name);
      }
    }
    for (auto it = polled_.begin(); it != polled_.end();) {
      if (present.count(it->first) == 0) {
        removed.push_back(it->first);
        it = polled_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& name : removed) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      auto it = models_.find(name);
      if (it == models_.end())
        continue;
      stop(it->second);
      models_.erase(it);
      publish_view();
    }
    std::cout << "model " << name << " was removed from the repository: unloaded" << std::endl;
  }
  for (const auto& name : changed)
    load_async(name, [name](std::variant<std::monostate, serving_error> r) {
      if (auto* e = std::get_if<serving_error>(&r))
        std::cerr << "caf-serving: model '" << name << "' changed in the repository and could "
                  << "not be loaded: " << e->message << std::endl;
      else
        std::cout << "model " << name << " (re)loaded from the repository" << std::endl;
    });
}

std::variant<std::monostate, serving_error> model_manager::load(const std::string& name) {
  auto r = load_model(name, nullptr);
  if (auto* f = std::get_if<load_failure>(&r))
    return f->error;
  return {};
}

/// What a load settled before any backend is built: the model's repository
/// entry, its configuration completed as Triton completes it, and the files
/// and config override it loads with.
struct model_manager::resolved_model {
  repository::model_entry entry;
  model_config config;
  std::shared_ptr<const load_directory> files;
  /// The "config" load parameter in effect (sent now, or kept from before).
  std::optional<std::string> config_json;
  /// What the record keeps of it for later loads without parameters.
  std::optional<override_state> override_now;
};

/// The backend of every version, the configuration they completed, and what
/// the pipeline is driven by: labels, batching policy, padding, latency target.
struct model_manager::built_model {
  std::map<int64_t, std::pair<model_config, loaded_backend>> backends;
  model_config config;
  std::map<std::string, std::vector<std::string>> labels;
  scheduler::policy_config policy;
  scheduler::padded_batching_config padding;
  std::optional<std::chrono::microseconds> latency_target;
  /// A generative model's versions (decoupled: true), instead of backends.
  std::map<int64_t, loaded_generative> generative;
};

auto model_manager::load_model(const std::string& name, const load_parameters* params)
  -> load_outcome {
  auto resolved = resolve_config(name, params);
  if (auto* f = std::get_if<load_failure>(&resolved))
    return record_failure(name, *f);
  auto& model = std::get<resolved_model>(resolved);
  auto built = build_backends(name, model);
  if (auto* f = std::get_if<load_failure>(&built))
    return record_failure(name, *f);
  auto served = wire_pipelines(name, model, std::get<built_model>(built));
  std::lock_guard<std::mutex> guard(mutex_);
  auto& r = models_[name];
  retire(r);
  r.served = std::move(served);
  r.state = "READY";
  r.reason.clear();
  r.override_config = std::move(model.override_now);
  publish_view();
  return {};
}

auto model_manager::record_failure(const std::string& name, const load_failure& f)
  -> load_outcome {
  std::lock_guard<std::mutex> guard(mutex_);
  if (f.stage != load_stage::backend && f.error.status == status_code::not_found
      && !models_.count(name))
    return f;
  auto& r = models_[name];
  if (r.served.empty()) {
    r.state = "UNAVAILABLE";
    r.reason = f.error.message;
  } else {
    // The versions served before keep serving (Triton's explicit mode).
    r.state = "READY";
    r.reason.clear();
  }
  publish_view();
  return f;
}

auto model_manager::resolve_config(const std::string& name, const load_parameters* params)
  -> std::variant<resolved_model, load_failure> {
  auto fail = [](const serving_error& e, load_stage stage) { return load_failure{e, stage}; };
  if (!plain_model_name(name))
    return fail(bad_request("'" + name + "' is not a model name; a model is named by its "
                            "directory in the repository, without '/' or a leading '.'"),
                load_stage::repository);
  auto repository_dir = cfg_.repository / name;
  auto fingerprint = repository::model_fingerprint(repository_dir);
  // A load without parameters keeps a config override while the repository
  // directory has not changed since (Triton's behaviour).
  std::optional<override_state> kept;
  if (params == nullptr) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = models_.find(name);
    if (it != models_.end() && it->second.override_config
        && it->second.override_config->repository_fingerprint == fingerprint)
      kept = it->second.override_config;
  }
  std::optional<std::string> config_json;
  if (params != nullptr && params->config)
    config_json = *params->config;
  else if (kept)
    config_json = kept->config;
  std::shared_ptr<const load_directory> files = kept ? kept->files : nullptr;
  if (params != nullptr && !params->files.empty()) {
    if (!params->config)
      return fail(bad_request("file: parameters replace the model's directory, so a \"config\" "
                              "parameter must come with them; add \"config\": the model's "
                              "configuration as a JSON string, e.g. {\"backend\": \"onnxruntime\"}"),
                  load_stage::repository);
    auto written = write_load_files(params->files, cfg_.load_files);
    if (!written)
      return fail(written.error(), written.error().status == status_code::internal
                                     ? load_stage::repository
                                     : load_stage::request);
    files = *written;
  }
  // Inputs and outputs may be left out for ONNX models: the graph completes them.
  repository::scan_config scan;
  scan.allow_missing_io = !cfg_.strict_model_config;
  std::optional<repository::model_entry> given;
  std::optional<override_state> override_now;
  if (config_json) {
    std::error_code ec;
    if (!files && !std::filesystem::is_directory(repository_dir, ec))
      return fail(not_found("model '" + name + "' is not in the repository "
                            + cfg_.repository.string() + "; create " + repository_dir.string()
                            + "/ with its version directories, or send its files as file: "
                              "parameters"),
                  load_stage::repository);
    repository::parse_context ctx{name, "the 'config' load parameter", true};
    // A builtin model's config.pbtxt completes what the override leaves out
    // (parse_model_config_json_over); sent files come without one.
    std::string base_text;
    if (!files) {
      std::ifstream in(repository_dir / "config.pbtxt", std::ios::binary);
      base_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto parsed = repository::parse_model_config_json_over(*config_json, base_text, ctx);
    if (!parsed)
      return fail(parsed.error(), load_stage::repository);
    given = repository::load_model_with_config(files ? files->path() : repository_dir, name,
                                               std::move(*parsed));
    override_now = override_state{*config_json, files, fingerprint};
  }
  auto entry = given ? std::move(*given)
                     : repository::load_model_config(cfg_.repository, name, scan);
  if (!entry.config)
    return fail(entry.config.error(), load_stage::repository);
  auto completed = entry.config->config;
  resolved_model out{std::move(entry), std::move(completed), files, config_json,
                     std::move(override_now)};
  auto& cfg = out.config;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (const auto& field : out.entry.config->ignored_fields)
      if (logged_ignored_.insert(name + "/" + field).second)
        std::cout << "model " << name << ": config field '" << field
                  << "' is accepted and ignored (it only concerns Triton's own backends)"
                  << std::endl;
  }
  // A model directory without platform or backend that holds the model file
  // (model.onnx, or default_model_filename) is ONNX.
  if (cfg.platform.empty() && cfg.backend.empty() && !out.entry.version_dirs.empty()
      && std::filesystem::exists(model_file(cfg, out.entry.version_dirs.back())))
    cfg.platform = "onnxruntime_onnx";
  // Triton completes an ONNX model's backend, platform and file name alike,
  // and GET .../config shows them.
  if (is_onnx(cfg)) {
    if (cfg.backend.empty())
      cfg.backend = "onnxruntime";
    if (cfg.platform.empty())
      cfg.platform = "onnxruntime_onnx";
    if (cfg.default_model_filename.empty())
      cfg.default_model_filename = "model.onnx";
  }
  return out;
}

auto model_manager::build_backends(const std::string& name, const resolved_model& model)
  -> std::variant<built_model, load_failure> {
  auto fail = [](const serving_error& e) { return load_failure{e, load_stage::backend}; };
  built_model out;
  out.config = model.config;
  const auto& entry = model.entry;
  if (model.config.decoupled) {
    // Decoupled models are generative decoders (issue 34): no scheduler,
    // executors or post-processor of the one-shot kind.
    if (!is_onnx(model.config))
      return fail(bad_request("model '" + name + "': decoupled: true is served for generative "
                              "ONNX decoders only (backend \"onnxruntime\"); use decoupled: "
                              "false or leave model_transaction_policy out"));
    for (size_t i = 0; i < entry.versions.size(); ++i) {
      generative_load_config gc;
      gc.config = model.config;
      gc.model_dir = cfg_.repository / name;
      gc.version_dir = entry.version_dirs[i];
      gc.kv_cache_bytes = cfg_.kv_cache_bytes;
      gc.max_waiting = cfg_.max_queue_size;
      gc.compute_pool = cfg_.compute_pool;
      gc.threads = cfg_.executor_threads;
      auto loaded = load_generative(gc);
      if (!loaded)
        return fail(loaded.error());
      std::cout << "model " << name << " (" << entry.versions[i] << "): " << loaded->summary
                << std::endl;
      out.config = loaded->config;
      out.generative.emplace(entry.versions[i], std::move(*loaded));
    }
    return out;
  }
  for (size_t i = 0; i < entry.versions.size(); ++i) {
    model_config version_cfg = model.config;
    auto factory = make_backend(version_cfg, entry.version_dirs[i], cfg_);
    if (!factory)
      return fail(factory.error());
    out.backends[entry.versions[i]] = {version_cfg, *factory};
  }
  if (!out.backends.empty())
    out.config = out.backends.rbegin()->second.first;
  const auto& cfg = out.config;
  auto labels = read_labels(entry);
  if (!labels)
    return fail(labels.error());
  out.labels = std::move(*labels);
  out.policy = scheduler::make_policy_config(cfg, cfg_.max_queue_size, cfg_.max_batch_bytes);
  // GPU instances replay one captured graph per bucket: the policy may pad a
  // batch up to the next bucket instead of waiting for more requests.
  if (is_onnx(cfg) && cuda::wants_gpu(cfg))
    if (auto gpu = cuda::read_gpu_options(cfg))
      out.policy.captured_batch_sizes = gpu->buckets;
  auto padding = scheduler::read_padded_batching(cfg);
  if (!padding)
    return fail(padding.error());
  out.padding = *padding;
  if (out.padding.enabled())
    out.policy.max_padding_waste = out.padding.max_waste;
  if (auto problem = scheduler::batching_policy::validate(out.policy))
    return fail(*problem);
  // With a latency target the scheduler chooses batch sizes and delays itself
  // (docs/latency-target.md).
  auto latency_target = scheduler::read_latency_target(cfg);
  if (!latency_target)
    return fail(latency_target.error());
  out.latency_target = *latency_target;
  if (out.latency_target)
    std::cout << "model " << name << ": latency_target_ms " << cfg.parameters.at("latency_target_ms")
              << ": the scheduler chooses batch sizes and delays to meet it and sheds what it "
                 "cannot serve in time; max_queue_delay_microseconds and preferred_batch_size "
                 "are ignored"
              << std::endl;
  return out;
}

auto model_manager::wire_pipelines(const std::string& name, const resolved_model& model,
                                   const built_model& built)
  -> std::map<int64_t, std::shared_ptr<const model_pipeline>> {
  const auto& cfg = built.config;
  std::map<int64_t, std::shared_ptr<const model_pipeline>> served;
  for (const auto& [version, g] : built.generative) {
    auto p = std::make_shared<model_pipeline>();
    p->config = g.config;
    p->version = version;
    p->stats = std::make_shared<model_stats>(cfg.name, version);
    p->metadata_json = repository::model_metadata_json(g.config, model.entry.versions);
    auto completed = *model.entry.config;
    completed.config = g.config;
    p->config_json = repository::model_config_json(completed);
    p->files = model.files;
    if (model.config_json)
      p->config_override = *model.config_json;
    auto generative = g.start(sys_);
    // Readiness: the generation actor is the model's scheduler and executor.
    p->stats->scheduler_running = true;
    p->stats->live_executors = 1;
    p->stats->healthy_executors = 1;
    generative->actor->attach_functor([stats = p->stats](const caf::error&) {
      stats->scheduler_running = false;
      stats->live_executors = 0;
      stats->healthy_executors = 0;
    });
    p->generative = std::move(generative);
    served.emplace(version, std::move(p));
  }
  if (!built.generative.empty())
    return served;
  for (auto version : model.entry.versions) {
    const auto& [version_cfg, loaded] = built.backends.at(version);
    const auto& make_instance = loaded.make_instance;
    auto p = std::make_shared<model_pipeline>();
    p->config = version_cfg;
    p->version = version;
    p->stats = std::make_shared<model_stats>(cfg.name, version);
    p->stats->gpu_memory_bytes = loaded.gpu_memory_bytes;
    p->stats->gpu_pinned_bytes = loaded.gpu_pinned_bytes;
    p->metadata_json = repository::model_metadata_json(version_cfg, model.entry.versions);
    auto completed = *model.entry.config;
    completed.config = version_cfg;
    p->config_json = repository::model_config_json(completed);
    p->files = model.files;
    if (model.config_json)
      p->config_override = *model.config_json;
    scheduler::scheduler_config sc;
    sc.model = version_cfg;
    sc.policy = built.policy;
    sc.stats = p->stats;
    sc.padding = built.padding;
    sc.executor_depth = cfg_.executor_depth;
    sc.local_batch_timeout = cfg_.executor_timeout;
    sc.latency_target = built.latency_target;
    int instances = 0;
    for (const auto& g : cfg.instance_groups)
      instances += g.kind == instance_kind::gpu ? g.count * std::max<int>(1, static_cast<int>(g.gpus.size()))
                                                : g.count;
    for (int i = 0; cfg_.local_executors && i < std::max(instances, 1); ++i) {
      auto instance = make_instance();
      // An asynchronous backend overlaps consecutive batches (copy-in of the
      // next during compute of this one): its executor gets at least its
      // pipeline depth in credits; --executor-depth can give every executor more.
      sc.executor_depth = std::max(sc.executor_depth, instance->pipeline_depth());
      sc.executors.push_back(executor::spawn_executor(sys_, std::move(instance), version_cfg));
    }
    p->executors = sc.executors;
    // Supervision: an executor that stops is replaced by a new one of the same
    // model instance (backends are shared by the factory or rebuilt by it). Not
    // for GPU instances: their factory hands out the instances built at load,
    // one per executor, so a replacement would share a live executor's device
    // state; a broken GPU instance stays out until the model is reloaded.
    if (cfg_.local_executors && !(is_onnx(cfg) && cuda::wants_gpu(cfg)))
      // Copies by init-capture: a lambda may not capture structured bindings in C++17.
      sc.respawn_executor = [sys = &sys_, make_instance = make_instance,
                             version_cfg = version_cfg] {
        return executor::spawn_executor(*sys, make_instance(), version_cfg);
      };
    else if (!cfg_.local_executors)
      sc.no_executor_reason = "this server runs no local executors (--local-executors false) "
                              "and no worker that serves the model has joined; start a "
                              "caf-serving-worker with the model, or drop --local-executors false";
    postprocess::postprocessor_config pc;
    pc.stats = p->stats;
    pc.responses.batched = cfg.max_batch_size > 0;
    pc.responses.labels = built.labels;
    pc.responses.padding = built.padding;
    sc.postprocessor = postprocess::spawn_postprocessor(sys_, pc);
    sc.respawn_postprocessor = [sys = &sys_, pc] { return postprocess::spawn_postprocessor(*sys, pc); };
    p->scheduler = scheduler::spawn_scheduler(sys_, std::move(sc));
    // Supervision of the scheduler: one that stops abnormally (a bug) takes its
    // executors and post-processor with it (they are linked) and its requests
    // are answered 500 by their sinks; the model is then loaded again.
    p->scheduler->attach_functor([hook = std::weak_ptr<restart_hook>(restart_hook_), name,
                                  version, addr = p->scheduler.address(),
                                  sys = &sys_](const caf::error& reason) {
      if (!reason || reason == caf::make_error(caf::exit_reason::normal)
          || reason == caf::make_error(caf::exit_reason::user_shutdown))
        return;
      auto h = hook.lock();
      if (!h)
        return;
      std::lock_guard<std::mutex> guard(h->mutex);
      if (h->manager)
        h->manager->scheduler_stopped(name, version, addr, sys->render(reason));
    });
    served.emplace(version, std::move(p));
  }
  return served;
}

void model_manager::scheduler_stopped(const std::string& name, int64_t version,
                                      const caf::actor_addr& addr, const std::string& why) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = models_.find(name);
    if (it == models_.end())
      return;
    auto v = it->second.served.find(version);
    if (v == it->second.served.end() || v->second->scheduler.address() != addr)
      return; // replaced or unloaded meanwhile
    v->second->stats->stage_restarts.fetch_add(1, std::memory_order_relaxed);
  }
  std::cerr << "caf-serving: model '" << name << "' version " << version
            << ": its scheduler stopped (" << why << "); loading the model again" << std::endl;
  load_async(name, [name](std::variant<std::monostate, serving_error> r) {
    if (auto* e = std::get_if<serving_error>(&r))
      std::cerr << "caf-serving: model '" << name << "' could not be loaded again: " << e->message
                << std::endl;
    else
      std::cerr << "caf-serving: model '" << name << "' was loaded again" << std::endl;
  });
}

void model_manager::retire(record& r) {
  if (cfg_.reload_grace.count() <= 0) {
    stop(r);
    return;
  }
  auto now = std::chrono::steady_clock::now();
  retiring_.erase(std::remove_if(retiring_.begin(), retiring_.end(),
                                 [&](const auto& entry) { return entry.second <= now; }),
                  retiring_.end());
  for (auto& [version, p] : r.served) {
    if (p->generative)
      caf::delayed_anon_send(p->generative->actor, cfg_.reload_grace,
                             scheduler::generation_stop_atom::value);
    else
      caf::delayed_anon_send(p->scheduler, cfg_.reload_grace, drain_atom::value);
    retiring_.emplace_back(p, now + cfg_.reload_grace);
  }
  r.served.clear();
}

void model_manager::stop(record& r) {
  for (auto& [version, p] : r.served)
    drain(*p);
  r.served.clear();
}

std::variant<std::monostate, serving_error> model_manager::unload(const std::string& name) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = models_.find(name);
  if (it == models_.end())
    return not_found("unknown model '" + name + "'; POST /v2/repository/index lists the models");
  stop(it->second);
  it->second.state = "UNAVAILABLE";
  it->second.reason = "unloaded";
  it->second.override_config.reset();
  publish_view();
  return {};
}

std::variant<std::monostate, serving_error>
model_manager::request_unload(const std::string& name, const unload_parameters& params) {
  // unload_dependents asks for the ensembles that use the model to go too;
  // the engine has none, so there is nothing more to unload.
  (void)params.unload_dependents;
  if (cfg_.control_mode != model_control_mode::explicit_control)
    return control_refused(cfg_.control_mode);
  auto r = unload(name);
  // As Triton: a model that is not loaded is already unloaded.
  if (auto* e = std::get_if<serving_error>(&r); e && e->status == status_code::not_found)
    return {};
  return r;
}

result<std::shared_ptr<const model_pipeline>> model_manager::find(const std::string& name,
                                                                  int64_t version) const {
  // Each message begins with Triton's text for the same case (its model
  // repository manager's "Request for unknown model: ..."), which Triton's
  // clients and tests match on, and goes on with this server's explanation.
  auto view = current_view();
  // Built only for an error: a found model costs no allocation here.
  auto quoted = [&name]() { return "'" + name + "'"; };
  auto it = view->find(name);
  if (it == view->end())
    return not_found("Request for unknown model: " + quoted() + " is not found; POST "
                     "/v2/repository/index lists the models this server knows");
  const auto& r = it->second;
  if (r.served.empty()) {
    std::string why = "model " + quoted() + " is not ready: "
                      + (r.reason.empty() ? std::string("not loaded") : r.reason);
    if (version != 0)
      return serving_error{status_code::unavailable,
                           "Request for unknown model: " + quoted() + " version "
                             + std::to_string(version) + " is not at ready state; " + why,
                           failure_reason::unavailable};
    return serving_error{status_code::not_found,
                         "Request for unknown model: " + quoted() + " has no available versions; "
                           + why,
                         failure_reason::unavailable};
  }
  auto chosen = version == 0 ? std::prev(r.served.end()) : r.served.find(version);
  if (chosen == r.served.end()) {
    std::string served;
    for (const auto& [v, p] : r.served)
      served += (served.empty() ? "" : ", ") + std::to_string(v);
    return not_found("Request for unknown model: " + quoted() + " version "
                     + std::to_string(version) + " is not found; versions served: " + served);
  }
  auto why = not_ready_reason(*chosen->second);
  // Without local executors a reloaded pipeline is not ready until workers have
  // loaded the model too (cluster/model_sync.hpp): the pipeline it replaced
  // answers meanwhile, within its reload grace, so that no request is refused.
  if (why && !cfg_.local_executors) {
    auto now = std::chrono::steady_clock::now();
    for (auto it = r.retiring.rbegin(); it != r.retiring.rend(); ++it)
      if (it->second > now && it->first->version == chosen->first
          && !not_ready_reason(*it->first))
        return it->first;
  }
  if (why)
    return serving_error{status_code::unavailable,
                         "Request for unknown model: " + quoted() + " version "
                           + std::to_string(chosen->first) + " is not at ready state; model "
                           + quoted() + " version " + std::to_string(chosen->first)
                           + " is not ready: " + *why,
                         failure_reason::unavailable};
  return chosen->second;
}

std::vector<std::shared_ptr<const model_pipeline>>
model_manager::versions(const std::string& name) const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<std::shared_ptr<const model_pipeline>> out;
  auto it = models_.find(name);
  if (it != models_.end())
    for (const auto& [v, p] : it->second.served)
      out.push_back(p);
  return out;
}

std::vector<index_row> model_manager::index() const {
  // Every model of the repository is listed, as Triton lists them: one never
  // loaded (explicit mode) by its name only.
  auto in_repository = repository::list_model_names(cfg_.repository);
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<index_row> rows;
  for (const auto& name : in_repository)
    if (models_.count(name) == 0)
      rows.push_back({name, "", "", ""});
  for (const auto& [name, r] : models_) {
    if (r.served.empty()) {
      rows.push_back({name, "", r.state, r.reason});
      continue;
    }
    for (const auto& [v, p] : r.served) {
      auto why = not_ready_reason(*p);
      rows.push_back({name, std::to_string(v), why ? "UNAVAILABLE" : r.state, why ? *why : ""});
    }
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const index_row& a, const index_row& b) { return a.name < b.name; });
  return rows;
}

std::vector<std::shared_ptr<model_stats>> model_manager::all_stats() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<std::shared_ptr<model_stats>> out;
  for (const auto& [name, r] : models_)
    for (const auto& [v, p] : r.served)
      out.push_back(p->stats);
  return out;
}

bool model_manager::all_ready() const {
  std::lock_guard<std::mutex> guard(mutex_);
  for (const auto& [name, r] : models_) {
    // Unloaded on purpose: not a model that should be ready (Triton's rule).
    if (r.served.empty() && r.reason == "unloaded")
      continue;
    if (r.served.empty())
      return false;
    for (const auto& [v, p] : r.served)
      if (not_ready_reason(*p))
        return false;
  }
  return true;
}

void model_manager::set_cluster_view(cluster_view view) {
  std::lock_guard<std::mutex> guard(mutex_);
  cluster_ = std::move(view);
}

std::string model_manager::cluster_json() const {
  std::function<std::string()> f;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    f = cluster_.json;
  }
  return f ? f() : std::string();
}

std::string model_manager::cluster_prometheus() const {
  std::function<std::string()> f;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    f = cluster_.prometheus;
  }
  return f ? f() : std::string();
}

void model_manager::drain(const model_pipeline& p) {
  if (p.generative)
    caf::anon_send(p.generative->actor, scheduler::generation_stop_atom::value);
  else
    caf::anon_send(p.scheduler, drain_atom::value);
}

void model_manager::shutdown() {
  std::lock_guard<std::mutex> guard(mutex_);
  for (auto& [name, r] : models_)
    stop(r);
  for (auto& [p, when] : retiring_)
    drain(*p);
  retiring_.clear();
  publish_view();
}

void model_manager::publish_view() {
  auto view = std::make_shared<find_view>();
  for (const auto& [name, r] : models_)
    (*view)[name] = find_entry{r.served, r.reason, {}};
  for (const auto& entry : retiring_) {
    auto it = view->find(entry.first->config.name);
    if (it != view->end())
      it->second.retiring.push_back(entry);
  }
  view_ = std::move(view);
  view_generation_.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<const model_manager::find_view> model_manager::current_view() const {
  // Weak: a thread's cache must not keep pipelines (and their actors' handles)
  // alive past the manager or the actor system.
  struct cached {
    uint64_t instance = 0;
    uint64_t generation = 0;
    std::weak_ptr<const find_view> view;
  };
  thread_local cached c;
  uint64_t generation = view_generation_.load(std::memory_order_acquire);
  if (c.instance == instance_id_ && c.generation == generation)
    if (auto view = c.view.lock())
      return view;
  std::lock_guard<std::mutex> guard(mutex_);
  c.instance = instance_id_;
  c.generation = view_generation_.load(std::memory_order_relaxed);
  c.view = view_;
  return view_;
}

} // namespace caf_serving::server
