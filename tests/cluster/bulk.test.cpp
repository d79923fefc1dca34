/// The bulk channel (docs/cluster.md, "The bulk channel"): batches at least
/// --bulk-threshold-bytes go to the worker over its bulk port and come back
/// that way, every answer equal to its request; small ones beside them stay on
/// CAF's link; a connection with a wrong token is refused while the worker
/// keeps serving; and kill -9 of a worker holding large batches loses no
/// request and answers none twice.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

namespace {

/// Floats per row of model "wide": 32 KiB a row, so that every batch of it is
/// above the tests' threshold (16 KiB), and every batch of "fast" (8 rows of 16
/// floats at most) below.
constexpr int wide_floats = 8192;
const std::string threshold = "16384";

/// "wide": identity on 8192 FP32, max batch 8, each batch sleeping `delay_us`.
void write_wide_model(support::temp_repository& repo, int delay_us) {
  std::string cfg = "name: \"wide\"\nbackend: \"builtin\"\nmax_batch_size: 8\n"
                    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ "
                    + std::to_string(wide_floats)
                    + " ] } ]\n"
                      "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ "
                    + std::to_string(wide_floats)
                    + " ] } ]\n"
                      "dynamic_batching { max_queue_delay_microseconds: 200 }\n"
                      "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
                      "parameters { key: \"delay_us\" value: { string_value: \""
                    + std::to_string(delay_us) + "\" } }\n";
  repo.write_file("wide/config.pbtxt", cfg);
  repo.write_file("wide/1/model.txt", "builtin\n");
}

/// Like run_load, with rows of model "wide": each request's values are its own
/// (request number * 8 + column % 8), and its answer must hold them all.
load_totals run_wide_load(uint16_t http_port, int clients, int per_client, int first_id,
                          std::function<void()> midway = nullptr, int call_after = 0) {
  std::mutex mutex;
  load_totals totals;
  std::atomic<int> answered{0};
  std::atomic<bool> called{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      support::http_client http(http_port);
      http.timeout = std::chrono::milliseconds(30000);
      for (int i = 0; i < per_client; ++i) {
        int id = first_id + c * per_client + i;
        std::string data = "[";
        for (int k = 0; k < wide_floats; ++k)
          data += (k ? "," : "") + std::to_string(id * 8 + k % 8);
        data += "]";
        std::string body = "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\","
                           "\"shape\":[1,"
                           + std::to_string(wide_floats) + "],\"data\":" + data + "}]}";
        int status = 0;
        std::string answer;
        try {
          auto r = http.post("/v2/models/wide/infer", body, {{"Content-Type", "application/json"}});
          status = r.status;
          answer = r.body;
        } catch (const std::exception& e) {
          answer = e.what();
          http.close();
        }
        bool same = answer.find("\"data\":" + data) != std::string::npos;
        {
          std::lock_guard<std::mutex> guard(mutex);
          ++totals.sent;
          if (status == 200 && same)
            ++totals.correct;
          else if (status == 200)
            ++totals.wrong;
          else
            ++totals.failed;
          if ((status != 200 || !same) && totals.first_failure.empty())
            totals.first_failure = std::to_string(status) + " " + answer.substr(0, 300);
        }
        if (++answered >= call_after && midway && !called.exchange(true))
          midway();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return totals;
}

/// The port of the worker's "bulk channel on 127.0.0.1:PORT" line.
uint16_t bulk_port(const worker_process& w) {
  const std::string line = "bulk channel on 127.0.0.1:";
  REQUIRE(w.wait_for_output(line, std::chrono::seconds(5)));
  for (int i = 0; i < 200; ++i) {
    auto out = w.output();
    auto at = out.find(line) + line.size();
    auto eol = out.find('\n', at);
    if (eol != std::string::npos)
      return static_cast<uint16_t>(std::stoul(out.substr(at, eol - at)));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL("no end of the bulk channel line");
  return 0;
}

double worker_metric(uint16_t metrics_port, const std::string& metric, const std::string& w) {
  return metric_sum(metrics_port, metric, "worker=\"" + w + "\"");
}

} // namespace

TEST_CASE("large batches go over the bulk channel, small ones beside them over CAF") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "bulk-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 0);
  write_wide_model(repo, 0);
  worker_process w1({repo.path().string(), "w1", {}, {}});
  auto port = bulk_port(w1);
  CHECK(port != w1.port());
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--local-executors", "false",
                                   "--bulk-threshold-bytes", threshold}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\"", std::chrono::seconds(10)));
  REQUIRE(server.wait_for_output("bulk channel connected", std::chrono::seconds(10)));
  auto p = server.metrics_port();

  // (a) Only large batches: every one over the bulk channel, every answer right.
  auto wide = run_wide_load(server.http_port(), 3, 20, 0);
  INFO(wide.first_failure);
  CHECK(wide.correct == 60);
  CHECK(wide.wrong == 0);
  CHECK(wide.failed == 0);
  auto batches = worker_metric(p, "caf_serving_worker_batches_total", "w1");
  auto bulk = worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1");
  MESSAGE(batches << " batches, " << bulk << " over the bulk channel");
  CHECK(batches >= 1);
  CHECK(bulk == batches);

  // (b) A mix: small requests of "fast" beside large ones, at the same time.
  load_totals small;
  std::thread fast([&] { small = run_load(server.http_port(), {2, 60, "fast", nullptr, 0}); });
  auto mixed = run_wide_load(server.http_port(), 2, 30, 1000);
  fast.join();
  INFO(small.first_failure);
  INFO(mixed.first_failure);
  CHECK(small.correct == 120);
  CHECK(mixed.correct == 60);
  auto batches2 = worker_metric(p, "caf_serving_worker_batches_total", "w1");
  auto bulk2 = worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1");
  MESSAGE((batches2 - batches) << " batches of the mix, " << (bulk2 - bulk)
                                << " over the bulk channel");
  CHECK(bulk2 > bulk);               // the large ones
  CHECK(batches2 - batches > bulk2 - bulk); // the small ones did not
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"wide\"") == 120);
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"fast\"") == 120);

  // (c) A connection with a wrong token is refused, and the worker serves on.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  std::string wrong(16, 'x');
  REQUIRE(::send(fd, wrong.data(), wrong.size(), 0) == 16);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  CHECK(::recv(fd, &c, 1, 0) == 0); // closed by the worker, not timed out
  ::close(fd);
  CHECK(w1.wait_for_output("refused a bulk channel connection from 127.0.0.1",
                           std::chrono::seconds(5)));
  auto after = run_wide_load(server.http_port(), 2, 10, 5000);
  CHECK(after.correct == 20);
  CHECK(worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1") > bulk2);
  CHECK(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"" + w1.address()
                                          + "\",\"state\":\"ready\"",
                    std::chrono::seconds(1)));
}

TEST_CASE("kill -9 of a worker holding large batches loses no request and answers none twice") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "bulk-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 0);
  write_wide_model(repo, 3000);
  auto w1 = std::make_unique<worker_process>(worker_config{repo.path().string(), "w1", {}, {}});
  worker_process w2({repo.path().string(), "w2", {}, {}});
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1->address(), "--worker", w2.address(),
                                   "--local-executors", "false", "--heartbeat-ms", "100",
                                   "--node-timeout-ms", "500", "--bulk-threshold-bytes",
                                   threshold}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\"", std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w2\"", std::chrono::seconds(10)));
  auto p = server.metrics_port();
  double held = -1;
  auto midway = [&] {
    // Kill while w1 holds batches, so that they must be run elsewhere.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    do
      held = worker_metric(p, "caf_serving_worker_batches_in_flight", "w1");
    while (held < 1 && std::chrono::steady_clock::now() < until);
    w1->kill_hard();
  };
  auto totals = run_wide_load(server.http_port(), 6, 25, 0, midway, 40);
  INFO(totals.first_failure);
  CHECK(totals.sent == 150);
  CHECK(totals.correct == 150);
  CHECK(totals.wrong == 0);
  CHECK(totals.failed == 0);
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"wide\"") == 150);
  CHECK(metric_sum(p, "caf_serving_inference_request_failure", "model=\"wide\"") == 0);
  auto lost = worker_metric(p, "caf_serving_worker_batches_lost_total", "w1");
  auto bulk1 = worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1");
  auto bulk2 = worker_metric(p, "caf_serving_worker_bulk_batches_total", "w2");
  MESSAGE("w1 held " << held << " batches when killed; " << lost << " went back to the queue; "
                     << bulk1 << " / " << bulk2 << " batches over w1's / w2's bulk channel");
  CHECK(held >= 1);
  CHECK(lost >= 1);
  CHECK(bulk1 >= 1);
  CHECK(bulk2 >= 1);
  CHECK(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"" + w1->address()
                                          + "\",\"state\":\"lost\"",
                    std::chrono::seconds(5)));
}

namespace {

/// Whether `ss -K` destroys a TCP connection here: tried on one of our own.
bool ss_kill_works() {
  if (::geteuid() != 0)
    return false;
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(l, 1) != 0
      || ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(l);
    return false;
  }
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  bool works = false;
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    int s = ::accept(l, nullptr, nullptr);
    auto cmd = "ss -K dst 127.0.0.1 dport = " + std::to_string(ntohs(a.sin_port))
               + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) {
      timeval tv{2, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char ch;
      // Destroyed: an error at once (ECONNABORTED), not a 2 s timeout.
      works = ::recv(c, &ch, 1, 0) < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
    }
    ::close(s);
  }
  ::close(c);
  ::close(l);
  return works;
}

/// Occurrences of `text` in `out`.
size_t count_of(const std::string& out, const std::string& text) {
  size_t n = 0;
  for (auto at = out.find(text); at != std::string::npos; at = out.find(text, at + 1))
    ++n;
  return n;
}

/// The cases that cut a bulk connection from outside need `ss -K` (root and a
/// kernel with sock_destroy). Without it the process ends with 77 before the
/// case starts anything, which CTest reports as skipped: those cases run in
/// their own CTest entry, cluster_it.bulk_cut.test (tests/cluster/CMakeLists.txt).
void skip_unless_ss_kill_works() {
  if (ss_kill_works())
    return;
  std::printf("SKIPPED: ss -K cannot destroy sockets here (needs root and sock_destroy)\n");
  std::fflush(stdout);
  std::exit(77);
}

/// A server with its own executors and a worker that joined it (the harness
/// starts workers with --address 127.0.0.1, where the server reaches them), its
/// bulk channel connected.
struct joined_worker {
  support::temp_repository repo;
  support::server_process server;
  worker_process w1;
  uint16_t bulk = 0;

  joined_worker()
      : server(server_with_models(repo)),
        w1({repo.path().string(), "w1",
            {"--join", "127.0.0.1:" + std::to_string(cluster_port(server))}, {}}),
        bulk(bulk_port(w1)) {
    REQUIRE(server.wait_for_output("worker w1: bulk channel connected", std::chrono::seconds(10)));
  }

  static support::server_config server_with_models(support::temp_repository& repo) {
    setenv("CAF_SERVING_CLUSTER_SECRET", "bulk-test-secret", 1);
    write_test_models(repo, 0);
    write_wide_model(repo, 20000);
    return {CAF_SERVING_BINARY, repo.path().string(),
            {"--cluster-port", "0", "--cluster-address", "127.0.0.1", "--local-executors",
             "true", "--bulk-threshold-bytes", threshold}};
  }
};

} // namespace

TEST_CASE("a bulk channel cut under load: the worker is lost and back, every request right") {
  // The server's end of the bulk connection is destroyed from outside with
  // `ss -K` (root and a kernel with sock_destroy); the CAF link stays up.
  skip_unless_ss_kill_works();
  setenv("CAF_SERVING_CLUSTER_SECRET", "bulk-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 0);
  write_wide_model(repo, 20000); // a batch in flight long enough to be cut
  worker_process w1({repo.path().string(), "w1", {}, {}});
  worker_process w2({repo.path().string(), "w2", {}, {}});
  auto port = bulk_port(w1);
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--worker", w2.address(),
                                   "--local-executors", "false", "--bulk-threshold-bytes",
                                   threshold}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\"", std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w2\"", std::chrono::seconds(10)));
  auto connected = [&] { return count_of(server.output(), "bulk channel connected"); };
  for (int i = 0; i < 500 && connected() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(connected() == 2);
  auto p = server.metrics_port();
  int cut = -1;
  double held = -1;
  auto midway = [&] {
    // Cut while w1 holds batches, so that they must be run elsewhere.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    do
      held = worker_metric(p, "caf_serving_worker_batches_in_flight", "w1");
    while (held < 1 && std::chrono::steady_clock::now() < until);
    cut = std::system(("ss -K dst 127.0.0.1 dport = " + std::to_string(port) + " >/dev/null 2>&1")
                        .c_str());
  };
  auto totals = run_wide_load(server.http_port(), 4, 30, 0, midway, 20);
  INFO(totals.first_failure);
  CHECK(totals.correct == 120);
  CHECK(totals.wrong == 0);
  CHECK(totals.failed == 0);
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"wide\"") == 120);
  CHECK(metric_sum(p, "caf_serving_inference_request_failure", "model=\"wide\"") == 0);
  if (cut != 0) {
    MESSAGE("ss -K did not run (exit " << cut << "): the cut was not made");
    return;
  }
  // A third connection: w1 was greeted again, with a new token.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (connected() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(connected() == 3);
  auto lost = worker_metric(p, "caf_serving_worker_batches_lost_total", "w1");
  MESSAGE("w1 held " << held << " batches at the cut; " << lost << " went back to the queue");
  CHECK(lost >= 1);
  CHECK(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"" + w1.address()
                                          + "\",\"state\":\"ready\"",
                    std::chrono::seconds(5)));
  // And it carries large batches again.
  auto before = worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1");
  CHECK(run_wide_load(server.http_port(), 2, 10, 9000).correct == 20);
  CHECK(worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1") > before);
}

TEST_CASE("a worker that joined: its bulk channel carries large batches") {
  joined_worker c;
  auto p = c.server.metrics_port();
  auto wide = run_wide_load(c.server.http_port(), 3, 10, 0);
  INFO(wide.first_failure);
  CHECK(wide.correct == 30);
  // The server's own executors share the load; the worker's batches are all bulk.
  auto batches = worker_metric(p, "caf_serving_worker_batches_total", "w1");
  CHECK(batches >= 1);
  CHECK(worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1") == batches);
}

TEST_CASE("a worker that joined: after a cut of its bulk channel it is greeted again") {
  skip_unless_ss_kill_works();
  joined_worker c;
  auto p = c.server.metrics_port();
  REQUIRE(std::system(("ss -K dst 127.0.0.1 dport = " + std::to_string(c.bulk) + " >/dev/null 2>&1")
                        .c_str())
          == 0);
  // The CAF link is up, so the worker does not join again: the server greets it
  // again over that link, and it hands out a new token.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (count_of(c.server.output(), "worker w1: bulk channel connected") < 2
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(count_of(c.server.output(), "worker w1: bulk channel connected") == 2);
  CHECK(count_of(c.w1.output(), "joined server") == 1);
  auto before = worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1");
  auto again = run_wide_load(c.server.http_port(), 3, 10, 5000);
  CHECK(again.correct == 30);
  CHECK(worker_metric(p, "caf_serving_worker_bulk_batches_total", "w1") > before);
}
