/// Test harness for caf-serving-perf's integration tests: start a server
/// process and learn its port from its "HTTP listening on 127.0.0.1:PORT"
/// line, run the tool with a time limit, read its JSON, fetch a URL.
/// Header-only because each test file is its own executable.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <simdjson.h>

namespace perf_test {

inline pid_t spawn(const std::vector<std::string>& args, int stdout_fd,
                   int stderr_fd) {
  pid_t pid = fork();
  if (pid == 0) {
    if (stdout_fd >= 0)
      dup2(stdout_fd, 1);
    if (stderr_fd >= 0)
      dup2(stderr_fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::perror("execv");
    _exit(127);
  }
  return pid;
}

/// A server child process, stopped when this object goes.
class server_process {
public:
  /// Starts `args` and waits (up to `timeout_s`) for its listening line.
  explicit server_process(const std::vector<std::string>& args,
                          int timeout_s = 20) {
    int fds[2];
    if (pipe(fds) != 0)
      throw std::runtime_error("pipe failed");
    pid_ = spawn(args, fds[1], -1);
    close(fds[1]);
    out_fd_ = fds[0];
    auto deadline = std::chrono::steady_clock::now()
                    + std::chrono::seconds(timeout_s);
    std::string seen;
    const std::string marker = "HTTP listening on ";
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0)
        continue;
      char buf[512];
      auto n = read(out_fd_, buf, sizeof(buf));
      if (n <= 0)
        break;
      seen.append(buf, static_cast<std::size_t>(n));
      auto at = seen.find(marker);
      auto eol = at == std::string::npos ? at : seen.find('\n', at);
      if (eol != std::string::npos) {
        auto colon = seen.rfind(':', eol);
        if (colon != std::string::npos && colon > at)
          port_ = std::atoi(seen.c_str() + colon + 1);
        break;
      }
    }
    if (port_ <= 0) {
      stop();
      throw std::runtime_error("server '" + args[0]
                               + "' did not print its port; output: " + seen);
    }
    // Keep draining its stdout so that it never blocks on a full pipe.
    fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  }
  ~server_process() {
    stop();
  }
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  int port() const {
    return port_;
  }
  std::string url() const {
    return "127.0.0.1:" + std::to_string(port_);
  }

  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      for (int i = 0; i < 50; ++i) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        usleep(20000);
      }
      if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
      }
    }
    if (out_fd_ >= 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
  }

private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
};

struct tool_run {
  int exit_code = -1;
  bool timed_out = false;
  double seconds = 0;
  std::string out;
  std::string err;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A fresh temporary file name.
inline std::string temp_path(const std::string& suffix) {
  char tmpl[] = "/tmp/caf-serving-perf-test-XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  unlink(tmpl);
  return std::string(tmpl) + suffix;
}

/// Runs the tool with `args`, killing it after `timeout_s`.
inline tool_run run_tool(const std::string& tool,
                         const std::vector<std::string>& args,
                         int timeout_s = 60) {
  tool_run r;
  auto out_path = temp_path(".out");
  auto err_path = temp_path(".err");
  int out_fd = open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  int err_fd = open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  std::vector<std::string> argv{tool};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--no-progress");
  auto start = std::chrono::steady_clock::now();
  pid_t pid = spawn(argv, out_fd, err_fd);
  close(out_fd);
  close(err_fd);
  int status = 0;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      break;
    if (std::chrono::steady_clock::now() - start
        > std::chrono::seconds(timeout_s)) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    usleep(10000);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now()
                                            - start)
                .count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(out_path);
  r.err = read_text(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return r;
}

/// A blocking GET on loopback; returns the body (empty on failure).
inline std::string http_get(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return {};
  }
  std::string req = "GET " + path
                    + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
  [[maybe_unused]] auto w = write(fd, req.data(), req.size());
  std::string resp;
  char buf[65536];
  for (;;) {
    auto n = read(fd, buf, sizeof(buf));
    if (n <= 0)
      break;
    resp.append(buf, static_cast<std::size_t>(n));
    auto head = resp.find("\r\n\r\n");
    if (head == std::string::npos)
      continue;
    auto cl = resp.find("Content-Length: ");
    if (cl != std::string::npos && cl < head) {
      auto len = std::stoul(resp.substr(cl + 16));
      if (resp.size() >= head + 4 + len)
        break;
    }
  }
  close(fd);
  auto head = resp.find("\r\n\r\n");
  return head == std::string::npos ? std::string() : resp.substr(head + 4);
}

/// Arrival times (microseconds) the test endpoint recorded.
inline std::vector<int64_t> endpoint_arrivals(int port) {
  auto body = http_get(port, "/test/arrivals");
  simdjson::dom::parser parser;
  std::vector<int64_t> v;
  auto doc = parser.parse(body);
  if (doc.error())
    return v;
  for (auto x : doc["arrivals_us"].get_array())
    v.push_back(x.get_int64().value());
  return v;
}

/// Mean and coefficient of variation of the gaps between times, and the
/// share of gaps below a multiple of the mean. The shares are the robust
/// view: one scheduler stall on a loaded machine turns a few dozen gaps into
/// one long gap and a run of near-zero ones, which moves the CV a lot (it
/// squares the long gap) but each share by only a few dozen in a thousand.
struct gap_stats {
  double mean = 0;
  double cv = 0;
  /// Share of gaps shorter than multiple * mean.
  double share_below(double multiple) const {
    if (gaps.empty())
      return 0;
    auto limit = multiple * mean;
    auto n = std::count_if(gaps.begin(), gaps.end(),
                           [limit](double g) { return g < limit; });
    return static_cast<double>(n) / static_cast<double>(gaps.size());
  }
  std::vector<double> gaps;
};

inline gap_stats gaps_of(const std::vector<int64_t>& t) {
  gap_stats s;
  if (t.size() < 3)
    return s;
  std::vector<double> g;
  for (std::size_t i = 1; i < t.size(); ++i)
    g.push_back(static_cast<double>(t[i] - t[i - 1]));
  for (auto x : g)
    s.mean += x;
  s.mean /= static_cast<double>(g.size());
  double var = 0;
  for (auto x : g)
    var += (x - s.mean) * (x - s.mean);
  var /= static_cast<double>(g.size());
  s.cv = s.mean > 0 ? std::sqrt(var) / s.mean : 0;
  s.gaps = std::move(g);
  return s;
}

} // namespace perf_test
