/// Open loop against perf-test-endpoint: the arrival times the endpoint saw
/// must have the rate and shape asked for (constant, Poisson, bursty, trace),
/// and latency must count from the intended send time (coordinated omission).
#include <algorithm>

#include <doctest/doctest.h>

#include "perf_harness.hpp"

using namespace perf_test;

namespace {

struct open_run {
  tool_run run;
  double throughput = 0;
  double p90_us = 0;
  uint64_t completed = 0;
  std::vector<int64_t> arrivals;
};

/// Runs one open-loop level and collects what the endpoint saw.
open_run run_open(const std::vector<std::string>& endpoint_args,
                  const std::vector<std::string>& tool_args) {
  std::vector<std::string> args{PERF_ENDPOINT};
  args.insert(args.end(), endpoint_args.begin(), endpoint_args.end());
  server_process server(args);
  auto json = temp_path(".json");
  std::vector<std::string> targs{"-m", "identity_fp32", "-u", server.url(),
                                 "--measurement-interval", "1000",
                                 "--warmup-interval", "300", "--max-trials",
                                 "3", "--json", json};
  targs.insert(targs.end(), tool_args.begin(), tool_args.end());
  open_run r;
  r.run = run_tool(PERF_TOOL, targs);
  auto text = read_text(json);
  unlink(json.c_str());
  simdjson::dom::parser parser;
  auto doc = parser.parse(text);
  if (doc.error() == simdjson::SUCCESS) {
    auto step = doc["steps"].at(0);
    r.throughput = step["throughput"].get_double().value();
    r.p90_us = step["latency"]["p90"].get_double().value();
    r.completed = step["completed"].get_uint64().value();
  }
  r.arrivals = endpoint_arrivals(server.port());
  // The first arrival is the tool's test request, before the load starts.
  if (!r.arrivals.empty())
    r.arrivals.erase(r.arrivals.begin());
  return r;
}

} // namespace

TEST_CASE("constant 200 req/s: the endpoint sees evenly spaced requests") {
  auto r = run_open({"--delay-ms", "1"},
                    {"--request-rate-range", "200", "--request-distribution",
                     "constant"});
  INFO(r.run.out << r.run.err);
  REQUIRE(r.run.exit_code == 0);
  CHECK(r.throughput == doctest::Approx(200).epsilon(0.05));
  CHECK(r.arrivals.size() == r.completed);
  auto g = gaps_of(r.arrivals);
  CHECK(g.mean == doctest::Approx(5000).epsilon(0.03));
  // Most gaps are near 5 ms; timer jitter and a loaded machine's stalls move
  // a few. Poisson arrivals would put only 38% of the gaps in this band.
  INFO("gap cv " << g.cv);
  CHECK(g.share_below(1.5) - g.share_below(0.5) > 0.8);
}

TEST_CASE("poisson 400 req/s: the rate holds and the gaps are exponential") {
  auto r = run_open({"--delay-ms", "0.5"},
                    {"--request-rate-range", "400", "--request-distribution",
                     "poisson", "--seed", "3"});
  INFO(r.run.out << r.run.err);
  REQUIRE(r.run.exit_code == 0);
  CHECK(r.throughput == doctest::Approx(400).epsilon(0.12));
  CHECK(r.arrivals.size() == r.completed);
  auto g = gaps_of(r.arrivals);
  CHECK(g.mean == doctest::Approx(2500).epsilon(0.1));
  // An exponential distribution has CV 1; constant arrivals would give ~0.
  // A stall only raises the CV, so the lower bound holds on a loaded machine.
  INFO("gap cv " << g.cv << "; shares below 0.5, 1, 2 x mean: "
                 << g.share_below(0.5) << ", " << g.share_below(1.0) << ", "
                 << g.share_below(2.0));
  CHECK(g.cv > 0.8);
  // The shape: an exponential puts 1-exp(-x) of the gaps below x times the
  // mean (39%, 63%, 86% at 0.5, 1, 2). Constant arrivals give 0, ~50%, 100%;
  // clumped arrivals (CV well above 1) put far more below half the mean.
  CHECK(g.share_below(0.5) == doctest::Approx(0.393).epsilon(0.2));
  CHECK(g.share_below(1.0) == doctest::Approx(0.632).epsilon(0.1));
  CHECK(g.share_below(2.0) == doctest::Approx(0.865).epsilon(0.06));
}

TEST_CASE("bursty arrivals come only in the on phase; a trace is replayed") {
  auto r = run_open({"--delay-ms", "0.2"},
                    {"--request-rate-range", "200", "--request-distribution",
                     "bursty", "--burst-on-ms", "100", "--burst-off-ms",
                     "100"});
  INFO(r.run.out << r.run.err);
  REQUIRE(r.run.exit_code == 0);
  CHECK(r.throughput == doctest::Approx(200).epsilon(0.12));
  REQUIRE(r.arrivals.size() > 100);
  // In the on phase the gaps are 2.5 ms (400/s); the first request is due
  // 2.5 ms after the start. Fold the times onto the 200 ms period.
  auto origin = r.arrivals.front() - 2500;
  std::size_t in_off = 0;
  for (auto t : r.arrivals) {
    auto phase = (t - origin) % 200000;
    if (phase > 115000 && phase < 195000)
      ++in_off;
  }
  // Uniform arrivals would put 40% there; allow a loaded machine's delays.
  CHECK(in_off <= r.arrivals.size() / 20);

  auto trace = temp_path(".txt");
  {
    std::ofstream f(trace);
    f << "# gaps in microseconds\n2000\n8000\n";
  }
  auto t = run_open({"--delay-ms", "0.2"}, {"--request-intervals", trace});
  unlink(trace.c_str());
  INFO(t.run.out << t.run.err);
  REQUIRE(t.run.exit_code == 0);
  // Mean gap 5 ms: 200 req/s, alternating short and long gaps.
  CHECK(t.throughput == doctest::Approx(200).epsilon(0.06));
  std::vector<int64_t> gaps;
  for (std::size_t i = 1; i < t.arrivals.size(); ++i)
    gaps.push_back(t.arrivals[i] - t.arrivals[i - 1]);
  auto short_gaps = std::count_if(gaps.begin(), gaps.end(),
                                  [](int64_t g) { return g < 4000; });
  CHECK(static_cast<double>(short_gaps) / static_cast<double>(gaps.size())
        == doctest::Approx(0.5).epsilon(0.2));
}

TEST_CASE("coordinated omission: a stall counts for every request it "
          "delayed, not only the one it hit") {
  // One connection, so requests due during a 100 ms stall wait in the tool.
  // Every 50th request stalls; at 100 req/s the ~10 requests due during it
  // are late by 10..90 ms. Measured from the send time they would look fast
  // and P90 would be ~1 ms; measured from the intended time it is ~50 ms.
  auto r = run_open({"--delay-ms", "1", "--slow-every", "50",
                     "--slow-delay-ms", "100"},
                    {"--request-rate-range", "100", "--max-connections", "1"});
  INFO(r.run.out << r.run.err);
  REQUIRE(r.run.exit_code == 0);
  CHECK(r.p90_us > 20000);
  CHECK(r.throughput == doctest::Approx(100).epsilon(0.12));
}
