#include "support/http_client.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <stdexcept>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

namespace caf_serving::support {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return std::string(s);
}

/// Signals that the connection closed before any byte of the response.
struct closed_before_response {};

int open_socket(const std::string& host, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    throw std::runtime_error("not an IPv4 address: " + host);
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error("connect to " + host + ":" + std::to_string(port) + ": "
                             + std::strerror(err));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

} // namespace

std::string http_response::header(std::string_view name) const {
  auto it = headers.find(lower(name));
  return it == headers.end() ? std::string() : it->second;
}

http_client::http_client(uint16_t port, std::string host) : host_(std::move(host)), port_(port) {}

http_client::~http_client() {
  close();
}

http_client::http_client(http_client&& other) noexcept
    : timeout(other.timeout),
      host_(std::move(other.host_)),
      port_(other.port_),
      fd_(other.fd_),
      reused_(other.reused_),
      buffer_(std::move(other.buffer_)) {
  other.fd_ = -1;
}

void http_client::close() {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
  reused_ = false;
  buffer_.clear();
}

void http_client::connect() {
  if (fd_ < 0)
    fd_ = open_socket(host_, port_);
}

void http_client::write_all(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

bool http_client::fill() {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline_ - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw std::runtime_error("no complete HTTP response from port " + std::to_string(port_)
                               + " within " + std::to_string(timeout.count()) + " ms");
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      continue; // the deadline check above decides
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == ECONNRESET)
      return false;
    if (n < 0)
      throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
    if (n == 0)
      return false;
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }
}

http_response http_client::read_response() {
  size_t header_end;
  while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) {
      if (buffer_.empty())
        throw closed_before_response{};
      throw std::runtime_error("the server closed the connection inside response headers");
    }
  }
  http_response r;
  std::string_view head(buffer_.data(), header_end);
  auto line_end = head.find("\r\n");
  std::string_view status_line = head.substr(0, line_end);
  if (status_line.substr(0, 5) != "HTTP/" || status_line.size() < 12)
    throw std::runtime_error("not an HTTP status line: " + std::string(status_line));
  r.status = std::atoi(std::string(status_line.substr(9, 3)).c_str());
  size_t at = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (at < head.size()) {
    auto end = head.find("\r\n", at);
    if (end == std::string_view::npos)
      end = head.size();
    auto line = head.substr(at, end - at);
    auto colon = line.find(':');
    if (colon != std::string_view::npos)
      r.headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
    at = end + 2;
  }
  buffer_.erase(0, header_end + 4);

  auto need = [&](size_t bytes) {
    while (buffer_.size() < bytes)
      if (!fill())
        throw std::runtime_error("the server closed the connection inside a response body");
  };
  if (lower(r.header("transfer-encoding")).find("chunked") != std::string::npos) {
    for (;;) {
      size_t eol;
      while ((eol = buffer_.find("\r\n")) == std::string::npos)
        need(buffer_.size() + 1);
      size_t size = std::strtoull(buffer_.c_str(), nullptr, 16);
      buffer_.erase(0, eol + 2);
      if (size == 0) {
        // Trailers (none expected) end with an empty line.
        while ((eol = buffer_.find("\r\n")) == std::string::npos)
          need(buffer_.size() + 1);
        buffer_.erase(0, eol + 2);
        break;
      }
      need(size + 2);
      r.body.append(buffer_, 0, size);
      buffer_.erase(0, size + 2);
    }
  } else if (!r.header("content-length").empty()) {
    size_t size = std::strtoull(r.header("content-length").c_str(), nullptr, 10);
    need(size);
    r.body = buffer_.substr(0, size);
    buffer_.erase(0, size);
  } else {
    // No length: the body runs to the end of the connection.
    while (fill()) {
    }
    r.body = std::move(buffer_);
    buffer_.clear();
    close();
    return r;
  }
  if (lower(r.header("connection")) == "close")
    close();
  else
    reused_ = true;
  return r;
}

http_response http_client::raw_request(std::string_view bytes) {
  for (int attempt = 0;; ++attempt) {
    deadline_ = std::chrono::steady_clock::now() + timeout;
    connect();
    bool was_reused = reused_;
    // Only a kept-alive connection the server closed while idle is retried:
    // the write fails or the read ends before the first byte.
    try {
      write_all(bytes);
    } catch (const std::runtime_error&) {
      close();
      if (!was_reused || attempt > 0)
        throw;
      continue;
    }
    try {
      return read_response();
    } catch (const closed_before_response&) {
      close();
      if (!was_reused || attempt > 0)
        throw std::runtime_error("the server closed the connection without answering");
    } catch (...) {
      close();
      throw;
    }
  }
}

http_response http_client::request(const http_request& req) {
  std::string out = req.method + " " + req.path + " HTTP/1.1\r\nHost: " + host_ + ":"
                    + std::to_string(port_) + "\r\n";
  for (const auto& [name, value] : req.headers)
    out += name + ": " + value + "\r\n";
  if (!req.body.empty() || req.method == "POST" || req.method == "PUT")
    out += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
  out += "\r\n";
  out += req.body;
  return raw_request(out);
}

http_response http_client::get(const std::string& path) {
  return request({"GET", path, "", {}});
}

http_response http_client::post(const std::string& path, std::string body, header_list headers) {
  return request({"POST", path, std::move(body), std::move(headers)});
}

bool can_connect(uint16_t port) {
  try {
    int fd = open_socket("127.0.0.1", port);
    ::close(fd);
    return true;
  } catch (const std::runtime_error&) {
    return false;
  }
}

} // namespace caf_serving::support
