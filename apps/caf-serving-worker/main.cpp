/// caf-serving-worker: loads models with the server's model manager (every
/// backend: builtin, ONNX on the CPU, CUDA where built) and publishes their
/// executors through CAF's middleman, for caf-serving servers that know the
/// cluster's secret (docs/cluster.md). The models come from its own repository,
/// or are shipped by the server into a cache directory.
///
///   CAF_SERVING_CLUSTER_SECRET=... caf-serving-worker --model-repository DIR --port 9100
///   caf-serving-worker --port 0 --join SERVER:9200 --model-cache-dir /var/cache/cs \
///                      --cluster-secret-file /etc/caf-serving/secret

#include "cluster/secret.hpp"
#include "cluster/tls.hpp"
#include "cluster/worker_host.hpp"
#include "core/thread_config.hpp"
#include "onnx_cpu/work_pool.hpp"
#include "server/model_manager.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>

#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <unistd.h>

using namespace caf_serving;

namespace {

struct worker_options {
  std::string repository;
  std::string cache_dir;
  std::vector<std::string> models;
  uint64_t max_model_bytes = 1ull << 30;
  unsigned executor_threads = 0;
  std::string address = "0.0.0.0";
  uint16_t port = 9100;
  uint16_t bulk_port = 0;
  std::optional<std::string> join;
  std::optional<std::string> secret_file;
  std::string name;
  uint32_t heartbeat_ms = 200;
  uint32_t node_timeout_ms = 1000;
  unsigned caf_workers = 0;
  cluster::tls_config tls;
};

const char* usage_text =
  "caf-serving-worker: executors for caf-serving servers (docs/cluster.md).\n"
  "\n"
  "usage: caf-serving-worker [--model-repository DIR | --model-cache-dir DIR] [options]\n"
  "\n"
  "  --model-repository DIR     the same repository layout as the server's; each model\n"
  "                             is served only where its hash equals the server's\n"
  "  --model-cache-dir DIR      where the models the server ships are written: every\n"
  "                             model without --model-repository, else those missing\n"
  "                             there (default: TMPDIR/caf-serving-worker-NAME)\n"
  "  --max-model-bytes N        largest shipped model accepted (default 1073741824)\n"
  "  --models A,B               serve only these models (default: all)\n"
  "  --executor-threads N       compute threads shared by every CPU executor (default:\n"
  "                             from the cores this process may use, as the server)\n"
  "  --address ADDR             address to publish on (default 0.0.0.0)\n"
  "  --port N                   port to publish on (default 9100; 0 picks one)\n"
  "  --bulk-port N              port of the bulk channel, on the same address, that\n"
  "                             servers send large batches over (default 0: any free\n"
  "                             port, announced to each server; not opened under TLS)\n"
  "  --join HOST:PORT           join the server listening there (--cluster-port)\n"
  "  --name NAME                this worker's name in /v2 and /metrics (default host:port)\n"
  "  --cluster-secret-file F    the cluster's shared secret (else the environment\n"
  "                             variable CAF_SERVING_CLUSTER_SECRET)\n"
  "  --heartbeat-ms N           middleman heartbeat interval (default 200)\n"
  "  --node-timeout-ms N        a silent server is dropped after this (default 1000)\n"
  "  --caf-workers N            CAF scheduler threads (default: sized from the cores\n"
  "                             this process may use, its affinity and CPU quota)\n"
  "%s"
  "  --help                     this text\n";

std::variant<worker_options, std::string, bool> parse(int argc, char** argv) {
  worker_options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h")
      return true;
    std::string value;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return "flag " + flag + " needs a value; see --help";
    }
    auto number = [&](unsigned long max) -> std::optional<unsigned long> {
      char* end = nullptr;
      auto v = std::strtoul(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v > max)
        return std::nullopt;
      return v;
    };
    if (cluster::parse_tls_flag(flag, value, o.tls)) {
      // --tls-certificate, --tls-key, --tls-ca, --tls-passphrase-file
    } else if (flag == "--model-repository") {
      o.repository = value;
    } else if (flag == "--model-cache-dir") {
      o.cache_dir = value;
    } else if (flag == "--models") {
      o.models.clear();
      for (size_t start = 0; start <= value.size();) {
        auto comma = value.find(',', start);
        auto part = value.substr(start, comma == std::string::npos ? std::string::npos
                                                                   : comma - start);
        if (part.empty())
          return "flag --models: '" + value + "' has an empty name; give names as A,B";
        o.models.push_back(part);
        if (comma == std::string::npos)
          break;
        start = comma + 1;
      }
    } else if (flag == "--max-model-bytes") {
      char* end = nullptr;
      auto v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v == 0)
        return "flag --max-model-bytes: '" + value + "' is not a positive number of bytes";
      o.max_model_bytes = v;
    } else if (flag == "--executor-threads") {
      auto n = number(1024);
      if (!n || *n == 0)
        return "flag --executor-threads: '" + value + "' is not a number from 1 to 1024";
      o.executor_threads = static_cast<unsigned>(*n);
    } else if (flag == "--address") {
      o.address = value;
    } else if (flag == "--port") {
      auto n = number(65535);
      if (!n)
        return "flag --port: '" + value + "' is not a port number (0-65535)";
      o.port = static_cast<uint16_t>(*n);
    } else if (flag == "--bulk-port") {
      auto n = number(65535);
      if (!n)
        return "flag --bulk-port: '" + value + "' is not a port number (0-65535)";
      o.bulk_port = static_cast<uint16_t>(*n);
    } else if (flag == "--join") {
      if (auto hp = cluster::parse_host_port(value); !hp)
        return "flag --join: " + hp.error().message;
      o.join = value;
    } else if (flag == "--name") {
      o.name = value;
    } else if (flag == "--cluster-secret-file") {
      o.secret_file = value;
    } else if (flag == "--cluster-secret") {
      return std::string("--cluster-secret is not accepted: a secret on the command line is "
                         "visible to every user (ps); use --cluster-secret-file FILE or "
                         "CAF_SERVING_CLUSTER_SECRET");
    } else if (flag == "--heartbeat-ms" || flag == "--node-timeout-ms"
               || flag == "--caf-workers") {
      auto n = number(3'600'000);
      if (!n || *n == 0)
        return "flag " + flag + ": '" + value + "' is not a number from 1 to 3600000";
      (flag == "--heartbeat-ms"      ? o.heartbeat_ms
       : flag == "--node-timeout-ms" ? o.node_timeout_ms
                                     : o.caf_workers) = static_cast<unsigned>(*n);
    } else {
      return "unknown flag " + flag + "; see --help";
    }
  }
  if (o.node_timeout_ms <= o.heartbeat_ms)
    return std::string("--node-timeout-ms must be longer than --heartbeat-ms");
  return o;
}

} // namespace

int main(int argc, char** argv) {
  auto parsed = parse(argc, argv);
  if (std::holds_alternative<bool>(parsed)) {
    std::printf(usage_text, cluster::tls_usage_text);
    return 0;
  }
  if (auto* err = std::get_if<std::string>(&parsed)) {
    std::cerr << "caf-serving-worker: " << *err << "\n";
    return 2;
  }
  auto& opts = std::get<worker_options>(parsed);
  auto secret = cluster::load_secret(opts.secret_file);
  if (!secret) {
    std::cerr << "caf-serving-worker: " << secret.error().message << "\n";
    return 2;
  }
  auto tls = cluster::check_tls_files(opts.tls);
  if (!tls) {
    std::cerr << "caf-serving-worker: " << tls.error().message << "\n";
    return 2;
  }

  // Wait for SIGINT/SIGTERM on this thread; block them before CAF starts threads.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

  caf::actor_system_config cfg;
  cluster::liveness_config live;
  live.heartbeat = std::chrono::milliseconds(opts.heartbeat_ms);
  live.node_timeout = std::chrono::milliseconds(opts.node_timeout_ms);
  cluster::configure_actor_system(cfg, live);
  cluster::configure_tls(cfg, *tls);
  // Sized as the server sizes itself, from the cores this process may use
  // (affinity mask, cgroup quota). A worker has no HTTP loop, and its builtin
  // executors compute on CAF's workers, so CAF gets the compute budget too.
  auto threads = worker_thread_config(usable_cores());
  if (opts.executor_threads)
    threads.executor_threads = opts.executor_threads;
  cfg.set("scheduler.max-threads",
          static_cast<size_t>(opts.caf_workers ? opts.caf_workers
                                                : threads.caf_workers + threads.executor_threads));
  caf::actor_system sys{cfg};

  cluster::worker_config wc;
  wc.repository = opts.repository;
  wc.secret = *secret;
  if (opts.join)
    wc.join_to = *cluster::parse_host_port(*opts.join);
  wc.name = opts.name;
  if (wc.name.empty()) {
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    wc.name = std::string(hostname) + "-" + std::to_string(getpid());
  }
  wc.placement = opts.models;
  wc.max_model_bytes = opts.max_model_bytes;
  wc.cache_dir = opts.cache_dir;
  if (wc.cache_dir.empty())
    wc.cache_dir = std::filesystem::temp_directory_path() / ("caf-serving-worker-" + wc.name);
  // Loaded as the server loads: one budget of compute threads for every CPU
  // executor of every model. The worker's model managers, loading and
  // unloading on its servers' word (explicit control).
  server::model_manager_config mc;
  mc.executor_threads = threads.executor_threads;
  mc.compute_pool = std::make_shared<onnx::work_pool>(threads.executor_threads);
  mc.control_mode = server::model_control_mode::explicit_control;
  mc.local_executors = true;
  std::vector<std::shared_ptr<server::model_manager>> managers;
  wc.make_models = [&](const std::filesystem::path& repository,
                       const std::vector<std::string>& startup)
    -> result<std::shared_ptr<server::model_directory>> {
    auto cfg = mc;
    cfg.repository = repository;
    cfg.startup_models = startup;
    auto manager = std::make_shared<server::model_manager>(sys, cfg);
    if (auto r = manager->start(); std::holds_alternative<serving_error>(r))
      return std::get<serving_error>(r);
    managers.push_back(manager);
    return std::shared_ptr<server::model_directory>(manager);
  };
  // The bulk channel (docs/cluster.md): plain TCP, so not under TLS.
  if (!tls->enabled()) {
    auto bulk = cluster::bulk_listener::listen(sys, opts.address, opts.bulk_port, {});
    if (!bulk) {
      std::cerr << "caf-serving-worker: " << bulk.error().message << "\n";
      return 1;
    }
    wc.bulk = *bulk;
    if (opts.address != "0.0.0.0")
      wc.bulk_host = opts.address;
  }
  auto host = cluster::start_worker(sys, wc);
  if (!host) {
    std::cerr << "caf-serving-worker: " << host.error().message << "\n";
    return 1;
  }
  if (wc.repository.empty())
    std::cout << "no --model-repository: serving the models servers ship, written into "
              << wc.cache_dir.string() << std::endl;
  for (const auto& m : host->loaded)
    std::cout << "model " << m << " READY" << std::endl;
  for (const auto& m : host->failed)
    std::cout << "model " << m << std::endl;
  auto bind = opts.address == "0.0.0.0" ? nullptr : opts.address.c_str();
  auto port = cluster::publish_link(sys, host->actor, opts.port, bind, true);
  if (!port) {
    std::cerr << "caf-serving-worker: cannot publish on " << opts.address << ":" << opts.port
              << ": " << sys.render(port.error()) << "\n";
    return 1;
  }
  auto shown = opts.address == "0.0.0.0" ? std::string("127.0.0.1") : opts.address;
  if (tls->enabled())
    std::cout << "cluster links use TLS; peers must show a certificate of " << tls->ca
              << std::endl;
  // Each line in one write (tests read the ports from them; other threads print).
  std::cout << ("worker " + wc.name + " listening on " + shown + ":" + std::to_string(*port)
                + "\n")
            << std::flush;
  if (wc.bulk)
    std::cout << ("bulk channel on " + shown + ":" + std::to_string(wc.bulk->port()) + "\n")
              << std::flush;
  else
    std::cout << "bulk channel off: the cluster runs TLS, so large batches stay on the "
                 "encrypted CAF link"
              << std::endl;

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "caf-serving-worker: stopping" << std::endl;
  sys.middleman().unpublish(host->actor, *port);
  caf::anon_send_exit(host->actor, caf::exit_reason::user_shutdown);
  for (auto& manager : managers)
    manager->shutdown();
  wc.bulk.reset();
  return 0;
}
