#pragma once
/// The HTTP ingress's control endpoints (part of http_server; internal to the
/// ingress): the model repository (POST /v2/repository/index and
/// /v2/repository/models/{m}/load or /unload, repository_api.hpp) and the
/// shared-memory extension (/v2/systemsharedmemory/... and
/// /v2/cudasharedmemory/..., shm_api.hpp). Their bodies are read whole, within
/// their limits, before they are parsed.

#include "ingress/http_body.hpp"
#include "ingress/http_response.hpp"
#include "ingress/http_shared.hpp"

#include <kj/compat/http.h>
#include <kj/timer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::ingress {

class http_control {
public:
  http_control(const http_shared& shared, response_writer& writer, kj::Timer& timer)
      : shared_(shared), writer_(writer), timer_(timer) {}

  /// /v2/repository/...; `parts` is the path split at '/'.
  kj::Promise<void> repository(kj::HttpMethod method, kj::AsyncInputStream& body,
                               const std::vector<std::string>& parts, http_response& response);

  /// /v2/systemsharedmemory/... and /v2/cudasharedmemory/...: the body (a
  /// register request, at most max_shm_request_bytes) is read, then
  /// shm_api.hpp answers.
  kj::Promise<void> shared_memory(kj::HttpMethod method, std::vector<std::string> parts,
                                  kj::AsyncInputStream& body, http_response& response);

private:
  /// How much a control request's body (not an inference's) may hold, and
  /// the answer to one that holds more.
  struct body_limit {
    uint64_t max_bytes = 0;
    int too_large_status = 400;
    std::string too_large_message;
  };

  /// The repository index's limit: --max-body-bytes, answered as Triton
  /// answers an oversized body.
  body_limit input_size_limit() const;

  /// Reads the body of a control request, at most `max_bytes`, each read
  /// waiting at most --idle-timeout-ms.
  kj::Promise<body_read> read_body(kj::AsyncInputStream& body, uint64_t max_bytes);

  /// The answer to a control request whose body could not be read whole.
  kj::Promise<void> send_read_error(http_response& response, const body_read& read,
                                    const body_limit& limit);

  /// A load with its body (repository_api), answered once the model
  /// manager's loader thread is done.
  kj::Promise<void> load(http_response& response, const std::string& name, std::string body);

  /// An unload with its body (repository_api).
  kj::Promise<void> unload(http_response& response, const std::string& name,
                           const std::string& body);

  const http_shared& shared_;
  response_writer& writer_;
  kj::Timer& timer_;
};

} // namespace caf_serving::ingress
