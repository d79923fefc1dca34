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

TEST_CASE("--load: a fixed load shape, and goodput instead of a search") {
  auto r = parse_options({"-m", "m", "--load", "bursts:100:400:2000",
                          "--latency-target-ms", "50"});
  REQUIRE(r.error.empty());
  REQUIRE(r.value.load);
  CHECK(r.value.load->kind == arrival_kind::bursts);
  CHECK(r.value.load->rate == doctest::Approx(400));
  CHECK(*r.value.latency_target_ms == 50);
  CHECK_FALSE(r.value.concurrency);
  CHECK_FALSE(r.value.request_rate);

  auto step = parse_options({"-m", "m", "--load=step:50:150:4:8",
                             "--measurement-interval", "12000"});
  REQUIRE(step.error.empty());
  CHECK(step.value.load->kind == arrival_kind::step);
  CHECK(step.value.load->step_back_ns == 8'000'000'000);
}

TEST_CASE("--load refuses what does not fit with it") {
  CHECK(parse_options({"-m", "m", "--load", "poisson:10", "--concurrency-range", "2"})
          .error.find("--load is one fixed load")
        != std::string::npos);
  CHECK(parse_options({"-m", "m", "--load", "poisson:10", "--request-rate-range", "20"})
          .error.find("--load is one fixed load")
        != std::string::npos);
  CHECK(parse_options({"-m", "m", "--load", "step:10:20:5:9", "--measurement-interval",
                       "6000"})
          .error.find("measure longer")
        != std::string::npos);
  CHECK(parse_options({"-m", "m", "--load", "wave:3"}).error.find("not a load shape")
        != std::string::npos);
}

TEST_CASE("--request-parameter is repeatable and checked") {
  auto r = parse_options({"-m", "m", "--request-parameter", "timeout:20000:int",
                          "--request-parameter=priority:1:int"});
  REQUIRE(r.error.empty());
  REQUIRE(r.value.request_parameters.size() == 2);
  CHECK(r.value.request_parameters[0].name == "timeout");
  CHECK(r.value.request_parameters[0].json_value == "20000");
  CHECK(r.value.request_parameters[1].name == "priority");
  CHECK(parse_options({"-m", "m", "--request-parameter", "timeout"}).error.find("NAME:VALUE:TYPE")
        != std::string::npos);
}
