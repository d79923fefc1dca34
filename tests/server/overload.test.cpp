/// Overload and soak (issue 14): the real server under open-loop Poisson load.
///
/// The model is a builtin identity whose every batch takes 20 ms, with at most
/// 4 rows a batch and one instance, so it serves about 200 rows a second; the
/// server runs with --max-queue-size 32.
///
/// - Overload: 10x that capacity. The server must stay responsive (a health
///   probe on its own connection), answer every request either 200 with its
///   own values or 503 at once, keep admitted requests within what a queue of
///   32 allows, and keep its memory, descriptors and threads bounded.
/// - Soak: 80% of capacity from well-behaved clients, mixed with clients that
///   send half a request and vanish, send 100 KB of header, or connect and
///   hold the connection idle. No well-behaved request may be lost or wrong,
///   and memory, descriptors and threads must not grow.
///
/// Each run lasts CAF_SERVING_OVERLOAD_SECONDS / CAF_SERVING_SOAK_SECONDS
/// (5 by default, for CI); bench/overload/run sets them to minutes and copies
/// the "FIGURES" lines printed here into bench/RESULTS.md. Latencies count
/// from when a request was due, not from when a client thread got to send it,
/// so a client that falls behind cannot hide queueing.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

// -- the model ---------------------------------------------------------------

constexpr const char* model_name = "overload";
constexpr int max_queue_size = 32;
constexpr int max_batch_rows = 4;
constexpr int batch_delay_us = 20000;
/// Rows a second the single instance serves when every batch is full.
constexpr double capacity_rows_per_s = max_batch_rows * 1e6 / batch_delay_us;

std::vector<std::string> server_flags() {
  return {"--max-queue-size", std::to_string(max_queue_size)};
}

void add_overload_model(temp_repository& repo) {
  repo.write_file(std::string(model_name) + "/config.pbtxt",
                  "name: \"" + std::string(model_name)
                    + "\"\nbackend: \"builtin\"\nmax_batch_size: "
                    + std::to_string(max_batch_rows)
                    + "\ninput [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                      "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                      "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                      "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
                      "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
                      "parameters { key: \"delay_us\" value: { string_value: \""
                    + std::to_string(batch_delay_us) + "\" } }\n");
  repo.write_file(std::string(model_name) + "/1/model.builtin", "builtin: no model file\n");
}

/// The server with the model, started on a fresh repository.
struct overload_server {
  temp_repository repo;
  std::unique_ptr<server_process> process;

  overload_server() {
    add_overload_model(repo);
    process = std::make_unique<server_process>(
      server_config{CAF_SERVING_BINARY, repo.path().string(), server_flags()});
  }
  uint16_t port() const { return process->http_port(); }
};

/// Four values no other request of the run has.
std::vector<float> request_values(int tag) {
  auto t = static_cast<float>(tag);
  return {t, t + 0.5f, -t, 0.25f};
}

int env_seconds(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0')
    return fallback;
  int value = std::atoi(text);
  REQUIRE_MESSAGE(value > 0, name << " must be a positive number of seconds, not '" << text
                                  << "'");
  return value;
}

double ms_since(steady_clock::time_point from, steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// -- latency figures -----------------------------------------------------------

/// The nearest-rank percentile `p` (0..100) of `values`; 0 when empty.
double percentile(std::vector<double> values, double p) {
  if (values.empty())
    return 0;
  std::sort(values.begin(), values.end());
  auto rank = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

std::string fixed(double v, int digits = 1) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(digits);
  out << v;
  return out.str();
}

// -- /proc ---------------------------------------------------------------------

struct proc_sample {
  double at_s = 0;
  long rss_kb = -1;
  long fds = -1;
  long threads = -1;
  /// utime + stime in clock ticks.
  long cpu_ticks = -1;
};

long count_entries(const fs::path& dir) {
  std::error_code ec;
  long n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

long cpu_ticks_of(const std::string& pid) {
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // The command name may hold spaces; the fields after it are space-separated:
  // state is field 3, utime 14 and stime 15.
  auto close = text.rfind(')');
  if (close == std::string::npos)
    return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14)
      utime = std::atol(field.c_str());
    if (i == 15)
      stime = std::atol(field.c_str());
  }
  return utime + stime;
}

proc_sample sample_process(pid_t pid, steady_clock::time_point t0) {
  proc_sample s;
  s.at_s = ms_since(t0, steady_clock::now()) / 1000;
  auto dir = "/proc/" + std::to_string(pid);
  std::ifstream status(dir + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0)
      s.rss_kb = std::atol(line.c_str() + 6);
  s.fds = count_entries(dir + "/fd");
  s.threads = count_entries(dir + "/task");
  s.cpu_ticks = cpu_ticks_of(std::to_string(pid));
  return s;
}


/// Samples the server's RSS, descriptors and threads once a second, and this
/// test process's CPU time alongside, so a run can tell whether the server or
/// its own clients used the machine.
class process_sampler {
public:
  process_sampler(pid_t pid, steady_clock::time_point t0) : pid_(pid), t0_(t0) {
    self_ticks_at_start_ = cpu_ticks_of("self");
    samples_.push_back(sample_process(pid_, t0_));
    thread_ = std::thread([this] { run(); });
  }
  ~process_sampler() { stop(); }

  void stop() {
    if (!thread_.joinable())
      return;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    samples_.push_back(sample_process(pid_, t0_));
    self_ticks_at_end_ = cpu_ticks_of("self");
  }

  /// After stop(): every sample, the first taken at construction and the
  /// last at stop().
  const std::vector<proc_sample>& samples() const { return samples_; }

  /// The first sample at or after `at_s` seconds.
  const proc_sample& sample_after(double at_s) const {
    for (const auto& s : samples_)
      if (s.at_s >= at_s)
        return s;
    return samples_.back();
  }

  /// The last sample at or before `at_s` seconds.
  const proc_sample& sample_before(double at_s) const {
    for (auto it = samples_.rbegin(); it != samples_.rend(); ++it)
      if (it->at_s <= at_s)
        return *it;
    return samples_.front();
  }

  /// CPU used over the whole sampling, in percent of one core.
  double server_cpu_percent() const { return percent(samples_.front().cpu_ticks, samples_.back().cpu_ticks); }
  double test_cpu_percent() const { return percent(self_ticks_at_start_, self_ticks_at_end_); }

  long max_rss_kb() const { return max_of(&proc_sample::rss_kb); }
  long max_fds() const { return max_of(&proc_sample::fds); }
  long max_threads() const { return max_of(&proc_sample::threads); }

private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; }))
      samples_.push_back(sample_process(pid_, t0_));
  }

  long max_of(long proc_sample::*field) const {
    long m = 0;
    for (const auto& s : samples_)
      m = std::max(m, s.*field);
    return m;
  }

  double percent(long from, long to) const {
    double seconds = samples_.back().at_s - samples_.front().at_s;
    if (seconds <= 0)
      return 0;
    return 100.0 * static_cast<double>(to - from) / static_cast<double>(sysconf(_SC_CLK_TCK))
           / seconds;
  }

  pid_t pid_;
  steady_clock::time_point t0_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<proc_sample> samples_;
  long self_ticks_at_start_ = 0;
  long self_ticks_at_end_ = 0;
  std::thread thread_;
};

// -- health probe ---------------------------------------------------------------

/// GET /v2/health/ready every 50 ms on a connection of its own.
class health_probe {
public:
  explicit health_probe(uint16_t port) : http_(port) {
    http_.timeout = milliseconds(5000);
    thread_ = std::thread([this] { run(); });
  }
  ~health_probe() { stop(); }

  /// Stops probing and closes the probe's connection.
  void stop() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
    http_.close();
  }

  /// After stop().
  const std::vector<double>& latencies_ms() const { return latencies_ms_; }
  /// Probes not answered 200, and why.
  const std::vector<std::string>& failures() const { return failures_; }

private:
  void run() {
    auto next = steady_clock::now();
    while (!stop_) {
      auto sent = steady_clock::now();
      try {
        auto r = http_.get("/v2/health/ready");
        latencies_ms_.push_back(ms_since(sent, steady_clock::now()));
        if (r.status != 200)
          failures_.push_back("status " + std::to_string(r.status) + ": " + r.body);
      } catch (const std::exception& e) {
        latencies_ms_.push_back(ms_since(sent, steady_clock::now()));
        failures_.push_back(e.what());
      }
      next += milliseconds(50);
      std::this_thread::sleep_until(std::max(next, steady_clock::now()));
    }
  }

  http_client http_;
  std::atomic<bool> stop_{false};
  std::vector<double> latencies_ms_;
  std::vector<std::string> failures_;
  std::thread thread_;
};

// -- open-loop load --------------------------------------------------------------

struct open_loop_config {
  uint16_t port = 0;
  /// Mean requests a second, Poisson arrivals.
  double rate = 0;
  std::chrono::seconds duration{5};
  /// Client threads, each with one keep-alive connection: a request due
  /// while all are busy waits for one, and its latency includes the wait.
  size_t connections = 64;
  uint64_t seed = 1;
};

/// What happened to one request.
struct outcome {
  /// The HTTP status; 0 when no answer came (the request is lost).
  int status = 0;
  /// From when it was due to the answer's last byte.
  double latency_ms = 0;
  /// From when a client thread sent it (the part the server is answerable for).
  double service_ms = 0;
  /// Why a 200 was wrong or no answer came; empty when fine.
  std::string error;
};

struct open_loop_result {
  std::vector<outcome> outcomes;
  /// Requests that waited for a free client thread, and the longest wait.
  size_t waited = 0;
  double longest_wait_ms = 0;
  /// When the first request could be due, and when the last one was.
  steady_clock::time_point started;
  steady_clock::time_point last_due;

  std::vector<double> latencies(int status) const {
    std::vector<double> out;
    for (const auto& o : outcomes)
      if (o.status == status)
        out.push_back(o.latency_ms);
    return out;
  }
  std::vector<double> service_times(int status) const {
    std::vector<double> out;
    for (const auto& o : outcomes)
      if (o.status == status)
        out.push_back(o.service_ms);
    return out;
  }
  size_t count(int status) const {
    return static_cast<size_t>(std::count_if(outcomes.begin(), outcomes.end(),
                                             [&](const outcome& o) { return o.status == status; }));
  }
  /// Requests lost or answered wrongly, a few of them described.
  size_t failures(std::string& examples) const {
    size_t n = 0;
    for (const auto& o : outcomes)
      if (!o.error.empty()) {
        if (++n <= 5)
          examples += o.error + "\n";
      }
    return n;
  }
};

/// One request of the run, answered and checked by one client thread.
outcome send_one(http_client& http, int tag, steady_clock::time_point due) {
  outcome o;
  auto values = request_values(tag);
  auto sent = steady_clock::now();
  try {
    auto r = http.post(std::string("/v2/models/") + model_name + "/infer",
                       fp32_identity_body(values, 1), json_content);
    auto done = steady_clock::now();
    o.status = r.status;
    o.latency_ms = ms_since(due, done);
    o.service_ms = ms_since(sent, done);
    if (r.status == 200) {
      auto got = fp32_output(json_document::parse(r.body));
      if (got != values)
        o.error = "request " + std::to_string(tag) + " got " + json_list(got) + " instead of "
                  + json_list(values);
    } else if (r.status != 503) {
      o.error = "request " + std::to_string(tag) + ": status " + std::to_string(r.status)
                + ": " + r.body;
    }
  } catch (const std::exception& e) {
    auto done = steady_clock::now();
    o.status = 0;
    o.latency_ms = ms_since(due, done);
    o.service_ms = ms_since(sent, done);
    o.error = "request " + std::to_string(tag) + " lost after " + fixed(o.service_ms)
              + " ms: " + e.what();
    http.close();
  }
  return o;
}

/// Sends Poisson arrivals at `config.rate` for `config.duration`, then waits
/// for every answer.
open_loop_result run_open_loop(const open_loop_config& config) {
  struct job {
    int tag;
    steady_clock::time_point due;
  };
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<job> jobs;
  bool done = false;
  size_t idle = 0;
  size_t connected = 0;
  open_loop_result result;

  std::vector<std::vector<outcome>> per_thread(config.connections);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < config.connections; ++i)
    threads.emplace_back([&, i] {
      http_client http(config.port);
      http.timeout = milliseconds(10000);
      // Every connection is open before the load starts, so the server's
      // descriptor count does not grow with the first busy moment.
      std::string warm_error;
      try {
        http.get("/v2/health/live");
      } catch (const std::exception& e) {
        warm_error = e.what();
      }
      std::unique_lock<std::mutex> lock(mutex);
      if (!warm_error.empty())
        per_thread[i].push_back({0, 0, 0, "client connection failed: " + warm_error});
      ++connected;
      ready.notify_all();
      for (;;) {
        ++idle;
        ready.wait(lock, [&] { return done || !jobs.empty(); });
        --idle;
        if (jobs.empty())
          return;
        auto j = jobs.front();
        jobs.pop_front();
        lock.unlock();
        per_thread[i].push_back(send_one(http, j.tag, j.due));
        lock.lock();
      }
    });

  {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait(lock, [&] { return connected == config.connections; });
  }
  std::mt19937_64 rng(config.seed);
  std::exponential_distribution<double> gap(config.rate);
  auto start = steady_clock::now();
  result.started = start;
  auto end = start + config.duration;
  auto due = start;
  for (int tag = 1;; ++tag) {
    due += std::chrono::duration_cast<steady_clock::duration>(
      std::chrono::duration<double>(gap(rng)));
    if (due >= end)
      break;
    std::this_thread::sleep_until(due);
    std::lock_guard<std::mutex> guard(mutex);
    if (idle <= jobs.size()) {
      ++result.waited;
      if (!jobs.empty())
        result.longest_wait_ms = std::max(result.longest_wait_ms,
                                          ms_since(jobs.front().due, steady_clock::now()));
    }
    jobs.push_back({tag, due});
    ready.notify_one();
  }
  result.last_due = steady_clock::now();
  {
    std::lock_guard<std::mutex> guard(mutex);
    done = true;
  }
  ready.notify_all();
  for (auto& t : threads)
    t.join();
  for (auto& v : per_thread)
    result.outcomes.insert(result.outcomes.end(), v.begin(), v.end());
  return result;
}

// -- misbehaving clients ------------------------------------------------------------

/// A plain TCP connection to the server, closed with the object.
class raw_socket {
public:
  explicit raw_socket(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (fd_ < 0)
      return;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~raw_socket() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  raw_socket(const raw_socket&) = delete;
  raw_socket& operator=(const raw_socket&) = delete;

  bool connected() const { return connected_; }

  /// Writes as much of `bytes` as the server takes; false when it closed.
  bool send(std::string_view bytes) {
    if (!connected_)
      return false;
    while (!bytes.empty()) {
      auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0)
        return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  /// Reads until the server closes, `enough` holds for what was read, or
  /// `timeout` passes; the bytes read, and whether the server closed.
  std::pair<std::string, bool> read_until(milliseconds timeout,
                                          const std::function<bool(const std::string&)>& enough) {
    std::string out;
    if (!connected_)
      return {out, true};
    auto deadline = steady_clock::now() + timeout;
    char buffer[4096];
    for (;;) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
      if (left.count() <= 0)
        return {out, false};
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        continue;
      auto n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0)
        return {out, true};
      out.append(buffer, static_cast<size_t>(n));
      if (enough(out))
        return {out, false};
    }
  }

private:
  int fd_;
  bool connected_ = false;
};

int status_of(const std::string& bytes) {
  if (bytes.rfind("HTTP/1.1 ", 0) != 0 || bytes.size() < 12)
    return 0;
  return std::atoi(bytes.c_str() + 9);
}

struct misbehaviour_counts {
  size_t half_requests = 0;
  size_t oversized_headers = 0;
  /// How the oversized headers were answered: status -> count (0: closed
  /// without an answer, -1: neither answered nor closed within 5 s).
  std::map<int, size_t> oversized_answers;
  size_t idle_connections = 0;
};

std::string describe(const std::map<int, size_t>& answers) {
  std::string out;
  for (auto [status, n] : answers)
    out += (out.empty() ? "" : ",") + std::to_string(status) + ":" + std::to_string(n);
  return out.empty() ? "none" : out;
}

/// Runs the misbehaving clients until stop(): every 50 ms one that connects,
/// sends part of a request (nothing, half the headers, or the headers and
/// half the body) and closes; every 250 ms one that sends 100 KB of header
/// and reads the answer; and `idle_count` connections opened at the start
/// and held (half of them after one complete request) until release_idle().
class misbehaving_clients {
public:
  misbehaving_clients(uint16_t port, size_t idle_count) : port_(port) {
    for (size_t i = 0; i < idle_count; ++i) {
      auto c = std::make_unique<raw_socket>(port);
      if (i % 2 == 1 && c->send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"))
        c->read_until(milliseconds(5000), [](const std::string& bytes) {
          return bytes.find("\r\n\r\n") != std::string::npos;
        });
      idle_.push_back(std::move(c));
    }
    counts_.idle_connections = idle_count;
    half_ = std::thread([this] { run_half_requests(); });
    oversized_ = std::thread([this] { run_oversized_headers(); });
  }
  ~misbehaving_clients() {
    stop();
    release_idle();
  }

  void stop() {
    stop_ = true;
    if (half_.joinable())
      half_.join();
    if (oversized_.joinable())
      oversized_.join();
  }
  void release_idle() { idle_.clear(); }
  /// After stop().
  const misbehaviour_counts& counts() const { return counts_; }

private:
  void run_half_requests() {
    auto body = fp32_identity_body(request_values(1), 1);
    auto request = std::string("POST /v2/models/") + model_name
                   + "/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: "
                   + std::to_string(body.size()) + "\r\n\r\n";
    const std::string parts[] = {"", request.substr(0, request.size() / 2),
                                 request + body.substr(0, body.size() / 2)};
    for (size_t i = 0; !stop_; ++i) {
      {
        raw_socket c(port_);
        c.send(parts[i % 3]);
      }
      ++counts_.half_requests;
      std::this_thread::sleep_for(milliseconds(50));
    }
  }

  void run_oversized_headers() {
    auto request = "GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Filler: "
                   + std::string(100 * 1024, 'a') + "\r\n\r\n";
    while (!stop_) {
      {
        raw_socket c(port_);
        c.send(request);
        auto [bytes, closed] = c.read_until(milliseconds(5000),
                                            [](const std::string&) { return false; });
        ++counts_.oversized_answers[closed || !bytes.empty() ? status_of(bytes) : -1];
      }
      ++counts_.oversized_headers;
      std::this_thread::sleep_for(milliseconds(250));
    }
  }

  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<raw_socket>> idle_;
  misbehaviour_counts counts_;
  std::thread half_;
  std::thread oversized_;
};

// -- shared checks -------------------------------------------------------------------

/// The server's state at rest after one answered request, on no open
/// connection of this test's.
proc_sample warmed_baseline(const overload_server& server, steady_clock::time_point t0) {
  {
    http_client http(server.port());
    auto r = http.post(std::string("/v2/models/") + model_name + "/infer",
                       fp32_identity_body(request_values(0), 1), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
  }
  std::this_thread::sleep_for(milliseconds(200));
  return sample_process(server.process->pid(), t0);
}

/// One series of the model's metrics ("name" or "name{...,reason=...}"
/// without the model and version labels); -1 when absent.
double model_metric(const overload_server& server, const std::string& name,
                    const std::string& extra_labels = "") {
  http_client metrics(server.process->metrics_port());
  return metric_value(metrics.get("/metrics").body,
                      name + "{model=\"" + model_name + "\",version=\"1\"" + extra_labels + "}");
}

/// Waits until the server holds no more descriptors and threads than at
/// `baseline`, and returns the state it settled at.
proc_sample settled(const overload_server& server, const proc_sample& baseline,
                    steady_clock::time_point t0) {
  proc_sample now;
  eventually(
    [&] {
      now = sample_process(server.process->pid(), t0);
      return now.fds <= baseline.fds && now.threads <= baseline.threads;
    },
    milliseconds(10000));
  return now;
}

} // namespace

TEST_CASE("at 10x capacity the server stays responsive, rejects at once and stays bounded") {
  auto seconds = env_seconds("CAF_SERVING_OVERLOAD_SECONDS", 5);
  overload_server server;
  auto t0 = steady_clock::now();
  auto baseline = warmed_baseline(server, t0);

  open_loop_config load;
  load.port = server.port();
  load.rate = 10 * capacity_rows_per_s;
  load.duration = std::chrono::seconds(seconds);
  load.connections = 64;

  process_sampler sampler(server.process->pid(), t0);
  health_probe health(server.port());
  auto run = run_open_loop(load);
  health.stop();
  sampler.stop();
  auto after = settled(server, baseline, t0);

  auto ok = run.latencies(200);
  auto rejected = run.latencies(503);
  const auto& first = sampler.samples().front();
  const auto& last = sampler.samples().back();
  double rss_growth_mb = static_cast<double>(sampler.max_rss_kb() - first.rss_kb) / 1024;
  double health_p99 = percentile(health.latencies_ms(), 99);
  double rejected_p99 = percentile(rejected, 99);
  double ok_p99 = percentile(ok, 99);
  // Rates over the time requests were due, not the drain after it.
  double load_seconds = ms_since(run.started, run.last_due) / 1000;
  double served_per_s = static_cast<double>(ok.size()) / load_seconds;

  MESSAGE("FIGURES overload seconds=" << seconds << " offered_per_s="
          << fixed(static_cast<double>(run.outcomes.size()) / load_seconds) << " requests="
          << run.outcomes.size() << " ok=" << ok.size() << " rejected_503=" << rejected.size()
          << " lost=" << run.count(0) << " served_per_s=" << fixed(served_per_s)
          << " health_probes=" << health.latencies_ms().size()
          << " health_p50_ms=" << fixed(percentile(health.latencies_ms(), 50), 2)
          << " health_p99_ms=" << fixed(health_p99, 2)
          << " health_max_ms=" << fixed(percentile(health.latencies_ms(), 100), 2)
          << " rejected_p50_ms=" << fixed(percentile(rejected, 50), 2)
          << " rejected_p99_ms=" << fixed(rejected_p99, 2)
          << " rejected_service_p99_ms=" << fixed(percentile(run.service_times(503), 99), 2)
          << " ok_p50_ms=" << fixed(percentile(ok, 50)) << " ok_p99_ms=" << fixed(ok_p99)
          << " ok_max_ms=" << fixed(percentile(ok, 100))
          << " waited_for_client=" << run.waited
          << " longest_client_wait_ms=" << fixed(run.longest_wait_ms, 2)
          << " rss_first_mb=" << fixed(static_cast<double>(first.rss_kb) / 1024)
          << " rss_last_mb=" << fixed(static_cast<double>(last.rss_kb) / 1024)
          << " rss_max_mb=" << fixed(static_cast<double>(sampler.max_rss_kb()) / 1024)
          << " fds_baseline=" << baseline.fds << " fds_max=" << sampler.max_fds()
          << " fds_after=" << after.fds << " threads_baseline=" << baseline.threads
          << " threads_max=" << sampler.max_threads() << " threads_after=" << after.threads
          << " server_cpu_pct=" << fixed(sampler.server_cpu_percent())
          << " test_cpu_pct=" << fixed(sampler.test_cpu_percent()));

  std::string examples;
  CHECK_MESSAGE(run.failures(examples) == 0, examples);
  CHECK_MESSAGE(health.failures().empty(),
                health.failures().size() << " health probes failed, first: "
                                         << (health.failures().empty() ? "" : health.failures().front()));
  // Overloaded tenfold, most requests must be rejected, and the model must
  // still serve at least half its capacity.
  CHECK(rejected.size() > ok.size());
  CHECK(served_per_s > 0.5 * capacity_rows_per_s);
  // Rejections come at once rather than after a wait in the queue: well under
  // what an admitted request waits (a full queue, 160 ms). Against the admitted
  // median, not a fixed 50 ms, which a loaded 2-core machine (load average 9)
  // passed at 72 ms while every admitted request still waited ~160 ms.
  double ok_p50 = percentile(ok, 50);
  CHECK(rejected_p99 < 0.5 * ok_p50);
  CHECK(health_p99 < 50);
  // Admitted requests wait at most for a full queue (32 rows at 200 a second,
  // 160 ms) and one batch; the margin is for a loaded machine.
  CHECK(ok_p99 < 1000);
  // Memory bounded: the most it used against where it started.
  CHECK(rss_growth_mb < 50);
  CHECK(after.fds <= baseline.fds);
  CHECK(after.threads <= baseline.threads);
  // Every 503 was the full queue's, and nothing stays pending.
  CHECK(model_metric(server, "caf_serving_inference_request_failure", ",reason=\"queue_full\"")
        == static_cast<double>(rejected.size()));
  CHECK(model_metric(server, "caf_serving_pending_request_count") == 0);
}

TEST_CASE("a soak at 80% of capacity with misbehaving clients loses nothing and does not grow") {
  auto seconds = env_seconds("CAF_SERVING_SOAK_SECONDS", 5);
  overload_server server;
  auto t0 = steady_clock::now();
  auto baseline = warmed_baseline(server, t0);

  open_loop_config load;
  load.port = server.port();
  load.rate = 0.8 * capacity_rows_per_s;
  load.duration = std::chrono::seconds(seconds);
  load.connections = 32;
  load.seed = 2;

  constexpr size_t idle_count = 32;
  process_sampler sampler(server.process->pid(), t0);
  health_probe health(server.port());
  misbehaving_clients bad(server.port(), idle_count);
  auto run = run_open_loop(load);
  bad.stop();
  health.stop();
  sampler.stop();
  // Warm-up: the first fifth of the run, at most 30 s; everything the test
  // opens (idle connections, client pool) is open before the run starts.
  double load_start_s = ms_since(t0, run.started) / 1000;
  const auto& warm = sampler.sample_after(load_start_s + std::min(30.0, seconds / 5.0));
  // The last sample while the load still ran, the client pool still open.
  const auto& last = sampler.sample_before(ms_since(t0, run.last_due) / 1000);
  bad.release_idle();
  auto after = settled(server, baseline, t0);

  auto ok = run.latencies(200);
  double rss_growth_mb = static_cast<double>(last.rss_kb - warm.rss_kb) / 1024;
  double health_p99 = percentile(health.latencies_ms(), 99);
  const auto& counts = bad.counts();

  MESSAGE("FIGURES soak seconds=" << seconds << " requests=" << run.outcomes.size()
          << " ok=" << ok.size() << " rejected_503=" << run.count(503)
          << " lost=" << run.count(0) << " ok_p50_ms=" << fixed(percentile(ok, 50))
          << " ok_p99_ms=" << fixed(percentile(ok, 99))
          << " ok_max_ms=" << fixed(percentile(ok, 100))
          << " health_p99_ms=" << fixed(health_p99, 2)
          << " half_requests=" << counts.half_requests
          << " oversized_headers=" << counts.oversized_headers
          << " oversized_answers=" << describe(counts.oversized_answers)
          << " idle_connections=" << counts.idle_connections
          << " rss_warm_mb=" << fixed(static_cast<double>(warm.rss_kb) / 1024)
          << " rss_last_mb=" << fixed(static_cast<double>(last.rss_kb) / 1024)
          << " rss_max_mb=" << fixed(static_cast<double>(sampler.max_rss_kb()) / 1024)
          << " fds_baseline=" << baseline.fds << " fds_warm=" << warm.fds
          << " fds_last=" << last.fds << " fds_max=" << sampler.max_fds()
          << " fds_after=" << after.fds
          << " threads_baseline=" << baseline.threads << " threads_warm=" << warm.threads
          << " threads_last=" << last.threads << " threads_after=" << after.threads
          << " server_cpu_pct=" << fixed(sampler.server_cpu_percent())
          << " test_cpu_pct=" << fixed(sampler.test_cpu_percent()));

  // Every well-behaved request answered 200 with its own values.
  std::string examples;
  CHECK_MESSAGE(run.failures(examples) == 0, examples);
  CHECK(run.count(503) == 0);
  CHECK(ok.size() == run.outcomes.size());
  CHECK(health.failures().empty());
  CHECK(health_p99 < 50);
  CHECK(counts.oversized_answers.count(-1) == 0);
  // No growth: a few descriptors of misbehaving clients may be open at any
  // one moment, and none may stay once everything is closed.
  CHECK(rss_growth_mb < 20);
  CHECK(last.fds <= warm.fds + 4);
  CHECK(last.threads <= warm.threads);
  CHECK(after.fds <= baseline.fds);
  CHECK(after.threads <= baseline.threads);
  // The half requests left nothing pending behind them.
  CHECK(model_metric(server, "caf_serving_pending_request_count") == 0);
}
