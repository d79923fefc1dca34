/// Only a server that proves the cluster's secret can use a worker, and only a
/// worker that proves it can join a server; each refusal is logged.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdlib>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

TEST_CASE("a server with the wrong secret is refused by the worker") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "the-right-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 0);
  worker_process worker({repo.path().string(), "w1", {}, {}});
  repo.write_file("wrong-secret", "not-the-secret\n");
  support::server_process server(
    {CAF_SERVING_BINARY, repo.path().string(),
     {"--worker", worker.address(), "--cluster-secret-file",
      (repo.path() / "wrong-secret").string(), "--cluster-port", "0", "--cluster-address",
      "127.0.0.1"}});
  CHECK(wait_for_v2(server.http_port(), "\"state\":\"refused\"", std::chrono::seconds(10)));
  CHECK(worker.wait_for_output("refused server node", std::chrono::seconds(5)));
  CHECK(worker.output().find("accepted server node") == std::string::npos);
  // The server still answers with its own executors; the worker ran nothing.
  CHECK(run_load(server.http_port(), {1, 10, "fast", nullptr, 0}).correct == 10);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_batches_total") == 0);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_up") == 0);

  // A worker with the wrong secret cannot join that server either.
  REQUIRE(server.wait_for_output("cluster listening on 127.0.0.1:", std::chrono::seconds(5)));
  auto out = server.output();
  auto at = out.find("cluster listening on 127.0.0.1:") + 31;
  auto join_to = "127.0.0.1:" + out.substr(at, out.find('\n', at) - at);
  worker_process intruder({repo.path().string(), "intruder", {"--join", join_to}, {}});
  CHECK(intruder.wait_for_output("the server refused", std::chrono::seconds(10)));
  CHECK(intruder.output().find("joined server") == std::string::npos);
}

TEST_CASE("a secret on the command line is rejected with the fix") {
  support::temp_repository repo;
  write_test_models(repo, 0);
  REQUIRE_THROWS_WITH_AS(
    support::server_process({CAF_SERVING_BINARY, repo.path().string(),
                             {"--cluster-secret", "x"}, std::chrono::milliseconds(5000)}),
    doctest::Contains("did not start"), std::runtime_error);
}
