#include "latency.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::perf;

TEST_CASE("nearest-rank percentiles over 1..1000") {
  std::vector<int64_t> v;
  for (int i = 1000; i >= 1; --i)
    v.push_back(i * 1000); // microseconds as nanoseconds
  auto s = summarize(v, 99);
  CHECK(s.count == 1000);
  CHECK(s.p50_us == 500);
  CHECK(s.p90_us == 900);
  CHECK(s.p99_us == 990);
  CHECK(s.p999_us == 999);
  CHECK(s.chosen_us == 990);
  CHECK(s.avg_us == doctest::Approx(500.5));
  CHECK(s.min_us == 1);
  CHECK(s.max_us == 1000);
  CHECK(percentile_of({}, 50) == 0);
}

TEST_CASE("a window counts 200s as successes and the rest by status") {
  std::vector<completion> done = {
    {0, 1000, 200}, {0, 3000, 200}, {0, 5, 503}, {0, 5, 0}, {0, 5, 503}};
  auto w = summarize_window(done, 500'000'000, 99);
  CHECK(w.ok == 2);
  CHECK(w.errors.at(503) == 2);
  CHECK(w.errors.at(0) == 1);
  CHECK(w.throughput == doctest::Approx(4.0));
  CHECK(w.latency.avg_us == doctest::Approx(2.0));
}

TEST_CASE("merged windows pool latencies and durations") {
  auto a = summarize_window({{0, 1000, 200}}, 1'000'000'000, 50);
  auto b = summarize_window({{0, 3000, 200}, {0, 5000, 200}, {0, 1, 500}},
                            1'000'000'000, 50);
  auto m = merge_windows({a, b}, 50);
  CHECK(m.ok == 3);
  CHECK(m.errors.at(500) == 1);
  CHECK(m.throughput == doctest::Approx(1.5));
  CHECK(m.latency.p50_us == 3);
}

TEST_CASE("stability needs three windows within the percentage") {
  auto w = [](double tput, int64_t lat_ns) {
    window_summary s;
    s.throughput = tput;
    s.latency.chosen_us = static_cast<double>(lat_ns) / 1e3;
    return s;
  };
  CHECK_FALSE(is_stable({w(100, 1000), w(100, 1000)}, 10));
  CHECK(is_stable({w(50, 9000), w(100, 1000), w(104, 1040), w(97, 980)}, 10));
  CHECK_FALSE(is_stable({w(100, 1000), w(130, 1000), w(100, 1000)}, 10));
  CHECK_FALSE(is_stable({w(100, 1000), w(100, 1500), w(100, 1000)}, 10));
  CHECK_FALSE(is_stable({w(0, 0), w(0, 0), w(0, 0)}, 10));
}

TEST_CASE("goodput counts OK answers within the target; shed and failed apart") {
  std::vector<completion> done;
  // 6 OK answers of 10..60 ms, 3 shed (503, 429), 1 server error, 1 broken connection.
  for (int i = 1; i <= 6; ++i)
    done.push_back({0, i * 10'000'000, 200});
  done.push_back({0, 1, 503});
  done.push_back({0, 1, 503});
  done.push_back({0, 1, 429});
  done.push_back({0, 1, 500});
  done.push_back({0, 1, 0});
  auto w = summarize_window(done, 2'000'000'000, 99);
  auto s = summarize_slo(w, 35'000);
  CHECK(s.good == 3);
  CHECK(s.late == 3);
  CHECK(s.shed == 3);
  CHECK(s.failed == 2);
  CHECK(s.goodput == doctest::Approx(1.5));
  CHECK(s.good_share == doctest::Approx(3.0 / 11));
  CHECK(s.shed_share == doctest::Approx(3.0 / 11));
  // A latency exactly at the target is in time.
  CHECK(summarize_slo(w, 40'000).good == 4);
  // Without a target every OK answer is good.
  CHECK(summarize_slo(w, 0).good == 6);
}
