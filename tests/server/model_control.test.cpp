/// Loading and unloading models while the server serves: another model under
/// load sees no error, the unloaded model answers 503, loading brings it back,
/// and requests in flight on a model being unloaded are all answered.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <mutex>

using namespace caf_serving::server_test;

namespace {

/// Client threads sending identity requests with their own values until
/// stopped; every answer is checked.
class background_load {
public:
  background_load(uint16_t port, std::string model, int width, int clients)
      : model_(std::move(model)) {
    for (int c = 0; c < clients; ++c)
      threads_.emplace_back([this, port, width, c] { run(port, width, c); });
  }
  ~background_load() { stop(); }

  void stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable())
        t.join();
  }
  int ok() const { return ok_; }
  int unavailable() const { return unavailable_; }
  std::vector<std::string> problems() {
    std::lock_guard<std::mutex> guard(mutex_);
    return problems_;
  }

private:
  void run(uint16_t port, int width, int c) {
    http_client http(port);
    for (int k = 0; !stop_; ++k) {
      std::vector<float> values;
      for (int i = 0; i < width; ++i)
        values.push_back(static_cast<float>(c * 1000000 + k * 100 + i));
      std::string problem;
      try {
        auto r = http.post("/v2/models/" + model_ + "/infer", fp32_identity_body(values, 1),
                           json_content);
        if (r.status == 200 && fp32_output(json_document::parse(r.body)) == values)
          ++ok_;
        // 503 for a request the unload caught queued; 404 (Triton's "has no
        // available versions") for one sent after it.
        else if ((r.status == 503 || r.status == 404)
                 && error_message(r.body).find(model_) != std::string::npos)
          ++unavailable_;
        else
          problem = "status " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
      } catch (const std::exception& e) {
        problem = e.what();
      }
      if (!problem.empty()) {
        std::lock_guard<std::mutex> guard(mutex_);
        problems_.push_back(problem);
      }
    }
  }

  std::string model_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::atomic<int> unavailable_{0};
  std::mutex mutex_;
  std::vector<std::string> problems_;
  std::vector<std::thread> threads_;
};

std::string simple_body(int32_t a, int32_t b) {
  return infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(std::vector<int32_t>(16, a))),
                     input_json("INPUT1", "INT32", {1, 16}, json_list(std::vector<int32_t>(16, b)))});
}

std::string index_state(http_client& http, const std::string& model, std::string* reason) {
  auto r = http.post("/v2/repository/index", "");
  REQUIRE(r.status == 200);
  auto doc = json_document::parse(r.body);
  simdjson::dom::array rows = doc.root().get_array();
  for (auto row : rows) {
    if (std::string_view(row["name"].get_string().value()) != model)
      continue;
    std::string_view why;
    if (reason && !row["reason"].get(why))
      *reason = std::string(why);
    return std::string(row["state"].get_string().value());
  }
  return "(absent)";
}

} // namespace

TEST_CASE("unload and load one model while another is under load") {
  test_server server({example_model("simple"), example_model("identity_fp32")},
                     model_control_api());
  auto http = server.client();
  background_load load(server.port(), "identity_fp32", 16, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  auto r = http.post("/v2/models/simple/infer", simple_body(5, 2), json_content);
  REQUIRE(r.status == 200);

  r = http.post("/v2/repository/models/simple/unload", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  r = http.post("/v2/models/simple/infer", simple_body(5, 2), json_content);
  // No version left to serve: Triton's 404 and wording, then the reason.
  CHECK(r.status == 404);
  CHECK(error_message(r.body).find("Request for unknown model: 'simple' has no available "
                                   "versions; model 'simple' is not ready: unloaded")
        != std::string::npos);
  CHECK(http.get("/v2/models/simple/ready").status == 400); // Triton 2.51's answer
  // Strict readiness leaves out a model unloaded on purpose (Triton's rule).
  CHECK(http.get("/v2/health/ready").status == 200);
  std::string reason;
  CHECK(index_state(http, "simple", &reason) == "UNAVAILABLE");
  CHECK(reason == "unloaded");
  CHECK(index_state(http, "identity_fp32", nullptr) == "READY");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  r = http.post("/v2/repository/models/simple/load", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  r = http.post("/v2/models/simple/infer", simple_body(5, 2), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(json_ints(doc.at("/outputs/0/data")) == std::vector<int64_t>(16, 7));
  CHECK(json_ints(doc.at("/outputs/1/data")) == std::vector<int64_t>(16, 3));
  CHECK(http.get("/v2/models/simple/ready").status == 200);
  CHECK(http.get("/v2/health/ready").status == 200);
  CHECK(index_state(http, "simple", nullptr) == "READY");

  load.stop();
  for (const auto& p : load.problems())
    FAIL_CHECK(p);
  CHECK(load.unavailable() == 0);
  CHECK(load.ok() > 10);
  MESSAGE("identity_fp32 answered " << load.ok() << " requests during unload and load");
}

TEST_CASE("load a model added to the repository; unknown models fail as in Triton") {
  test_server server({example_model("simple")}, model_control_api());
  auto http = server.client();
  auto body = infer_body({input_json("INPUT0", "BYTES", {1, 1}, "[\"new\"]")});
  auto r = http.post("/v2/models/identity_bytes/infer", body, json_content);
  CHECK(r.status == 404);

  server.repo.add_model(test_model("identity_bytes"));
  r = http.post("/v2/repository/models/identity_bytes/load", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  r = http.post("/v2/models/identity_bytes/infer", body, json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json_strings(json_document::parse(r.body).at("/outputs/0/data"))
        == std::vector<std::string>{"new"});

  // Triton's status and words (its tests match on them), the engine's hint after.
  r = http.post("/v2/repository/models/no_such_model/load", "");
  CHECK(r.status == 500);
  CHECK(error_message(r.body).rfind(
          "failed to load 'no_such_model', failed to poll from model repository: ", 0) == 0);
  CHECK(error_message(r.body).find("is not in the repository") != std::string::npos);
  // Unloading a model that is not loaded is no error in Triton.
  r = http.post("/v2/repository/models/no_such_model/unload", "");
  CHECK(r.status == 200);
  CHECK(http.get("/v2/repository/models/simple/load").status == 405);
}

TEST_CASE("unloading a model with requests in flight answers every one of them") {
  test_server server({test_model("slow_batch")}, model_control_api());
  auto http = server.client();
  background_load load(server.port(), "slow_batch", 4, 6);
  REQUIRE(eventually([&] { return load.ok() >= 6; }));
  auto r = http.post("/v2/repository/models/slow_batch/unload", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  // Clients keep sending to the unloaded model and are refused (404, or 503
  // when caught queued); none hangs.
  REQUIRE(eventually([&] { return load.unavailable() >= 6; }));
  r = http.post("/v2/repository/models/slow_batch/load", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  int ok_before = load.ok();
  REQUIRE(eventually([&] { return load.ok() >= ok_before + 6; }));
  load.stop();
  for (const auto& p : load.problems())
    FAIL_CHECK(p);
  MESSAGE("slow_batch: " << load.ok() << " answered, " << load.unavailable()
                         << " refused while unloaded");
}

TEST_CASE("a slow load runs off the event loop: health, other models and the old version serve") {
  // Each load of `slow_load` takes 1.5 s (the builtin's load_delay_us).
  const std::string config =
    "name: \"slow_load\"\nbackend: \"builtin\"\nmax_batch_size: 8\n"
    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
    "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
    "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
    "parameters { key: \"load_delay_us\" value: { string_value: \"1500000\" } }\n";
  test_server server({example_model("identity_fp32")}, model_control_api());
  server.repo.write_file("slow_load/config.pbtxt", config);
  server.repo.write_file("slow_load/1/model.builtin", "builtin: no model file\n");
  auto first = server.client().post("/v2/repository/models/slow_load/load", "");
  REQUIRE_MESSAGE(first.status == 200, first.body);

  // Reload it; while it loads, everything else answers at once.
  auto reload = std::async(std::launch::async, [&] {
    return server.client().post("/v2/repository/models/slow_load/load", "");
  });
  CHECK(eventually([&] {
    return server.client().post("/v2/repository/index", "").body.find("\"LOADING\"")
           != std::string::npos;
  }, std::chrono::milliseconds(1000)));
  auto start = std::chrono::steady_clock::now();
  CHECK(server.client().get("/v2/health/live").status == 200);
  std::vector<float> v(16, 2.0f);
  auto other = server.client().post("/v2/models/identity_fp32/infer", fp32_identity_body(v, 1),
                                    json_content);
  CHECK(other.status == 200);
  std::vector<float> w{1, 2, 3, 4};
  auto old_version = server.client().post("/v2/models/slow_load/infer", fp32_identity_body(w, 1),
                                          json_content);
  CHECK(old_version.status == 200);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < std::chrono::milliseconds(700));
  CHECK(reload.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready);
  auto done = reload.get();
  CHECK(done.status == 200);
  auto index = server.client().post("/v2/repository/index", "").body;
  CHECK(index.find("\"LOADING\"") == std::string::npos);
  CHECK(index.find("\"READY\"") != std::string::npos);
}
