/// perf-test-endpoint: a KServe v2 HTTP server with a known, injected service
/// time, for testing caf-serving-perf against numbers fixed in advance.
///
/// One model (default `identity_fp32`: INPUT0 FP32 [-1,16] -> OUTPUT0) served
/// by a single server: requests wait in one FIFO queue and each takes
/// --delay-ms (every --slow-every'th takes --slow-delay-ms instead). Service
/// times are laid out on a virtual timeline (a request starts when the one
/// before it ended), so timer lateness never accumulates and the capacity is
/// exactly 1000/delay requests/s: the knee a latency-target search must find.
///
/// Routes:
///   GET  /                          "ok" at once (for the wrk comparison)
///   GET  /v2/models/M               metadata
///   GET  /v2/models/M/stats         Triton-style statistics
///   POST /v2/models/M/infer         the queued, delayed inference
///   GET  /test/arrivals             arrival times (us) of every infer request
///
/// Prints "HTTP listening on 127.0.0.1:PORT" once ready.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct endpoint_config {
  int port = 0;
  double delay_ms = 0;
  int slow_every = 0;
  double slow_delay_ms = 0;
  int fail_every = 0;
  std::string model = "identity_fp32";
};

struct connection {
  int fd = -1;
  std::string in;
  std::string out;
  bool waiting = false; // a delayed response is pending
  bool want_write = false;
  bool close_after = false;
};

struct delayed_response {
  int64_t due_ns;
  int conn;
  uint64_t generation;
  std::string bytes;
};

struct stat_pair {
  uint64_t count = 0;
  uint64_t ns = 0;
};

struct model_statistics {
  stat_pair success, fail, queue, compute_infer;
};

class endpoint_server {
public:
  explicit endpoint_server(endpoint_config config) : config_(config) {
  }

  int run();

private:
  void accept_all();
  void on_readable(int fd);
  void process(int fd);
  void handle(int fd, std::string_view method, std::string_view path,
              std::string_view headers, std::string_view body);
  void respond(int fd, int status, std::string_view body);
  void flush(int fd);
  void drop(int fd);
  void arm_timer();
  void fire_due();
  std::string infer_error(std::string_view headers, std::string_view body);

  endpoint_config config_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  std::vector<std::unique_ptr<connection>> conns_; // indexed by fd
  std::vector<uint64_t> generation_;                // per fd, bumps on close
  std::deque<delayed_response> delayed_;
  int64_t server_free_ns_ = 0;
  uint64_t infer_count_ = 0;
  model_statistics stats_;
  std::vector<int64_t> arrivals_us_;
};

std::string response_bytes(int status, std::string_view body) {
  const char* reason = status == 200   ? "OK"
                       : status == 400 ? "Bad Request"
                       : status == 404 ? "Not Found"
                                       : "Service Unavailable";
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason
                  + "\r\nContent-Type: application/json\r\nContent-Length: "
                  + std::to_string(body.size()) + "\r\n\r\n";
  r.append(body);
  return r;
}

std::string header_value(std::string_view headers, std::string_view name) {
  std::size_t pos = 0;
  while (pos < headers.size()) {
    auto eol = headers.find("\r\n", pos);
    if (eol == std::string_view::npos)
      eol = headers.size();
    auto line = headers.substr(pos, eol - pos);
    pos = eol + 2;
    if (line.size() > name.size() && line[name.size()] == ':'
        && strncasecmp(line.data(), name.data(), name.size()) == 0) {
      auto v = line.substr(name.size() + 1);
      while (!v.empty() && v.front() == ' ')
        v.remove_prefix(1);
      return std::string(v);
    }
  }
  return {};
}

int endpoint_server::run() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(config_.port));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0
      || listen(listen_fd_, 4096) != 0) {
    std::fprintf(stderr, "perf-test-endpoint: cannot listen on port %d: %s\n",
                 config_.port, std::strerror(errno));
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = timer_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev);
  std::printf("HTTP listening on 127.0.0.1:%d\n", ntohs(addr.sin_port));
  std::fflush(stdout);
  epoll_event events[256];
  for (;;) {
    int n = epoll_wait(epoll_fd_, events, 256, -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        accept_all();
      } else if (fd == timer_fd_) {
        uint64_t x;
        [[maybe_unused]] auto r = read(timer_fd_, &x, sizeof(x));
        fire_due();
      } else {
        if (events[i].events & EPOLLOUT)
          flush(fd);
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
          on_readable(fd);
      }
    }
  }
}

void endpoint_server::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (static_cast<std::size_t>(fd) >= conns_.size()) {
      conns_.resize(static_cast<std::size_t>(fd) + 1);
      generation_.resize(static_cast<std::size_t>(fd) + 1);
    }
    conns_[fd] = std::make_unique<connection>();
    conns_[fd]->fd = fd;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

void endpoint_server::drop(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  conns_[fd].reset();
  ++generation_[fd];
}

void endpoint_server::on_readable(int fd) {
  auto* c = conns_[fd].get();
  if (c == nullptr)
    return;
  char buf[65536];
  for (;;) {
    auto n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c->in.append(buf, static_cast<std::size_t>(n));
      if (static_cast<std::size_t>(n) < sizeof(buf))
        break;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    drop(fd);
    return;
  }
  process(fd);
}

void endpoint_server::process(int fd) {
  for (;;) {
    auto* c = conns_[fd].get();
    if (c == nullptr || c->waiting)
      return;
    auto end = c->in.find("\r\n\r\n");
    if (end == std::string::npos)
      return;
    std::string_view head(c->in.data(), end);
    auto line_end = head.find("\r\n");
    auto request_line = head.substr(0, line_end);
    auto headers = line_end == std::string_view::npos
                     ? std::string_view{}
                     : head.substr(line_end + 2);
    auto length_text = header_value(headers, "Content-Length");
    std::size_t length = length_text.empty() ? 0 : std::stoul(length_text);
    if (c->in.size() < end + 4 + length)
      return;
    auto sp1 = request_line.find(' ');
    auto sp2 = request_line.find(' ', sp1 + 1);
    auto method = request_line.substr(0, sp1);
    auto path = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
    c->close_after = header_value(headers, "Connection") == "close";
    std::string_view body(c->in.data() + end + 4, length);
    handle(fd, method, path, headers, body);
    c = conns_[fd].get();
    if (c == nullptr)
      return;
    c->in.erase(0, end + 4 + length);
  }
}

std::string endpoint_server::infer_error(std::string_view headers,
                                         std::string_view body) {
  auto json_len = header_value(headers, "Inference-Header-Content-Length");
  std::string_view json = body;
  if (!json_len.empty())
    json = body.substr(0, std::min<std::size_t>(std::stoul(json_len),
                                                 body.size()));
  auto s = json.find("\"shape\":[");
  if (s == std::string_view::npos)
    return "request has no input shape";
  auto e = json.find(']', s);
  auto dims = json.substr(s + 9, e - s - 9);
  auto last_comma = dims.rfind(',');
  if (last_comma == std::string_view::npos)
    return "input 'INPUT0' has shape [" + std::string(dims)
           + "] but the model expects [-1,16]";
  auto last = dims.substr(last_comma + 1);
  if (last != "16" || dims.find(',') != last_comma)
    return "input 'INPUT0' has shape [" + std::string(dims)
           + "] but the model expects [-1,16]";
  return {};
}

void endpoint_server::handle(int fd, std::string_view method,
                             std::string_view path, std::string_view headers,
                             std::string_view body) {
  if (path == "/") {
    static constexpr std::string_view ok = "HTTP/1.1 200 OK\r\nContent-Length: "
                                           "2\r\n\r\nok";
    conns_[fd]->out.append(ok);
    flush(fd);
    return;
  }
  std::string prefix = "/v2/models/" + config_.model;
  if (path == "/test/arrivals") {
    std::string j = "{\"count\":" + std::to_string(arrivals_us_.size())
                    + ",\"arrivals_us\":[";
    for (std::size_t i = 0; i < arrivals_us_.size(); ++i)
      j += (i ? "," : "") + std::to_string(arrivals_us_[i]);
    respond(fd, 200, j + "]}");
    return;
  }
  if (path.rfind("/v2/models/", 0) == 0 && path.rfind(prefix, 0) != 0) {
    respond(fd, 404,
            "{\"error\":\"unknown model '" + std::string(path.substr(11)) + "'\"}");
    return;
  }
  auto rest = path.substr(std::min(prefix.size(), path.size()));
  if (method == "GET" && (rest.empty() || rest == "/versions/1")) {
    respond(fd, 200,
            "{\"name\":\"" + config_.model
              + "\",\"versions\":[\"1\"],\"platform\":\"test\",\"inputs\":[{"
                "\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":[-1,16]}"
                "],\"outputs\":[{\"name\":\"OUTPUT0\",\"datatype\":\"FP32\","
                "\"shape\":[-1,16]}]}");
    return;
  }
  if (method == "GET" && rest == "/stats") {
    auto pair = [](const char* k, const stat_pair& p) {
      return std::string("\"") + k + "\":{\"count\":" + std::to_string(p.count)
             + ",\"ns\":" + std::to_string(p.ns) + "}";
    };
    respond(fd, 200,
            "{\"model_stats\":[{\"name\":\"" + config_.model
              + "\",\"version\":\"1\",\"inference_count\":"
              + std::to_string(stats_.success.count)
              + ",\"execution_count\":" + std::to_string(stats_.success.count)
              + ",\"inference_stats\":{" + pair("success", stats_.success)
              + "," + pair("fail", stats_.fail) + ","
              + pair("queue", stats_.queue)
              + ",\"compute_input\":{\"count\":"
              + std::to_string(stats_.success.count) + ",\"ns\":0},"
              + pair("compute_infer", stats_.compute_infer)
              + ",\"compute_output\":{\"count\":"
              + std::to_string(stats_.success.count) + ",\"ns\":0}}}]}");
    return;
  }
  if (method == "POST" && (rest == "/infer" || rest == "/versions/1/infer")) {
    auto arrival = now_ns();
    arrivals_us_.push_back(arrival / 1000);
    ++infer_count_;
    if (auto err = infer_error(headers, body); !err.empty()) {
      ++stats_.fail.count;
      respond(fd, 400, "{\"error\":\"" + err + "\"}");
      return;
    }
    if (config_.fail_every > 0 && infer_count_ % config_.fail_every == 0) {
      ++stats_.fail.count;
      respond(fd, 503, "{\"error\":\"injected failure\"}");
      return;
    }
    bool slow = config_.slow_every > 0
                && infer_count_ % config_.slow_every == 0;
    auto service = static_cast<int64_t>(
      (slow ? config_.slow_delay_ms : config_.delay_ms) * 1e6);
    auto start = std::max(arrival, server_free_ns_);
    auto done = start + service;
    server_free_ns_ = done;
    stats_.success.count++;
    stats_.success.ns += static_cast<uint64_t>(done - arrival);
    stats_.queue.count++;
    stats_.queue.ns += static_cast<uint64_t>(start - arrival);
    stats_.compute_infer.count++;
    stats_.compute_infer.ns += static_cast<uint64_t>(service);
    auto bytes = response_bytes(
      200, "{\"model_name\":\"" + config_.model
             + "\",\"model_version\":\"1\",\"outputs\":[]}");
    if (service == 0) {
      conns_[fd]->out += bytes;
      flush(fd);
      return;
    }
    conns_[fd]->waiting = true;
    delayed_.push_back({done, fd, generation_[fd], std::move(bytes)});
    if (delayed_.size() == 1)
      arm_timer();
    return;
  }
  respond(fd, 404, "{\"error\":\"no route " + std::string(method) + " "
                     + std::string(path) + "\"}");
}

void endpoint_server::respond(int fd, int status, std::string_view body) {
  conns_[fd]->out += response_bytes(status, body);
  flush(fd);
}

void endpoint_server::flush(int fd) {
  auto* c = conns_[fd].get();
  if (c == nullptr)
    return;
  while (!c->out.empty()) {
    auto n = send(fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c->out.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c->want_write) {
        c->want_write = true;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.fd = fd;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
      }
      return;
    }
    drop(fd);
    return;
  }
  if (c->want_write) {
    c->want_write = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }
  if (c->close_after)
    drop(fd);
}

void endpoint_server::arm_timer() {
  if (delayed_.empty())
    return;
  itimerspec spec{};
  auto at = delayed_.front().due_ns;
  spec.it_value.tv_sec = at / 1'000'000'000;
  spec.it_value.tv_nsec = at % 1'000'000'000;
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0)
    spec.it_value.tv_nsec = 1;
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void endpoint_server::fire_due() {
  auto now = now_ns();
  while (!delayed_.empty() && delayed_.front().due_ns <= now) {
    auto d = std::move(delayed_.front());
    delayed_.pop_front();
    if (generation_[d.conn] != d.generation || !conns_[d.conn])
      continue; // the client went away
    auto* c = conns_[d.conn].get();
    c->waiting = false;
    c->out += d.bytes;
    flush(d.conn);
    if (conns_[d.conn])
      process(d.conn);
  }
  arm_timer();
}

} // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  endpoint_config config;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "perf-test-endpoint: %s needs a value\n", argv[i]);
      return 1;
    }
    std::string value = argv[++i];
    if (flag == "--port")
      config.port = std::atoi(value.c_str());
    else if (flag == "--delay-ms")
      config.delay_ms = std::atof(value.c_str());
    else if (flag == "--slow-every")
      config.slow_every = std::atoi(value.c_str());
    else if (flag == "--slow-delay-ms")
      config.slow_delay_ms = std::atof(value.c_str());
    else if (flag == "--fail-every")
      config.fail_every = std::atoi(value.c_str());
    else if (flag == "--model")
      config.model = value;
    else {
      std::fprintf(stderr,
                   "perf-test-endpoint: unknown option %s; options: --port N "
                   "--delay-ms D --slow-every N --slow-delay-ms D "
                   "--fail-every N --model NAME\n",
                   flag.c_str());
      return 1;
    }
  }
  endpoint_server server(config);
  return server.run();
}
