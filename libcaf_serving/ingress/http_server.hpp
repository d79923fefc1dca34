#pragma once
/// The KServe v2 HTTP/REST ingress: kj-http servers on event loops
/// (docs/http-event-loops.md) that admit inference requests
/// (admission.hpp), hand them to the model's scheduler, and write the
/// responses the post-processor hands back.
///
/// Endpoints (Triton's): /v2, /v2/health/{live,ready}, /v2/models/{m}[/versions/{v}]
/// with /ready, /config, /stats and /infer, /v2/models/stats,
/// /v2/repository/index, /v2/repository/models/{m}/{load,unload},
/// /v2/systemsharedmemory/... and /v2/cudasharedmemory/... (shm_api.hpp), and
/// /metrics (also on the metrics port).
///
/// Where each part is: http_service (routing, health, metadata, statistics,
/// /metrics), http_control (repository, shared memory), http_infer
/// (inference, the response cache), http_response (writing answers),
/// http_body (reading bodies), http_event_loop (the loops and their threads).
///
/// Usage (apps/caf-serving/main.cpp):
///
///   auto http = ingress::http_server::start(cfg, models);  // throws when it cannot bind
///   std::cout << "HTTP listening on ...:" << http->ports().http;
///   ...                                    // on SIGINT/SIGTERM, from another thread:
///   http->stop();
///   ...
///   auto report = http->serve();           // loop 0 here until stop(); then drained,
///                                          // or 503s at the timeout

#include "ingress/kserve_codec.hpp"
#include "ingress/shared_memory.hpp"
#include "ingress/restricted_api.hpp"
#include "server/model_directory.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace caf_serving::ingress {

class response_cache;

struct http_server_config {
  std::string address = "0.0.0.0";
  /// 0: pick a free port (http_server::ports() says which).
  uint16_t http_port = 8000;
  /// Event loops serving the HTTP port, one thread each (--http-threads, from
  /// thread_config::ingress_threads). Connections are spread across them; a
  /// connection's requests and answers stay on the loop that accepted it.
  /// Loop 0 accepts them, and also serves the metrics port; it runs on the
  /// thread that calls http_server::serve(), the others on threads of their
  /// own.
  unsigned event_loops = 1;
  /// Prometheus metrics only; 0: pick a free port; -1 (disabled) via metrics_enabled.
  uint16_t metrics_port = 8002;
  bool metrics_enabled = true;
  /// Readiness requires every model of the repository to be served (Triton's
  /// --strict-readiness, on by default there too).
  bool strict_readiness = true;
  request_limits limits;
  /// --http-restricted-api: endpoint groups that need a header (403 without).
  restricted_apis restricted;

  // -- Limits for clients (each a flag of caf-serving; see README) ------------

  /// Connections served at once, per port (--max-connections); the next one
  /// is answered 503 and closed.
  uint32_t max_connections = 1024;
  /// Largest request line plus headers (--max-header-bytes); larger is a 431
  /// and the connection is closed. kj buffers at most 128 KiB of headers, so
  /// past that a connection is closed without an answer whatever this says.
  size_t max_header_bytes = 64 * 1024;
  /// A keep-alive connection idle this long between requests is closed, and so
  /// is one whose request body stops arriving for this long (--idle-timeout-ms).
  uint32_t idle_timeout_ms = 60000;
  /// A request's line and headers must arrive within this many milliseconds of
  /// the connection opening or of their first byte (--header-timeout-ms).
  uint32_t header_timeout_ms = 10000;
  /// After SIGINT or SIGTERM, how long accepted requests may still take; the
  /// ones left then are answered 503 (--exit-timeout-secs, Triton's flag).
  uint32_t exit_timeout_secs = 30;
  /// Client shared-memory regions (--allow-client-shm, --shm-region-limit).
  shared_memory_config shared_memory;
  /// The server's one registry of regions, shared with gRPC; null: one of
  /// HTTP's own (from shared_memory).
  std::shared_ptr<shared_memory_registry> shared_memory_regions;
  /// The server's response cache (--cache-config local,size=N), one for all
  /// event loops; used for models with response_cache { enable: true }.
  /// Null: no cache.
  std::shared_ptr<response_cache> cache;
  /// What the engine's CPU backend runs at (onnx_cpu/cpu_level.hpp): a JSON
  /// object shown as "cpu" under GET /v2's "engine", and the same as the
  /// labels of /metrics' caf_serving_cpu_info gauge. Empty: left out.
  std::string engine_cpu_json;
  std::string engine_cpu_labels;
};

struct listening_ports {
  uint16_t http = 0;
  uint16_t metrics = 0; ///< 0 when metrics are disabled
};

/// How the drain after a stop ended.
struct stop_report {
  /// Requests still waiting for the pipeline at --exit-timeout-secs, answered
  /// 503 then.
  size_t abandoned = 0;
  /// Whether every connection had closed when serve() returned.
  bool drained = true;
};

class http_server {
public:
  /// Binds the ports and starts the loops other than loop 0 (cfg.event_loops
  /// in all), each on a thread of its own. Throws std::runtime_error, naming
  /// the port and its flag, when a port cannot be bound.
  static std::unique_ptr<http_server> start(const http_server_config& cfg,
                                            server::model_directory& models);
  /// Stops and joins the loops if serve() did not.
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  listening_ports ports() const;

  /// Runs loop 0 on the calling thread, accepting, until stop(); then stops
  /// accepting, answers every request already accepted (for at most
  /// cfg.exit_timeout_secs, then 503), and returns once every loop has ended.
  /// Once. Throws std::runtime_error when another loop failed; loop 0's
  /// failure is kj's exception.
  stop_report serve();

  /// From any thread, before or during serve(), and more than once: every
  /// loop stops accepting and drains.
  void stop();

  struct state;

private:
  explicit http_server(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

} // namespace caf_serving::ingress
