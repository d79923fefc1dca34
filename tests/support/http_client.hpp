#pragma once
/// A minimal blocking HTTP/1.1 client for whole-server tests: one connection,
/// kept alive between requests, Content-Length and chunked responses.
///
/// Usage:
///
///   support::http_client http(server.http_port());
///   auto r = http.post("/v2/models/simple/infer", body,
///                      {{"Content-Type", "application/json"}});
///   CHECK(r.status == 200);
///   auto encoding = r.header("content-encoding");
///
/// Every call blocks until the whole response is read, or throws
/// std::runtime_error after `timeout` or when the server closes the
/// connection mid-response. A kept-alive connection that the server closed
/// while idle is reopened once, transparently.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace caf_serving::support {

using header_list = std::vector<std::pair<std::string, std::string>>;

struct http_request {
  std::string method = "GET";
  std::string path = "/";
  /// Sent with a Content-Length header (also when empty, for POST).
  std::string body;
  header_list headers;
};

struct http_response {
  int status = 0;
  /// Header names in lower case.
  std::map<std::string, std::string> headers;
  std::string body;

  /// The header's value, "" when absent; `name` in any case.
  std::string header(std::string_view name) const;
};

class http_client {
public:
  explicit http_client(uint16_t port, std::string host = "127.0.0.1");
  ~http_client();
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;
  http_client(http_client&& other) noexcept;

  http_response request(const http_request& req);
  http_response get(const std::string& path);
  http_response post(const std::string& path, std::string body, header_list headers = {});

  /// Writes `bytes` as they are (for requests the helpers cannot express),
  /// then reads one response.
  http_response raw_request(std::string_view bytes);
  void close();

  /// How long one request may take, from sending to the last byte read.
  std::chrono::milliseconds timeout{30000};

private:
  void connect();
  void write_all(std::string_view bytes);
  http_response read_response();
  /// Reads into buffer_; false at EOF.
  bool fill();

  std::string host_;
  uint16_t port_;
  int fd_ = -1;
  /// Whether the connection has already carried a response.
  bool reused_ = false;
  std::string buffer_;
  std::chrono::steady_clock::time_point deadline_;
};

/// Whether a TCP connection to 127.0.0.1:port is accepted now.
bool can_connect(uint16_t port);

} // namespace caf_serving::support
