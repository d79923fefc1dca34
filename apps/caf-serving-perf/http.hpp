/// HTTP/1.1 pieces of the load generator: a response parser that works on a
/// connection's read buffer without copying, request builders, and a small
/// blocking client for control requests (metadata, statistics).
///
/// The parser is stateless: it is given everything read so far and says how
/// many bytes the first complete response used. A response that arrives in
/// pieces is parsed again from its start when more bytes come, which costs
/// nothing for the small responses of a load test and keeps the code simple.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace caf_serving::perf {

/// Whether the bytes seen so far hold a complete response.
enum class parse_state { incomplete, complete, malformed };

/// One parsed HTTP response. `body()` views the caller's buffer (or the
/// decoded chunked body) and is valid until the buffer changes.
struct http_response {
  parse_state state = parse_state::incomplete;
  int status = 0;
  /// Bytes of the buffer that this response used, header and body.
  std::size_t consumed = 0;
  /// False when the server said `Connection: close` (or spoke HTTP/1.0).
  bool keep_alive = true;
  /// The body as it lies in the buffer (not chunked).
  std::string_view raw_body;
  /// The decoded body of a chunked response.
  std::string decoded_body;
  bool chunked = false;
  /// What was wrong when `state` is `malformed`.
  std::string error;

  std::string_view body() const {
    return chunked ? std::string_view(decoded_body) : raw_body;
  }
};

/// Parses the first response in `buffer`.
http_response parse_response(std::string_view buffer);

/// A host and TCP port, as given by `-u HOST:PORT`.
struct endpoint {
  std::string host = "localhost";
  uint16_t port = 8000;
};

/// An endpoint, or why the text did not name one.
struct parsed_endpoint {
  endpoint value;
  std::string error;
};

/// Parses "HOST:PORT" (or "HOST", port 8000; an "http://" prefix is allowed).
parsed_endpoint parse_endpoint(std::string_view text);

/// Builds a complete HTTP/1.1 request. `extra_headers` lines end in "\r\n".
std::string build_request(std::string_view method, std::string_view path,
                          std::string_view host_header,
                          std::string_view extra_headers,
                          std::string_view body);

/// A connected socket, or -1 and why not.
struct connect_result {
  int fd = -1;
  std::string error;
};

/// Opens a TCP connection (TCP_NODELAY set, blocking connect).
connect_result connect_tcp(const endpoint& ep);

/// The result of a blocking control request.
struct control_reply {
  /// Empty when a response came; otherwise why none came.
  std::string error;
  int status = 0;
  std::string body;
};

/// Sends one request on a fresh connection and waits at most `timeout_ms` for
/// the whole answer. Used outside the measured path only.
control_reply http_get(const endpoint& ep, std::string_view path,
                       int timeout_ms);
control_reply http_exchange(const endpoint& ep, const std::string& request,
                            int timeout_ms);

} // namespace caf_serving::perf
