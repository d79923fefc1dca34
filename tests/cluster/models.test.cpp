/// Workers load models with the server's model manager: an ONNX model served on a
/// worker answers as the same model served in the server; a worker whose copy of a
/// model differs (hash of config and files) is kept out of that model, visibly;
/// a worker without a repository, or without the model in it, gets the model's
/// files shipped; and load,
/// unload and reload on the server (explicit control) reach the worker, a
/// reload under load without a request lost; and a worker killed under ONNX load
/// loses no request and duplicates none; and a config-only load (the "config"
/// load parameter) reaches the workers as any other.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

using namespace caf_serving;
using namespace caf_serving::cluster_test;

namespace {

const std::filesystem::path cnn_model =
  std::filesystem::path(CAF_SERVING_SOURCE_DIR) / "tests/onnx/fixtures/models/opset21_cnn";

/// A request for opset21_cnn (x: 3x12x12 FP32) with values of its own.
std::string cnn_body(int seed) {
  std::string data = "[";
  for (int k = 0; k < 3 * 12 * 12; ++k) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.5f", std::sin(0.37 * seed + 0.11 * k));
    data += (k ? "," : "") + std::string(buf);
  }
  return "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1,3,12,12],\"data\":"
         + data + "]}]}";
}

/// The numbers of the first "data" array of an inference answer.
std::vector<double> output_data(const std::string& body) {
  std::vector<double> out;
  auto at = body.find("\"data\":[");
  if (at == std::string::npos)
    return out;
  const char* p = body.c_str() + at + 8;
  while (*p && *p != ']') {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    if (end == p)
      break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

/// Sends `n` distinct requests to both servers, one at a time, and counts the
/// answers of `remote` equal to those of `local` (within float rounding).
int equal_answers(uint16_t remote, uint16_t local, int n) {
  support::http_client a(remote), b(local);
  int equal = 0;
  for (int i = 0; i < n; ++i) {
    auto body = cnn_body(i);
    auto ra = a.post("/v2/models/opset21_cnn/infer", body, {{"Content-Type", "application/json"}});
    auto rb = b.post("/v2/models/opset21_cnn/infer", body, {{"Content-Type", "application/json"}});
    auto va = output_data(ra.body), vb = output_data(rb.body);
    bool same = ra.status == 200 && rb.status == 200 && va.size() == 5 && va.size() == vb.size();
    for (size_t k = 0; same && k < va.size(); ++k)
      same = std::fabs(va[k] - vb[k]) <= 1e-5 * (1 + std::fabs(vb[k]));
    if (!same)
      MESSAGE("request " << i << ": remote " << ra.status << " " << ra.body.substr(0, 300)
                         << "\nlocal " << rb.status << " " << rb.body.substr(0, 300));
    equal += same;
  }
  return equal;
}

bool wait_for_v2_without(uint16_t port, const std::string& text,
                         std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  support::http_client http(port);
  while (std::chrono::steady_clock::now() < until) {
    auto r = http.get("/v2");
    if (r.status == 200 && r.body.find(text) == std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

/// Waits until the worker has written `part` at least `n` times.
bool wait_for_count(const worker_process& w, const std::string& part, int n,
                    std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (count(w.output(), part) < n) {
    if (std::chrono::steady_clock::now() >= until)
      return false;
    w.wait_for_output(part, std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

} // namespace

TEST_CASE("an ONNX model served by a worker answers as the server's own") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "models-test-secret", 1);
  support::temp_repository repo;
  repo.add_model(cnn_model);
  worker_process w1({repo.path().string(), "w1", {"--executor-threads", "1"}, {}});
  CHECK(w1.wait_for_output("model opset21_cnn version 1 (1 executors) READY",
                           std::chrono::seconds(10)));
  support::server_process remote({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--local-executors", "false"}});
  support::server_process local({CAF_SERVING_BINARY, repo.path().string(),
                                 {"--executor-threads", "1"}});
  REQUIRE(wait_for_v2(remote.http_port(),
                      "\"name\":\"w1\",\"address\":\"" + w1.address()
                        + "\",\"state\":\"ready\",\"models\":[\"opset21_cnn:1\"]",
                      std::chrono::seconds(10)));
  CHECK(equal_answers(remote.http_port(), local.http_port(), 24) == 24);
  CHECK(metric_sum(remote.metrics_port(), "caf_serving_worker_batches_total",
                   "worker=\"w1\"")
        >= 24);
  CHECK(metric_sum(remote.metrics_port(), "caf_serving_inference_request_success",
                   "model=\"opset21_cnn\"")
        == 24);
}

TEST_CASE("a worker whose copy of a model differs is kept out of it, and says so; one that "
          "lacks it gets it shipped") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "models-test-secret", 1);
  support::temp_repository server_repo, worker_repo;
  for (auto* r : {&server_repo, &worker_repo}) {
    r->add_model(cnn_model);
    write_test_models(*r, 0);
  }
  // The same model with another config: another version of it, as far as the
  // server can tell.
  {
    std::ofstream cfg(worker_repo.path() / "opset21_cnn/config.pbtxt", std::ios::app);
    cfg << "\n# edited on the worker\n";
  }
  worker_process w1({worker_repo.path().string(), "w1", {}, {}});
  // Placement: w2 holds the server's copy of everything but serves only "fast".
  worker_process w2({server_repo.path().string(), "w2", {"--models", "fast"}, {}});
  // A worker whose repository lacks the ONNX model gets it shipped into its cache.
  support::temp_repository partial_repo, scratch;
  write_test_models(partial_repo, 0);
  worker_process w3({partial_repo.path().string(), "w3",
                     {"--model-cache-dir", (scratch.path() / "cache").string()}, {}});
  support::server_process server({CAF_SERVING_BINARY, server_repo.path().string(),
                                  {"--worker", w1.address(), "--worker", w2.address(),
                                   "--worker", w3.address(), "--local-executors", "false"}});
  REQUIRE(wait_for_v2(server.http_port(),
                      "\"models_refused\":[\"opset21_cnn: the worker's copy differs",
                      std::chrono::seconds(10)));
  CHECK(wait_for_v2(server.http_port(), "\"models\":[\"fast:1\",\"slow:1\"]",
                    std::chrono::seconds(5)));
  CHECK(wait_for_v2(server.http_port(),
                    "\"name\":\"w2\",\"address\":\"" + w2.address()
                      + "\",\"state\":\"ready\",\"models\":[\"fast:1\"],",
                    std::chrono::seconds(5)));
  CHECK(w2.output().find("model opset21_cnn") == std::string::npos); // never loaded there
  CHECK(wait_for_v2(server.http_port(),
                    "\"name\":\"w3\",\"address\":\"" + w3.address()
                      + "\",\"state\":\"ready\",\"models\":[\"fast:1\",\"opset21_cnn:1\","
                        "\"slow:1\"],",
                    std::chrono::seconds(10)));
  CHECK(w3.wait_for_output("model opset21_cnn: 2 files (", std::chrono::seconds(5)));
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_model_refused",
                   "model=\"opset21_cnn\"")
        == 1); // w1 only
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_model_refused", "model=\"fast\"")
        == 0);
  // Served by w3 with the shipped copy, never by w1's other one.
  auto batches_w1 = metric_sum(server.metrics_port(), "caf_serving_worker_batches_total",
                               "worker=\"w1\"");
  support::http_client http(server.http_port());
  for (int i = 0; i < 6; ++i)
    CHECK(http.post("/v2/models/opset21_cnn/infer", cnn_body(i),
                    {{"Content-Type", "application/json"}})
            .status
          == 200);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_batches_total", "worker=\"w1\"")
        == batches_w1);
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_batches_total", "worker=\"w3\"")
        >= 6);
  // The models both hold alike are served by the worker.
  auto fast = run_load(server.http_port(), {2, 20, "fast", nullptr, 0});
  CHECK(fast.correct == 40);
}

TEST_CASE("a worker without a repository gets the files; load, unload and reload reach it") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "models-test-secret", 1);
  support::temp_repository repo, scratch;
  repo.add_model(cnn_model);
  write_test_models(repo, 500);
  auto cache = scratch.path() / "cache";
  worker_process w1({"", "w1", {"--model-cache-dir", cache.string(), "--executor-threads", "1"},
                     {}});
  CHECK(w1.wait_for_output("no --model-repository", std::chrono::seconds(5)));
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--local-executors", "false",
                                   "--model-control-mode", "explicit", "--load-model", "*"}});
  support::server_process local({CAF_SERVING_BINARY, repo.path().string(),
                                 {"--executor-threads", "1"}});
  auto port = server.http_port();
  for (auto* m : {"\"fast:1\"", "\"slow:1\"", "\"opset21_cnn:1\""})
    REQUIRE_MESSAGE(wait_for_v2(port, m, std::chrono::seconds(15)), m);
  CHECK(w1.wait_for_output("model opset21_cnn: 2 files (", std::chrono::seconds(5)));
  CHECK(std::filesystem::exists(cache / "opset21_cnn/1/model.onnx"));
  CHECK(equal_answers(port, local.http_port(), 12) == 12);

  // Unload and load again over the repository API.
  support::http_client http(port);
  CHECK(http.post("/v2/repository/models/fast/unload", "").status == 200);
  CHECK(w1.wait_for_output("model fast unloaded for the server", std::chrono::seconds(5)));
  CHECK(wait_for_v2_without(port, "\"fast:1\"", std::chrono::seconds(5)));
  CHECK(http.post("/v2/repository/models/fast/load", "").status == 200);
  CHECK(wait_for_count(w1, "model fast loaded for the server", 2, std::chrono::seconds(10)));
  CHECK(wait_for_v2(port, "\"fast:1\"", std::chrono::seconds(10)));
  auto fast = run_load(port, {2, 20, "fast", nullptr, 0});
  CHECK(fast.correct == 40);

  // A new version of "slow" in the server's repository, loaded under load: the
  // worker gets the new files, and every request is answered.
  load_config lc{4, 60, "slow", nullptr, 60};
  int reload_status = 0;
  lc.midway = [&] {
    std::ofstream cfg(repo.path() / "slow/config.pbtxt", std::ios::app);
    cfg << "\n# version 2\n";
    cfg.close();
    support::http_client control(port);
    reload_status = control.post("/v2/repository/models/slow/load", "").status;
  };
  auto totals = run_load(port, lc);
  INFO(totals.first_failure);
  CHECK(reload_status == 200);
  CHECK(totals.correct == 240);
  CHECK(totals.failed == 0);
  CHECK(wait_for_count(w1, "model slow loaded for the server", 2, std::chrono::seconds(10)));
  CHECK(count(w1.output(), "model slow: 2 files (") == 2);
  CHECK(wait_for_v2_without(port, "models_refused", std::chrono::seconds(1)));
}

TEST_CASE("an ONNX model on two workers, one killed under load: every request answered once") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "models-test-secret", 1);
  support::temp_repository repo;
  repo.add_model(cnn_model);
  worker_process w1({repo.path().string(), "w1", {"--executor-threads", "1"}, {}});
  worker_process w2({repo.path().string(), "w2", {"--executor-threads", "1"}, {}});
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--worker", w2.address(),
                                   "--local-executors", "false", "--heartbeat-ms", "100",
                                   "--node-timeout-ms", "500"}});
  support::server_process local({CAF_SERVING_BINARY, repo.path().string(),
                                 {"--executor-threads", "1"}});
  for (auto* w : {&w1, &w2})
    REQUIRE(wait_for_v2(server.http_port(),
                        "\"name\":\"" + std::string(w == &w1 ? "w1" : "w2")
                          + "\",\"address\":\"" + w->address()
                          + "\",\"state\":\"ready\",\"models\":[\"opset21_cnn:1\"]",
                        std::chrono::seconds(10)));
  // The answers of the server's own executors, for 8 inputs.
  std::vector<std::vector<double>> expected;
  {
    support::http_client http(local.http_port());
    for (int seed = 0; seed < 8; ++seed)
      expected.push_back(output_data(http.post("/v2/models/opset21_cnn/infer", cnn_body(seed),
                                               {{"Content-Type", "application/json"}})
                                       .body));
  }
  std::atomic<int> answered{0}, correct{0}, failed{0};
  std::atomic<bool> killed{false};
  std::mutex mutex;
  std::string first_failure;
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c)
    clients.emplace_back([&, c] {
      support::http_client http(server.http_port());
      http.timeout = std::chrono::milliseconds(30000);
      for (int i = 0; i < 40; ++i) {
        int seed = (c * 40 + i) % 8;
        auto r = http.post("/v2/models/opset21_cnn/infer", cnn_body(seed),
                           {{"Content-Type", "application/json"}});
        auto got = output_data(r.body);
        bool same = r.status == 200 && got.size() == expected[seed].size() && !got.empty();
        for (size_t k = 0; same && k < got.size(); ++k)
          same = std::fabs(got[k] - expected[seed][k]) <= 1e-5 * (1 + std::fabs(expected[seed][k]));
        (same ? correct : failed)++;
        if (!same) {
          std::lock_guard<std::mutex> guard(mutex);
          if (first_failure.empty())
            first_failure = std::to_string(r.status) + " " + r.body.substr(0, 300);
        }
        if (++answered == 30 && !killed.exchange(true))
          w2.kill_hard();
      }
    });
  for (auto& t : clients)
    t.join();
  INFO(first_failure);
  CHECK(killed.load());
  CHECK(correct == 120);
  CHECK(failed == 0);
  CHECK(wait_for_v2(server.http_port(), "\"name\":\"w2\",\"address\":\"" + w2.address()
                                          + "\",\"state\":\"lost\"",
                    std::chrono::seconds(5)));
  // Exactly once: the server counted as many successes as the clients got answers.
  CHECK(metric_sum(server.metrics_port(), "caf_serving_inference_request_success",
                   "model=\"opset21_cnn\"")
        == 120);
}

namespace {

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

/// An identity request to "fast" whose first value is `first` (then 1..15).
std::string fast_body(int first) {
  std::string data = "[" + std::to_string(first);
  for (int k = 1; k < 16; ++k)
    data += "," + std::to_string(k);
  return "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":[1,16],\"data\":"
         + data + "]}]}";
}

/// How many of `n` requests to "fast" holding the fault marker -1 the
/// injected fault answered (500), and how many were answered as identity.
/// Keep `n` under 3: an executor that fails 3 batches in a row is quarantined.
std::pair<int, int> marker_answers(uint16_t port, int n) {
  support::http_client http(port);
  int faulted = 0, identity = 0;
  for (int i = 0; i < n; ++i) {
    auto r = http.post("/v2/models/fast/infer", fast_body(-1),
                       {{"Content-Type", "application/json"}});
    faulted += r.status == 500 && r.body.find("injected fault") != std::string::npos;
    identity += r.status == 200 && r.body.find("\"data\":[-1,1,2,3") != std::string::npos;
    if (r.status != 200 && r.status != 500)
      MESSAGE("request " << i << ": " << r.status << " " << r.body.substr(0, 300));
  }
  return {faulted, identity};
}

/// The "models" list of the worker at `w`'s address in /v2 (empty without a row).
std::string worker_models(uint16_t port, const worker_process& w) {
  auto body = support::http_client(port).get("/v2").body;
  auto at = body.find("\"address\":\"" + w.address() + "\"");
  if (at == std::string::npos || (at = body.find("\"models\":[", at)) == std::string::npos)
    return "";
  return body.substr(at, body.find(']', at) - at + 1);
}

bool wait_for_ready(uint16_t port, const std::string& model, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  support::http_client http(port);
  while (http.get("/v2/models/" + model + "/ready").status != 200) {
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

} // namespace

TEST_CASE("a config-only load reaches the workers: both run the server's new configuration") {
  setenv("CAF_SERVING_CLUSTER_SECRET", "models-test-secret", 1);
  support::temp_repository repo, scratch;
  write_test_models(repo, 0);
  // w1 has its own copy of the repository; w2 none (the files are shipped).
  worker_process w1({repo.path().string(), "w1", {}, {}});
  worker_process w2({"", "w2", {"--model-cache-dir", (scratch.path() / "cache").string()}, {}});
  support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
                                  {"--worker", w1.address(), "--worker", w2.address(),
                                   "--local-executors", "false", "--model-control-mode",
                                   "explicit", "--load-model", "*"}});
  auto port = server.http_port();
  for (auto* w : {&w1, &w2})
    REQUIRE(wait_for_v2(port,
                        "\"address\":\"" + w->address()
                          + "\",\"state\":\"ready\",\"models\":[\"fast:1\",\"slow:1\"]",
                        std::chrono::seconds(15)));
  CHECK(wait_for_ready(port, "fast", std::chrono::seconds(5)));
  auto before = marker_answers(port, 2);
  CHECK(before.second == 2); // config.pbtxt: plain identity

  // The same files, another configuration: the fault "error" on inputs holding -1.
  const std::string config = R"({"parameters":{"function":{"string_value":"identity"},)"
                             R"("fault":{"string_value":"error"},)"
                             R"("fault_marker":{"string_value":"-1"}}})";
  support::http_client http(port);
  auto r = http.post("/v2/repository/models/fast/load",
                     "{\"parameters\":{\"config\":" + json_quote(config) + "}}",
                     {{"Content-Type", "application/json"}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  // Each worker loads it with the override: w1 from its repository, w2 from
  // files shipped again (its second load of "fast").
  CHECK(wait_for_count(w1, "model fast loaded for the server", 1, std::chrono::seconds(10)));
  CHECK(wait_for_count(w2, "model fast loaded for the server", 2, std::chrono::seconds(10)));
  CHECK(wait_for_ready(port, "fast", std::chrono::seconds(5)));
  CHECK(wait_for_v2_without(port, "models_refused", std::chrono::seconds(5)));
  for (auto* w : {&w1, &w2})
    CHECK(worker_models(port, *w).find("\"fast:1\"") != std::string::npos);
  // Served by the workers with the new configuration, never the old one.
  auto after = marker_answers(port, 2);
  CHECK(after.first == 2);
  CHECK(after.second == 0);
  CHECK(run_load(port, {2, 10, "fast", nullptr, 0}).correct == 20); // no marker: identity
  CHECK(metric_sum(server.metrics_port(), "caf_serving_worker_model_refused") == 0);

  // Unloaded and loaded without parameters: config.pbtxt again, on the workers too.
  CHECK(http.post("/v2/repository/models/fast/unload", "").status == 200);
  CHECK(wait_for_v2_without(port, "\"fast:1\"", std::chrono::seconds(5)));
  CHECK(http.post("/v2/repository/models/fast/load", "").status == 200);
  CHECK(wait_for_count(w1, "model fast loaded for the server", 2, std::chrono::seconds(10)));
  CHECK(wait_for_count(w2, "model fast loaded for the server", 3, std::chrono::seconds(10)));
  CHECK(wait_for_ready(port, "fast", std::chrono::seconds(5)));
  auto plain = marker_answers(port, 2);
  CHECK(plain.second == 2);
  CHECK(wait_for_v2_without(port, "models_refused", std::chrono::seconds(1)));
}
