/// Clients that misbehave cost the server nothing lasting: a body cut off
/// half-way, an oversized header, an idle or slow connection and one
/// connection too many are each closed (with a 4xx or 503 where an answer
/// helps), no file descriptor or thread is left behind, and well-behaved
/// clients are still served. Also: a port that cannot be bound is named in the
/// start-up error.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;

namespace {

/// A TCP connection to 127.0.0.1 that writes exactly what it is given and
/// reads with a deadline, for requests no well-behaved client would send.
class raw_connection {
public:
  explicit raw_connection(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0)
      throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      int err = errno;
      ::close(fd_);
      throw std::runtime_error(std::string("connect: ") + std::strerror(err));
    }
  }
  ~raw_connection() { close(); }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;

  /// Writes all of `bytes`; false when the server has closed the connection.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  void close() {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

  /// What the server sent until it closed the connection (eof) or `timeout`
  /// passed, or until `enough(received)` holds.
  struct reply {
    std::string bytes;
    bool eof = false;
  };
  reply read(milliseconds timeout,
             const std::function<bool(const std::string&)>& enough = nullptr) {
    reply r;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (enough && enough(r.bytes))
        return r;
      auto left = std::chrono::duration_cast<milliseconds>(deadline
                                                           - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return r;
      pollfd p{fd_, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n <= 0)
        continue;
      char buf[65536];
      ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0) {
        r.eof = true;
        return r;
      }
      r.bytes.append(buf, static_cast<size_t>(got));
    }
  }

  /// One whole response with a Content-Length (the server always sends one).
  reply read_response(milliseconds timeout) {
    return read(timeout, [](const std::string& s) {
      auto end = s.find("\r\n\r\n");
      if (end == std::string::npos)
        return false;
      auto at = s.find("Content-Length: ");
      if (at == std::string::npos || at > end)
        at = s.find("content-length: ");
      if (at == std::string::npos || at > end)
        return true;
      return s.size() >= end + 4 + std::strtoull(s.c_str() + at + 16, nullptr, 10);
    });
  }

private:
  int fd_ = -1;
};

int status_of(const std::string& response) {
  if (response.size() < 12 || response.compare(0, 5, "HTTP/") != 0)
    return 0;
  return std::atoi(response.c_str() + 9);
}

size_t entries(const std::filesystem::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

size_t open_fds(pid_t pid) {
  return entries("/proc/" + std::to_string(pid) + "/fd");
}

size_t threads(pid_t pid) {
  return entries("/proc/" + std::to_string(pid) + "/task");
}

const std::string live_request = "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n";

std::string identity_request(const std::string& body) {
  return "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
         "Content-Type: application/json\r\nContent-Length: "
         + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string good_body() {
  return fp32_identity_body(std::vector<float>(16, 0.5f), 1);
}

/// A free loopback port, held by a listening socket while the object lives.
class held_port {
public:
  held_port() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0
        || listen(fd_, 4) != 0)
      throw std::runtime_error(std::string("cannot hold a port: ") + std::strerror(errno));
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~held_port() { ::close(fd_); }
  uint16_t port() const { return port_; }

private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

/// Runs caf-serving with `args` and returns its exit status and its stdout
/// and stderr together; it must exit within 20 s.
std::pair<int, std::string> run_to_exit(std::vector<std::string> args) {
  temp_repository repo;
  repo.add_model(example_model("identity_fp32"));
  std::vector<std::string> argv{CAF_SERVING_BINARY, "--model-repository", repo.path().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  child_process child({argv, true});
  auto status = child.wait_exit(milliseconds(20000));
  if (!status) {
    child.kill_and_wait();
    return {-1, child.output()};
  }
  child.wait_until(milliseconds(2000), [](const std::string&) { return false; });
  return {*status, child.output()};
}

} // namespace

TEST_CASE("a metrics port that is taken is named as the metrics port, an HTTP port as HTTP") {
  held_port taken;
  auto port = std::to_string(taken.port());
  auto [status, out] = run_to_exit({"--http-address", "127.0.0.1", "--http-port", "0",
                                    "--metrics-port", port});
  CHECK(status == 1);
  CHECK_MESSAGE(out.find("metrics port " + port) != std::string::npos, out);
  CHECK_MESSAGE(out.find("HTTP port") == std::string::npos, out);
  // The kj exception's text (file names, line numbers) stays out of it.
  CHECK_MESSAGE(out.find(".c++") == std::string::npos, out);

  std::tie(status, out) = run_to_exit({"--http-address", "127.0.0.1", "--http-port", port,
                                       "--metrics-port", "0", "--grpc-port", "0"});
  CHECK(status == 1);
  CHECK_MESSAGE(out.find("HTTP port " + port) != std::string::npos, out);
  CHECK_MESSAGE(out.find("metrics port") == std::string::npos, out);
}

TEST_CASE("--worker with port 0 is an option error, not an abort") {
  // With a secret, start-up got as far as connecting, and aborted there with
  // bad_variant_access (exit 134).
  setenv("CAF_SERVING_CLUSTER_SECRET", "a-test-secret-of-enough-length-0123456789", 1);
  auto [status, out] = run_to_exit({"--worker", "127.0.0.1:0"});
  unsetenv("CAF_SERVING_CLUSTER_SECRET");
  CHECK_MESSAGE(status == 2, out);
  CHECK_MESSAGE(out.find("--worker") != std::string::npos, out);
  CHECK_MESSAGE(out.find("127.0.0.1:0") != std::string::npos, out);
  CHECK(out.find("bad_variant_access") == std::string::npos);
}

TEST_CASE("bodies cut off half-way, 200 times: nothing leaks, nothing is counted as 413") {
  test_server server({example_model("identity_fp32")});
  auto pid = server.process->pid();
  auto http = server.client();
  REQUIRE(http.post("/v2/models/identity_fp32/infer", good_body(), json_content).status == 200);
  http.close();
  // Every connection of the warm-up has been closed by now or soon.
  size_t fd_baseline = 0;
  REQUIRE(eventually([&] {
    auto a = open_fds(pid);
    std::this_thread::sleep_for(milliseconds(50));
    fd_baseline = open_fds(pid);
    return a == fd_baseline;
  }));
  auto thread_baseline = threads(pid);

  auto body = good_body();
  for (int i = 0; i < 200; ++i) {
    raw_connection c(server.port());
    // The headers promise the whole body; half of it comes, then the client
    // is gone (half of them close at once, half shut down writing first).
    c.send(identity_request(body).substr(0, identity_request(body).size() - body.size() / 2));
    if (i % 2)
      c.shutdown_write();
    c.close();
  }
  CHECK_MESSAGE(eventually([&] { return open_fds(pid) <= fd_baseline; }, milliseconds(10000)),
                "open fds: " << open_fds(pid) << ", before: " << fd_baseline);
  CHECK(threads(pid) == thread_baseline);
  // Nothing stays pending: a request whose client left is done once kj has
  // dropped its promise, which may come an event after its socket is closed.
  std::string metrics;
  CHECK_MESSAGE(eventually([&] {
                  metrics = http_client(server.process->metrics_port()).get("/metrics").body;
                  return metric_value(metrics, "caf_serving_pending_request_count{model="
                                               "\"identity_fp32\",version=\"1\"}")
                         == 0;
                }, milliseconds(3000)),
                "pending requests stay above 0");
  // A client that went away is not a request too large (it was 413 before).
  CHECK(metric_value(metrics, "caf_serving_inference_request_failure{model=\"identity_fp32\","
                              "version=\"1\",reason=\"bad_request\"}")
        <= 0);
  http_client after(server.port());
  CHECK(after.post("/v2/models/identity_fp32/infer", good_body(), json_content).status == 200);
}

TEST_CASE("a body shorter than its Content-Length, then end of input: no answer at all") {
  test_server server({example_model("identity_fp32")});
  raw_connection c(server.port());
  auto body = good_body();
  auto request = identity_request(body);
  c.send(request.substr(0, request.size() - 10));
  c.shutdown_write();
  auto r = c.read(milliseconds(5000));
  CHECK(r.eof);
  CHECK_MESSAGE(r.bytes.empty(), r.bytes);
}

TEST_CASE("a header over --max-header-bytes is a 431 and the connection is closed") {
  test_server server({example_model("identity_fp32")}, {"--max-header-bytes", "8192"});
  {
    raw_connection c(server.port());
    c.send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(20000, 'a')
           + "\r\n\r\n");
    auto r = c.read(milliseconds(5000));
    CHECK_MESSAGE(status_of(r.bytes) == 431, r.bytes);
    CHECK(r.bytes.find("--max-header-bytes") != std::string::npos);
    CHECK(r.eof);
  }
  {
    // Past what kj itself buffers (128 KiB): closed at the least, never
    // buffered without bound.
    raw_connection c(server.port());
    c.send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(300000, 'a')
           + "\r\n\r\n");
    auto r = c.read(milliseconds(5000));
    CHECK(r.eof);
    if (!r.bytes.empty())
      CHECK_MESSAGE(status_of(r.bytes) == 431, r.bytes);
  }
  // Headers under the limit still work, also with the same server afterwards.
  raw_connection c(server.port());
  c.send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(4000, 'a')
         + "\r\n\r\n");
  CHECK(status_of(c.read_response(milliseconds(5000)).bytes) == 200);
  http_client http(server.port());
  CHECK(http.post("/v2/models/identity_fp32/infer", good_body(), json_content).status == 200);
}

TEST_CASE("--idle-timeout-ms closes an idle keep-alive connection, --header-timeout-ms a slow one") {
  test_server server({example_model("identity_fp32")},
                     {"--idle-timeout-ms", "200", "--header-timeout-ms", "300"});
  raw_connection idle(server.port());
  idle.send(live_request);
  auto first = idle.read_response(milliseconds(5000));
  REQUIRE(status_of(first.bytes) == 200);
  auto started = std::chrono::steady_clock::now();
  auto r = idle.read(milliseconds(3000));
  CHECK(r.eof);
  CHECK(std::chrono::steady_clock::now() - started < milliseconds(2000));

  // Slowloris: headers that never end.
  raw_connection slow(server.port());
  slow.send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\n");
  started = std::chrono::steady_clock::now();
  r = slow.read(milliseconds(3000));
  CHECK(r.eof);
  CHECK(std::chrono::steady_clock::now() - started < milliseconds(2000));
  http_client http(server.port());
  CHECK(http.get("/v2/health/live").status == 200);
}

namespace {

/// Connections open on the server's HTTP port, from /metrics on its metrics
/// port (whose own connections are counted apart).
double open_connections(const test_server& server) {
  http_client m(server.process->metrics_port());
  return metric_value(m.get("/metrics").body, "caf_serving_http_connections_open");
}

/// `extra`: flags for the server besides --max-connections 4.
void check_max_connections(std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--max-connections", "4"});
  test_server server({example_model("identity_fp32")}, extra);
  std::vector<std::unique_ptr<raw_connection>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(std::make_unique<raw_connection>(server.port()));
    open.back()->send(live_request);
    REQUIRE(status_of(open.back()->read_response(milliseconds(5000)).bytes) == 200);
  }
  {
    raw_connection fifth(server.port());
    fifth.send(live_request);
    auto r = fifth.read(milliseconds(5000));
    CHECK(r.eof);
    CHECK_MESSAGE(status_of(r.bytes) == 503, r.bytes);
    CHECK(r.bytes.find("--max-connections") != std::string::npos);
  }
  // The four still work, and the server counts them.
  for (auto& c : open) {
    c->send(live_request);
    CHECK(status_of(c->read_response(milliseconds(5000)).bytes) == 200);
  }
  CHECK(open_connections(server) == 4);
  // Once they are closed (the server sees each close on the loop that serves
  // it, some time after the client's), the port serves four again.
  open.clear();
  CHECK(eventually([&] { return open_connections(server) == 0; }, milliseconds(5000)));
  std::vector<std::unique_ptr<raw_connection>> again;
  for (int i = 0; i < 4; ++i) {
    again.push_back(std::make_unique<raw_connection>(server.port()));
    again.back()->send(live_request);
    CHECK(status_of(again.back()->read_response(milliseconds(5000)).bytes) == 200);
  }
}

} // namespace

TEST_CASE("--max-connections: one connection too many gets a 503 and is closed") {
  check_max_connections({});
}

TEST_CASE("2 HTTP loops: --max-connections counts the connections of every loop together") {
  // Counted per loop, 4 would let 8 in.
  check_max_connections({"--http-threads", "2"});
}
