#pragma once
/// What every event loop of the HTTP ingress shares (part of http_server;
/// internal to the ingress): read-only after start, or thread-safe.

#include "ingress/admission.hpp"
#include "ingress/http_listen.hpp"
#include "ingress/http_response.hpp"
#include "ingress/http_server.hpp"
#include "ingress/shared_memory.hpp"
#include "server/model_directory.hpp"

#include <kj/compat/http.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace caf_serving::ingress {

struct http_shared {
  const http_server_config& cfg;
  server::model_directory& models;
  shared_memory_registry& shm;
  /// Inference requests' admission (admission.hpp): the same for every loop.
  const admission_config& admission;
  const kj::HttpHeaderTable& table;
  const header_ids& ids;
  connection_count& http_connections;
  connection_count& metrics_connections;
  /// Connections each event loop has accepted on the HTTP port, by loop
  /// (written only by that loop; rendered on /metrics).
  std::vector<std::atomic<uint64_t>>& accepted_by_loop;
};

/// Runs `f` (an endpoint) when the request's method is `wanted`; else 405.
template <class F>
kj::Promise<void> expect(response_writer& writer, kj::HttpMethod method, kj::HttpMethod wanted,
                         http_response& response, F&& f) {
  if (method != wanted)
    return writer.send_error(response, 405,
                             std::string("Method Not Allowed: this endpoint takes ")
                               + (wanted == kj::HttpMethod::GET ? "GET" : "POST"));
  return f();
}

} // namespace caf_serving::ingress
