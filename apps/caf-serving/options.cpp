#include "options.hpp"

#include "cluster/worker_host.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

namespace caf_serving::app {

std::string usage() {
  auto d = default_thread_config(usable_cores());
  return "caf-serving: an inference server (KServe v2 over HTTP and gRPC) built on CAF actors.\n"
         "\n"
         "usage: caf-serving --model-repository DIR [options]\n"
         "\n"
         "  --model-repository DIR     Triton-layout model repository (required)\n"
         "  --http-address ADDR        address to listen on (default 0.0.0.0)\n"
         "  --http-port N              HTTP port (default 8000; 0 picks a free port)\n"
         "  --metrics-port N           Prometheus /metrics port (default 8002; 0 picks)\n"
         "  --allow-metrics BOOL       serve the metrics port (default true)\n"
         "  --allow-grpc BOOL          serve KServe gRPC (default true; docs/grpc.md)\n"
         "  --grpc-address ADDR        gRPC address to listen on (default 0.0.0.0)\n"
         "  --grpc-port N              gRPC port (default 8001; 0 picks a free port, and\n"
         "                             so does --http-port 0 without --grpc-port)\n"
         "  --grpc-infer-response-compression-level none|low|medium|high\n"
         "                             grpc's compression of answers (default none);\n"
         "                             gzip and deflate requests are always accepted\n"
         "  --grpc-stream-max-in-flight N\n"
         "                             requests one ModelStreamInfer stream may have in\n"
         "                             the pipeline; past it the stream is read only as\n"
         "                             answers are written (default 64)\n"
         "  --grpc-threads N           threads serving every gRPC call, one completion\n"
         "                             queue each, 1 to 256 (default "
           + std::to_string(d.ingress_threads) + " here, the\n"
         "                             ingress thread count)\n"
         "  --grpc-max-concurrent-streams N\n"
         "                             gRPC calls open at once per connection; past it a\n"
         "                             client's calls wait for one to end (default 1024)\n"
         "  --grpc-max-open-calls N    gRPC inference calls and streams open at once in\n"
         "                             the server; past it UNAVAILABLE (default 4096)\n"
         "  --strict-readiness BOOL    /v2/health/ready needs every model ready (default true)\n"
         "  --max-queue-size N         queue bound per model and priority level where\n"
         "                             config.pbtxt says 0 (default 1024); a full queue\n"
         "                             answers 503\n"
         "  --kv-cache-bytes N         KV cache budget of each generative model where\n"
         "                             config.pbtxt sets no kv_cache_bytes (default: room\n"
         "                             for its max_sequences full contexts, at most a\n"
         "                             quarter of memory; printed at load)\n"
         "  --max-body-bytes N         largest request body, also after decompression\n"
         "                             (default 268435456); larger answers 400, as in\n"
         "                             Triton (also --http-max-input-size, its name)\n"
         "  --max-batch-bytes N        largest sum of input tensor bytes in one batch\n"
         "                             (default and most 536870911, a Cap'n Proto Data\n"
         "                             field); a batch closes before it would pass it,\n"
         "                             a request over it alone answers 413\n"
         "  --caf-workers N            CAF scheduler threads (default "
         + std::to_string(d.caf_workers) + " here)\n"
         "  --executor-threads N       compute threads of the process, shared by every\n"
         "                             CPU executor of every model (default "
         + std::to_string(d.executor_threads) + " here,\n"
         "                             from the cores this process may use: its CPU\n"
         "                             affinity and cgroup quota)\n"
         "  --http-threads N           HTTP event loops, one thread each; connections are\n"
         "                             spread across them (default "
         + std::to_string(d.ingress_threads) + " here: 1 below 4\n"
         "                             cores, a quarter of the cores from there, at most 8)\n"
         "  --executor-depth N         batches one executor may hold (default 1; an\n"
         "                             asynchronous backend's, at least its pipeline depth)\n"
         "  --executor-timeout-ms N    a local executor that has not answered a batch\n"
         "                             this long is taken for hung: it is replaced and\n"
         "                             the batch sent once more (default 60000; 0: never)\n"
         "  --exit-timeout-secs N      after SIGINT or SIGTERM, how long accepted requests\n"
         "                             may still take; the rest are answered 503 (default 30)\n"
         "  --cache-config local,size=N\n"
         "                             the response cache (Triton's flag): answers of models\n"
         "                             with response_cache { enable: true } are kept, up to\n"
         "                             N bytes in all, least recently used dropped first;\n"
         "                             identical requests are answered from it (default:\n"
         "                             no cache; size=0: none). --response-cache-byte-size N\n"
         "                             is the same\n"
         "\n"
         "Model control (Triton's flags):\n"
         "  --model-control-mode MODE  none: load every model at start, refuse the load and\n"
         "                             unload API (default); explicit: load only the\n"
         "                             --load-model models at start, then load and unload\n"
         "                             over the API; poll: load every model, then rescan\n"
         "                             the repository every --repository-poll-secs\n"
         "  --load-model NAME          a model explicit mode loads at start (repeatable;\n"
         "                             '*' alone: every model)\n"
         "  --repository-poll-secs N   seconds between two scans in poll mode (default 15;\n"
         "                             0: scan only at start)\n"
         "  --strict-model-config BOOL config.pbtxt must be complete; false lets the loader\n"
         "                             complete it from the model file (default false)\n"
         "  --disable-auto-complete-config  Triton's flag (no value): the same as\n"
         "                             --strict-model-config true\n"
         "  --model-load-max-file-bytes N  most bytes of model files (file: parameters)\n"
         "                             one load request may write (default 268435456);\n"
         "                             more answers 413\n"
         "\n"
         "Limits for clients (per port):\n"
         "  --max-connections N        connections served at once; one more is answered\n"
         "                             503 and closed (default 1024)\n"
         "  --max-header-bytes N       largest request line plus headers; larger is a 431\n"
         "                             and the connection is closed (default 65536, at\n"
         "                             most 131072)\n"
         "  --idle-timeout-ms N        close a keep-alive connection idle this long, or a\n"
         "                             request body that stops arriving (default 60000)\n"
         "  --header-timeout-ms N      a request's line and headers must arrive within\n"
         "                             this time; else the connection is closed (default\n"
         "                             10000)\n"
         "\n"
         "Shared memory (Triton's system shared-memory extension):\n"
         "  --allow-client-shm BOOL    let clients register and unregister shared-memory\n"
         "                             regions (default false, as in Triton: a client that\n"
         "                             reaches the port could map any object the server's\n"
         "                             user can open)\n"
         "  --shm-region-limit N       regions registered at once; one more is a 400\n"
         "                             (default 64)\n"
         "\n"
         "Access control (Triton's flag):\n"
         "  --http-restricted-api APIS:KEY=VALUE\n"
         "                             the endpoints of APIS (comma-separated: health,\n"
         "                             metadata, inference, shared-memory, model-config,\n"
         "                             model-repository, statistics, trace, logging)\n"
         "                             answer 403 unless the request has header KEY:\n"
         "                             VALUE (repeatable; each API in one flag at most)\n"
         "\n"
         "Cluster (docs/cluster.md):\n"
         "  --worker HOST:PORT         use the caf-serving-worker there (repeatable)\n"
         "  --cluster-port N           listen for workers that --join (0 picks a port)\n"
         "  --cluster-address ADDR     address of that listener (default: all)\n"
         "  --cluster-secret-file F    the cluster's shared secret (else the environment\n"
         "                             variable CAF_SERVING_CLUSTER_SECRET)\n"
         "  --local-executors BOOL     also run executors here (default true)\n"
         "  --remote-credits N         batches one remote executor may hold (default 2)\n"
         "  --remote-timeout-factor X  a remote batch unanswered X times its predicted\n"
         "                             completion (cost model) is re-run elsewhere, and its\n"
         "                             late answer dropped (default 4)\n"
         "  --remote-timeout-floor-ms N  ... but never sooner than N ms (default 500)\n"
         "  --remote-timeout-ms N      that timeout before the worker's executor has been\n"
         "                             measured (default 10000)\n"
         "  --heartbeat-ms N           middleman heartbeat interval (default 200)\n"
         "  --node-timeout-ms N        a silent node is lost after this (default 1000)\n"
         "  --max-ship-bytes N         largest model shipped to a worker that lacks it\n"
         "                             (default 1073741824)\n"
         "  --bulk-threshold-bytes N   batches of at least N bytes go to a worker over its\n"
         "                             bulk channel, a TCP connection beside CAF's, and\n"
         "                             their results come back that way (default 1048576;\n"
         "                             0: off; always off under TLS)\n"
         + std::string(cluster::tls_usage_text) +
         "  --print-plan MODEL         print MODEL's optimized ONNX plan (each step's\n"
         "                             kernel, layouts, thread split, shapes) and exit\n"
         "  --print-plan-batch N       rows of that plan (default 1)\n"
         "  --help                     this text\n"
         "\n"
         "Signals: SIGINT or SIGTERM stop accepting, answer every accepted request (503\n"
         "after --exit-timeout-secs), exit 0.\n";
}

namespace {

std::optional<uint64_t> parse_uint(const std::string& s, uint64_t max) {
  if (s.empty() || s[0] == '-')
    return std::nullopt;
  errno = 0;
  char* end = nullptr;
  auto v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v > max)
    return std::nullopt;
  return v;
}

/// Largest --cache-config size: far above any machine's memory, low enough
/// that byte counts never overflow.
constexpr uint64_t max_cache_bytes = uint64_t{1} << 50;

/// Triton's --cache-config value, "<cache>,<key>=<value>": only the local
/// cache, whose one key is size (bytes).
std::optional<std::string> parse_cache_config(const std::string& value,
                                              ingress::response_cache_config& cfg) {
  auto comma = value.find(',');
  std::string cache = value.substr(0, comma);
  if (cache != "local")
    return "flag --cache-config: cache '" + cache + "' is not supported; caf-serving has "
           "only Triton's local cache: --cache-config local,size=BYTES";
  std::string setting = comma == std::string::npos ? "" : value.substr(comma + 1);
  auto eq = setting.find('=');
  if (setting.empty() || eq == std::string::npos)
    return std::string("flag --cache-config: '") + value + "' gives no setting; write "
           "--cache-config local,size=BYTES";
  auto key = setting.substr(0, eq);
  if (key != "size")
    return "flag --cache-config: the local cache has no setting '" + key
           + "'; its one setting is size=BYTES";
  auto n = parse_uint(setting.substr(eq + 1), max_cache_bytes);
  if (!n)
    return "flag --cache-config: size '" + setting.substr(eq + 1)
           + "' is not a byte count from 0 (no cache) to 2^50";
  cfg.max_bytes = *n;
  return std::nullopt;
}

std::optional<bool> parse_bool(const std::string& s) {
  if (s == "true" || s == "1")
    return true;
  if (s == "false" || s == "0")
    return false;
  return std::nullopt;
}

} // namespace

std::variant<server_options, show_help, std::string> parse_options(int argc, char** argv) {
  server_options o;
  bool grpc_port_given = false;
  bool grpc_threads_given = false;
  o.threads = default_thread_config(usable_cores());
  o.http.limits.max_body_bytes = size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    if (flag == "--help" || flag == "-h")
      return show_help{};
    // Triton's one flag without a value.
    if (flag == "--disable-auto-complete-config") {
      o.strict_model_config = true;
      continue;
    }
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return "flag " + flag + " needs a value; see --help";
    }
    auto number = [&](uint64_t max) -> std::optional<uint64_t> { return parse_uint(value, max); };
    auto bad = [&](const char* what) {
      return "flag " + flag + ": '" + value + "' is not " + what;
    };
    if (flag == "--model-repository") {
      o.model_repository = value;
    } else if (flag == "--http-address") {
      o.http.address = value;
    } else if (flag == "--http-port" || flag == "--metrics-port") {
      auto n = number(65535);
      if (!n)
        return bad("a port number (0-65535)");
      (flag == "--http-port" ? o.http.http_port : o.http.metrics_port) = static_cast<uint16_t>(*n);
    } else if (flag == "--allow-metrics" || flag == "--strict-readiness") {
      auto b = parse_bool(value);
      if (!b)
        return bad("true or false");
      (flag == "--allow-metrics" ? o.http.metrics_enabled : o.http.strict_readiness) = *b;
    } else if (flag == "--allow-grpc") {
      auto b = parse_bool(value);
      if (!b)
        return bad("true or false");
      o.grpc_enabled = *b;
    } else if (flag == "--grpc-address") {
      o.grpc.address = value;
    } else if (flag == "--grpc-port") {
      auto n = number(65535);
      if (!n)
        return bad("a port number (0-65535)");
      o.grpc.port = static_cast<uint16_t>(*n);
      grpc_port_given = true;
    } else if (flag == "--grpc-infer-response-compression-level") {
      if (value == "none")
        o.grpc.compression = ingress::grpc_response_compression::none;
      else if (value == "low")
        o.grpc.compression = ingress::grpc_response_compression::low;
      else if (value == "medium")
        o.grpc.compression = ingress::grpc_response_compression::medium;
      else if (value == "high")
        o.grpc.compression = ingress::grpc_response_compression::high;
      else
        return bad("none, low, medium or high");
    } else if (flag == "--grpc-stream-max-in-flight") {
      auto n = number(1u << 20);
      if (!n || *n == 0)
        return bad("a request count from 1 to 2^20");
      o.grpc.stream_max_in_flight = static_cast<uint32_t>(*n);
    } else if (flag == "--grpc-threads") {
      auto n = number(256);
      if (n && *n == 0)
        return std::string("flag --grpc-threads: 0 (grpc's callback API) is no longer served; "
                           "give 1 to 256 completion-queue threads (bench/RESULTS.md has what "
                           "the callback API measured)");
      if (!n)
        return bad("a thread count from 1 to 256");
      o.grpc.threads = static_cast<uint32_t>(*n);
      grpc_threads_given = true;
    } else if (flag == "--grpc-max-concurrent-streams") {
      auto n = number(1u << 20);
      if (!n || *n == 0)
        return bad("a call count from 1 to 2^20");
      o.grpc.max_concurrent_streams = static_cast<uint32_t>(*n);
    } else if (flag == "--grpc-max-open-calls") {
      auto n = number(1u << 24);
      if (!n || *n == 0)
        return bad("a call count from 1 to 2^24");
      o.grpc.max_open_calls = static_cast<uint32_t>(*n);
    } else if (flag == "--allow-client-shm") {
      auto b = parse_bool(value);
      if (!b)
        return bad("true or false");
      o.http.shared_memory.allow_client_shm = *b;
    } else if (flag == "--shm-region-limit") {
      auto n = number(1u << 20);
      if (!n || *n == 0)
        return bad("a region count from 1 to 2^20");
      o.http.shared_memory.max_regions = static_cast<size_t>(*n);
    } else if (flag == "--max-queue-size") {
      auto n = number(1u << 30);
      if (!n || *n == 0)
        return bad("a queue size from 1 to 2^30");
      o.max_queue_size = static_cast<uint32_t>(*n);
    } else if (flag == "--kv-cache-bytes") {
      auto n = number(uint64_t{1} << 50);
      if (!n || *n < 4096)
        return bad("a byte count from 4096 to 2^50");
      o.kv_cache_bytes = *n;
    } else if (flag == "--max-body-bytes" || flag == "--http-max-input-size") {
      // --http-max-input-size: Triton's name for the same limit.
      auto n = number(uint64_t{1} << 32);
      if (!n || *n < 1024)
        return bad("a byte count from 1024 to 2^32");
      o.http.limits.max_body_bytes = *n;
    } else if (flag == "--executor-timeout-ms") {
      auto n = number(86'400'000);
      if (!n)
        return bad("milliseconds from 0 (never) to 86400000");
      o.executor_timeout_ms = static_cast<uint32_t>(*n);
    } else if (flag == "--max-batch-bytes") {
      auto n = number(max_data_field_bytes);
      if (!n || *n < 1024)
        return bad("a byte count from 1024 to 536870911 (a Cap'n Proto Data field)");
      o.max_batch_bytes = *n;
    } else if (flag == "--http-threads") {
      auto n = number(256);
      if (!n || *n == 0)
        return bad("a count of HTTP event loops from 1 to 256");
      o.threads.ingress_threads = static_cast<unsigned>(*n);
    } else if (flag == "--caf-workers" || flag == "--executor-threads"
               || flag == "--executor-depth") {
      auto n = number(1024);
      if (!n || *n == 0)
        return bad("a count from 1 to 1024");
      if (flag == "--caf-workers")
        o.threads.caf_workers = static_cast<unsigned>(*n);
      else if (flag == "--executor-threads")
        o.threads.executor_threads = static_cast<unsigned>(*n);
      else
        o.executor_depth = static_cast<uint32_t>(*n);
    } else if (flag == "--cache-config") {
      if (auto problem = parse_cache_config(value, o.cache))
        return *problem;
    } else if (flag == "--response-cache-byte-size") {
      auto n = number(max_cache_bytes);
      if (!n)
        return bad("a byte count from 0 (no cache) to 2^50");
      o.cache.max_bytes = *n;
    } else if (flag == "--worker") {
      // The same parser main() uses to connect, so that what passes here connects.
      if (auto hp = cluster::parse_host_port(value); !hp)
        return "flag --worker: " + hp.error().message;
      o.cluster.workers.push_back(value);
    } else if (flag == "--exit-timeout-secs") {
      auto n = number(86400);
      if (!n)
        return bad("a number of seconds from 0 to 86400");
      o.http.exit_timeout_secs = static_cast<uint32_t>(*n);
    } else if (flag == "--max-connections") {
      auto n = number(1'000'000);
      if (!n || *n == 0)
        return bad("a connection count from 1 to 1000000");
      o.http.max_connections = static_cast<uint32_t>(*n);
    } else if (flag == "--max-header-bytes") {
      // kj's HTTP parser buffers at most 128 KiB of headers.
      auto n = number(131072);
      if (!n || *n < 1024)
        return bad("a byte count from 1024 to 131072");
      o.http.max_header_bytes = *n;
    } else if (flag == "--idle-timeout-ms" || flag == "--header-timeout-ms") {
      auto n = number(86'400'000);
      if (!n || *n == 0)
        return bad("a number of milliseconds from 1 to 86400000");
      (flag == "--idle-timeout-ms" ? o.http.idle_timeout_ms : o.http.header_timeout_ms)
        = static_cast<uint32_t>(*n);
    } else if (cluster::parse_tls_flag(flag, value, o.cluster.tls)) {
      // --tls-certificate, --tls-key, --tls-ca, --tls-passphrase-file
    } else if (flag == "--cluster-port") {
      auto n = number(65535);
      if (!n)
        return bad("a port number (0-65535)");
      o.cluster.listen_port = static_cast<uint16_t>(*n);
    } else if (flag == "--cluster-address") {
      o.cluster.listen_address = value == "0.0.0.0" ? std::string() : value;
    } else if (flag == "--cluster-secret-file") {
      o.cluster.secret_file = value;
    } else if (flag == "--cluster-secret") {
      return std::string("--cluster-secret is not accepted: a secret on the command line is "
                         "visible to every user (ps); use --cluster-secret-file FILE or "
                         "CAF_SERVING_CLUSTER_SECRET");
    } else if (flag == "--local-executors") {
      auto b = parse_bool(value);
      if (!b)
        return bad("true or false");
      o.cluster.local_executors = *b;
    } else if (flag == "--remote-timeout-factor") {
      char* end = nullptr;
      double x = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(x >= 1.0 && x <= 1000.0))
        return bad("a factor from 1 to 1000 (how many times its predicted time a remote "
                   "batch may take)");
      o.cluster.remote_timeout_factor = x;
    } else if (flag == "--remote-credits" || flag == "--remote-timeout-ms"
               || flag == "--remote-timeout-floor-ms"
               || flag == "--heartbeat-ms" || flag == "--node-timeout-ms") {
      auto n = number(3'600'000);
      if (!n || *n == 0)
        return bad("a number from 1 to 3600000");
      auto v = static_cast<uint32_t>(*n);
      if (flag == "--remote-credits")
        o.cluster.remote_credits = v;
      else if (flag == "--remote-timeout-ms")
        o.cluster.remote_timeout_ms = v;
      else if (flag == "--remote-timeout-floor-ms")
        o.cluster.remote_timeout_floor_ms = v;
      else if (flag == "--heartbeat-ms")
        o.cluster.heartbeat_ms = v;
      else
        o.cluster.node_timeout_ms = v;
    } else if (flag == "--max-ship-bytes") {
      char* end = nullptr;
      auto v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v == 0)
        return bad("a positive number of bytes");
      o.cluster.max_ship_bytes = v;
    } else if (flag == "--bulk-threshold-bytes") {
      char* end = nullptr;
      auto v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || value[0] == '-')
        return bad("a number of bytes (0 turns the bulk channel off)");
      o.cluster.bulk_threshold_bytes = v;
    } else if (flag == "--http-restricted-api") {
      // Triton's flag, repeatable: API[,API...]:KEY=VALUE.
      if (auto err = o.http.restricted.add(value))
        return *err;
    } else if (flag == "--model-control-mode") {
      auto mode = server::parse_model_control_mode(value);
      if (!mode)
        return bad("a model control mode (none, explicit or poll)");
      o.model_control_mode = *mode;
    } else if (flag == "--load-model") {
      if (value.empty() || (value != "*" && (value.find('/') != std::string::npos || value[0] == '.')))
        return bad("a model name (a directory in --model-repository) or '*'");
      o.load_models.push_back(value);
    } else if (flag == "--repository-poll-secs") {
      auto n = number(86400);
      if (!n)
        return bad("a number of seconds from 0 (scan only at start) to 86400");
      o.repository_poll_secs = static_cast<uint32_t>(*n);
    } else if (flag == "--strict-model-config") {
      auto b = parse_bool(value);
      if (!b)
        return bad("true or false");
      o.strict_model_config = *b;
    } else if (flag == "--model-load-max-file-bytes") {
      auto n = number(uint64_t{1} << 40);
      if (!n)
        return bad("a byte count from 0 to 2^40");
      o.model_load_max_file_bytes = *n;
    } else if (flag == "--print-plan") {
      if (value.empty() || value.find('/') != std::string::npos)
        return bad("a model name (a directory in --model-repository)");
      o.print_plan = value;
    } else if (flag == "--print-plan-batch") {
      auto n = number(1u << 20);
      if (!n || *n == 0)
        return bad("a batch size from 1 to 2^20");
      o.print_plan_batch = static_cast<int64_t>(*n);
    } else {
      return "unknown flag " + flag + "; see --help";
    }
  }
  if (o.model_repository.empty())
    return std::string("--model-repository DIR is required; see --help");
  // gRPC takes HTTP's limits, readiness and shared-memory settings. A server
  // told to pick its HTTP port picks its gRPC port too, so that servers
  // started side by side (tests, benchmarks) do not collide on 8001.
  o.grpc.limits = o.http.limits;
  o.grpc.strict_readiness = o.http.strict_readiness;
  o.grpc.shared_memory = o.http.shared_memory;
  if (!grpc_threads_given)
    o.grpc.threads = o.threads.ingress_threads;
  if (o.http.http_port == 0 && !grpc_port_given)
    o.grpc.port = 0;
  // Triton's checks and wording.
  if (!o.load_models.empty() && o.model_control_mode != server::model_control_mode::explicit_control)
    return std::string("Error: Use of '--load-model' requires setting "
                       "'--model-control-mode=explicit' as well.");
  if (o.load_models.size() > 1
      && std::find(o.load_models.begin(), o.load_models.end(), "*") != o.load_models.end())
    return std::string("Wildcard model name '*' must be the ONLY startup model if specified at "
                       "all; give --load-model '*' alone, or name each model");
  if (!o.cluster.local_executors && !o.cluster.enabled())
    return std::string("--local-executors false needs workers: give --worker HOST:PORT or "
                       "--cluster-port N");
  if (o.cluster.tls.enabled() && !o.cluster.enabled())
    return std::string("--tls-certificate/--tls-key/--tls-ca secure cluster links: give them "
                       "with --worker HOST:PORT or --cluster-port N");
  if (o.cluster.enabled() && o.cluster.node_timeout_ms <= o.cluster.heartbeat_ms)
    return std::string("--node-timeout-ms must be longer than --heartbeat-ms, or every node "
                       "looks lost between two heartbeats");
  return o;
}

} // namespace caf_serving::app
