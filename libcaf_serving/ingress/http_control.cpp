#include "ingress/http_control.hpp"

#include "ingress/repository_api.hpp"
#include "ingress/repository_index.hpp"
#include "ingress/shm_api.hpp"

#include <memory>
#include <optional>
#include <variant>

namespace caf_serving::ingress {

kj::Promise<void> http_control::repository(kj::HttpMethod method, kj::AsyncInputStream& body,
                                           const std::vector<std::string>& parts,
                                           http_response& response) {
  const auto& cfg = shared_.cfg;
  if (parts.size() == 3 && parts[2] == "index")
    return expect(writer_, method, kj::HttpMethod::POST, response, [&] {
      auto limit = input_size_limit();
      return read_body(body, limit.max_bytes)
        .then([this, &response, limit = std::move(limit)](body_read read) {
          if (read.result != body_read::outcome::complete)
            return send_read_error(response, read, limit);
          auto request = parse_index_request(read.bytes.view());
          if (!request)
            return writer_.send_error(response, request.error());
          std::vector<index_entry> rows;
          for (auto& row : shared_.models.index())
            rows.push_back({std::move(row.name), std::move(row.version), std::move(row.state),
                            std::move(row.reason)});
          return writer_.send_json(response, 200, serialize_index(rows, *request));
        });
    });
  if (parts.size() == 5 && parts[2] == "models" && (parts[4] == "load" || parts[4] == "unload"))
    return expect(writer_, method, kj::HttpMethod::POST, response, [&]() -> kj::Promise<void> {
      // The body (parameters; model files for a load) is read whole, within
      // --max-body-bytes, then parsed by repository_api. Triton's phrase
      // first (its tests match on it).
      auto too_large = [&cfg](const std::string& size) {
        return "request JSON size of " + size + " bytes exceeds the maximum allowed input "
               "size of " + std::to_string(cfg.limits.max_body_bytes)
               + " bytes; raise --max-body-bytes to send larger model files";
      };
      body_limit limit{cfg.limits.max_body_bytes, 413,
                       too_large("more than " + std::to_string(cfg.limits.max_body_bytes))};
      KJ_IF_MAYBE (n, body.tryGetLength())
        if (*n > limit.max_bytes)
          return writer_.send_error(response, 413, too_large(std::to_string(*n)),
                                    close_connection::yes);
      return read_body(body, limit.max_bytes)
        .then([this, &response, name = parts[3], unloading = parts[4] == "unload",
               limit = std::move(limit)](body_read read) -> kj::Promise<void> {
          if (read.result != body_read::outcome::complete)
            return send_read_error(response, read, limit);
          if (unloading)
            return unload(response, name, std::string(read.bytes.view()));
          return load(response, name, std::string(read.bytes.view()));
        });
    });
  return writer_.send_error(response, 404,
                            "Not Found: repository endpoints are POST /v2/repository/index and "
                            "/v2/repository/models/{model}/load or /unload");
}

kj::Promise<void> http_control::shared_memory(kj::HttpMethod method,
                                              std::vector<std::string> parts,
                                              kj::AsyncInputStream& body,
                                              http_response& response) {
  shm_method m = method == kj::HttpMethod::GET    ? shm_method::get
                 : method == kj::HttpMethod::POST ? shm_method::post
                                                  : shm_method::other;
  body_limit limit{max_shm_request_bytes, 413,
                   "a shared-memory request body may have at most "
                     + std::to_string(max_shm_request_bytes) + " bytes"};
  return read_body(body, limit.max_bytes)
    .then([this, &response, m, parts = std::move(parts),
           limit = std::move(limit)](body_read read) -> kj::Promise<void> {
      if (read.result != body_read::outcome::complete)
        return send_read_error(response, read, limit);
      auto r = handle_shared_memory_request(
        shared_.shm, {m, parts, std::string_view(read.bytes.data(), read.bytes.size())});
      return writer_.send_json(response, r.status, std::move(r.body));
    });
}

http_control::body_limit http_control::input_size_limit() const {
  auto max_bytes = shared_.cfg.limits.max_body_bytes;
  auto max = std::to_string(max_bytes);
  return {max_bytes, 400,
          "request JSON size of more than " + max
            + " bytes exceeds the maximum allowed input size of " + max
            + " bytes. Use --http-max-input-size to increase the limit (this server's "
              "--max-body-bytes)"};
}

kj::Promise<body_read> http_control::read_body(kj::AsyncInputStream& body, uint64_t max_bytes) {
  std::optional<uint64_t> expected;
  KJ_IF_MAYBE (n, body.tryGetLength())
    expected = *n;
  auto reader = kj::heap<body_reader>(body, timer_,
                                      shared_.cfg.idle_timeout_ms * kj::MILLISECONDS, max_bytes,
                                      expected);
  auto reading = reader->read();
  return reading.attach(kj::mv(reader));
}

kj::Promise<void> http_control::send_read_error(http_response& response, const body_read& read,
                                                const body_limit& limit) {
  switch (read.result) {
    case body_read::outcome::disconnected:
      return KJ_EXCEPTION(DISCONNECTED, "the client left inside the request body");
    case body_read::outcome::too_large:
      return writer_.send_error(response, limit.too_large_status, limit.too_large_message,
                                close_connection::yes);
    case body_read::outcome::stalled:
      return writer_.send_error(response, 408,
                                "no byte of the request body arrived for "
                                  + std::to_string(shared_.cfg.idle_timeout_ms)
                                  + " ms (--idle-timeout-ms)",
                                close_connection::yes);
    case body_read::outcome::malformed:
    case body_read::outcome::complete:
      break;
  }
  return writer_.send_error(response, 400, "the request body could not be read",
                            close_connection::yes);
}

kj::Promise<void> http_control::unload(http_response& response, const std::string& name,
                                       const std::string& body) {
  auto params = parse_unload_request(body);
  if (!params)
    return writer_.send_error(response, params.error());
  auto r = shared_.models.request_unload(name, *params);
  if (auto* e = std::get_if<serving_error>(&r))
    return writer_.send_error(response, *e);
  return writer_.send_json(response, 200, "");
}

kj::Promise<void> http_control::load(http_response& response, const std::string& name,
                                     std::string body) {
  // A load (its body parsed, files written, ONNX import, compile, warm-up)
  // runs on the model manager's loader thread; this loop keeps serving.
  using load_result = std::variant<std::monostate, serving_error>;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<load_result>();
  // std::function copies its callable: the fulfiller goes behind a shared_ptr.
  auto fulfiller = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<load_result>>>(
    kj::mv(paf.fulfiller));
  auto shared_body = std::make_shared<std::string>(std::move(body));
  shared_.models.request_load(
    name, [shared_body] { return parse_load_request(*shared_body); },
    [fulfiller](load_result r) { (*fulfiller)->fulfill(kj::mv(r)); });
  return paf.promise.then([this, &response](load_result r) {
    if (auto* e = std::get_if<serving_error>(&r))
      return writer_.send_error(response, *e);
    return writer_.send_json(response, 200, "");
  });
}

} // namespace caf_serving::ingress
