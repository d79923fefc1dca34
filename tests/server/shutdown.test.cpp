/// Graceful shutdown: on SIGTERM or SIGINT the server stops accepting
/// connections, answers every request it already accepted (running or still
/// queued), and exits 0.

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
