#pragma once
/// The shared-memory endpoints of Triton's HTTP API, without the networking:
/// the HTTP server hands over the method, the path and the body, and sends
/// back the status and body this returns.
///
///   GET  /v2/systemsharedmemory[/region/{name}]/status
///   POST /v2/systemsharedmemory/region/{name}/register  {"key","offset","byte_size"}
///   POST /v2/systemsharedmemory[/region/{name}]/unregister
///   and the same under /v2/cudasharedmemory, which answers as Triton built
///   without GPUs does: status lists nothing, register is refused (400,
///   "GPUs not supported"), unregister has nothing to do.
///
/// Statuses and leading phrases are Triton's (clients and Triton's tests match
/// on them); caf-serving's guidance follows after a semicolon.

#include "ingress/shared_memory.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

enum class shm_method { get, post, other };

struct shm_api_request {
  shm_method method = shm_method::get;
  /// The path split at '/', as the server routes it: {"v2", "systemsharedmemory", ...}.
  std::vector<std::string> parts;
  std::string_view body;
};

struct shm_api_response {
  int status = 200;
  /// JSON: the status list, {"error": ...}, or empty.
  std::string body;
};

/// Whether `parts` starts with /v2/systemsharedmemory or /v2/cudasharedmemory.
bool is_shared_memory_path(const std::vector<std::string>& parts);

/// Largest register request body read (a key, two numbers); larger is a 413.
constexpr size_t max_shm_request_bytes = 64 * 1024;

shm_api_response handle_shared_memory_request(shared_memory_registry& registry,
                                              const shm_api_request& request);

/// `text` with %XX escapes decoded (tritonclient quotes region names in URLs).
/// An invalid escape is kept as it is.
std::string percent_decode(std::string_view text);

} // namespace caf_serving::ingress
