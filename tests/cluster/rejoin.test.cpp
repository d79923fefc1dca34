/// A worker that joins again keeps its identity: after a kill -9 and a restart
/// under the same --name, /v2 has one row for it (ready again, its counters
/// kept), not a lost row and a new one. A second live worker with a name already
/// connected is refused with the fix.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("a worker that re-joins under its name takes its old row back") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "rejoin-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 1000);
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--cluster-port", "0", "--cluster-address", "127.0.0.1",
                                   "--local-executors", "false"}});
  auto join_to = "127.0.0.1:" + std::to_string(cluster_port(server));
  auto port = server.http_port();
  auto w1 = std::make_unique<worker_process>(
    worker_config{repo.path().string(), "w1", {"--join", join_to}, {}});
  REQUIRE(wait_for_v2(port, "\"name\":\"w1\"", std::chrono::seconds(10)));
  CHECK(run_load(port, {2, 20, "slow", nullptr, 0}).correct == 40);
  auto before = metric_sum(server.metrics_port(), "caf_serving_worker_batches_total",
                           "worker=\"w1\"");
  CHECK(before > 0);

  // The same name from another live node is refused while w1 is connected.
  worker_process twin({repo.path().string(), "w1", {"--join", join_to}, {}});
  CHECK(twin.wait_for_output("give each worker its own --name", std::chrono::seconds(10)));
  twin.kill_hard();

  w1->kill_hard();
  REQUIRE(wait_for_v2(port, "\"state\":\"lost\"", std::chrono::seconds(5)));
  w1 = std::make_unique<worker_process>(
    worker_config{repo.path().string(), "w1", {"--join", join_to}, {}});
  REQUIRE(w1->wait_for_output("joined server", std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(port, "\"state\":\"ready\"", std::chrono::seconds(10)));

  support::http_client http(port);
  auto v2 = http.get("/v2").body;
  INFO(v2);
  CHECK(count(v2, "\"name\":\"w1\"") == 1);
  CHECK(v2.find("\"state\":\"lost\"") == std::string::npos);
  // The row is the same: its batch counter goes on from where it was.
  CHECK(run_load(port, {2, 20, "slow", nullptr, 0}).correct == 40);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_batches_total", "worker=\"w1\"")
        > before);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_up") == 1);
}
