/// caf-serving-perf against the real caf-serving: started here on a free
/// loopback port with the example repository, stopped at the end.
#include <doctest/doctest.h>

#include "perf_checks.hpp"
#include "perf_harness.hpp"

using namespace perf_test;

namespace {

uint64_t server_success_count(int port, const std::string& model) {
  auto body = http_get(port, "/v2/models/" + model + "/stats");
  simdjson::dom::parser parser;
  auto doc = parser.parse(body);
  if (doc.error())
    return 0;
  uint64_t n = 0;
  for (auto m : doc["model_stats"].get_array()) {
    uint64_t c = 0;
    if (!m["inference_stats"]["success"]["count"].get_uint64().get(c))
      n += c;
  }
  return n;
}

} // namespace

TEST_CASE("a concurrency sweep on identity_fp32: every request answered and "
          "counted by the server") {
  server_process server({CAF_SERVING, "--model-repository", MODEL_REPOSITORY,
                         "--http-port", "0"});
  auto before = server_success_count(server.port(), "identity_fp32");
  auto json = temp_path(".json");
  auto r = run_tool(PERF_TOOL,
                    {"-m", "identity_fp32", "-u", server.url(),
                     "--concurrency-range", "1:4:3", "--measurement-interval",
                     "400", "--warmup-interval", "200", "--max-trials", "3",
                     "--json", json},
                    60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto text = read_text(json);
  unlink(json.c_str());
  simdjson::dom::parser parser;
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  uint64_t completed = 0;
  for (auto s : doc["steps"].get_array()) {
    CHECK(s["throughput"].get_double().value() > 50);
    CHECK(s["errors"].get_object().value().size() == 0);
    CHECK(s["completed"].get_uint64().value() == s["sent"].get_uint64().value());
    completed += s["completed"].get_uint64().value();
  }
  // The server counted every request of the tool, plus its test request.
  auto after = server_success_count(server.port(), "identity_fp32");
  if (after > 0)
    CHECK(after - before == completed + 1);
}

TEST_CASE("simple (two INT32 inputs) with -b 4 and JSON tensors, open loop") {
  server_process server({CAF_SERVING, "--model-repository", MODEL_REPOSITORY,
                         "--http-port", "0"});
  auto json = temp_path(".json");
  auto r = run_tool(PERF_TOOL,
                    {"-m", "simple", "-u", server.url(), "-b", "4",
                     "--input-tensor-format", "json", "--output-tensor-format",
                     "json", "--request-rate-range", "200",
                     "--request-distribution", "poisson",
                     "--measurement-interval", "500", "--warmup-interval",
                     "200", "--max-trials", "3", "--json", json},
                    60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto text = read_text(json);
  unlink(json.c_str());
  simdjson::dom::parser parser;
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  auto step = doc["steps"].at(0);
  CHECK(step["throughput"].get_double().value()
        == doctest::Approx(200).epsilon(0.15));
  CHECK(step["errors"].get_object().value().size() == 0);
}

TEST_CASE("against caf-serving: unknown model and bad shape fail clearly") {
  server_process server({CAF_SERVING, "--model-repository", MODEL_REPOSITORY,
                         "--http-port", "0"});
  check_unknown_model_fails(PERF_TOOL, server.url());
  auto bad = run_tool(PERF_TOOL, {"-m", "identity_fp32", "-u", server.url(),
                                  "--shape", "INPUT0:1,7"},
                      20);
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("expects [-1,16]") != std::string::npos);
  check_server_rejects_short_input(PERF_TOOL, server.url());
}
