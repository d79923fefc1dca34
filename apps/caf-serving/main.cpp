/// caf-serving: parse options, start the actor system, load the repository,
/// serve HTTP and gRPC until a signal, then drain and stop in reverse order.

#include "cluster/node_registry.hpp"
#include "cluster/secret.hpp"
#include "core/stop_signals.hpp"
#include "onnx_cpu/cpu_level.hpp"
#include "onnx_cpu/work_pool.hpp"
#include "ingress/grpc/grpc_server.hpp"
#include "ingress/http_server.hpp"
#include "ingress/response_cache.hpp"
#include "options.hpp"
#include "server/model_manager.hpp"
#include "core/timed_sharing.hpp"
#include "server/print_plan.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <kj/exception.h>

#include <sys/prctl.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>
#include <unistd.h>
#include <iostream>

using namespace caf_serving;

int main(int argc, char** argv) {
  auto parsed = app::parse_options(argc, argv);
  if (std::holds_alternative<app::show_help>(parsed)) {
    std::cout << app::usage();
    return 0;
  }
  if (auto* err = std::get_if<std::string>(&parsed)) {
    std::cerr << "caf-serving: " << *err << "\n";
    return 2;
  }
  auto& opts = std::get<app::server_options>(parsed);
  if (opts.print_plan) {
    server::print_plan_request req;
    req.repository = opts.model_repository;
    req.model = *opts.print_plan;
    req.batch = opts.print_plan_batch;
    req.threads = opts.threads.executor_threads;
    auto text = server::describe_model_plan(req);
    if (!text) {
      std::cerr << "caf-serving: " << text.error().message << "\n";
      return 1;
    }
    std::cout << *text;
    return 0;
  }

  // Before any thread starts: SIGINT and SIGTERM wait for the stop
  // coordinator below, which then tells HTTP and gRPC to drain.
  auto stop = stop_signals::capture();
  // CAF's timers (the batching delay) fire ~100 us late with the default slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

  // A cluster (docs/cluster.md): the secret comes from a file or the environment.
  std::string cluster_secret;
  if (opts.cluster.enabled()) {
    auto secret = cluster::load_secret(opts.cluster.secret_file);
    if (!secret) {
      std::cerr << "caf-serving: " << secret.error().message << "\n";
      return 2;
    }
    cluster_secret = *secret;
  }
  auto tls = cluster::check_tls_files(opts.cluster.tls);
  if (!tls) {
    std::cerr << "caf-serving: " << tls.error().message << "\n";
    return 2;
  }

  caf::actor_system_config cfg;
  if (opts.cluster.enabled()) {
    cluster::liveness_config live;
    live.heartbeat = std::chrono::milliseconds(opts.cluster.heartbeat_ms);
    live.node_timeout = std::chrono::milliseconds(opts.cluster.node_timeout_ms);
    cluster::configure_actor_system(cfg, live);
    cluster::configure_tls(cfg, *tls);
  }
  cfg.set("scheduler.max-threads", static_cast<size_t>(opts.threads.caf_workers));
  // Work sharing whose idle workers also keep the batching timers
  // (core/timed_sharing.hpp).
  use_timed_sharing(cfg);
  caf::actor_system sys{cfg};

  // What the CPU backend runs at: oneDNN's ISA and the engine's kernels' (the
  // same ONEDNN_MAX_CPU_ISA caps both), said before any model is compiled for it.
  const auto& cpu = onnx::process_cpu_level();
  std::cout << "CPU: " << cpu.describe() << std::endl;
  opts.http.engine_cpu_json = cpu.json();
  opts.http.engine_cpu_labels = cpu.prometheus_labels();

  server::model_manager_config manager_cfg;
  manager_cfg.repository = opts.model_repository;
  manager_cfg.max_queue_size = opts.max_queue_size;
  manager_cfg.kv_cache_bytes = opts.kv_cache_bytes;
  manager_cfg.max_batch_bytes = opts.max_batch_bytes;
  manager_cfg.executor_timeout = std::chrono::milliseconds(opts.executor_timeout_ms);
  manager_cfg.executor_depth = opts.executor_depth;
  manager_cfg.executor_threads = opts.threads.executor_threads;
  // One budget of compute threads, shared by every CPU executor of every model.
  manager_cfg.compute_pool = std::make_shared<onnx::work_pool>(opts.threads.executor_threads);
  manager_cfg.local_executors = opts.cluster.local_executors;
  manager_cfg.control_mode = opts.model_control_mode;
  manager_cfg.startup_models = opts.load_models;
  manager_cfg.poll_interval = std::chrono::seconds(opts.repository_poll_secs);
  manager_cfg.strict_model_config = opts.strict_model_config;
  manager_cfg.load_files.max_total_bytes = opts.model_load_max_file_bytes;
  server::model_manager models(sys, manager_cfg);
  auto loaded = models.start();
  if (auto* err = std::get_if<serving_error>(&loaded)) {
    std::cerr << "caf-serving: " << err->message << "\n";
    return 1;
  }
  for (const auto& row : models.index()) {
    if (row.state == "READY")
      std::cout << "model " << row.name << " version " << row.version << " READY\n";
    else if (row.state.empty())
      std::cout << "model " << row.name << " not loaded (--model-control-mode explicit)\n";
    else
      std::cout << "model " << row.name << " " << row.state << ": " << row.reason << "\n";
  }

  std::optional<cluster::node_registry> registry;
  if (opts.cluster.enabled()) {
    cluster::registry_config rc;
    for (const auto& w : opts.cluster.workers) {
      auto hp = cluster::parse_host_port(w);
      if (!hp) { // parse_options has checked each one with the same parser
        std::cerr << "caf-serving: flag --worker: " << hp.error().message << "\n";
        return 2;
      }
      rc.workers.push_back(*hp);
    }
    rc.secret = cluster_secret;
    rc.server_name = "caf-serving-" + std::to_string(getpid());
    rc.credits = opts.cluster.remote_credits;
    rc.max_ship_bytes = opts.cluster.max_ship_bytes;
    // The bulk channel is plain TCP: under TLS every batch stays on the
    // encrypted CAF link.
    rc.bulk_threshold = tls->enabled() ? 0 : opts.cluster.bulk_threshold_bytes;
    if (tls->enabled() && opts.cluster.bulk_threshold_bytes > 0)
      std::cout << "bulk channel off: the cluster runs TLS, so large batches stay on the "
                   "encrypted CAF link"
                << std::endl;
    rc.remote_timeout.unmeasured = std::chrono::milliseconds(opts.cluster.remote_timeout_ms);
    rc.remote_timeout.factor = opts.cluster.remote_timeout_factor;
    rc.remote_timeout.floor = std::chrono::milliseconds(opts.cluster.remote_timeout_floor_ms);
    registry = cluster::start_registry(sys, models, std::move(rc));
    if (tls->enabled())
      std::cout << "cluster links use TLS; peers must show a certificate of " << tls->ca
                << std::endl;
    if (opts.cluster.listen_port) {
      const auto& addr = opts.cluster.listen_address;
      auto port = cluster::publish_link(sys, registry->actor, *opts.cluster.listen_port,
                                        addr.empty() ? nullptr : addr.c_str(), true);
      if (!port) {
        std::cerr << "caf-serving: cannot listen for workers on port "
                  << *opts.cluster.listen_port << ": " << sys.render(port.error()) << "\n";
        return 1;
      }
      // Each line in one write: actor and channel threads print beside this one,
      // and the tests read the ports from these lines.
      std::cout << ("cluster listening on " + (addr.empty() ? std::string("127.0.0.1") : addr)
                    + ":" + std::to_string(*port) + "\n")
                << std::flush;
    }
  }

  // One response cache for the whole server (every event loop), as Triton's.
  if (opts.cache.max_bytes > 0)
    opts.http.cache = std::make_shared<ingress::response_cache>(opts.cache);
  opts.grpc.cache = opts.http.cache;
  // One registry of shared-memory regions for HTTP and gRPC, as Triton's.
  opts.http.shared_memory_regions
    = std::make_shared<ingress::shared_memory_registry>(opts.http.shared_memory);
  opts.grpc.shared_memory_regions = opts.http.shared_memory_regions;

  // gRPC (docs/grpc.md) serves on its own threads, HTTP on its event loops
  // (docs/http-event-loops.md); both drain when the stop signal comes.
  std::unique_ptr<ingress::grpc_server> grpc;
  if (opts.grpc_enabled) {
    try {
      grpc = ingress::grpc_server::start(opts.grpc, models);
    } catch (const std::exception& e) {
      std::cerr << "caf-serving: " << e.what() << "\n";
      return 1;
    }
    auto host = opts.grpc.address == "0.0.0.0" ? std::string("127.0.0.1") : opts.grpc.address;
    std::cout << ("GRPC listening on " + host + ":" + std::to_string(grpc->port()) + "\n")
              << std::flush;
  }
  opts.http.event_loops = opts.threads.ingress_threads;
  std::unique_ptr<ingress::http_server> http;
  try {
    http = ingress::http_server::start(opts.http, models);
  } catch (const std::exception& e) {
    std::cerr << "caf-serving: " << e.what() << "\n";
    return 1;
  }
  auto ports = http->ports();
  auto host = opts.http.address == "0.0.0.0" ? std::string("127.0.0.1") : opts.http.address;
  std::cout << ("HTTP listening on " + host + ":" + std::to_string(ports.http) + "\n")
            << std::flush;
  if (ports.metrics)
    std::cout << ("metrics listening on " + host + ":" + std::to_string(ports.metrics) + "\n")
              << std::flush;

  // The stop coordinator: on SIGINT or SIGTERM both ingresses drain at once,
  // each within the exit timeout. gRPC is no longer ready and answers new
  // calls UNAVAILABLE as HTTP's loops stop accepting.
  ingress::grpc_stop_report grpc_stopped;
  std::thread coordinator([&] {
    stop.wait();
    if (grpc)
      grpc->begin_drain();
    http->stop();
    if (grpc)
      grpc_stopped = grpc->stop(std::chrono::seconds(opts.http.exit_timeout_secs));
  });
  // HTTP's loop 0 on this thread, until the coordinator stops it.
  ingress::stop_report stopped;
  std::string failure;
  try {
    stopped = http->serve();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (const kj::Exception& e) {
    failure = "the HTTP server failed: " + std::string(e.getDescription().cStr());
  }
  if (!failure.empty())
    stop.request_stop(); // loop 0 ended on its own: the coordinator has not woken
  coordinator.join();
  if (!failure.empty()) {
    std::cerr << "caf-serving: " << failure << "\n";
    return 1;
  }
  stopped.abandoned += grpc_stopped.abandoned;
  if (stopped.abandoned > 0 || !stopped.drained) {
    // Something is stuck (an executor that does not come back): waiting for
    // the actors would wait for it. Every client has had its answer.
    std::cout << "caf-serving: stopped after --exit-timeout-secs (" << opts.http.exit_timeout_secs
              << " s) with " << stopped.abandoned
              << (stopped.abandoned == 1 ? " request" : " requests")
              << " abandoned (answered 503)" << std::endl;
    std::cerr.flush();
    std::_Exit(0);
  }
  std::cout << "caf-serving: stopping" << std::endl;
  // Stopping the actors gets the same deadline: a batch still running in an
  // executor (its requests answered already, e.g. timed out) is not waited for
  // past it.
  std::thread([secs = opts.http.exit_timeout_secs] {
    std::this_thread::sleep_for(std::chrono::seconds(secs));
    std::cout << "caf-serving: actors still running after --exit-timeout-secs (" << secs
              << " s); stopped without them" << std::endl;
    std::_Exit(0);
  }).detach();
  models.shutdown();
  if (registry)
    caf::anon_send_exit(registry->actor, caf::exit_reason::user_shutdown);
  sys.await_all_actors_done();
  std::cout << "caf-serving: stopped" << std::endl;
  return 0;
}
