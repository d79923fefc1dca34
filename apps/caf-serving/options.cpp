#include "options.hpp"

#include <cerrno>
#include <cstdlib>
#include <thread>

namespace caf_serving::app {

std::string usage() {
  auto d = default_thread_config(std::thread::hardware_concurrency());
  return "caf-serving: an inference server (KServe v2 over HTTP) built on CAF actors.\n"
         "\n"
         "usage: caf-serving --model-repository DIR [options]\n"
         "\n"
         "  --model-repository DIR     Triton-layout model repository (required)\n"
         "  --http-address ADDR        address to listen on (default 0.0.0.0)\n"
         "  --http-port N              HTTP port (default 8000; 0 picks a free port)\n"
         "  --metrics-port N           Prometheus /metrics port (default 8002; 0 picks)\n"
         "  --allow-metrics BOOL       serve the metrics port (default true)\n"
         "  --strict-readiness BOOL    /v2/health/ready needs every model ready (default true)\n"
         "  --max-queue-size N         queue bound per model and priority level where\n"
         "                             config.pbtxt says 0 (default 1024); a full queue\n"
         "                             answers 503\n"
         "  --max-body-bytes N         largest request body, also after decompression\n"
         "                             (default 268435456); larger answers 413\n"
         "  --caf-workers N            CAF scheduler threads (default "
         + std::to_string(d.caf_workers) + " here)\n"
         "  --executor-threads N       compute threads per CPU executor (default "
         + std::to_string(d.executor_threads) + " here)\n"
         "  --executor-depth N         batches one executor may hold (default 1)\n"
         "  --help                     this text\n"
         "\n"
         "Signals: SIGINT or SIGTERM stop accepting, answer every accepted request, exit 0.\n";
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
  o.threads = default_thread_config(std::thread::hardware_concurrency());
  o.http.limits.max_body_bytes = size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    if (flag == "--help" || flag == "-h")
      return show_help{};
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
    } else if (flag == "--max-queue-size") {
      auto n = number(1u << 30);
      if (!n || *n == 0)
        return bad("a queue size from 1 to 2^30");
      o.max_queue_size = static_cast<uint32_t>(*n);
    } else if (flag == "--max-body-bytes") {
      auto n = number(uint64_t{1} << 32);
      if (!n || *n < 1024)
        return bad("a byte count from 1024 to 2^32");
      o.http.limits.max_body_bytes = *n;
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
    } else {
      return "unknown flag " + flag + "; see --help";
    }
  }
  if (o.model_repository.empty())
    return std::string("--model-repository DIR is required; see --help");
  return o;
}

} // namespace caf_serving::app
