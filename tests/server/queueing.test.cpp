/// Queue limits, queue timeouts and priority levels on slow single-instance
/// models: a full queue answers 503 at once, a request past its own timeout
/// answers 503, and a high-priority request overtakes queued low ones.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <future>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

struct timed_response {
  http_response response;
  steady_clock::time_point finished;
};

/// Sends one request on its own connection in the background.
std::future<timed_response> send_async(uint16_t port, const std::string& model,
                                       std::string body) {
  return std::async(std::launch::async, [port, model, body = std::move(body)] {
    http_client http(port);
    auto r = http.post("/v2/models/" + model + "/infer", body, json_content);
    return timed_response{std::move(r), steady_clock::now()};
  });
}

std::string with_value(float v, int width, const std::string& rest = "") {
  return fp32_identity_body(std::vector<float>(static_cast<size_t>(width), v), 1, rest);
}

void check_value(const timed_response& t, float v) {
  REQUIRE_MESSAGE(t.response.status == 200, t.response.body);
  auto got = fp32_output(json_document::parse(t.response.body));
  REQUIRE(!got.empty());
  CHECK(got.front() == v);
}

} // namespace

TEST_CASE("a full queue is answered 503 with a KServe error at once") {
  test_server server({test_model("slow_queue")});
  // One request runs (300 ms), two fill the queue of 2.
  auto running = send_async(server.port(), "slow_queue", with_value(1, 2));
  REQUIRE(wait_pending(server, "slow_queue", 1));
  auto queued1 = send_async(server.port(), "slow_queue", with_value(2, 2));
  REQUIRE(wait_pending(server, "slow_queue", 2));
  auto queued2 = send_async(server.port(), "slow_queue", with_value(3, 2));
  REQUIRE(wait_pending(server, "slow_queue", 3));

  auto http = server.client();
  auto start = steady_clock::now();
  auto r = http.post("/v2/models/slow_queue/infer", with_value(4, 2), json_content);
  auto took = steady_clock::now() - start;
  CHECK(r.status == 503);
  CHECK(r.header("content-type") == "application/json");
  CHECK(error_message(r.body).find("is full") != std::string::npos);
  // Triton's words first (its clients match on them).
  CHECK(error_message(r.body).rfind("Exceeds maximum queue size: ", 0) == 0);
  // At once: well before the running request (300 ms) finishes.
  CHECK(took < milliseconds(200));

  check_value(running.get(), 1);
  check_value(queued1.get(), 2);
  check_value(queued2.get(), 3);
  // After the queue drained, requests are accepted again.
  r = http.post("/v2/models/slow_queue/infer", with_value(5, 2), json_content);
  CHECK(r.status == 200);
  auto metrics = http_client(server.process->metrics_port()).get("/metrics").body;
  CHECK(metric_value(metrics, "caf_serving_inference_request_failure{model=\"slow_queue\","
                              "version=\"1\",reason=\"queue_full\"}")
        == 1);
}

TEST_CASE("a request past its own queue timeout is answered 503") {
  test_server server({test_model("slow_queue")});
  auto running = send_async(server.port(), "slow_queue", with_value(1, 2));
  REQUIRE(wait_pending(server, "slow_queue", 1));
  auto http = server.client();
  auto start = steady_clock::now();
  auto r = http.post("/v2/models/slow_queue/infer",
                     with_value(2, 2, ",\"parameters\":{\"timeout\":40000}"), json_content);
  auto took = steady_clock::now() - start;
  CHECK(r.status == 503);
  CHECK(error_message(r.body).find("past its queue timeout of 40000 us") != std::string::npos);
  CHECK(error_message(r.body).rfind("Request timeout expired: ", 0) == 0);
  // Answered when the timeout passed, not when the running request ended.
  CHECK(took >= milliseconds(35));
  CHECK(took < milliseconds(250));
  check_value(running.get(), 1);

  // A timeout that is long enough lets the request through.
  running = send_async(server.port(), "slow_queue", with_value(3, 2));
  REQUIRE(wait_pending(server, "slow_queue", 1));
  r = http.post("/v2/models/slow_queue/infer",
                with_value(4, 2, ",\"parameters\":{\"timeout\":5000000}"), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)).front() == 4);
  check_value(running.get(), 3);
  auto metrics = http_client(server.process->metrics_port()).get("/metrics").body;
  CHECK(metric_value(metrics, "caf_serving_inference_request_failure{model=\"slow_queue\","
                              "version=\"1\",reason=\"timeout\"}")
        == 1);
}

TEST_CASE("a high-priority request finishes before queued low-priority ones") {
  test_server server({test_model("priority")});
  // Level 2 (low) is the default; the first one occupies the only instance.
  std::vector<std::future<timed_response>> low;
  for (int i = 0; i < 4; ++i) {
    auto rest = i % 2 == 0 ? std::string(",\"parameters\":{\"priority\":2}") : std::string();
    low.push_back(send_async(server.port(), "priority", with_value(static_cast<float>(i), 1, rest)));
    REQUIRE(wait_pending(server, "priority", i + 1));
  }
  auto high = send_async(server.port(), "priority",
                         with_value(100, 1, ",\"parameters\":{\"priority\":1}"));
  auto h = high.get();
  check_value(h, 100);
  std::vector<timed_response> lows;
  for (auto& f : low)
    lows.push_back(f.get());
  for (int i = 0; i < 4; ++i)
    check_value(lows[static_cast<size_t>(i)], static_cast<float>(i));
  // The first low request was already running; the three queued ones come after.
  CHECK(lows[0].finished < h.finished);
  for (int i = 1; i < 4; ++i)
    CHECK_MESSAGE(h.finished < lows[static_cast<size_t>(i)].finished, "low request " << i);
  // Within a level, first come first served.
  CHECK(lows[1].finished < lows[2].finished);
  CHECK(lows[2].finished < lows[3].finished);

  auto http = server.client();
  auto r = http.post("/v2/models/priority/infer",
                     with_value(1, 1, ",\"parameters\":{\"priority\":3}"), json_content);
  CHECK(r.status == 400);
  CHECK(error_message(r.body).find("priority 3 is not a level") != std::string::npos);
}
