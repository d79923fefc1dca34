/// The failure test with the worker on a host of its own: a network namespace
/// joined to this one by a veth pair. Cutting the link (no process dies, no
/// connection is closed) must be noticed by the heartbeat timeout; the batches the
/// cut-off worker held are answered by the other worker. Where network namespaces
/// cannot be made (no CAP_NET_ADMIN, no `ip`) it says so and exits 77, which CTest
/// reports as skipped (cmake/CafServingTesting.cmake).

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

namespace {

int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

/// A namespace with 10.231.N.2, reached from here at 10.231.N.1; removed at the end.
struct netns_host {
  std::string ns, veth_here, veth_there, here_ip, there_ip;
  bool ok = false;

  netns_host() {
    auto id = std::to_string(getpid() % 200 + 20);
    ns = "cafs-test-" + std::to_string(getpid());
    veth_here = "cafsh" + id;
    veth_there = "cafsw" + id;
    here_ip = "10.231." + id + ".1";
    there_ip = "10.231." + id + ".2";
    ok = sh("ip netns add " + ns) == 0
         && sh("ip link add " + veth_here + " type veth peer name " + veth_there) == 0
         && sh("ip link set " + veth_there + " netns " + ns) == 0
         && sh("ip addr add " + here_ip + "/24 dev " + veth_here) == 0
         && sh("ip link set " + veth_here + " up") == 0
         && sh("ip netns exec " + ns + " ip addr add " + there_ip + "/24 dev " + veth_there) == 0
         && sh("ip netns exec " + ns + " ip link set " + veth_there + " up") == 0
         && sh("ip netns exec " + ns + " ip link set lo up") == 0;
  }
  ~netns_host() { remove(); }
  void remove() {
    sh("ip link del " + veth_here);
    sh("ip netns del " + ns);
  }
  /// Drops every packet on the link, both ways, without telling either side.
  bool cut() {
    return sh("ip netns exec " + ns + " ip link set " + veth_there + " down") == 0;
  }
};

} // namespace

TEST_CASE("a worker on another host whose link is cut is lost; no request is") {
  netns_host host;
  if (!host.ok) {
    std::printf("SKIPPED: cannot create a network namespace with a veth link here (needs "
                "CAP_NET_ADMIN and iproute2); the kill -9 failover test covers the rest\n");
    std::fflush(stdout);
    host.remove(); // what a partial set-up made: exit runs no destructor
    std::exit(77);
  }
  setenv("CAF_SERVING_CLUSTER_SECRET", "netns-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 3000);
  worker_process far({repo.path().string(), "far",
                      {"--address", host.there_ip, "--heartbeat-ms", "100",
                       "--node-timeout-ms", "500"},
                      {"ip", "netns", "exec", host.ns}});
  worker_process near({repo.path().string(), "near", {}, {}});
  auto far_addr = host.there_ip + ":" + std::to_string(far.port());
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", far_addr, "--worker", near.address(),
                                   "--local-executors", "false", "--heartbeat-ms", "100",
                                   "--node-timeout-ms", "500", "--remote-timeout-ms",
                                   "3000"}});
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"far\",\"address\":\"" + far_addr
                                            + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"near\"", std::chrono::seconds(10)));
  std::chrono::steady_clock::time_point cut_at;
  load_config load{6, 50, "slow", nullptr, 90};
  load.midway = [&] {
    cut_at = std::chrono::steady_clock::now();
    CHECK(host.cut());
  };
  auto totals = run_load(server.http_port(), load);
  INFO(totals.first_failure);
  CHECK(totals.correct == 300);
  CHECK(totals.failed == 0);
  CHECK(wait_for_v2(server.http_port(), "\"name\":\"far\",\"address\":\"" + far_addr
                                          + "\",\"state\":\"lost\"",
                    std::chrono::seconds(5)));
  auto detected = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  auto p = server.metrics_port();
  MESSAGE("far worker lost within " << detected << " s of the cut; batches lost and re-sent: "
                                    << metric_sum(p, "caf_serving_worker_batches_lost_total"));
  CHECK(metric_sum(p, "caf_serving_inference_request_success", "model=\"slow\"") == 300);
}
