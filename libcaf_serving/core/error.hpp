#pragma once
/// Expected failures travel as values (STYLE.md, two tiers of errors). A
/// serving_error carries the HTTP status the client will see and a message that
/// says what was wrong and how to fix it.

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

struct serving_error {
  status_code status = status_code::internal;
  std::string message;
};

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
