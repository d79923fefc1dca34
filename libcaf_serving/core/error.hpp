#pragma once
/// Expected failures travel as values (STYLE.md, two tiers of errors). A
/// serving_error carries the HTTP status the client will see and a message that
/// says what was wrong and how to fix it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace caf_serving {

/// Triton's mapping of failures to HTTP status codes.
enum class status_code : int {
  bad_request = 400,
  not_found = 404,
  method_not_allowed = 405,
  payload_too_large = 413,
  too_many_requests = 429,
  internal = 500,
  unavailable = 503,
};

/// Why a request failed, for the failure counters on /metrics. The ordinals match
/// wire::FailureReason in schemas/serving.capnp.
enum class failure_reason : uint8_t {
  bad_request, queue_full, timeout, unavailable, internal,
};
constexpr size_t failure_reason_count = 5;

struct serving_error {
  status_code status = status_code::internal;
  std::string message;
  /// Defaults from the status when left out (see reason_of).
  std::optional<failure_reason> reason = std::nullopt;
  /// Seconds the client should wait before retrying (HTTP Retry-After); 0: none.
  /// Set when a request is shed (docs/latency-target.md).
  uint32_t retry_after_s = 0;
};

inline failure_reason reason_of(const serving_error& e) {
  if (e.reason)
    return *e.reason;
  switch (e.status) {
    case status_code::bad_request:
    case status_code::not_found:
    case status_code::method_not_allowed:
    case status_code::payload_too_large: return failure_reason::bad_request;
    case status_code::unavailable:
    case status_code::too_many_requests: return failure_reason::unavailable;
    default: return failure_reason::internal;
  }
}

inline serving_error bad_request(std::string msg) {
  return {status_code::bad_request, std::move(msg)};
}
inline serving_error not_found(std::string msg) {
  return {status_code::not_found, std::move(msg)};
}
inline serving_error unavailable(std::string msg) {
  return {status_code::unavailable, std::move(msg)};
}

/// A value or the reason there is none. Kept tiny and CAF-free so that the
/// codec, config and policy code compiles without CAF headers.
template <class T>
class result {
public:
  result(T value) : v_(std::move(value)) {}
  result(serving_error err) : v_(std::move(err)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const serving_error& error() const { return std::get<1>(v_); }

private:
  std::variant<T, serving_error> v_;
};

} // namespace caf_serving
