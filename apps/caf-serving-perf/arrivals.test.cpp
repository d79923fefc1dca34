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

TEST_CASE("--load bursts: Poisson at the burst rate inside each burst, nothing between") {
  auto shape = parse_load_shape("bursts:100:400:2000");
  REQUIRE(shape.error.empty());
  CHECK(shape.value.kind == arrival_kind::bursts);
  // The mean over a period: 2000/s for 100 ms of every 500 ms.
  CHECK(shape.value.rate == doctest::Approx(400));
  arrival_schedule s(shape.value);
  int n = 0;
  std::vector<double> gaps_in_burst;
  int64_t prev = -1;
  for (;;) {
    auto t = s.next();
    if (t >= 10'000'000'000)
      break;
    REQUIRE(t % 500'000'000 < 100'000'000);
    if (prev >= 0 && t / 500'000'000 == prev / 500'000'000)
      gaps_in_burst.push_back(static_cast<double>(t - prev));
    prev = t;
    ++n;
  }
  // 20 bursts of 200 expected arrivals each (Poisson: sd of the total ~63).
  CHECK(n == doctest::Approx(4000).epsilon(0.05));
  // Exponential gaps: coefficient of variation near 1, unlike `bursty`.
  double mean = 0, var = 0;
  for (auto g : gaps_in_burst)
    mean += g;
  mean /= static_cast<double>(gaps_in_burst.size());
  for (auto g : gaps_in_burst)
    var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps_in_burst.size());
  CHECK(mean == doctest::Approx(5e5).epsilon(0.1));
  CHECK(std::sqrt(var) / mean == doctest::Approx(1).epsilon(0.15));
}

TEST_CASE("--load step: the rate steps up at AT_S and back at BACK_S") {
  auto shape = parse_load_shape("step:1000:4000:2:3");
  REQUIRE(shape.error.empty());
  CHECK(shape.value.kind == arrival_kind::step);
  arrival_schedule s(shape.value);
  int before = 0, during = 0, after = 0;
  for (;;) {
    auto t = s.next();
    if (t >= 5'000'000'000)
      break;
    (t < 2'000'000'000 ? before : t < 3'000'000'000 ? during : after)++;
  }
  CHECK(before == doctest::Approx(2000).epsilon(0.07));
  CHECK(during == doctest::Approx(4000).epsilon(0.05));
  CHECK(after == doctest::Approx(2000).epsilon(0.07));

  // Without BACK_S the second rate stays.
  auto up = parse_load_shape("step:10:20:1");
  REQUIRE(up.error.empty());
  CHECK(up.value.step_back_ns == 0);
  CHECK(describe_arrivals(shape.value) == "poisson step 1000/s -> 4000/s at 2 s, back at 3 s");
}

TEST_CASE("--load names what is wrong with a shape") {
  auto p = parse_load_shape("poisson:250");
  REQUIRE(p.error.empty());
  CHECK(p.value.kind == arrival_kind::poisson);
  CHECK(p.value.rate == 250);
  CHECK(parse_load_shape("bursts:100:400").error.find("bursts:ON_MS:OFF_MS:RATE")
        != std::string::npos);
  CHECK(parse_load_shape("step:10:20:5:4").error.find("must come after")
        != std::string::npos);
  CHECK(parse_load_shape("poisson:-3").error.find("'-3' is not a positive number")
        != std::string::npos);
  CHECK_FALSE(parse_load_shape("sine:10").error.empty());
}
