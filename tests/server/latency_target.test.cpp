/// The latency-target scheduler in the real server (docs/latency-target.md), on
/// builtin identity models whose every batch takes a fixed time (delay_us), so
/// the cost the scheduler measures is known:
///
/// - Overload: a burst far past what the target allows is answered at once with
///   503 + Retry-After for what cannot be served in time, while every admitted
///   request is answered within the target (the server's own goodput and
///   deadline-miss counters say so).
/// - EDF: a request with a tighter `timeout` overtakes one queued before it.
/// - A request's own `timeout` is honoured: shed at once when even an idle
///   executor cannot meet it, dispatched by it (not by the target) when it can.
/// - Warm-up: a new executor is measured by synthetic batches before the first
///   request, so that request is planned with its cost.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <future>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

/// A builtin identity model: `max_batch` rows a batch, each batch `delay_ms`,
/// one instance, and a latency target. Its tensors are of any length: requests
/// of different lengths never share a batch.
/// `length`: the tensors' length; -1 (any) unless a test needs a fixed one.
void add_model(temp_repository& repo, const std::string& name, int max_batch, int delay_ms,
               int target_ms, int length = -1) {
  std::string dims = "dims: [ " + std::to_string(length) + " ]";
  repo.write_file(name + "/config.pbtxt",
                  "name: \"" + name + "\"\nbackend: \"builtin\"\nmax_batch_size: "
                    + std::to_string(max_batch)
                    + "\ninput [ { name: \"INPUT0\" data_type: TYPE_FP32 " + dims + " } ]\n"
                      "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 " + dims + " } ]\n"
                      "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                      "dynamic_batching { max_queue_delay_microseconds: 100000 "
                      "preferred_batch_size: [ 1 ] }\n"
                      "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
                      "parameters { key: \"delay_us\" value: { string_value: \""
                    + std::to_string(delay_ms * 1000)
                    + "\" } }\n"
                      "parameters { key: \"latency_target_ms\" value: { string_value: \""
                    + std::to_string(target_ms) + "\" } }\n");
  repo.write_file(name + "/1/model.builtin", "builtin: no model file\n");
}

struct slo_server {
  temp_repository repo;
  std::unique_ptr<server_process> process;

  slo_server(const std::string& name, int max_batch, int delay_ms, int target_ms,
             int length = -1) {
    add_model(repo, name, max_batch, delay_ms, target_ms, length);
    process = std::make_unique<server_process>(
      server_config{CAF_SERVING_BINARY, repo.path().string(), {"--max-queue-size", "256"}});
  }
  uint16_t port() const { return process->http_port(); }
  std::string metrics() const {
    return http_client(process->metrics_port()).get("/metrics").body;
  }
  /// Waits until `model` has `count` requests accepted and not answered, then a
  /// little longer so that the last one has reached the scheduler's queue.
  bool wait_pending(const std::string& model, double count) const {
    bool ok = eventually([&] {
      return metric_value(metrics(), "caf_serving_pending_request_count{model=\"" + model
                                       + "\",version=\"1\"}")
             == count;
    });
    std::this_thread::sleep_for(milliseconds(30));
    return ok;
  }
};

struct timed_response {
  http_response response;
  steady_clock::time_point sent;
  steady_clock::time_point finished;
  float tag = 0;
};

/// A request of `rows` rows of `length` values, the first of each `tag`.
std::string body(float tag, int rows = 1, const std::string& rest = "", int length = 2) {
  std::vector<float> values;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < length; ++i)
      values.push_back(tag + 0.5f * static_cast<float>(i));
  return fp32_identity_body(values, rows, rest);
}

std::string with_timeout_us(int us) {
  return ",\"parameters\":{\"timeout\":" + std::to_string(us) + "}";
}

std::future<timed_response> send_async(uint16_t port, const std::string& model, float tag,
                                       std::string text) {
  return std::async(std::launch::async, [=] {
    http_client http(port);
    auto sent = steady_clock::now();
    auto r = http.post("/v2/models/" + model + "/infer", text, json_content);
    return timed_response{std::move(r), sent, steady_clock::now(), tag};
  });
}

void check_echo(const timed_response& t) {
  REQUIRE_MESSAGE(t.response.status == 200, t.response.body);
  auto got = fp32_output(json_document::parse(t.response.body));
  REQUIRE(!got.empty());
  CHECK(got.front() == t.tag);
}

/// Runs a request of `rows` rows alone, so the scheduler measures that size.
void warm_up(const slo_server& server, const std::string& model, int rows) {
  http_client http(server.port());
  auto r = http.post("/v2/models/" + model + "/infer", body(0, rows), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
}

double series(const std::string& metrics, const std::string& name, const std::string& model) {
  return metric_value(metrics, name + "{model=\"" + model + "\",version=\"1\"}");
}

double ms_between(steady_clock::time_point a, steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

} // namespace

TEST_CASE("overload: what cannot finish in time gets a fast 503 with Retry-After; the "
          "admitted meet the target") {
  // 4 rows a batch, 40 ms a batch, target 200 ms: about four batches (16
  // requests) of a burst fit; the rest cannot.
  const std::string model = "slo_overload";
  slo_server server(model, 4, 40, 200);
  CHECK(server.process->wait_for_output("preferred_batch_size are ignored", milliseconds(1000)));
  warm_up(server, model, 1);
  warm_up(server, model, 4);
  auto before = server.metrics();
  double goodput_before = series(before, "caf_serving_slo_goodput_total", model);

  constexpr int burst = 48;
  std::vector<std::future<timed_response>> replies;
  for (int i = 1; i <= burst; ++i)
    replies.push_back(send_async(server.port(), model, static_cast<float>(i), body(i)));
  int admitted = 0, shed = 0;
  for (auto& f : replies) {
    auto t = f.get();
    if (t.response.status == 200) {
      check_echo(t);
      ++admitted;
      continue;
    }
    REQUIRE_MESSAGE(t.response.status == 503, t.response.body);
    ++shed;
    auto message = error_message(t.response.body);
    CHECK_MESSAGE(message.rfind("request shed: ", 0) == 0, message);
    CHECK_MESSAGE(message.find("> latency target 200 ms") != std::string::npos, message);
    CHECK(std::atoi(t.response.header("retry-after").c_str()) >= 1);
    // At once: a shed request does not wait in the queue for the target.
    CHECK(ms_between(t.sent, t.finished) < 200);
  }
  CHECK(admitted >= 8);
  CHECK(shed >= burst / 4);
  auto after = server.metrics();
  CHECK(series(after, "caf_serving_slo_shed_total", model) == shed);
  CHECK(series(after, "caf_serving_slo_goodput_total", model) - goodput_before == admitted);
  CHECK(series(after, "caf_serving_slo_deadline_miss_total", model) == 0);
  CHECK(metric_value(after, "caf_serving_slo_cost_us{model=\"" + model
                              + "\",version=\"1\",batch_size=\"4\"}")
        >= 40000);
  CHECK(metric_value(after, "caf_serving_slo_batch_size_count{model=\"" + model
                              + "\",version=\"1\"}")
        >= 1);
  // The statistics endpoint shows the same figures.
  auto stats = http_client(server.port()).get("/v2/models/" + model + "/stats");
  REQUIRE(stats.status == 200);
  CHECK_MESSAGE(stats.body.find("\"slo\":{\"target_us\":200000,") != std::string::npos,
                stats.body);
  CHECK(stats.body.find("\"shed\":" + std::to_string(shed) + ",") != std::string::npos);
  // Served again once the burst has drained.
  warm_up(server, model, 1);
}

TEST_CASE("EDF: a request with a tighter timeout overtakes one queued before it") {
  // 100 ms a batch, target 1 s. While a first batch runs, a request without a
  // timeout is queued, then one due in 400 ms (of another length, so the two
  // cannot share a batch): when the executor is free the urgent one goes first.
  const std::string model = "slo_edf";
  slo_server server(model, 4, 100, 1000);
  warm_up(server, model, 1);
  auto running = send_async(server.port(), model, 4, body(4));
  REQUIRE(server.wait_pending(model, 1));
  auto relaxed = send_async(server.port(), model, 1, body(1));
  REQUIRE(server.wait_pending(model, 2));
  auto urgent = send_async(server.port(), model, 2, body(2, 1, with_timeout_us(400'000), 3));
  check_echo(running.get());
  auto r = relaxed.get();
  auto u = urgent.get();
  check_echo(r);
  check_echo(u);
  CHECK_MESSAGE(u.finished < r.finished, "urgent answered after " << ms_between(u.sent, u.finished)
                                       << " ms, the other after " << ms_between(r.sent, r.finished)
                                       << " ms");
  auto metrics = server.metrics();
  CHECK(series(metrics, "caf_serving_slo_goodput_total", model) == 4);
  CHECK(series(metrics, "caf_serving_slo_deadline_miss_total", model) == 0);
}

TEST_CASE("a tighter per-request timeout is honoured: shed at once, or dispatched by it") {
  const std::string model = "slo_timeout";
  slo_server server(model, 4, 100, 1000);
  warm_up(server, model, 1);
  http_client http(server.port());
  // 50 ms cannot hold a 100 ms batch: 503 at once, naming the timeout.
  auto sent = steady_clock::now();
  auto r = http.post("/v2/models/" + model + "/infer", body(3, 1, with_timeout_us(50'000)),
                     json_content);
  CHECK(ms_between(sent, steady_clock::now()) < 100);
  REQUIRE(r.status == 503);
  CHECK_MESSAGE(error_message(r.body).find("> request timeout 50 ms") != std::string::npos,
                r.body);
  CHECK(std::atoi(r.header("retry-after").c_str()) >= 1);
  // 300 ms can: the request goes by its own deadline, long before the ~850 ms
  // a request due at the 1 s target may wait.
  sent = steady_clock::now();
  r = http.post("/v2/models/" + model + "/infer", body(4, 1, with_timeout_us(300'000)),
                json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(ms_between(sent, steady_clock::now()) < 600);
  auto metrics = server.metrics();
  CHECK(series(metrics, "caf_serving_slo_shed_total", model) == 1);
  CHECK(series(metrics, "caf_serving_slo_goodput_total", model) == 2);
}

TEST_CASE("warm-up: the executor is measured before the first request, which is then shed at "
          "once when it cannot finish in time instead of being served late") {
  // 100 ms a batch against a 50 ms target. Without a warm-up the first
  // request met an unmeasured executor, was admitted, and answered after
  // 100 ms: a deadline miss.
  const std::string model = "slo_warm";
  slo_server server(model, 4, 100, 50, 2);
  // The warm-up's batches of 1 and 4 rows publish the cost curve; no request
  // has been sent.
  CHECK(eventually([&] {
    auto m = server.metrics();
    return metric_value(m, "caf_serving_slo_cost_us{model=\"" + model
                             + "\",version=\"1\",batch_size=\"4\"}")
           >= 100000;
  }));
  http_client http(server.port());
  auto sent = steady_clock::now();
  auto r = http.post("/v2/models/" + model + "/infer", body(1), json_content);
  REQUIRE(r.status == 503);
  CHECK(ms_between(sent, steady_clock::now()) < 100);
  CHECK_MESSAGE(error_message(r.body).find("> latency target 50 ms") != std::string::npos, r.body);
  // Counted just after the answer is delivered.
  CHECK(eventually([&] { return series(server.metrics(), "caf_serving_slo_shed_total", model) == 1; }));
  CHECK(series(server.metrics(), "caf_serving_slo_deadline_miss_total", model) == 0);
}
