#pragma once
/// The KServe v2 HTTP/REST ingress: a kj-http server on its own event loop that
/// validates requests, turns them into InferRequest messages for the model's
/// scheduler, and writes the responses the post-processor hands back.
///
/// Endpoints (Triton's): /v2, /v2/health/{live,ready}, /v2/models/{m}[/versions/{v}]
/// with /ready, /config, /stats and /infer, /v2/models/stats,
/// /v2/repository/index, /v2/repository/models/{m}/{load,unload}, and /metrics
/// (also on the metrics port).

#include "ingress/kserve_codec.hpp"
#include "server/model_manager.hpp"

#include <cstdint>
#include <functional>
#include <string>

namespace caf_serving::ingress {

struct http_server_config {
  std::string address = "0.0.0.0";
  /// 0: pick a free port (reported through on_listening).
  uint16_t http_port = 8000;
  /// Prometheus metrics only; 0: pick a free port; -1 (disabled) via metrics_enabled.
  uint16_t metrics_port = 8002;
  bool metrics_enabled = true;
  /// Readiness requires every model of the repository to be served (Triton's
  /// --strict-readiness, on by default there too).
  bool strict_readiness = true;
  request_limits limits;
};

struct listening_ports {
  uint16_t http = 0;
  uint16_t metrics = 0; ///< 0 when metrics are disabled
};

/// Serves until SIGINT or SIGTERM, then stops accepting, answers every request
/// already accepted, and returns. The signals must have been captured with
/// kj::UnixEventPort::captureSignal before any thread was started.
/// Throws (kj::Exception) when a port cannot be bound.
void run_http_server(const http_server_config& cfg, server::model_manager& models,
                     const std::function<void(listening_ports)>& on_listening);

} // namespace caf_serving::ingress
