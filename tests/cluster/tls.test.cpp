/// TLS on the cluster's links (--tls-certificate/--tls-key/--tls-ca): a throwaway CA
/// and certificates are made at run time with the openssl CLI. Workers that dial
/// in (--join) and workers the server dials (--worker) serve over TLS; a worker
/// whose certificate comes from another CA, or one without TLS, never gets in,
/// and the server keeps serving.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

TEST_CASE("joined and dialled workers serve over TLS; foreign and plain workers stay out") {
  REQUIRE_MESSAGE(std::system("openssl version >/dev/null 2>&1") == 0,
                  "this test needs the openssl CLI (scripts/install-deps installs it)");
  setenv("CAF_SERVING_CLUSTER_SECRET", "tls-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 1000);
  support::temp_repository pki_dir; // not in the model repository
  auto pki = pki_dir.path();
  make_test_ca(pki, "ca");
  make_test_ca(pki, "rogue-ca");
  for (auto name : {"server", "w1", "w2"})
    make_test_cert(pki, "ca", name);
  make_test_cert(pki, "rogue-ca", "rogue");

  worker_process w1({repo.path().string(), "w1", tls_flags(pki, "ca", "w1"), {}});
  CHECK(w1.wait_for_output("cluster links use TLS", std::chrono::seconds(1)));
  // The bulk channel is plain TCP: under TLS neither end opens it.
  CHECK(w1.wait_for_output("bulk channel off", std::chrono::seconds(1)));
  support::server_process server(
    {CAF_SERVING_BINARY, repo.path().string(),
     concat({"--worker", w1.address(), "--cluster-port", "0", "--cluster-address", "127.0.0.1",
             "--local-executors", "false"},
            tls_flags(pki, "ca", "server"))});
  CHECK(server.wait_for_output("cluster links use TLS", std::chrono::seconds(5)));
  CHECK(server.wait_for_output("bulk channel off", std::chrono::seconds(5)));
  auto join_to = "127.0.0.1:" + std::to_string(cluster_port(server));
  worker_process w2(
    {repo.path().string(), "w2", concat({"--join", join_to}, tls_flags(pki, "ca", "w2")), {}});
  REQUIRE(w2.wait_for_output("joined server", std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w1\",\"address\":\"" + w1.address()
                                            + "\",\"state\":\"ready\"",
                      std::chrono::seconds(10)));
  REQUIRE(wait_for_v2(server.http_port(), "\"name\":\"w2\"", std::chrono::seconds(10)));

  auto totals = run_load(server.http_port(), {4, 50, "slow", nullptr, 0});
  INFO(totals.first_failure);
  CHECK(totals.correct == 200);
  auto p = server.metrics_port();
  CHECK(metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w1\"") > 0);
  CHECK(metric_sum(p, "caf_serving_worker_batches_total", "worker=\"w2\"") > 0);

  // A certificate from another CA: the TLS handshake fails, the worker logs it and
  // retries, and the server never lists it.
  worker_process rogue({repo.path().string(), "rogue",
                        concat({"--join", join_to}, tls_flags(pki, "rogue-ca", "rogue")), {}});
  CHECK(rogue.wait_for_output("cannot join " + join_to, std::chrono::seconds(10)));
  // A worker without TLS cannot join either.
  worker_process plain({repo.path().string(), "plain", {"--join", join_to}, {}});
  CHECK(plain.wait_for_output("cannot join " + join_to, std::chrono::seconds(10)));
  INFO("rogue: " << rogue.output() << "\nplain: " << plain.output());
  CHECK(rogue.output().find("joined server") == std::string::npos);
  CHECK(plain.output().find("joined server") == std::string::npos);
  support::http_client http(server.http_port());
  auto v2 = http.get("/v2").body;
  CHECK(v2.find("rogue") == std::string::npos);
  CHECK(v2.find("\"plain\"") == std::string::npos);
  // The server kept serving through both attempts.
  CHECK(run_load(server.http_port(), {2, 20, "slow", nullptr, 0}).correct == 40);
  CHECK(metric_sum(p, "caf_serving_worker_up") == 2);
}

TEST_CASE("a server the worker cannot verify is not served; TLS flags are checked at start") {
  REQUIRE(std::system("openssl version >/dev/null 2>&1") == 0);
  setenv("CAF_SERVING_CLUSTER_SECRET", "tls-test-secret", 1);
  support::temp_repository repo;
  write_test_models(repo, 0);
  support::temp_repository pki_dir; // not in the model repository
  auto pki = pki_dir.path();
  make_test_ca(pki, "ca");
  make_test_ca(pki, "rogue-ca");
  make_test_cert(pki, "ca", "w1");
  make_test_cert(pki, "rogue-ca", "rogue");

  // The server dials a TLS worker with a certificate of another CA: the worker
  // stays out of /v2's ready rows and runs nothing; the server answers itself.
  worker_process w1({repo.path().string(), "w1", tls_flags(pki, "ca", "w1"), {}});
  support::server_process server(
    {CAF_SERVING_BINARY, repo.path().string(),
     concat({"--worker", w1.address()}, tls_flags(pki, "rogue-ca", "rogue"))});
  CHECK(wait_for_v2(server.http_port(), "cannot connect", std::chrono::seconds(10)));
  CHECK(run_load(server.http_port(), {1, 10, "fast", nullptr, 0}).correct == 10);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_up") == 0);
  CHECK(w1.output().find("accepted server node") == std::string::npos);

  // Half the TLS flags, or a key that does not belong to the certificate, is a
  // start-up error, not a crash on the first link.
  auto d = pki.string() + "/";
  CHECK_THROWS_WITH_AS(
    worker_process({repo.path().string(), "bad", {"--tls-certificate", d + "w1.pem"}, {}}),
    doctest::Contains("needs all three"), std::runtime_error);
  CHECK_THROWS_WITH_AS(
    worker_process({repo.path().string(), "bad",
                    {"--tls-certificate", d + "w1.pem", "--tls-key", d + "rogue.key",
                     "--tls-ca", d + "ca.pem"},
                    {}}),
    doctest::Contains("key values mismatch"), std::runtime_error);
}
