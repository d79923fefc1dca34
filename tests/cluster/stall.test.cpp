/// A worker that stalls (SIGSTOP) under load, for less than the node timeout so
/// its node is not lost: its batches are presumed lost once far past their
/// predicted completion (the cost model, --remote-timeout-factor and
/// --remote-timeout-floor-ms), re-run on the other worker, and when it resumes its
/// late answers are dropped and counted. Every request is answered exactly once,
/// none lost, and the worker that stalled takes batches again.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <thread>

#include <signal.h>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

TEST_CASE("a stalled worker's batches run elsewhere, and its late answers are dropped") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "stall-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 2000);
  // Long node timeouts on both sides: the stall must not look like a lost node.
  std::vector<std::string> live = {"--heartbeat-ms", "200", "--node-timeout-ms", "60000"};
  worker_process w1({repo.path().string(), "w1", live, {}});
  worker_process w2({repo.path().string(), "w2", live, {}});
  support::server_process server(
    {CAF_SERVING_BINARY, repo.path().string(),
     {"--worker", w1.address(), "--worker", w2.address(), "--local-executors", "false",
      "--heartbeat-ms", "200", "--node-timeout-ms", "60000", "--remote-timeout-factor", "4",
      "--remote-timeout-floor-ms", "200", "--remote-timeout-ms", "60000"}});
  auto port = server.http_port();
  auto mport = server.metrics_port();
  REQUIRE(wait_for_v2(port, "\"name\":\"w1\",\"address\":\"" + w1.address()
                              + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(port, "\"name\":\"w2\",\"address\":\"" + w2.address()
                              + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  // Warm up: both executors get measured, so their batches have predictions.
  CHECK(run_load(port, {9, 20, "slow", nullptr, 0}).correct == 180);
  REQUIRE(metric_sum(mport, "caf_serving_worker_batches_total", "worker=\"w1\"") > 0);

  // w1 stops mid-load and stays stopped until the whole load is answered: with a
  // fixed 60 s timeout (--remote-timeout-ms) the load could not finish. 24
  // clients, three batches' worth: w1 holds a batch when it stops, or w2's
  // backlog sends it the next one (with 9 clients w2 alone kept up, and on a
  // loaded machine, where w1 had measured slower, w1 got nothing more after it
  // stopped: nothing to presume lost).
  std::atomic<bool> halfway{false};
  load_config load{24, 15, "slow", [&] { halfway = true; }, 90};
  load_totals totals;
  std::thread client([&] { totals = run_load(port, load); });
  while (!halfway)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(kill(w1.pid(), SIGSTOP) == 0);
  client.join();
  auto timed_out = metric_sum(mport, "caf_serving_worker_batches_timed_out_total",
                              "worker=\"w1\"");
  REQUIRE(kill(w1.pid(), SIGCONT) == 0);
  INFO(totals.first_failure);
  CHECK(totals.correct == 360);
  CHECK(totals.wrong == 0);
  CHECK(totals.failed == 0);
  MESSAGE("batches presumed lost on the stalled worker: " << timed_out);
  if (timed_out == 0)
    MESSAGE("server:\n" << server.output() << "\nw1:\n" << w1.output());
  CHECK(timed_out > 0);

  // Resumed, w1 answers the batches it held; each answer is dropped, since its
  // batch was answered through w2. (Batches the proxy kept back while w1 was
  // stalled were never sent to it, so they have no late answer.)
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric_sum(mport, "caf_serving_worker_late_answers_dropped_total", "worker=\"w1\"") < 1
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto dropped =
    metric_sum(mport, "caf_serving_worker_late_answers_dropped_total", "worker=\"w1\"");
  CHECK(dropped >= 1);
  CHECK(dropped <= timed_out);
  // The books: every request succeeded exactly once.
  CHECK(metric_sum(mport, "caf_serving_inference_request_success", "model=\"slow\"")
        == 180 + 360);
  CHECK(metric_sum(mport, "caf_serving_inference_request_failure", "model=\"slow\"") == 0);
  support::http_client http(port);
  CHECK(http.get("/v2").body.find("\"state\":\"lost\"") == std::string::npos);

  // The worker that stalled is used again once the scheduler's quarantine of
  // it (it timed out batches in a row) has passed: 9 clients need both workers
  // (batches of at most 8).
  auto before = metric_sum(mport, "caf_serving_worker_batches_total", "worker=\"w1\"");
  int sent = 0;
  int correct = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (metric_sum(mport, "caf_serving_worker_batches_total", "worker=\"w1\"") <= before
         && std::chrono::steady_clock::now() < until) {
    auto more = run_load(port, {9, 10, "slow", nullptr, 0});
    INFO(more.first_failure);
    sent += more.sent;
    correct += more.correct;
  }
  CHECK(metric_sum(mport, "caf_serving_worker_batches_total", "worker=\"w1\"") > before);
  CHECK(correct == sent);
  CHECK(metric_sum(mport, "caf_serving_inference_request_success", "model=\"slow\"")
        == 180 + 360 + sent);
}
