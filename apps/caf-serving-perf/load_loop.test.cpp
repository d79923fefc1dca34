#include "load_loop.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace caf_serving::perf;

namespace {

/// A server that answers one request per connection and then closes it,
/// although its answer says Keep-Alive: what llama.cpp's server does after a
/// streamed answer.
class one_answer_server {
public:
  one_answer_server() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 64);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }

  ~one_answer_server() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }

  uint16_t port() const {
    return port_;
  }
  int connections() const {
    return connections_;
  }

private:
  void serve() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0)
        return;
      ++connections_;
      std::string got;
      char buf[4096];
      // The request has no body: it ends at the blank line.
      while (got.find("\r\n\r\n") == std::string::npos) {
        auto n = recv(c, buf, sizeof(buf), 0);
        if (n <= 0)
          break;
        got.append(buf, static_cast<std::size_t>(n));
      }
      std::string answer = "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\n"
                           "Content-Length: 2\r\n\r\nok";
      send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      // Let the client send its next request on this connection first.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      close(c);
    }
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

} // namespace

TEST_CASE("a request on a kept-alive connection the server closed goes again on a new one") {
  one_answer_server server;
  load_loop loop{{endpoint{"127.0.0.1", server.port()},
                  {build_request("GET", "/", "h", "", "")}}};
  REQUIRE(loop.start_closed(1).empty());
  loop.run_until(now_ns() + 300'000'000);
  auto done = loop.take_completions();
  loop.stop(1'000'000'000);
  REQUIRE(done.size() >= 5);
  int failed = 0;
  for (const auto& d : done)
    failed += d.status != 200;
  // Every answer is a success: the server's close is not the request's fault.
  CHECK(failed == 0);
  // One connection per answer.
  CHECK(server.connections() >= static_cast<int>(done.size()));
}
