#include "report.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

using namespace caf_serving::perf;

namespace {

step_result step(std::size_t concurrency, double tput, int64_t lat_ns) {
  step_result s;
  s.level.concurrency = concurrency;
  std::vector<completion> done;
  for (int i = 0; i < 100; ++i)
    done.push_back({0, lat_ns + i * 1000, 200});
  done.push_back({0, 1, 503});
  auto w = summarize_window(done, static_cast<int64_t>(100 / tput * 1e9), 99);
  s.windows = {w};
  s.measured = w;
  s.stable = true;
  s.server.valid = true;
  s.server.queue_us = 100;
  s.server.compute_infer_us = 200;
  return s;
}

run_report sample() {
  run_report r;
  r.model = "identity_fp32";
  r.url = "127.0.0.1:8000";
  r.steps = {step(2, 400, 5'000'000), step(1, 200, 4'000'000)};
  return r;
}

} // namespace

TEST_CASE("CSV uses perf_analyzer's header and microseconds") {
  auto csv = format_csv(sample());
  CHECK(csv.rfind("Concurrency,Inferences/Second,Client Send,"
                  "Network+Server Send/Recv,Server Queue,Server Compute Input,"
                  "Server Compute Infer,Server Compute Output,Client Recv,"
                  "p50 latency,p90 latency,p95 latency,p99 latency,"
                  "Avg latency,request/response,response wait",
                  0)
        == 0);
  // Level order, whatever the run order; p50 of 4000..4099 us is 4049.
  auto line1 = csv.substr(csv.find('\n') + 1);
  CHECK(line1.rfind("1,200.00,0,", 0) == 0);
  CHECK(line1.find(",4049,") != std::string::npos);
}

TEST_CASE("JSON holds every step and window and parses") {
  auto text = format_json(sample());
  simdjson::dom::parser parser;
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  auto steps = doc["steps"].get_array();
  REQUIRE(steps.error() == simdjson::SUCCESS);
  CHECK(steps.value().size() == 2);
  auto first = steps.value().at(0);
  CHECK(first["concurrency"].get_int64().value() == 2);
  CHECK(first["errors"]["503"].get_int64().value() == 1);
  CHECK(first["latency"]["p50"].get_double().value() == doctest::Approx(5049));
  CHECK(first["server"]["queue"].get_double().value() == 100);
  CHECK(first["windows"].get_array().value().size() == 1);
}

TEST_CASE("the table and the search sentence") {
  auto r = sample();
  auto table = format_table(r);
  CHECK(table.find("Concurrency") != std::string::npos);
  CHECK(table.find("503:1") != std::string::npos);
  r.mode = run_mode::latency_target;
  r.target_ms = 50;
  r.search.found = true;
  r.search.rate = 190;
  r.search.failed_rate = 200;
  CHECK(search_sentence(r)
        == "at P99 under 50 ms the largest sustained rate is 190.0 "
           "requests/s (200.0 requests/s failed)");
}

TEST_CASE("the SVG has both panels and a line per percentile") {
  auto svg = format_svg(sample());
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("Latency vs throughput") != std::string::npos);
  CHECK(svg.find("Throughput vs concurrency") != std::string::npos);
  std::size_t lines = 0;
  for (auto p = svg.find("<polyline"); p != std::string::npos;
       p = svg.find("<polyline", p + 1))
    ++lines;
  CHECK(lines == 5);
  CHECK(svg.find("</svg>") != std::string::npos);
}

TEST_CASE("with a latency target the table, CSV and JSON hold goodput and shed apart") {
  auto r = sample();
  auto plain = format_table(r);
  CHECK(plain.find("Goodput/s") == std::string::npos);
  CHECK(plain.find("Shed%") != std::string::npos);
  r.mode = run_mode::fixed_load;
  // Latencies 4000..4099 us at level 1: 50 of them are within 4.0495 ms.
  r.target_ms = 4.0495;
  auto table = format_table(r);
  CHECK(table.find("Goodput/s") != std::string::npos);
  CHECK(table.find("goodput 100.0/s within 4.0495 ms (49.5% of answered), 50 late, 1 shed "
                   "(1.0%), 0 failed")
        != std::string::npos);
  auto csv = format_csv(r);
  auto line1 = csv.substr(csv.find('\n') + 1);
  line1 = line1.substr(0, line1.find('\n'));
  const std::string tail = ",4.0495,100.00,0.4950,50,1,0.0099,0";
  REQUIRE(line1.size() > tail.size());
  CHECK(line1.substr(line1.size() - tail.size()) == tail);
  simdjson::dom::parser parser;
  auto doc = parser.parse(format_json(r));
  REQUIRE(doc.error() == simdjson::SUCCESS);
  CHECK(std::string(doc["mode"].get_string().value()) == "fixed_load");
  auto slo = doc["steps"].at(1)["slo"];
  CHECK(slo["good"].get_uint64().value() == 50);
  CHECK(slo["shed"].get_uint64().value() == 1);
  CHECK(doc["steps"].at(1)["windows"].at(0)["slo"]["late"].get_uint64().value() == 50);
}
