/// Closed loop against perf-test-endpoint, whose single server takes a known
/// time per request: throughput, latency per concurrency, percentiles,
/// server-side breakdown, error counts, request counts, and the output files.
#include <doctest/doctest.h>

#include "perf_harness.hpp"

using namespace perf_test;

namespace {

simdjson::dom::element parse_json(simdjson::dom::parser& parser,
                                  const std::string& path) {
  auto text = read_text(path);
  auto doc = parser.parse(text);
  REQUIRE_MESSAGE(doc.error() == simdjson::SUCCESS, "bad JSON: " << text);
  return doc.value();
}

/// Short windows so each test takes seconds, not minutes.
std::vector<std::string> quick(std::vector<std::string> args) {
  for (const char* a : {"--measurement-interval", "400", "--warmup-interval",
                        "200", "--max-trials", "4"})
    args.push_back(a);
  return args;
}

} // namespace

TEST_CASE("a serial 5 ms server: 200 req/s at any concurrency, latency grows "
          "with concurrency, and the breakdown shows the queue") {
  server_process server({PERF_ENDPOINT, "--delay-ms", "5"});
  auto json = temp_path(".json");
  auto csv = temp_path(".csv");
  auto svg = temp_path(".svg");
  auto r = run_tool(PERF_TOOL,
                    quick({"-m", "identity_fp32", "-u", server.url(),
                           "--concurrency-range", "1:4:3", "--json", json,
                           "-f", csv, "--svg", svg}));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  simdjson::dom::parser parser;
  auto doc = parse_json(parser, json);
  auto steps = doc["steps"].get_array().value();
  REQUIRE(steps.size() == 2);
  auto c1 = steps.at(0).value();
  auto c4 = steps.at(1).value();
  CHECK(c1["concurrency"].get_int64().value() == 1);
  // Concurrency 1: one request at a time, 5 ms each plus the round trip
  // (which on a loaded 2-core machine can take a few ms: upper bounds are
  // loose, lower bounds are exact).
  double t1 = c1["throughput"].get_double().value();
  CHECK(t1 > 100);
  CHECK(t1 <= 201);
  double p50_1 = c1["latency"]["p50"].get_double().value();
  CHECK(p50_1 >= 5000);
  CHECK(p50_1 < 9000);
  // Concurrency 4: the server never idles, so exactly its capacity, and each
  // request waits for the three ahead of it.
  double t4 = c4["throughput"].get_double().value();
  CHECK(t4 == doctest::Approx(200).epsilon(0.06));
  double avg4 = c4["latency"]["avg"].get_double().value();
  CHECK(avg4 >= 19000);
  CHECK(avg4 < 24000);
  auto server4 = c4["server"];
  CHECK(server4["compute_infer"].get_double().value()
        == doctest::Approx(5000).epsilon(0.01));
  CHECK(server4["queue"].get_double().value()
        == doctest::Approx(15000).epsilon(0.25));
  // Every request the tool completed reached the endpoint, and nothing else
  // did but the tool's one test request.
  uint64_t completed = 0;
  for (auto s : steps) {
    CHECK(s["completed"].get_uint64().value() == s["sent"].get_uint64().value());
    CHECK(s["errors"].get_object().value().size() == 0);
    completed += s["completed"].get_uint64().value();
  }
  CHECK(endpoint_arrivals(server.port()).size() == completed + 1);
  // CSV: perf_analyzer's header, one row per level; SVG: both panels.
  auto csv_text = read_text(csv);
  CHECK(csv_text.rfind("Concurrency,Inferences/Second,Client Send,", 0) == 0);
  CHECK(std::count(csv_text.begin(), csv_text.end(), '\n') == 3);
  auto svg_text = read_text(svg);
  CHECK(svg_text.find("Throughput vs concurrency") != std::string::npos);
  CHECK(r.out.find("Concurrency") != std::string::npos);
  for (const auto& p : {json, csv, svg})
    unlink(p.c_str());
}

TEST_CASE("percentiles: 1 request in 50 takes 100 ms, the rest 10 ms") {
  server_process server({PERF_ENDPOINT, "--delay-ms", "10", "--slow-every",
                         "50", "--slow-delay-ms", "100"});
  auto json = temp_path(".json");
  auto r = run_tool(PERF_TOOL, {"-m", "identity_fp32", "-u", server.url(),
                                "--measurement-interval", "1000",
                                "--warmup-interval", "200", "--max-trials",
                                "3", "--json", json});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  simdjson::dom::parser parser;
  auto doc = parse_json(parser, json);
  auto lat = doc["steps"].at(0)["latency"];
  // 2% are slow: P50, P90 and P95 are fast, P99 and P99.9 are slow. Long
  // service times leave room for a busy machine's stalls (a few ms), which
  // only ever add latency.
  for (const char* p : {"p50", "p90", "p95"}) {
    double v = lat[p].get_double().value();
    INFO(std::string(p) << " = " << v);
    CHECK(v >= 10000);
    CHECK(v < 18000);
  }
  for (const char* p : {"p99", "p99.9"}) {
    double v = lat[p].get_double().value();
    INFO(std::string(p) << " = " << v);
    CHECK(v >= 100000);
    CHECK(v < 115000);
  }
  double avg = lat["avg"].get_double().value();
  // 0.98 * 10 ms + 0.02 * 100 ms, plus round trips
  CHECK(avg >= 11800);
  CHECK(avg < 15000);
  unlink(json.c_str());
}

TEST_CASE("errors are counted by status code, and latency only over "
          "successes") {
  server_process server({PERF_ENDPOINT, "--delay-ms", "1", "--fail-every",
                         "10"});
  auto json = temp_path(".json");
  auto r = run_tool(PERF_TOOL,
                    quick({"-m", "identity_fp32", "-u", server.url(),
                           "--concurrency-range", "2", "--json", json}));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  simdjson::dom::parser parser;
  auto doc = parse_json(parser, json);
  auto step = doc["steps"].at(0);
  double ok = static_cast<double>(step["count"].get_uint64().value());
  double failed = static_cast<double>(step["errors"]["503"].get_uint64().value());
  CHECK(failed / (ok + failed) == doctest::Approx(0.1).epsilon(0.05));
  CHECK(step["latency"]["count"].get_uint64().value()
        == step["count"].get_uint64().value());
  CHECK(r.out.find("503:") != std::string::npos);
  unlink(json.c_str());
}

TEST_CASE("a test request that is shed is sent again before the run gives up") {
  // Every request answered 503: the server sheds everything.
  server_process server({PERF_ENDPOINT, "--delay-ms", "1", "--fail-every", "1"});
  auto r = run_tool(PERF_TOOL, quick({"-m", "identity_fp32", "-u", server.url(),
                                      "--concurrency-range", "1"}));
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("shed the test request for model 'identity_fp32' 5 times")
        != std::string::npos);
  // Five tries of the test request, and no load after them.
  CHECK(endpoint_arrivals(server.port()).size() == 5);
}
