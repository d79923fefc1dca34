#include "arrivals.hpp"

#include <cmath>

#include <doctest/doctest.h>

using namespace caf_serving::perf;

namespace {

struct gap_stats {
  double mean_ns;
  double cv;
};

gap_stats gaps(arrival_schedule& s, int n) {
  std::vector<double> g;
  int64_t prev = 0;
  for (int i = 0; i < n; ++i) {
    auto t = s.next();
    g.push_back(static_cast<double>(t - prev));
    prev = t;
  }
  double mean = 0;
  for (auto x : g)
    mean += x;
  mean /= n;
  double var = 0;
  for (auto x : g)
    var += (x - mean) * (x - mean);
  var /= n;
  return {mean, std::sqrt(var) / mean};
}

} // namespace

TEST_CASE("constant arrivals are evenly spaced at the rate") {
  arrival_schedule s({arrival_kind::constant, 250});
  auto st = gaps(s, 1000);
  CHECK(st.mean_ns == doctest::Approx(4e6).epsilon(0.001));
  CHECK(st.cv < 0.001);
}

TEST_CASE("poisson arrivals have the rate and exponential gaps (CV near 1)") {
  arrival_config c{arrival_kind::poisson, 1000};
  c.seed = 7;
  arrival_schedule s(c);
  auto st = gaps(s, 20000);
  CHECK(st.mean_ns == doctest::Approx(1e6).epsilon(0.03));
  CHECK(st.cv == doctest::Approx(1.0).epsilon(0.05));
}

TEST_CASE("bursty arrivals keep the mean rate and send nothing when off") {
  arrival_config c{arrival_kind::bursty, 100};
  c.burst_on_ns = 50'000'000;
  c.burst_off_ns = 150'000'000;
  arrival_schedule s(c);
  int64_t last = 0;
  int n = 0;
  for (;;) {
    auto t = s.next();
    if (t >= 2'000'000'000)
      break;
    CHECK(t % 200'000'000 < 50'000'000);
    last = t;
    ++n;
  }
  CHECK(last > 0);
  // 2 s at a mean of 100/s.
  CHECK(n == doctest::Approx(200).epsilon(0.02));
}

TEST_CASE("a trace replays its gaps in a cycle") {
  auto tr = parse_trace("# gaps\n1000\n2000.5\n\n3000\n");
  REQUIRE(tr.error.empty());
  REQUIRE(tr.gaps_ns.size() == 3);
  arrival_config c{arrival_kind::trace};
  c.trace_gaps_ns = tr.gaps_ns;
  arrival_schedule s(c);
  CHECK(s.next() == 1'000'000);
  CHECK(s.next() == 3'000'500);
  CHECK(s.next() == 6'000'500);
  CHECK(s.next() == 7'000'500);
  CHECK_FALSE(parse_trace("10\nabc\n").error.empty());
  CHECK_FALSE(parse_trace("0\n0\n").error.empty());
  CHECK(parse_arrival_kind("poisson") == arrival_kind::poisson);
  CHECK_FALSE(parse_arrival_kind("gamma"));
}
