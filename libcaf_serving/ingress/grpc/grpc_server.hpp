#pragma once
/// The KServe v2 gRPC ingress: Triton's inference.GRPCInferenceService
/// (schemas/grpc_service.proto) on grpc++'s completion queues, in front of
/// the same pipeline as HTTP: the model manager finds the model, admission.hpp
/// admits the request (shared memory, validation, the response cache, the
/// InferRequest) as it does HTTP's, and the answer comes back through a
/// response_sink. docs/grpc.md lists what is served.
///
/// Usage (apps/caf-serving/main.cpp):
///
///   auto grpc = ingress::grpc_server::start(cfg, models);   // throws when it cannot bind
///   std::cout << "GRPC listening on ...:" << grpc->port();
///   ...                                      // on SIGINT/SIGTERM:
///   grpc->begin_drain();                     // not ready; new calls UNAVAILABLE
///   auto report = grpc->stop(std::chrono::seconds(exit_timeout_secs));

#include "ingress/kserve_codec.hpp"
#include "ingress/response_cache.hpp"
#include "ingress/shared_memory.hpp"
#include "server/model_directory.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace caf_serving::ingress {

/// grpc's own compression of answers (Triton's
/// --grpc-infer-response-compression-level). Requests compressed by the
/// client (gzip, deflate) are always accepted.
enum class grpc_response_compression { none, low, medium, high };

struct grpc_server_config {
  /// --grpc-address.
  std::string address = "0.0.0.0";
  /// --grpc-port; 0: pick a free port (grpc_server::port() says which).
  uint16_t port = 8001;
  /// The limits HTTP applies; max_body_bytes (--max-body-bytes) bounds one
  /// gRPC message.
  request_limits limits;
  /// Readiness requires every model of the repository to be served (as HTTP).
  bool strict_readiness = true;
  /// --grpc-infer-response-compression-level.
  grpc_response_compression compression = grpc_response_compression::none;
  /// Requests one ModelStreamInfer stream may have in the pipeline at once
  /// (--grpc-stream-max-in-flight); past it the stream is not read until an
  /// answer has been written, so a fast client cannot queue without bound.
  uint32_t stream_max_in_flight = 64;
  /// Threads serving every call, each on its own completion queue
  /// (--grpc-threads, at least 1): a request is read and handed to the
  /// scheduler on one, and its answer is turned into the reply on the CAF
  /// thread that delivers it.
  uint32_t threads = 1;
  /// Calls (unary and streams) open at once on one connection
  /// (--grpc-max-concurrent-streams, grpc's GRPC_ARG_MAX_CONCURRENT_STREAMS):
  /// a client past it waits for one of its calls to end (HTTP/2 flow
  /// control), so no client holds more server memory than this many calls.
  uint32_t max_concurrent_streams = 1024;
  /// ModelInfer calls and ModelStreamInfer streams open at once in the whole
  /// server (--grpc-max-open-calls); past it a new one is answered
  /// UNAVAILABLE naming the flag, so that many connections together cannot
  /// hold memory without bound either.
  uint32_t max_open_calls = 4096;
  /// The server's response cache (--cache-config), shared with HTTP; null:
  /// none. Consulted for models with response_cache enabled, as on HTTP.
  std::shared_ptr<response_cache> cache;
  /// --allow-client-shm, --shm-region-limit: used for a registry of gRPC's
  /// own when shared_memory_regions is null.
  shared_memory_config shared_memory;
  /// The server's one registry of regions, shared with HTTP
  /// (http_server_config::shared_memory_regions), as Triton keeps one: a
  /// region registered over either protocol is used, listed and
  /// unregistered over both. Null: a registry of gRPC's own.
  std::shared_ptr<shared_memory_registry> shared_memory_regions;
};

/// How the drain after a stop signal ended.
struct grpc_stop_report {
  /// Calls still waiting for the pipeline when the deadline passed; they
  /// were cancelled.
  size_t abandoned = 0;
};

class grpc_server {
public:
  /// Binds and starts serving. Throws std::runtime_error naming the port and
  /// --grpc-port when it cannot bind, std::invalid_argument when cfg.threads
  /// is 0.
  static std::unique_ptr<grpc_server> start(const grpc_server_config& cfg,
                                            server::model_directory& models);
  ~grpc_server();
  grpc_server(const grpc_server&) = delete;
  grpc_server& operator=(const grpc_server&) = delete;

  uint16_t port() const;
  /// From now on ServerReady is false and new inference calls are answered
  /// UNAVAILABLE; calls already accepted go on.
  void begin_drain();
  /// Stops accepting calls, waits up to `deadline` for those in flight, then
  /// cancels what is left. Returns once the server has stopped.
  grpc_stop_report stop(std::chrono::milliseconds deadline);

  struct state;

private:
  explicit grpc_server(std::unique_ptr<state> s);
  /// Waits up to `deadline` for every call object to be gone, then
  /// destroys the grpc::Server; past it, leaves server and state alive (the
  /// process is exiting), so no ServerContext outlives its server.
  void release_calls(std::chrono::milliseconds deadline);
  std::unique_ptr<state> state_;
};

std::string_view to_string(grpc_response_compression level);

} // namespace caf_serving::ingress
