/// A server with no executors of its own and two workers: every answer comes
/// through a remote executor and is correct, both workers take batches, and /v2
/// and /metrics show them.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdlib>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

TEST_CASE("two workers answer every request correctly through remote executors") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "remote-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 1000);
  worker_process w1({repo.path().string(), "w1", {}, {}});
  worker_process w2({repo.path().string(), "w2", {}, {}});
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--worker", w2.address(),
                                   "--local-executors", "false"}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w2\",\"address\":\"" + w2.address()
                                            + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"" + w1.address()
                                            + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  CHECK(w1.wait_for_output("accepted server node", std::chrono::seconds(5)));

  auto totals = run_load(server.http_port(), {4, 60, "slow", nullptr, 0});
  INFO(totals.first_failure);
  CHECK(totals.correct == 240);
  CHECK(totals.wrong == 0);
  CHECK(totals.failed == 0);
  auto fast = run_load(server.http_port(), {2, 50, "fast", nullptr, 0});
  CHECK(fast.correct == 100);

  // Both workers took part, and the books balance.
  auto p = server.metrics_port();
  double b1 = metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w1\"");
  double b2 = metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w2\"");
  MESSAGE("batches: w1 " << b1 << ", w2 " << b2);
  CHECK(b1 > 0);
  CHECK(b2 > 0);
  CHECK(metric_sum(p, "caf_serving_worker_batches_in_flight") == 0);
  CHECK(metric_sum(p, "caf_serving_worker_up") == 2);
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"slow\"") == 240);
}
