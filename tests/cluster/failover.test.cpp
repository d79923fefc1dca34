/// kill -9 of a worker under load: every request is still answered, correctly and
/// exactly once; the lost worker's batches were sent to the other worker; and a
/// worker that comes back on the same port is used again without a restart.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdlib>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

TEST_CASE("kill -9 of a worker under load loses no request and answers none twice") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "failover-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 3000);
  auto w1 = std::make_unique<worker_process>(worker_config{repo.path().string(), "w1", {}, {}});
  worker_process w2({repo.path().string(), "w2", {}, {}});
  auto w1_port = std::to_string(w1->port());
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1->address(), "--worker", w2.address(),
                                   "--local-executors", "false", "--heartbeat-ms", "100",
                                   "--node-timeout-ms", "500"}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\"", std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w2\"", std::chrono::seconds(10)));
  auto p = server.metrics_port();
  double w1_in_flight_at_kill = -1;
  load_config load{6, 60, "slow", nullptr, 120};
  load.midway = [&] {
    // Kill while w1 holds batches, so that the test sees them sent elsewhere.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    do
      w1_in_flight_at_kill
        = metric_sum(p, "caf_serving_worker_batches_in_flight", "worker=\"w1\"");
    while (w1_in_flight_at_kill < 1 && std::chrono::steady_clock::now() < until);
    w1->kill_hard();
  };
  auto t0 = std::chrono::steady_clock::now();
  auto totals = run_load(server.http_port(), load);
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(totals.first_failure);
  CHECK(totals.sent == 360);
  CHECK(totals.correct == 360);
  CHECK(totals.wrong == 0);
  CHECK(totals.failed == 0);
  // Counted exactly once each on the server: no request lost, none twice.
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"slow\"") == 360);
  CHECK(metric_sum(p, "caf_serving_inference_request_failure", "model=\"slow\"") == 0);
  double lost = metric_sum(p, "caf_serving_worker_batches_lost_total", "worker=\"w1\"");
  MESSAGE("w1 held " << w1_in_flight_at_kill << " batches when killed; " << lost
                     << " went back to the queue; load took " << seconds << " s");
  CHECK(lost >= 1); // the kill caught batches in flight, which went elsewhere
  CHECK(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"127.0.0.1:" + w1_port
                                          + "\",\"state\":\"lost\"",
                    std::chrono::seconds(5)));

  // w1 comes back on its port: the server reconnects and uses it again.
  w1.reset();
  w1 = std::make_unique<worker_process>(
    worker_config{repo.path().string(), "w1", {"--port", w1_port}, {}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"127.0.0.1:" + w1_port
                                            + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  double before = metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w1\"");
  auto again = run_load(server.http_port(), {4, 40, "slow", nullptr, 0});
  CHECK(again.correct == 160);
  CHECK(metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w1\"") > before);
}
