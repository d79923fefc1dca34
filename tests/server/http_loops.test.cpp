/// Several HTTP event loops (--http-threads): many client threads, keep-alive
/// and new connections mixed, against a server with 2 loops. Every answer
/// must be the answer to its own request (each request carries values no
/// other request has), both loops must have served connections, and the
/// per-model statistics must count every request exactly once.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace caf_serving::server_test;

namespace {

/// The values request `i` of client `t` sends: unique across the test and
/// exact in FP32 (all below 2^24).
std::vector<float> values_of(int t, int i) {
  std::vector<float> v(16);
  for (int k = 0; k < 16; ++k)
    v[static_cast<size_t>(k)] = static_cast<float>(t * 1'000'000 + i * 100 + k);
  return v;
}

/// Accepted connections per loop, from /metrics (loop 0, 1, ...).
std::vector<double> accepted_by_loop(const test_server& server, int loops) {
  http_client m(server.process->metrics_port());
  auto text = m.get("/metrics").body;
  std::vector<double> out;
  for (int i = 0; i < loops; ++i)
    out.push_back(metric_value(text, "caf_serving_http_connections_accepted_total{loop=\""
                                       + std::to_string(i) + "\"}"));
  return out;
}

} // namespace

TEST_CASE("2 HTTP loops, 8 client threads, keep-alive and new connections: every answer is "
          "its own request's") {
  test_server server({example_model("identity_fp32")}, {"--http-threads", "2"});
  constexpr int clients = 8;
  constexpr int requests = 150;
  std::atomic<int> connections{0};
  std::vector<std::future<std::string>> done;
  for (int t = 0; t < clients; ++t)
    done.push_back(std::async(std::launch::async, [&, t]() -> std::string {
      http_client http(server.port());
      ++connections;
      for (int i = 0; i < requests; ++i) {
        // Every third request of a client opens a new connection; the others
        // reuse the kept-alive one.
        if (i > 0 && i % 3 == 0) {
          http.close();
          ++connections;
        }
        auto sent = values_of(t, i);
        auto r = http.post("/v2/models/identity_fp32/infer", fp32_identity_body(sent, 1),
                           json_content);
        if (r.status != 200)
          return "client " + std::to_string(t) + " request " + std::to_string(i) + ": status "
                 + std::to_string(r.status) + " " + r.body;
        if (fp32_output(json_document::parse(r.body)) != sent)
          return "client " + std::to_string(t) + " request " + std::to_string(i)
                 + " got another request's answer: " + r.body;
      }
      return {};
    }));
  for (auto& d : done) {
    auto problem = d.get();
    CHECK_MESSAGE(problem.empty(), problem);
  }

  // Both loops took connections, and together they took every one.
  auto accepted = accepted_by_loop(server, 2);
  CAPTURE(accepted[0]);
  CAPTURE(accepted[1]);
  CHECK(accepted[0] > 0);
  CHECK(accepted[1] > 0);
  CHECK(accepted[0] + accepted[1] >= connections.load());

  // The statistics count each request once, whichever loop answered it.
  auto stats = json_document::parse(server.client().get("/v2/models/identity_fp32/stats").body);
  CHECK(stats.uint_at("/model_stats/0/inference_stats/success/count") == clients * requests);
  CHECK(stats.uint_at("/model_stats/0/inference_count") == clients * requests);
}

TEST_CASE("2 HTTP loops share one response cache: the same request on new connections, "
          "whichever loop serves them, runs the model once") {
  test_server server({}, model_control_api({"--http-threads", "2", "--cache-config",
                                            "local,size=1048576"}));
  server.repo.write_file("cached/config.pbtxt",
                         "name: \"cached\"\nbackend: \"builtin\"\nmax_batch_size: 4\n"
                         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                         "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
                         "response_cache { enable: true }\n");
  server.repo.write_file("cached/1/model.builtin", "");
  REQUIRE(server.client().post("/v2/repository/models/cached/load", "").status == 200);
  std::vector<float> values{1.5f, -2.f, 3.25f, 4.f};
  constexpr int n = 8;
  // A new connection for each request, all kept open until the end: loop 0
  // hands each to the loop with the fewest open connections, so both loops
  // serve some. (Closed one by one, every connection could go to the loop
  // that does not hold the test's own kept-alive connection.)
  std::vector<std::unique_ptr<http_client>> open;
  for (int i = 0; i < n; ++i) {
    open.push_back(std::make_unique<http_client>(server.port()));
    auto r = open.back()->post("/v2/models/cached/infer", fp32_identity_body(values, 1),
                               json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(fp32_output(json_document::parse(r.body)) == values);
  }
  auto accepted = accepted_by_loop(server, 2);
  CHECK(accepted[0] > 0);
  CHECK(accepted[1] > 0);
  auto stats = json_document::parse(server.client().get("/v2/models/cached/stats").body);
  CHECK(stats.uint_at("/model_stats/0/execution_count") == 1);
  CHECK(stats.uint_at("/model_stats/0/inference_stats/cache_hit/count") == n - 1);
}
