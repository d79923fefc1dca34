#include "http.hpp"

#include <cerrno>
#include <cstring>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

namespace caf_serving::perf {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z')
      x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z')
      y = static_cast<char>(y - 'A' + 'a');
    if (x != y)
      return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool parse_size(std::string_view s, int base, std::size_t& out) {
  if (s.empty())
    return false;
  std::size_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return false;
    v = v * static_cast<std::size_t>(base) + static_cast<std::size_t>(d);
  }
  out = v;
  return true;
}

http_response malformed(std::string what) {
  http_response r;
  r.state = parse_state::malformed;
  r.error = std::move(what);
  return r;
}

/// Decodes a chunked body starting at `pos`; sets `consumed` on success.
http_response parse_chunked(std::string_view buf, std::size_t pos,
                            http_response r) {
  std::string body;
  for (;;) {
    auto eol = buf.find("\r\n", pos);
    if (eol == std::string_view::npos)
      return http_response{};
    auto size_text = buf.substr(pos, eol - pos);
    if (auto semi = size_text.find(';'); semi != std::string_view::npos)
      size_text = size_text.substr(0, semi);
    std::size_t size = 0;
    if (!parse_size(trim(size_text), 16, size))
      return malformed("bad chunk size line");
    pos = eol + 2;
    if (size == 0) {
      // Trailers (usually none) end with an empty line.
      for (;;) {
        auto end = buf.find("\r\n", pos);
        if (end == std::string_view::npos)
          return http_response{};
        bool empty = end == pos;
        pos = end + 2;
        if (empty)
          break;
      }
      r.state = parse_state::complete;
      r.consumed = pos;
      r.decoded_body = std::move(body);
      r.chunked = true;
      return r;
    }
    if (buf.size() < pos + size + 2)
      return http_response{};
    body.append(buf.data() + pos, size);
    pos += size + 2;
  }
}

} // namespace

http_response parse_response(std::string_view buf) {
  auto header_end = buf.find("\r\n\r\n");
  if (header_end == std::string_view::npos) {
    if (buf.size() > 64 * 1024)
      return malformed("response header longer than 64 KiB");
    return http_response{};
  }
  http_response r;
  auto line_end = buf.find("\r\n");
  auto status_line = buf.substr(0, line_end);
  // "HTTP/1.1 200 OK"
  if (status_line.size() < 12 || status_line.substr(0, 5) != "HTTP/")
    return malformed("response does not start with an HTTP status line");
  if (status_line.substr(5, 3) == "1.0")
    r.keep_alive = false;
  std::size_t status = 0;
  if (!parse_size(status_line.substr(9, 3), 10, status))
    return malformed("bad status code in '" + std::string(status_line) + "'");
  r.status = static_cast<int>(status);
  bool chunked = false;
  bool has_length = false;
  std::size_t length = 0;
  std::size_t pos = line_end + 2;
  while (pos < header_end) {
    auto eol = buf.find("\r\n", pos);
    auto line = buf.substr(pos, eol - pos);
    pos = eol + 2;
    auto colon = line.find(':');
    if (colon == std::string_view::npos)
      continue;
    auto name = line.substr(0, colon);
    auto value = trim(line.substr(colon + 1));
    if (iequals(name, "content-length")) {
      if (!parse_size(value, 10, length))
        return malformed("bad Content-Length");
      has_length = true;
    } else if (iequals(name, "transfer-encoding")) {
      chunked = value.find("chunked") != std::string_view::npos;
    } else if (iequals(name, "connection")) {
      if (iequals(value, "close"))
        r.keep_alive = false;
      else if (iequals(value, "keep-alive"))
        r.keep_alive = true;
    }
  }
  auto body_start = header_end + 4;
  if (chunked)
    return parse_chunked(buf, body_start, std::move(r));
  if (!has_length) {
    // 1xx, 204 and 304 have no body; anything else without a length is
    // delimited by the close, which a load generator cannot use.
    if (r.status == 204 || r.status == 304 || r.status < 200) {
      length = 0;
    } else {
      return malformed("response has neither Content-Length nor chunked "
                       "encoding");
    }
  }
  if (buf.size() < body_start + length)
    return http_response{};
  r.state = parse_state::complete;
  r.raw_body = buf.substr(body_start, length);
  r.consumed = body_start + length;
  return r;
}

parsed_endpoint parse_endpoint(std::string_view text) {
  parsed_endpoint result;
  if (text.substr(0, 7) == "http://")
    text.remove_prefix(7);
  while (!text.empty() && text.back() == '/')
    text.remove_suffix(1);
  if (text.empty()) {
    result.error = "empty server address; give -u HOST:PORT";
    return result;
  }
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    result.value.host = std::string(text);
    return result;
  }
  std::size_t port = 0;
  if (!parse_size(text.substr(colon + 1), 10, port) || port == 0
      || port > 65535) {
    result.error = "bad port in server address '" + std::string(text)
                   + "'; expected HOST:PORT such as localhost:8000";
    return result;
  }
  result.value.host = std::string(text.substr(0, colon));
  if (result.value.host.empty())
    result.value.host = "localhost";
  result.value.port = static_cast<uint16_t>(port);
  return result;
}

std::string build_request(std::string_view method, std::string_view path,
                          std::string_view host_header,
                          std::string_view extra_headers,
                          std::string_view body) {
  std::string r;
  r.reserve(128 + extra_headers.size() + body.size());
  r.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: ");
  r.append(host_header).append("\r\n");
  r.append(extra_headers);
  if (!body.empty() || method == "POST") {
    r.append("Content-Length: ").append(std::to_string(body.size()));
    r.append("\r\n");
  }
  r.append("\r\n");
  r.append(body);
  return r;
}

connect_result connect_tcp(const endpoint& ep) {
  connect_result result;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  auto port = std::to_string(ep.port);
  if (int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &list);
      rc != 0) {
    result.error = "cannot resolve host '" + ep.host + "': " + gai_strerror(rc);
    return result;
  }
  std::string last_error = "no address";
  for (auto* ai = list; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    // A blocking connect to a host that drops SYNs would wait minutes; the
    // send timeout bounds connect() on Linux.
    timeval limit{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      freeaddrinfo(list);
      result.fd = fd;
      return result;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(list);
  result.error = "cannot connect to " + ep.host + ":" + std::to_string(ep.port)
                 + ": " + last_error
                 + " (is the server running, and is -u HOST:PORT right?)";
  return result;
}

namespace {

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

} // namespace

control_reply http_exchange(const endpoint& ep, const std::string& request,
                            int timeout_ms) {
  control_reply reply;
  auto conn = connect_tcp(ep);
  if (conn.fd < 0) {
    reply.error = conn.error;
    return reply;
  }
  int fd = conn.fd;
  auto deadline = now_ms() + timeout_ms;
  std::size_t sent = 0;
  while (sent < request.size()) {
    auto n = send(fd, request.data() + sent, request.size() - sent,
                  MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      reply.error = std::string("sending to server failed: ")
                    + std::strerror(errno);
      close(fd);
      return reply;
    }
    sent += static_cast<std::size_t>(n);
  }
  std::string buf;
  char chunk[16384];
  for (;;) {
    auto left = deadline - now_ms();
    if (left <= 0) {
      reply.error = "no answer from " + ep.host + ":" + std::to_string(ep.port)
                    + " within " + std::to_string(timeout_ms) + " ms";
      break;
    }
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc <= 0)
      continue;
    auto n = recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      reply.error = "server closed the connection before answering";
      break;
    }
    buf.append(chunk, static_cast<std::size_t>(n));
    auto r = parse_response(buf);
    if (r.state == parse_state::incomplete)
      continue;
    if (r.state == parse_state::malformed) {
      reply.error = "malformed HTTP response: " + r.error;
      break;
    }
    reply.status = r.status;
    reply.body = std::string(r.body());
    break;
  }
  close(fd);
  return reply;
}

control_reply http_get(const endpoint& ep, std::string_view path,
                       int timeout_ms) {
  auto host = ep.host + ":" + std::to_string(ep.port);
  return http_exchange(ep, build_request("GET", path, host, "", ""),
                       timeout_ms);
}

} // namespace caf_serving::perf
