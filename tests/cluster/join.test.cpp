/// Workers that join a server (--join): one before the load, one in the middle of
/// it; the second is used at once, and every request is answered correctly.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <atomic>
#include <memory>
#include <thread>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

TEST_CASE("a worker joining mid-load takes batches at once") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "join-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 3000);
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--cluster-port", "0", "--cluster-address", "127.0.0.1",
                                   "--local-executors", "false"}});
  auto join_to = "127.0.0.1:" + std::to_string(cluster_port(server));
  worker_process w1({repo.path().string(), "w1", {"--join", join_to}, {}});
  REQUIRE(w1.wait_for_output("joined server", std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\"", std::chrono::seconds(10)));

  // The load runs on its own thread; w2 starts from this one (a child's
  // PDEATHSIG follows the thread that forked it).
  std::atomic<bool> halfway{false};
  load_config load{4, 80, "slow", [&] { halfway = true; }, 60};
  load_totals totals;
  std::thread client([&] { totals = run_load(server.http_port(), load); });
  while (!halfway)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto w2 = std::make_unique<worker_process>(
    worker_config{repo.path().string(), "w2", {"--join", join_to}, {}});
  client.join();
  INFO(totals.first_failure);
  CHECK(totals.correct == 320);
  CHECK(totals.failed == 0);
  REQUIRE(w2);
  CHECK(w2->wait_for_output("joined server", std::chrono::seconds(5)));
  auto p = server.metrics_port();
  double b2 = metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w2\"");
  MESSAGE("batches: w1 " << metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w1\"")
                         << ", w2 (joined mid-load) " << b2);
  CHECK(b2 > 0);
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"slow\"") == 320);

  // A worker that leaves is marked lost; the server keeps serving with the other.
  w1.kill_hard();
  CHECK(wait_for_v2(server.http_port(), "\"state\":\"lost\"", std::chrono::seconds(5)));
  CHECK(run_load(server.http_port(), {2, 20, "slow", nullptr, 0}).correct == 40);
}
