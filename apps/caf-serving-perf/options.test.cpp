#include "options.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::perf;

TEST_CASE("perf_analyzer's flags parse") {
  auto r = parse_options({"-m", "identity_fp32", "-u", "127.0.0.1:9000", "-b",
                          "4", "--shape", "INPUT0:16", "--input-data", "zero",
                          "--concurrency-range", "1:8:2",
                          "--measurement-interval", "500", "--percentile=95",
                          "-f", "out.csv"});
  REQUIRE(r.error.empty());
  const auto& o = r.value;
  CHECK(o.model == "identity_fp32");
  CHECK(o.url == "127.0.0.1:9000");
  CHECK(o.batch_size == 4);
  REQUIRE(o.shapes.size() == 1);
  CHECK(o.shapes[0].dims == std::vector<int64_t>{16});
  CHECK(o.input_data == input_data_kind::zero);
  CHECK(range_levels(*o.concurrency) == std::vector<double>{1, 3, 5, 7});
  CHECK(o.measurement_interval_ms == 500);
  CHECK(o.warmup_ms == 500);
  CHECK(o.percentile == 95);
  CHECK(o.csv_file == "out.csv");
}

TEST_CASE("open loop and the latency target") {
  auto r = parse_options({"-m", "m", "--request-rate-range", "100:400:100",
                          "--request-distribution", "poisson",
                          "--latency-target-ms", "50"});
  REQUIRE(r.error.empty());
  CHECK(r.value.distribution == arrival_kind::poisson);
  CHECK(*r.value.latency_target_ms == 50);
  CHECK(range_levels(*r.value.request_rate).size() == 4);
  CHECK_FALSE(r.value.concurrency);
}

TEST_CASE("the default is concurrency 1") {
  auto r = parse_options({"-m", "m"});
  REQUIRE(r.error.empty());
  REQUIRE(r.value.concurrency);
  CHECK(r.value.concurrency->start == 1);
}

TEST_CASE("bad options are refused with a message") {
  CHECK(parse_options({}).error.find("-m MODEL") != std::string::npos);
  CHECK(parse_options({"-m", "m", "--bogus"}).error.find("--bogus")
        != std::string::npos);
  CHECK_FALSE(parse_options({"-m", "m", "-b", "0"}).error.empty());
  CHECK_FALSE(parse_options({"-m", "m", "--shape", "X:1,a"}).error.empty());
  CHECK_FALSE(parse_options({"-m", "m", "--concurrency-range", "4:2"})
                .error.empty());
  CHECK_FALSE(parse_options({"-m", "m", "--request-distribution", "gamma"})
                .error.empty());
  CHECK_FALSE(parse_options({"-m", "m", "--concurrency-range", "1:2",
                             "--request-rate-range", "10"})
                .error.empty());
  CHECK_FALSE(parse_options({"-m", "m", "--percentile", "101"}).error.empty());
  CHECK_FALSE(parse_options({"-m", "m", "-u"}).error.empty());
  CHECK(parse_options({"--help"}).help);
}
