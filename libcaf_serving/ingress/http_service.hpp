#pragma once
/// The KServe v2 HTTP service of one event loop and port (part of
/// http_server; internal to the ingress): routes each request, and answers
/// health, server and model metadata, configuration, statistics and
/// /metrics itself. The repository and shared-memory endpoints are
/// http_control's, inference is http_infer's, and response_writer writes
/// every answer.

#include "ingress/http_control.hpp"
#include "ingress/http_generate.hpp"
#include "ingress/http_infer.hpp"
#include "ingress/http_response.hpp"
#include "ingress/http_shared.hpp"

#include <kj/compat/http.h>
#include <kj/timer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::ingress {

/// Which endpoints a service answers.
enum class service_ports {
  /// The HTTP port: every endpoint.
  http,
  /// The metrics port: GET /metrics only.
  metrics_only,
};

/// A request as the routing sees it: kj's parts of it (valid until its body
/// is first read) and its path split at '/', without the query string.
struct routed_request {
  kj::HttpMethod method;
  kj::StringPtr url;
  const kj::HttpHeaders& headers;
  kj::AsyncInputStream& body;
  std::vector<std::string> parts;
  /// When it arrived (now_ns()).
  int64_t received_ns = 0;
};

class kserve_service final : public kj::HttpService {
public:
  kserve_service(const http_shared& shared, service_ports ports, kj::Timer& timer,
                 close_after_response& closer)
      : shared_(shared),
        ports_(ports),
        writer_(shared.table, shared.ids, closer),
        control_(shared, writer_, timer),
        infer_(shared, writer_, timer),
        generate_(shared, writer_) {}

  /// Set when the server stops: readiness is false from then on.
  bool draining = false;

  /// Answers 503 to every inference request still waiting for the pipeline,
  /// now and from now on (the exit timeout has passed); returns how many were
  /// waiting.
  size_t abandon_in_flight() { return infer_.abandon_in_flight(); }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override;

private:
  /// GET /v2: the server's metadata.
  kj::Promise<void> server_metadata(kj::HttpMethod method, http_response& response);
  /// /v2/health/live and /ready.
  kj::Promise<void> health(kj::HttpMethod method, const std::string& which,
                           http_response& response);
  /// /v2/models/...
  kj::Promise<void> openai(const routed_request& req, http_response& response);
  kj::Promise<void> models(const routed_request& req, http_response& response);
  /// GET /v2/models/{m}[/versions/{v}]/stats.
  kj::Promise<void> model_stats_of(const std::string& name, int64_t version,
                                   http_response& response);
  /// GET /metrics.
  kj::Promise<void> metrics(kj::HttpMethod method, http_response& response);
  /// Connections open on the HTTP port now, over every loop, and those
  /// accepted per event loop: how evenly the loops share them.
  std::string loop_prometheus() const;
  /// An info gauge (always 1) whose labels say what the CPU backend runs at.
  std::string cpu_prometheus() const;

  const http_shared& shared_;
  service_ports ports_;
  response_writer writer_;
  http_control control_;
  http_infer infer_;
  http_generate generate_;
};

} // namespace caf_serving::ingress
