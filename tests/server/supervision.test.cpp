/// Supervision (issue 14, finding 4 and 10; DESIGN.md "Supervision"): a stage
/// that fails is answered for, restarted or quarantined; readiness tells the
/// truth; no internal text reaches a client; other models do not notice.
///
/// The faults come from the builtin identity function's test parameters
/// (`fault`, `fault_marker`): a batch whose input holds the marker fails with an
/// error value, an exception, or a broken executor.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <mutex>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;

namespace {

constexpr float marker = -999.0f;

std::string faulty_config(const std::string& name, const std::string& fault, int instances = 1) {
  return "name: \"" + name + "\"\nbackend: \"builtin\"\nmax_batch_size: 8\n"
         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
         "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
         "instance_group [ { kind: KIND_CPU count: " + std::to_string(instances) + " } ]\n"
         "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
         "parameters { key: \"delay_us\" value: { string_value: \"1000\" } }\n"
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

/// What a load of many clients saw. Every request must get exactly one
/// answer: 200 with its own values, or an error that names the model and holds
/// no internals.
struct tally {
  int ok = 0;
  int errors = 0;
  int poisoned = 0;
  std::vector<std::string> problems;
};

bool leaks_internals(const std::string& body) {
  for (const char* s : {"kj/", "kj::", "caf::", "sec::", "runtime_error", "injected fault",
                        "exception", ".c++", ".cpp"})
    if (body.find(s) != std::string::npos)
      return true;
  return false;
}

/// `clients` threads send `per_client` requests each to `model`; every
/// `poison_every`-th request of client 0 holds the marker (0: none do).
tally run_load(const test_server& server, const std::string& model, int clients,
               int per_client, int poison_every) {
  tally t;
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      http_client http(server.port());
      for (int k = 0; k < per_client; ++k) {
        bool poison = c == 0 && poison_every > 0 && k % poison_every == poison_every - 1;
        std::vector<float> v{static_cast<float>(c), static_cast<float>(k), 0.5f,
                             poison ? marker : 1.0f};
        std::string problem;
        bool ok = false;
        try {
          auto r = http.post("/v2/models/" + model + "/infer", fp32_identity_body(v, 1),
                             json_content);
          if (r.status == 200) {
            ok = fp32_output(json_document::parse(r.body)) == v;
            if (!ok)
              problem = "200 with another request's values";
            else if (poison)
              problem = "a poisoned request was answered 200";
          } else if (r.status != 500 && r.status != 503) {
            problem = "status " + std::to_string(r.status) + ": " + r.body;
          } else if (r.body.find("model '" + model + "'") == std::string::npos) {
            problem = "an error that does not name the model: " + r.body;
          } else if (leaks_internals(r.body)) {
            problem = "internals in an error body: " + r.body;
          }
        } catch (const std::exception& e) {
          problem = std::string("no answer: ") + e.what();
        }
        std::lock_guard<std::mutex> guard(mutex);
        (ok ? t.ok : t.errors) += 1;
        t.poisoned += poison ? 1 : 0;
        if (!problem.empty())
          t.problems.push_back(problem);
      }
    });
  for (auto& th : threads)
    th.join();
  return t;
}

double metric(const test_server& server, const std::string& name, const std::string& model) {
  http_client m(server.process->metrics_port());
  return metric_value(m.get("/metrics").body,
                      name + "{model=\"" + model + "\",version=\"1\"}");
}

/// The faulty model under load beside a healthy one: every request answered
/// once, the healthy model untouched, the faulty one serving afterwards.
void check_fault_under_load(const std::string& fault, const std::string& counter) {
  test_server server({example_model("identity_fp32")}, model_control_api());
  add_model(server.repo, "faulty", faulty_config("faulty", fault));
  load(server, "faulty");

  auto healthy = std::async(std::launch::async, [&] {
    tally t;
    http_client http(server.port());
    for (int k = 0; k < 200; ++k) {
      std::vector<float> v(16, static_cast<float>(k));
      auto r = http.post("/v2/models/identity_fp32/infer", fp32_identity_body(v, 1),
                         json_content);
      if (r.status == 200 && fp32_output(json_document::parse(r.body)) == v)
        ++t.ok;
      else
        t.problems.push_back("identity_fp32: " + std::to_string(r.status) + " " + r.body);
    }
    return t;
  });
  auto faulty = run_load(server, "faulty", 4, 40, 5);
  auto other = healthy.get();
  for (const auto& p : faulty.problems)
    FAIL_CHECK(p);
  for (const auto& p : other.problems)
    FAIL_CHECK(p);
  CHECK(faulty.ok + faulty.errors == 160);
  CHECK(faulty.errors >= faulty.poisoned);
  CHECK(faulty.ok >= 160 - 8 * faulty.poisoned); // a poisoned batch holds at most 8
  CHECK(other.ok == 200);
  MESSAGE(fault << ": " << faulty.ok << " answered 200, " << faulty.errors << " errors for "
                << faulty.poisoned << " poisoned requests");
  CHECK(metric(server, counter, "faulty") >= 1);

  // The model recovers: ready again and answering clean requests.
  CHECK(eventually([&] { return server.client().get("/v2/models/faulty/ready").status == 200; }));
  auto after = run_load(server, "faulty", 2, 10, 0);
  CHECK(after.ok == 20);
  CHECK(server.client().get("/v2/health/ready").status == 200);
}

} // namespace

TEST_CASE("a backend that throws fails only its batch; the executor keeps serving") {
  check_fault_under_load("throw", "caf_serving_executor_failures");
}

TEST_CASE("an executor that breaks is restarted; its batch is retried once, then a clear 500") {
  check_fault_under_load("crash", "caf_serving_executor_restarts");
  // A lone poisoned request: it breaks the executor twice (the retry too), and
  // its answer says the request was not tried again.
  test_server server({}, model_control_api());
  add_model(server.repo, "breaks", faulty_config("breaks", "crash"));
  load(server, "breaks");
  std::vector<float> v{1, 2, 3, marker};
  auto r = server.client().post("/v2/models/breaks/infer", fp32_identity_body(v, 1), json_content);
  CHECK(r.status == 500);
  CHECK(r.body.find("model 'breaks'") != std::string::npos);
  CHECK(r.body.find("not tried again") != std::string::npos);
  CHECK_FALSE(leaks_internals(r.body));
  CHECK(metric(server, "caf_serving_executor_restarts", "breaks") >= 2);
  CHECK(metric(server, "caf_serving_batch_retries", "breaks") >= 1);
  std::vector<float> clean{1, 2, 3, 4};
  CHECK(eventually([&] {
    auto ok = server.client().post("/v2/models/breaks/infer", fp32_identity_body(clean, 1),
                                   json_content);
    return ok.status == 200 && fp32_output(json_document::parse(ok.body)) == clean;
  }));
}

TEST_CASE("a hung executor is replaced after --executor-timeout-ms; others are served meanwhile") {
  test_server server({example_model("identity_fp32")},
                     model_control_api({"--executor-timeout-ms", "400"}));
  add_model(server.repo, "hangs", faulty_config("hangs", "hang"));
  load(server, "hangs");
  // The poisoned request hangs its executor, and the one that replaces it;
  // it is answered 500 after two timeouts, not after the backend's 30 s.
  auto start = std::chrono::steady_clock::now();
  std::vector<float> bad{1, 2, 3, marker};
  auto poisoned = std::async(std::launch::async, [&] {
    http_client http(server.port());
    return http.post("/v2/models/hangs/infer", fp32_identity_body(bad, 1), json_content);
  });
  REQUIRE(wait_pending(server, "hangs", 1));
  auto r = poisoned.get();
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(r.status == 500);
  CHECK(r.body.find("did not answer within --executor-timeout-ms") != std::string::npos);
  CHECK(took < std::chrono::seconds(5));
  CHECK(metric(server, "caf_serving_executor_restarts", "hangs") >= 2);
  // A clean request is served by the newest executor at once.
  std::vector<float> clean{1, 2, 3, 4};
  auto ok = server.client().post("/v2/models/hangs/infer", fp32_identity_body(clean, 1),
                                 json_content);
  CHECK(ok.status == 200);
  CHECK(server.client().get("/v2/models/hangs/ready").status == 200);
  CHECK(server.client().post("/v2/models/identity_fp32/infer",
                             fp32_identity_body(std::vector<float>(16, 1.0f), 1), json_content)
          .status == 200);
}

TEST_CASE("an executor failing batch after batch is quarantined: not ready, then back") {
  test_server server({example_model("identity_fp32")}, model_control_api());
  add_model(server.repo, "failing", faulty_config("failing", "error"));
  load(server, "failing");
  std::vector<float> bad{1, 2, 3, marker};
  for (int i = 0; i < 3; ++i) {
    auto r = server.client().post("/v2/models/failing/infer", fp32_identity_body(bad, 1),
                                  json_content);
    CHECK(r.status == 500);
  }
  // Three internal failures in a row: out of rotation, and readiness says so.
  auto ready = server.client().get("/v2/models/failing/ready");
  CHECK(ready.status == 400); // Triton 2.51: "Model version not ready"
  CHECK(ready.body.find("quarantined") != std::string::npos);
  std::vector<float> clean{1, 2, 3, 4};
  auto r = server.client().post("/v2/models/failing/infer", fp32_identity_body(clean, 1),
                                json_content);
  CHECK(r.status == 503);
  CHECK(r.body.find("quarantined") != std::string::npos);
  CHECK(metric(server, "caf_serving_executor_quarantines", "failing") == 1);
  CHECK(metric(server, "caf_serving_healthy_executors", "failing") == 0);
  // Another model is not affected, but the server as a whole is not ready.
  CHECK(server.client().get("/v2/models/identity_fp32/ready").status == 200);
  CHECK(server.client().get("/v2/health/ready").status == 400); // Triton's "not ready"
  // After the backoff the executor is tried again, and a success clears it.
  CHECK(eventually([&] {
    auto ok = server.client().post("/v2/models/failing/infer", fp32_identity_body(clean, 1),
                                   json_content);
    return ok.status == 200;
  }));
  CHECK(server.client().get("/v2/models/failing/ready").status == 200);
  CHECK(metric(server, "caf_serving_healthy_executors", "failing") == 1);
}

TEST_CASE("a model that nothing can execute answers at once with 503 and is not ready") {
  // A server that waits for workers to join, and none does.
  setenv("CAF_SERVING_CLUSTER_SECRET", "supervision-test-secret", 1);
  test_server server({example_model("identity_fp32")},
                     {"--local-executors", "false", "--cluster-port", "0",
                      "--cluster-address", "127.0.0.1"});
  std::vector<float> v(16, 1.0f);
  auto start = std::chrono::steady_clock::now();
  auto r = server.client().post("/v2/models/identity_fp32/infer", fp32_identity_body(v, 1),
                                json_content);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(r.status == 503);
  CHECK(r.body.find("no executor") != std::string::npos);
  CHECK(took < std::chrono::seconds(2));
  CHECK(server.client().get("/v2/models/identity_fp32/ready").status == 400);
  CHECK(server.client().get("/v2/health/ready").status == 400);
  auto index = server.client().post("/v2/repository/index", "");
  CHECK(index.body.find("UNAVAILABLE") != std::string::npos);
}
