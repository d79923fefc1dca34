/// caf-serving-perf's generative mode against the real caf-serving serving
/// the tiny GPT-2 fixture of tests/generative: the report's numbers must be
/// consistent with what was asked (ignore_eos makes every output the asked
/// length; completions' token-id prompts have the asked length) and with
/// each other (TTFT <= e2e, TPOT x (tokens - 1) <= e2e, tokens/s = requests/s
/// x tokens).
#include <doctest/doctest.h>

#include <filesystem>

#include "perf_harness.hpp"

using namespace perf_test;

namespace {

/// A model repository holding a copy of the fixture.
struct fixture_repository {
  std::filesystem::path path;
  fixture_repository() {
    path = temp_path("-repo");
    std::filesystem::create_directories(path);
    std::filesystem::copy(std::string(GENERATIVE_FIXTURES) + "/tiny_gpt2",
                          path / "tiny_gpt2",
                          std::filesystem::copy_options::recursive);
  }
  ~fixture_repository() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

simdjson::dom::element run_json(simdjson::dom::parser& parser, std::string& text,
                                const std::vector<std::string>& args) {
  auto json = temp_path(".json");
  auto all = args;
  all.push_back("--json");
  all.push_back(json);
  auto r = run_tool(PERF_TOOL, all, 90);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  text = read_text(json);
  unlink(json.c_str());
  auto doc = parser.parse(text);
  REQUIRE(doc.error() == simdjson::SUCCESS);
  return doc.value();
}

double num(simdjson::dom::element e) {
  return e.get_double().value();
}

} // namespace

TEST_CASE("openai-completions at concurrency 1 and 4: counts as asked, "
          "latencies consistent") {
  fixture_repository repo;
  server_process server({CAF_SERVING, "--model-repository", repo.path.string(),
                         "--http-port", "0", "--metrics-port", "0",
                         "--allow-grpc", "false"});
  constexpr int prompt = 24;
  constexpr int output = 16;
  simdjson::dom::parser parser;
  std::string text;
  auto doc = run_json(parser, text,
                      {"--generate", "openai-completions", "-m", "tiny_gpt2", "-u",
                       server.url(), "--prompt-tokens", std::to_string(prompt),
                       "--output-tokens", std::to_string(output),
                       "--concurrency-range", "1:4:3", "--measurement-interval", "500",
                       "--warmup-interval", "200", "--max-trials", "3",
                       "--ttft-target-ms", "60000", "--tpot-target-ms", "60000"});
  CHECK(std::string_view(doc["generate"].get_string().value()) == "openai-completions");
  int steps = 0;
  for (auto s : doc["steps"].get_array()) {
    ++steps;
    CAPTURE(steps);
    CHECK(s["errors"].get_object().value().size() == 0);
    CHECK(s["completed"].get_uint64().value() == s["sent"].get_uint64().value());
    auto g = s["generation"];
    auto requests = g["requests"].get_uint64().value();
    REQUIRE(requests > 0);
    CHECK(requests == s["count"].get_uint64().value());
    CHECK(g["output_tokens"].get_uint64().value() == requests * output);
    CHECK(g["prompt_tokens"].get_uint64().value() == requests * prompt);
    // Generous targets: every request is good.
    CHECK(g["good"].get_uint64().value() == requests);
    CHECK(num(g["goodput"]) == doctest::Approx(num(g["requests_per_s"])));
    double seconds = num(s["duration_ms"]) / 1e3;
    CHECK(num(g["requests_per_s"]) == doctest::Approx(requests / seconds).epsilon(1e-3));
    CHECK(num(g["output_tokens_per_s"])
          == doctest::Approx(num(g["requests_per_s"]) * output).epsilon(1e-3));
    CHECK(g["ttft"]["count"].get_uint64().value() == requests);
    CHECK(g["e2e"]["count"].get_uint64().value() == requests);
    CHECK(g["tpot"]["count"].get_uint64().value() == requests);
    CHECK(num(g["ttft"]["min"]) > 0);
    CHECK(num(g["ttft"]["max"]) <= num(g["e2e"]["max"]));
    CHECK(num(g["ttft"]["p50"]) <= num(g["e2e"]["p50"]));
    CHECK(num(g["tpot"]["max"]) * (output - 1) <= num(g["e2e"]["max"]));
    // Inter-chunk gaps lie within one request's span; at most output - 1
    // per request (chunks may carry several tokens).
    CHECK(g["itl"]["count"].get_uint64().value() <= requests * (output - 1));
    CHECK(num(g["itl"]["max"]) <= num(g["e2e"]["max"]));
    // The e2e latency is the one-shot latency of the same requests.
    CHECK(num(g["e2e"]["p50"]) == doctest::Approx(num(s["latency"]["p50"])));
  }
  CHECK(steps == 2);

  // An unreachable TTFT target: nobody is good.
  auto strict = run_json(parser, text,
                         {"--generate", "openai-chat", "-m", "tiny_gpt2", "-u",
                          server.url(), "--prompt-tokens", "8:16", "--output-tokens", "4",
                          "--concurrency-range", "2", "--measurement-interval", "400",
                          "--warmup-interval", "100", "--max-trials", "3",
                          "--ttft-target-ms", "0.000001"});
  for (auto s : strict["steps"].get_array()) {
    auto g = s["generation"];
    REQUIRE(g["requests"].get_uint64().value() > 0);
    CHECK(g["output_tokens"].get_uint64().value() == 4 * g["requests"].get_uint64().value());
    CHECK(g["good"].get_uint64().value() == 0);
    CHECK(num(g["goodput"]) == 0);
  }
}

TEST_CASE("triton generate_stream under an open-loop Poisson load") {
  fixture_repository repo;
  server_process server({CAF_SERVING, "--model-repository", repo.path.string(),
                         "--http-port", "0", "--metrics-port", "0",
                         "--allow-grpc", "false"});
  simdjson::dom::parser parser;
  std::string text;
  auto doc = run_json(parser, text,
                      {"--generate", "triton", "-m", "tiny_gpt2", "-u", server.url(),
                       "--prompt-tokens", "16", "--output-tokens", "8", "--load",
                       "poisson:20", "--measurement-interval", "1000",
                       "--warmup-interval", "200"});
  for (auto s : doc["steps"].get_array()) {
    auto g = s["generation"];
    auto requests = g["requests"].get_uint64().value();
    REQUIRE(requests > 5);
    CHECK(s["errors"].get_object().value().size() == 0);
    // No usage in Triton's stream: chunks count as tokens, at most 8 each.
    CHECK(g["output_tokens"].get_uint64().value() <= 8 * requests);
    CHECK(g["output_tokens"].get_uint64().value() >= requests);
    CHECK(num(g["ttft"]["max"]) <= num(g["e2e"]["max"]));
  }
}
