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

namespace {

/// `extra`: flags for the server (the number of event loops).
void check_drain_answers_everything(std::vector<std::string> extra) {
  test_server server({test_model("slow_drain")}, std::move(extra));
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

} // namespace

TEST_CASE("SIGTERM with requests in flight: every request is answered, exit 0") {
  check_drain_answers_everything({});
}

TEST_CASE("2 HTTP loops (--http-threads 2): SIGTERM with requests in flight, all answered") {
  // Six connections land on either loop; each loop drains its own.
  check_drain_answers_everything({"--http-threads", "2"});
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

TEST_CASE("2 HTTP loops: SIGINT with idle keep-alive connections on the loops: exit 0") {
  test_server server({example_model("identity_fp32")}, {"--http-threads", "2"});
  std::vector<std::unique_ptr<http_client>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<http_client>(server.port()));
    REQUIRE(idle.back()->get("/v2/health/live").status == 200);
  }
  server.process->send_signal(SIGINT);
  auto status = server.process->wait_exit(milliseconds(15000));
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK(server.process->wait_for_output("caf-serving: stopped", milliseconds(1000)));
}

namespace {

/// `stuck_requests` requests, each on its own connection, wait for a batch
/// that takes a minute; `extra`: flags for the server.
void check_exit_timeout(int stuck_requests, std::vector<std::string> extra) {
  // A model whose one batch takes a minute: without a deadline the drain waits
  // for it, and a SIGTERM never ends the process.
  extra.insert(extra.end(), {"--exit-timeout-secs", "1"});
  test_server server({}, model_control_api(extra));
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
  std::vector<std::future<http_response>> stuck;
  for (int i = 0; i < stuck_requests; ++i)
    stuck.push_back(std::async(std::launch::async, [port = server.port()] {
      http_client http(port);
      return http.post("/v2/models/stuck/infer", fp32_identity_body({1.f, 2.f, 3.f}, 1),
                       json_content);
    }));
  REQUIRE(wait_pending(server, "stuck", stuck_requests));
  auto signalled = std::chrono::steady_clock::now();
  server.process->send_signal(SIGTERM);

  for (auto& f : stuck) {
    REQUIRE(f.wait_for(milliseconds(10000)) == std::future_status::ready);
    auto r = f.get();
    CHECK(r.status == 503);
    CHECK(r.header("content-type") == "application/json");
    CHECK(error_message(r.body).find(
            "did not finish this request within --exit-timeout-secs (1 s)")
          != std::string::npos);
  }
  auto status = server.process->wait_exit(milliseconds(10000));
  REQUIRE_MESSAGE(status.has_value(), "the server was still running 10 s after SIGTERM");
  CHECK(*status == 0);
  auto took = std::chrono::steady_clock::now() - signalled;
  CHECK(took < std::chrono::seconds(6));
  // Summed over the loops that held them.
  auto counted = std::to_string(stuck_requests)
                 + (stuck_requests == 1 ? " request abandoned" : " requests abandoned");
  CHECK_MESSAGE(server.process->output().find(counted) != std::string::npos,
                server.process->output());
}

} // namespace

TEST_CASE("SIGTERM with a request stuck past --exit-timeout-secs: a 503, and exit 0 soon") {
  check_exit_timeout(1, {});
}

TEST_CASE("2 HTTP loops: requests stuck past --exit-timeout-secs on either loop: all 503, "
          "all counted") {
  check_exit_timeout(6, {"--http-threads", "2"});
}
