/// The latency-target search finds the known knee of perf-test-endpoint, and
/// failures (no server, unknown model, bad shape) end quickly with a clear
/// message and a non-zero exit.
#include <doctest/doctest.h>

#include "perf_checks.hpp"
#include "perf_harness.hpp"

using namespace perf_test;

TEST_CASE("latency target: a serial 4 ms server sustains 250 req/s and no "
          "more") {
  server_process server({PERF_ENDPOINT, "--delay-ms", "4"});
  auto json = temp_path(".json");
  auto r = run_tool(PERF_TOOL,
                    {"-m", "identity_fp32", "-u", server.url(),
                     "--latency-target-ms", "60", "--request-rate-range",
                     "100:2000", "--measurement-interval", "500",
                     "--warmup-interval", "200", "--max-trials", "3",
                     "--json", json},
                    80);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  simdjson::dom::parser parser;
  auto text = read_text(json);
  unlink(json.c_str());
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  auto search = doc["search"];
  CHECK(search["found"].get_bool().value());
  double rate = search["rate"].get_double().value();
  double failed = search["failed_rate"].get_double().value();
  // Below capacity the latency is the 4 ms service time; above it the queue
  // grows without bound and P99 passes 60 ms within the probe.
  CHECK(rate >= 0.85 * 250);
  CHECK(rate <= 1.06 * 250);
  CHECK(failed > rate);
  CHECK(failed <= 1.25 * 250);
  CHECK(r.out.find("at P99 under 60 ms the largest sustained rate is")
        != std::string::npos);
}

TEST_CASE("an unreachable server is an error, not a hang") {
  // Port 1 on loopback: nothing listens there.
  auto r = run_tool(PERF_TOOL, {"-m", "identity_fp32", "-u", "127.0.0.1:1"},
                    20);
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("cannot connect to 127.0.0.1:1") != std::string::npos);
}

TEST_CASE("an unknown model and bad shapes are errors with a reason") {
  server_process server({PERF_ENDPOINT, "--delay-ms", "1"});
  check_unknown_model_fails(PERF_TOOL, server.url());

  // Caught against the metadata before any request is sent.
  auto local = run_tool(PERF_TOOL, {"-m", "identity_fp32", "-u", server.url(),
                                    "--shape", "INPUT0:7"},
                        20);
  CHECK(local.exit_code == 1);
  CHECK(local.err.find("expects [-1,16]") != std::string::npos);

  // A shape only the server can refuse (from a data file): the test request
  // fails and the server's own message is shown.
  auto remote = check_server_rejects_short_input(PERF_TOOL, server.url());
  CHECK(remote.err.find("HTTP 400") != std::string::npos);

  auto usage = run_tool(PERF_TOOL, {"-u", server.url()}, 20);
  CHECK(usage.exit_code == 1);
  CHECK(usage.err.find("-m MODEL") != std::string::npos);
}
