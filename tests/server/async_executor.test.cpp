/// The asynchronous executor in the whole server (issue 20, item 6): a model
/// whose backend is asynchronous (the builtin identity with `asynchronous:
/// "true"`, a thread of its own with a pipeline of 2 batches, like a GPU) is
/// given its next batch while one computes, and its faults behave as a
/// synchronous model's do (supervision.test.cpp).

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <mutex>

using namespace caf_serving::server_test;

namespace {

constexpr float marker = -999.0f;

/// One request per batch (max_batch_size 1, no dynamic batching), so that a
/// batch holding the marker is alone.
std::string async_config(const std::string& name, const std::string& fault,
                         int max_batch_size = 1) {
  return "name: \"" + name + "\"\nbackend: \"builtin\"\nmax_batch_size: "
         + std::to_string(max_batch_size) + "\n"
         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
         + std::string(max_batch_size > 1 ? "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
                                          : "")
         + "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
           "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
           "parameters { key: \"asynchronous\" value: { string_value: \"true\" } }\n"
           "parameters { key: \"delay_us\" value: { string_value: \"500\" } }\n"
           "parameters { key: \"fault\" value: { string_value: \"" + fault + "\" } }\n"
           "parameters { key: \"fault_marker\" value: { string_value: \"-999\" } }\n";
}

void add_model(temp_repository& repo, const std::string& name, const std::string& config) {
  repo.write_file(name + "/config.pbtxt", config);
  repo.write_file(name + "/1/model.builtin", "builtin: no model file\n");
}

void load(const test_server& server, const std::string& name) {
  auto r = server.client().post("/v2/repository/models/" + name + "/load", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
}

} // namespace

TEST_CASE("an asynchronous model's executor is given the next batch while one computes") {
  // The default --executor-depth is 1: the backend's pipeline depth (2) is
  // what lets the held batch see another submitted behind it. Given one
  // batch at a time, the held batch fails after 10 s instead.
  test_server server({}, model_control_api());
  add_model(server.repo, "pipelined", async_config("pipelined", "hold"));
  load(server, "pipelined");
  std::vector<float> held{1, 2, 3, marker};
  std::atomic<bool> answered{false};
  auto first = std::async(std::launch::async, [&] {
    http_client http(server.port());
    auto r = http.post("/v2/models/pipelined/infer", fp32_identity_body(held, 1), json_content);
    answered = true;
    return r;
  });
  // Clean requests, one at a time, until the held one is answered: the first
  // that reaches the executor after it releases it.
  http_client http(server.port());
  int sent = 0;
  for (; !answered && sent < 2000; ++sent) {
    std::vector<float> v{static_cast<float>(sent), 1, 2, 3};
    auto r = http.post("/v2/models/pipelined/infer", fp32_identity_body(v, 1), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(fp32_output(json_document::parse(r.body)) == v);
  }
  auto r = first.get();
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)) == held);
}

TEST_CASE("an asynchronous model under load: every request answered once, with its own values") {
  test_server server({}, model_control_api());
  add_model(server.repo, "batched", async_config("batched", "error", 8));
  load(server, "batched");
  std::mutex mutex;
  std::vector<std::string> problems;
  int ok = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c)
    clients.emplace_back([&, c] {
      http_client http(server.port());
      for (int k = 0; k < 40; ++k) {
        std::vector<float> v{static_cast<float>(c), static_cast<float>(k), 0.5f, 1.0f};
        auto r = http.post("/v2/models/batched/infer", fp32_identity_body(v, 1), json_content);
        std::lock_guard<std::mutex> guard(mutex);
        if (r.status == 200 && fp32_output(json_document::parse(r.body)) == v)
          ++ok;
        else
          problems.push_back(std::to_string(r.status) + " " + r.body);
      }
    });
  for (auto& t : clients)
    t.join();
  for (const auto& p : problems)
    FAIL_CHECK(p);
  CHECK(ok == 240);
}

TEST_CASE("an asynchronous executor that breaks is restarted and its batches are sent again") {
  test_server server({}, model_control_api());
  add_model(server.repo, "breaks", async_config("breaks", "crash"));
  load(server, "breaks");
  // A lone poisoned request breaks the executor, and its retry breaks the
  // next: a clear 500 naming the model.
  std::vector<float> bad{1, 2, 3, marker};
  auto r = server.client().post("/v2/models/breaks/infer", fp32_identity_body(bad, 1),
                                json_content);
  CHECK(r.status == 500);
  CHECK(r.body.find("model 'breaks'") != std::string::npos);
  CHECK(r.body.find("not tried again") != std::string::npos);
  // Clean requests are served by the executor started in its place.
  std::vector<float> clean{1, 2, 3, 4};
  CHECK(eventually([&] {
    auto ok = server.client().post("/v2/models/breaks/infer", fp32_identity_body(clean, 1),
                                   json_content);
    return ok.status == 200 && fp32_output(json_document::parse(ok.body)) == clean;
  }));
}
