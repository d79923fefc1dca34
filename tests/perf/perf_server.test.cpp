/// caf-serving-perf against the real caf-serving: started here on a free
/// loopback port with the example repository (or a generated one that can be
/// overloaded), stopped at the end.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>

#include <sys/stat.h>

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

namespace {

/// A model repository with builtin identity models that serve about 200
/// requests/s (batches of at most 4 that take 20 ms): slow_identity's queue
/// holds 4 requests, so that a higher rate is shed with 503 at once;
/// deadline_identity's queue is the server's (1024) and rejects a request
/// only when it waited longer than the request's own `timeout` parameter.
struct overloadable_repository {
  std::string dir;
  overloadable_repository() {
    char tmpl[] = "/tmp/perf-slo-repo-XXXXXX";
    dir = mkdtemp(tmpl);
    write_model("slow_identity", "max_queue_size: 4 timeout_action: REJECT");
    write_model("deadline_identity", "timeout_action: REJECT allow_timeout_override: true");
  }
  void write_model(const std::string& name, const std::string& queue_policy) {
    auto model = dir + "/" + name;
    mkdir(model.c_str(), 0755);
    mkdir((model + "/1").c_str(), 0755);
    std::ofstream(model + "/1/model") << "";
    std::ofstream(model + "/config.pbtxt")
      << "name: \"" << name << "\"\nbackend: \"builtin\"\nmax_batch_size: 4\n"
      << "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
         "dynamic_batching {\n  max_queue_delay_microseconds: 1000\n"
         "  default_queue_policy { "
      << queue_policy
      << " }\n}\n"
         "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
         "parameters { key: \"delay_us\" value: { string_value: \"20000\" } }\n";
  }
  ~overloadable_repository() {
    std::system(("rm -rf '" + dir + "'").c_str());
  }
};

uint64_t answered(simdjson::dom::element window) {
  uint64_t n = window["count"].get_uint64().value();
  for (auto [status, count] : window["errors"].get_object())
    n += count.get_uint64().value();
  return n;
}

} // namespace

TEST_CASE("--load with --latency-target-ms against an overloaded caf-serving: goodput, "
          "shed and failed counted apart") {
  overloadable_repository repo;
  server_process server({CAF_SERVING, "--model-repository", repo.dir, "--http-port", "0",
                         "--metrics-port", "0"});
  auto json = temp_path(".json");
  auto csv = temp_path(".csv");
  auto r = run_tool(PERF_TOOL,
                    {"-m", "slow_identity", "-u", server.url(), "--load", "poisson:800",
                     "--latency-target-ms", "200", "--measurement-interval", "1500",
                     "--warmup-interval", "300", "--json", json, "-f", csv},
                    60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // A fixed load is measured, not searched: one step, and its goodput sentence.
  CHECK(r.out.find("Goodput/s") != std::string::npos);
  CHECK(r.out.find("goodput ") != std::string::npos);
  auto text = read_text(json);
  auto csv_text = read_text(csv);
  unlink(json.c_str());
  unlink(csv.c_str());
  simdjson::dom::parser parser;
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  CHECK(std::string(doc["mode"].get_string().value()) == "fixed_load");
  auto steps = doc["steps"].get_array().value();
  REQUIRE(steps.size() == 1);
  auto step = steps.at(0).value();
  auto slo = step["slo"];
  // 800/s offered to a model that serves ~200/s with a queue of 4: most are shed.
  uint64_t shed = slo["shed"].get_uint64().value();
  CHECK(shed > 0);
  CHECK(shed == step["errors"]["503"].get_uint64().value());
  CHECK(slo["failed"].get_uint64().value() == 0);
  CHECK(slo["shed_share"].get_double().value() > 0.3);
  uint64_t good = slo["good"].get_uint64().value();
  CHECK(good > 0);
  CHECK(good + slo["late"].get_uint64().value() == step["count"].get_uint64().value());
  CHECK(slo["goodput"].get_double().value() <= step["throughput"].get_double().value());
  // Two windows of up to a second make the 1.5 s measurement (its timeline).
  CHECK(step["windows"].get_array().value().size() == 2);
  CHECK(csv_text.find(",Latency Target ms,Goodput/Second,Good Share,Late,Shed,Shed Share,"
                      "Failed\n")
        != std::string::npos);
}

TEST_CASE("--load step: the windows follow the step up and back down") {
  overloadable_repository repo;
  server_process server({CAF_SERVING, "--model-repository", repo.dir, "--http-port", "0",
                         "--metrics-port", "0"});
  auto json = temp_path(".json");
  auto r = run_tool(PERF_TOOL,
                    {"-m", "slow_identity", "-u", server.url(), "--load", "step:40:600:1:2",
                     "--latency-target-ms", "200", "--measurement-interval", "3000",
                     "--warmup-interval", "200", "--json", json},
                    60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto text = read_text(json);
  unlink(json.c_str());
  simdjson::dom::parser parser;
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  auto windows = doc["steps"].at(0)["windows"].get_array().value();
  REQUIRE(windows.size() == 3);
  // 40/s, then 600/s (mostly shed, answered at once), then 40/s again.
  auto before = answered(windows.at(0).value());
  auto during = answered(windows.at(1).value());
  auto after = answered(windows.at(2).value());
  CHECK(during > 4 * before);
  CHECK(during > 4 * after);
  // The queue of 4 overflows now and then even at 40/s (Poisson clumps, a busy
  // machine); at 600/s it overflows all the time.
  CHECK(windows.at(1)["slo"]["shed"].get_uint64().value()
        > 4 * windows.at(0)["slo"]["shed"].get_uint64().value());
}

TEST_CASE("--request-parameter timeout reaches caf-serving: requests that wait longer are shed") {
  overloadable_repository repo;
  server_process server({CAF_SERVING, "--model-repository", repo.dir, "--http-port", "0",
                         "--metrics-port", "0"});
  auto shed_at_3x = [&](std::vector<std::string> extra) {
    auto json = temp_path(".json");
    std::vector<std::string> args = {"-m", "deadline_identity", "-u", server.url(), "--load",
                                     "poisson:600", "--measurement-interval", "1000",
                                     "--warmup-interval", "200", "--json", json};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_tool(PERF_TOOL, args, 60);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    auto text = read_text(json);
    unlink(json.c_str());
    simdjson::dom::parser parser;
    auto doc = parser.parse(text);
    REQUIRE(doc.error() == simdjson::SUCCESS);
    return doc["steps"].at(0)["slo"]["shed"].get_uint64().value();
  };
  // 3x the capacity for 1.2 s queues ~500 requests: within the server's bound, so only a
  // deadline of the request's own sheds any.
  CHECK(shed_at_3x({}) == 0);
  CHECK(shed_at_3x({"--request-parameter", "timeout:5000:int"}) > 0);
}
