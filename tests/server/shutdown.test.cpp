/// Graceful shutdown: on SIGTERM or SIGINT the server stops accepting
/// connections, answers every request it already accepted (running or still
/// queued), and exits 0; a request still unanswered after --exit-timeout-secs
/// gets a 503 and the server exits anyway.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <future>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;

TEST_CASE("SIGTERM with requests in flight: every request is answered, exit 0") {
  test_server server({test_model("slow_drain")});
  constexpr int n = 6;
  std::vector<std::future<http_response>> in_flight;
  for (int i = 0; i < n; ++i) {
    in_flight.push_back(std::async(std::launch::async, [port = server.port(), i] {
      http_client http(port);
      std::vector<float> v{static_cast<float>(i), static_cast<float>(i) + 0.5f, -1.f * i};
      return http.post("/v2/models/slow_drain/infer", fp32_identity_body(v, 1), json_content);
    }));
  }
  // All six accepted: one batch runs (250 ms each), the rest wait in the queue.
  REQUIRE(wait_pending(server, "slow_drain", n));
  server.process->send_signal(SIGTERM);

  // New connections are refused while the accepted requests finish.
  CHECK(eventually([&] { return !can_connect(server.port()); }, milliseconds(2000)));
  for (int i = 0; i < n; ++i) {
    auto r = in_flight[static_cast<size_t>(i)].get();
    REQUIRE_MESSAGE(r.status == 200, "request " << i << ": " << r.body);
    auto got = fp32_output(json_document::parse(r.body));
    CHECK(got == std::vector<float>{static_cast<float>(i), static_cast<float>(i) + 0.5f,
                                    -1.f * i});
  }
  auto status = server.process->wait_exit(milliseconds(15000));
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK(server.process->output().find("caf-serving: stopped") != std::string::npos);
}

TEST_CASE("SIGINT on an idle server with an open keep-alive connection: exit 0") {
  test_server server({example_model("identity_fp32")});
  auto http = server.client();
  auto r = http.get("/v2/health/live");
  REQUIRE(r.status == 200); // the connection stays open and idle
  server.process->send_signal(SIGINT);
  auto status = server.process->wait_exit(milliseconds(15000));
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK(server.process->wait_for_output("caf-serving: stopped", milliseconds(1000)));
}

TEST_CASE("SIGTERM with a request stuck past --exit-timeout-secs: a 503, and exit 0 soon") {
  // A model whose one batch takes a minute: without a deadline the drain waits
  // for it, and a SIGTERM never ends the process.
  test_server server({}, model_control_api({"--exit-timeout-secs", "1"}));
  server.repo.write_file("stuck/config.pbtxt",
                         "name: \"stuck\"\n"
                         "backend: \"builtin\"\n"
                         "max_batch_size: 2\n"
                         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
                         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
                         "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
                         "parameters { key: \"delay_us\" value: { string_value: \"60000000\" } }\n");
  server.repo.write_file("stuck/1/.keep", "");
  REQUIRE(server.client().post("/v2/repository/models/stuck/load", "").status == 200);
  auto stuck = std::async(std::launch::async, [port = server.port()] {
    http_client http(port);
    return http.post("/v2/models/stuck/infer", fp32_identity_body({1.f, 2.f, 3.f}, 1),
                     json_content);
  });
  REQUIRE(wait_pending(server, "stuck", 1));
  auto signalled = std::chrono::steady_clock::now();
  server.process->send_signal(SIGTERM);

  REQUIRE(stuck.wait_for(milliseconds(10000)) == std::future_status::ready);
  auto r = stuck.get();
  CHECK(r.status == 503);
  CHECK(r.header("content-type") == "application/json");
  CHECK(error_message(r.body).find("did not finish this request within --exit-timeout-secs (1 s)")
        != std::string::npos);
  auto status = server.process->wait_exit(milliseconds(10000));
  REQUIRE_MESSAGE(status.has_value(), "the server was still running 10 s after SIGTERM");
  CHECK(*status == 0);
  auto took = std::chrono::steady_clock::now() - signalled;
  CHECK(took < std::chrono::seconds(6));
  CHECK(server.process->output().find("1 request abandoned") != std::string::npos);
}
