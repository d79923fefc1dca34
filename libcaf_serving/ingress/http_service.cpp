#include "ingress/http_service.hpp"

#include "core/clock.hpp"
#include "ingress/response_cache.hpp"
#include "ingress/restricted_api.hpp"
#include "ingress/shm_api.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>

namespace caf_serving::ingress {

namespace {

/// The Triton release whose HTTP protocol and client behaviour this server
/// matches (tritonclient 2.51 and its examples are the tests of it).
constexpr const char* triton_protocol_version = "2.51.0";

constexpr const char* server_extensions
  = "[\"classification\",\"binary_tensor_data\",\"model_repository\",\"statistics\","
    "\"schedule_policy\",\"model_configuration\",\"system_shared_memory\"]";

std::string_view view(kj::StringPtr s) {
  return {s.cStr(), s.size()};
}

/// The value of header `name` (any case), which need not be one the header
/// table registered.
std::optional<std::string> find_header(const kj::HttpHeaders& h, std::string_view name) {
  std::optional<std::string> found;
  h.forEach([&](kj::StringPtr key, kj::StringPtr value) {
    if (found || key.size() != name.size())
      return;
    for (size_t i = 0; i < name.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(key[i]))
          != std::tolower(static_cast<unsigned char>(name[i])))
        return;
    found = std::string(value.cStr(), value.size());
  });
  return found;
}

/// The path split at '/', without the query string.
std::vector<std::string> split_path(kj::StringPtr url) {
  std::string_view path = view(url);
  if (auto q = path.find('?'); q != std::string_view::npos)
    path = path.substr(0, q);
  std::vector<std::string> parts;
  // At most one part per '/' and one more: reserved, not grown 1, 2, 4.
  parts.reserve(static_cast<size_t>(std::count(path.begin(), path.end(), '/')) + 1);
  size_t at = 0;
  while (at < path.size()) {
    auto next = path.find('/', at);
    if (next == std::string_view::npos)
      next = path.size();
    if (next > at)
      parts.emplace_back(path.substr(at, next - at));
    at = next + 1;
  }
  return parts;
}

} // namespace

kj::Promise<void> kserve_service::request(kj::HttpMethod method, kj::StringPtr url,
                                          const kj::HttpHeaders& headers,
                                          kj::AsyncInputStream& body, Response& response) {
  int64_t received = now_ns();
  const auto& cfg = shared_.cfg;
  // The request line and headers as they came, give or take the spacing.
  size_t header_bytes = url.size() + 32;
  headers.forEach([&](kj::StringPtr name, kj::StringPtr value) {
    header_bytes += name.size() + value.size() + 4;
  });
  if (header_bytes > cfg.max_header_bytes)
    return writer_.send_error(response, 431,
                              "the request line and headers take about "
                                + std::to_string(header_bytes) + " bytes, over the limit of "
                                + std::to_string(cfg.max_header_bytes)
                                + " bytes (--max-header-bytes)",
                              close_connection::yes);
  routed_request req{method, url, headers, body, split_path(url), received};
  const auto& parts = req.parts;
  if (ports_ == service_ports::metrics_only) {
    if (parts.size() == 1 && parts[0] == "metrics")
      return metrics(method, response);
    return writer_.send_error(response, 404,
                              "Not Found: the metrics port serves only GET /metrics");
  }
  if (parts.size() == 1 && parts[0] == "metrics")
    return metrics(method, response);
  // --http-restricted-api, checked before anything else about the request
  // (its method included), as Triton does.
  if (auto group = api_group_of(parts))
    if (!cfg.restricted.allows(*group, [&](const std::string& header) {
          return find_header(headers, header);
        }))
      return writer_.send_error(response, 403, cfg.restricted.refusal(*group));
  if (!parts.empty() && parts[0] == "v1")
    return openai(req, response);
  if (parts.empty() || parts[0] != "v2")
    return writer_.send_error(response, 404,
                              "Not Found: unknown path '" + std::string(view(url))
                                + "'; KServe v2 endpoints start with /v2");
  if (parts.size() == 1)
    return server_metadata(method, response);
  if (parts[1] == "health" && parts.size() == 3)
    return health(method, parts[2], response);
  if (parts[1] == "repository")
    return control_.repository(method, body, parts, response);
  if (is_shared_memory_path(parts))
    return control_.shared_memory(method, parts, body, response);
  if (parts[1] == "models")
    return models(req, response);
  return writer_.send_error(response, 404,
                            "Not Found: unknown path '" + std::string(view(url)) + "'");
}

kj::Promise<void> kserve_service::server_metadata(kj::HttpMethod method,
                                                  http_response& response) {
  return expect(writer_, method, kj::HttpMethod::GET, response, [&] {
    const auto& cfg = shared_.cfg;
    auto cluster = shared_.models.cluster_json();
    return writer_.send_json(
      response, 200,
      // Triton's clients and examples check that the server calls itself
      // "triton" (tritonclient's simple_http_health_metadata.py fails
      // otherwise), so name and version are those of the Triton release whose
      // protocol this server speaks; the engine names itself under "engine".
      std::string("{\"name\":\"triton\",\"version\":\"") + triton_protocol_version
        + "\",\"engine\":{\"name\":\"caf-serving\",\"version\":\"" CAF_SERVING_VERSION "\""
        + (cfg.engine_cpu_json.empty() ? std::string() : ",\"cpu\":" + cfg.engine_cpu_json)
        + "},\"extensions\":" + std::string(server_extensions)
        + (cluster.empty() ? std::string() : ",\"cluster\":" + cluster) + "}");
  });
}

kj::Promise<void> kserve_service::health(kj::HttpMethod method, const std::string& which,
                                         http_response& response) {
  return expect(writer_, method, kj::HttpMethod::GET, response, [&] {
    const auto& cfg = shared_.cfg;
    if (which != "live" && which != "ready")
      return writer_.send_error(response, 404,
                                "Not Found: health endpoints are /v2/health/live and /ready");
    bool ok = which == "live"
              || (!draining && (!cfg.strict_readiness || shared_.models.all_ready()));
    // Triton answers a server that is not ready (or not live) 400, with no
    // body.
    return writer_.send_json(response, ok ? 200 : 400, "");
  });
}

kj::Promise<void> kserve_service::models(const routed_request& req, http_response& response) {
  const auto& parts = req.parts;
  auto method = req.method;
  auto& models = shared_.models;
  if (parts.size() == 3 && parts[2] == "stats")
    return expect(writer_, method, kj::HttpMethod::GET, response, [&] {
      return writer_.send_json(response, 200, stats_json(models.all_stats()));
    });
  if (parts.size() < 3)
    return writer_.send_error(response, 404, "Not Found: name a model: /v2/models/{model}");
  const std::string& name = parts[2];
  size_t next = 3;
  int64_t version = 0;
  if (parts.size() >= 5 && parts[3] == "versions") {
    char* end = nullptr;
    version = std::strtoll(parts[4].c_str(), &end, 10);
    // Triton's routes take only digits there, so anything else is its 404.
    if (*end != '\0' || version <= 0)
      return writer_.send_error(response, 404,
                                "Not Found: version '" + parts[4] + "' of model '" + name
                                  + "' is not a positive integer");
    next = 5;
  }
  std::string action = parts.size() > next ? parts[next] : "";
  if (parts.size() > next + 1)
    return writer_.send_error(response, 404,
                              "Not Found: unknown path '" + std::string(view(req.url)) + "'");
  if (action == "ready")
    return expect(writer_, method, kj::HttpMethod::GET, response, [&] {
      // Triton 2.51 (the release /v2 names) answers every model or version
      // that is not ready, known or not, 400 "Model version not ready";
      // find() says which case it is, in later Triton's words.
      auto m = models.find(name, version);
      if (!m)
        return writer_.send_error(response, 400,
                                  "Model version not ready: " + m.error().message);
      return writer_.send_json(response, 200, "");
    });
  if (action == "stats")
    return expect(writer_, method, kj::HttpMethod::GET, response,
                  [&] { return model_stats_of(name, version, response); });
  if (action.empty() || action == "config")
    return expect(writer_, method, kj::HttpMethod::GET, response, [&] {
      auto m = models.find(name, version);
      if (!m)
        return writer_.send_error(response, m.error());
      return writer_.send_json(response, 200,
                               action.empty() ? (*m)->metadata_json : (*m)->config_json);
    });
  if (action == "generate" || action == "generate_stream") {
    if (method != kj::HttpMethod::POST)
      return writer_.send_error(response, 405, "Method Not Allowed: generation takes POST");
    auto m = models.find(name, version);
    if (!m)
      return writer_.send_error(response, m.error());
    return generate_.triton(*m, action == "generate_stream", req.body, response,
                            req.received_ns);
  }
  if (action == "infer") {
    if (method != kj::HttpMethod::POST)
      return writer_.send_error(response, 405, "Method Not Allowed: inference takes POST");
    auto m = models.find(name, version);
    if (!m)
      return writer_.send_error(response, m.error());
    return infer_.infer(*m, req.headers, req.body, response, req.received_ns);
  }
  return writer_.send_error(response, 404,
                            "Not Found: unknown path '" + std::string(view(req.url)) + "'");
}

/// The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions,
/// /v1/models[/{id}].
kj::Promise<void> kserve_service::openai(const routed_request& req, http_response& response) {
  const auto& parts = req.parts;
  if (parts.size() >= 2 && parts[1] == "models" && parts.size() <= 3)
    return expect(writer_, req.method, kj::HttpMethod::GET, response, [&] {
      return generate_.openai_models(parts.size() == 3 ? parts[2] : std::string(), response);
    });
  std::optional<generate_api> api;
  if (parts.size() == 2 && parts[1] == "completions")
    api = generate_api::openai_completion;
  else if (parts.size() == 3 && parts[1] == "chat" && parts[2] == "completions")
    api = generate_api::openai_chat;
  if (!api)
    return writer_.send_error(response, 404,
                              "Not Found: unknown path '" + std::string(view(req.url))
                                + "'; the OpenAI endpoints are /v1/completions, "
                                  "/v1/chat/completions and /v1/models");
  return expect(writer_, req.method, kj::HttpMethod::POST, response, [&] {
    return generate_.openai(*api, req.body, response, req.received_ns);
  });
}

kj::Promise<void> kserve_service::model_stats_of(const std::string& name, int64_t version,
                                                 http_response& response) {
  auto& models = shared_.models;
  std::vector<std::shared_ptr<model_stats>> stats;
  for (const auto& p : models.versions(name))
    if (version == 0 || p->version == version)
      stats.push_back(p->stats);
  if (stats.empty()) {
    // Triton's statistics answer 400 for a model or version it does not
    // serve, with its own wording; find() says why.
    auto m = models.find(name, version);
    std::string why = m ? std::string("it is not served") : m.error().message;
    bool model_served = version != 0 && !models.versions(name).empty();
    return writer_.send_error(
      response, 400,
      (model_served ? "requested model version is not available for model '" + name + "'"
                    : "requested model '" + name + "' is not available")
        + ": " + why);
  }
  return writer_.send_json(response, 200, stats_json(stats));
}

kj::Promise<void> kserve_service::metrics(kj::HttpMethod method, http_response& response) {
  return expect(writer_, method, kj::HttpMethod::GET, response, [&] {
    const auto& cache = shared_.cfg.cache;
    return writer_.send(response, 200,
                        prometheus_text(shared_.models.all_stats())
                          + generate_.prometheus() + shared_.models.cluster_prometheus()
                          + (cache ? cache->prometheus() : std::string()) + loop_prometheus()
                          + cpu_prometheus(),
                        {"text/plain; version=0.0.4"});
  });
}

std::string kserve_service::loop_prometheus() const {
  const auto& accepted = shared_.accepted_by_loop;
  std::string out = "# HELP caf_serving_http_connections_open Connections open on the HTTP "
                    "port, over every event loop (the count --max-connections limits)\n"
                    "# TYPE caf_serving_http_connections_open gauge\n"
                    "caf_serving_http_connections_open "
                    + std::to_string(
                      shared_.http_connections.open.load(std::memory_order_relaxed))
                    + "\n";
  out += "# HELP caf_serving_http_connections_accepted_total Connections "
         "accepted on the HTTP port, per event loop (--http-threads)\n"
         "# TYPE caf_serving_http_connections_accepted_total counter\n";
  for (size_t i = 0; i < accepted.size(); ++i)
    out += "caf_serving_http_connections_accepted_total{loop=\"" + std::to_string(i) + "\"} "
           + std::to_string(accepted[i].load(std::memory_order_relaxed)) + "\n";
  return out;
}

std::string kserve_service::cpu_prometheus() const {
  const auto& labels = shared_.cfg.engine_cpu_labels;
  if (labels.empty())
    return {};
  return "# HELP caf_serving_cpu_info What the CPU backend runs at: oneDNN's ISA, the "
         "engine's kernels' ISA, the channel block of its layouts, and whether int8 runs on "
         "VNNI or the exact path\n# TYPE caf_serving_cpu_info gauge\ncaf_serving_cpu_info{"
         + labels + "} 1\n";
}

} // namespace caf_serving::ingress
