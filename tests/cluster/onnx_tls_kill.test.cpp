/// Issue 19's "done when" in one run: an ONNX model with real compute served only
/// by workers, over TLS, one worker killed under load. Worker A has its own
/// --model-repository (the hash check at join passes) and is dialled by the
/// server; worker B has none (the server ships the files at join) and joins the
/// server's cluster port. Client threads send requests whose answers are checked
/// against ONNX Runtime's reference outputs (tests/onnx/fixtures/reference), each
/// with an id that must come back exactly once; mid-run A gets kill -9. Nothing
/// may be lost, answered twice or wrong, B serves the rest, and /v2 shows A lost.

#include "cluster_harness.hpp"

#include "support/http_client.hpp"
#include "support/json_document.hpp"
#include "support/tensor_bytes.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <signal.h>

using namespace caf_serving;
using namespace caf_serving::cluster_test;
namespace fs = std::filesystem;

namespace {

const std::string model = "resnet_narrow_opset17";
const fs::path fixtures = fs::path(CAF_SERVING_SOURCE_DIR) / "tests/onnx/fixtures";

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The fixture's reference: ONNX Runtime's logits for two input rows.
struct reference_rows {
  std::vector<std::string> inputs;              ///< bytes of each 3x64x64 FP32 row
  std::vector<std::vector<float>> outputs;      ///< 10 logits of each row
};

reference_rows read_reference() {
  auto dir = fixtures / "reference" / model;
  // The manifest this test was written against: 2 rows of input 3x64x64, logits 10.
  auto manifest = read_all(dir / "manifest.txt");
  REQUIRE(manifest.find("input input TYPE_FP32 2,3,64,64 input_input.bin") != std::string::npos);
  REQUIRE(manifest.find("output logits TYPE_FP32 2,10 output_logits.bin") != std::string::npos);
  auto in = read_all(dir / "input_input.bin");
  auto out = support::from_bytes<float>(read_all(dir / "output_logits.bin"));
  REQUIRE(in.size() == 2 * 3 * 64 * 64 * sizeof(float));
  REQUIRE(out.size() == 20);
  reference_rows r;
  for (size_t row = 0; row < 2; ++row) {
    r.inputs.push_back(in.substr(row * in.size() / 2, in.size() / 2));
    r.outputs.emplace_back(out.begin() + static_cast<long>(row * 10),
                           out.begin() + static_cast<long>(row * 10 + 10));
  }
  return r;
}

/// ||a - b|| / ||b||.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// One request: the reference rows in `rows` order (1 or 2 rows), binary in and out.
struct request {
  std::string id;
  std::vector<size_t> rows;
};

support::http_response send(support::http_client& http, const reference_rows& ref,
                            const request& q) {
  std::string tail;
  for (auto row : q.rows)
    tail += ref.inputs[row];
  std::string json = "{\"id\":\"" + q.id + "\",\"inputs\":[{\"name\":\"input\",\"datatype\":"
                     "\"FP32\",\"shape\":[" + std::to_string(q.rows.size())
                     + ",3,64,64],\"parameters\":{\"binary_data_size\":"
                     + std::to_string(tail.size()) + "}}],\"outputs\":[{\"name\":\"logits\","
                     "\"parameters\":{\"binary_data\":true}}]}";
  return http.post("/v2/models/" + model + "/infer", json + tail,
                   {{"Content-Type", "application/octet-stream"},
                    {"Inference-Header-Content-Length", std::to_string(json.size())}});
}

/// Empty when `r` is the answer to `q`: status 200, its id, and per row the
/// reference logits within 1e-4 relative error (onnx_server.test's bound). Else why not.
std::string check_answer(const support::http_response& r, const reference_rows& ref,
                         const request& q, std::string& answered_id) {
  if (r.status != 200)
    return "status " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
  auto body = support::split_binary(r);
  auto doc = support::json_document::parse(body.json);
  answered_id = doc.has("/id") ? doc.string_at("/id") : "(none)";
  if (answered_id != q.id)
    return "request " + q.id + " answered with id " + answered_id;
  auto got = support::from_bytes<float>(body.binary);
  if (got.size() != 10 * q.rows.size())
    return "request " + q.id + ": " + std::to_string(got.size()) + " logits";
  for (size_t i = 0; i < q.rows.size(); ++i) {
    std::vector<float> row(got.begin() + static_cast<long>(i * 10),
                           got.begin() + static_cast<long>(i * 10 + 10));
    auto err = relative_error(row, ref.outputs[q.rows[i]]);
    if (!(err < 1e-4))
      return "request " + q.id + " row " + std::to_string(i) + ": relative error "
             + std::to_string(err);
  }
  return "";
}

/// Worker `name`'s row of GET /v2's "workers" (empty when it has none).
std::string worker_row(uint16_t port, const std::string& name) {
  auto body = support::http_client(port).get("/v2").body;
  auto at = body.find("{\"name\":\"" + name + "\",");
  return at == std::string::npos ? "" : body.substr(at, body.find('}', at) - at + 1);
}

/// Waits until worker `name`'s row in /v2 contains `part`.
bool wait_for_row(uint16_t port, const std::string& name, const std::string& part,
                  std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (worker_row(port, name).find(part) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

} // namespace

TEST_CASE("an ONNX model on TLS workers (own repository and shipped files), one killed under "
          "load: every answer correct and given exactly once") {
  REQUIRE_MESSAGE(std::system("openssl version >/dev/null 2>&1") == 0,
                  "this test needs the openssl CLI (scripts/install-deps installs it)");
  setenv("CAF_SERVING_CLUSTER_SECRET", "onnx-tls-kill-secret", 1);
  auto ref = read_reference();
  support::temp_repository repo, scratch, pki_dir;
  repo.add_model(fixtures / "models" / model);
  auto pki = pki_dir.path();
  make_test_ca(pki, "ca");
  for (auto name : {"server", "wa", "wb"})
    make_test_cert(pki, "ca", name);

  // A: a copy of the server's repository, dialled by the server.
  auto wa = std::make_unique<worker_process>(worker_config{
    repo.path().string(), "wa", concat({"--executor-threads", "1"}, tls_flags(pki, "ca", "wa")),
    {}});
  CHECK(wa->wait_for_output("cluster links use TLS", std::chrono::seconds(1)));
  REQUIRE(wa->wait_for_output("model " + model + " version 1 (1 executors) READY",
                              std::chrono::seconds(20)));
  support::server_process server(
    {CAF_SERVING_BINARY, repo.path().string(),
     concat({"--worker", wa->address(), "--cluster-port", "0", "--cluster-address", "127.0.0.1",
             "--local-executors", "false", "--heartbeat-ms", "100", "--node-timeout-ms", "500"},
            tls_flags(pki, "ca", "server"))});
  CHECK(server.wait_for_output("cluster links use TLS", std::chrono::seconds(5)));
  // B: no repository; it joins, and the server ships the model's files.
  worker_process wb({"", "wb",
                     concat({"--join", "127.0.0.1:" + std::to_string(cluster_port(server)),
                             "--model-cache-dir", (scratch.path() / "cache").string(),
                             "--executor-threads", "1"},
                            tls_flags(pki, "ca", "wb")),
                     {}});
  REQUIRE(wb.wait_for_output("joined server", std::chrono::seconds(10)));
  auto port = server.http_port();
  auto served = "\"state\":\"ready\",\"models\":[\"" + model + ":1\"]";
  REQUIRE(wait_for_row(port, "wa", "\"address\":\"" + wa->address() + "\"," + served,
                       std::chrono::seconds(10)));
  REQUIRE(wait_for_row(port, "wb", served, std::chrono::seconds(30)));
  CHECK(wb.output().find("model " + model + ": 2 files (") != std::string::npos);
  // A's own copy passed the hash check: it was not reloaded, nothing was shipped to it.
  CHECK(wa->output().find("received from the server") == std::string::npos);
  CHECK(wa->output().find("loaded for the server") == std::string::npos);
  support::http_client http(port);
  CHECK(http.get("/v2").body.find("models_refused\":[\"") == std::string::npos);

  // The load: 4 clients x 100 requests, 1 or 2 rows each, in both orders.
  const int clients = 4, per_client = 100, total = clients * per_client, kill_after = 100;
  auto mp = server.metrics_port();
  auto batches = [&](const char* w) {
    return metric_sum(mp, "caf_serving_worker_batches_total",
                      "worker=\"" + std::string(w) + "\"");
  };
  std::mutex mutex;
  std::map<std::string, int> answers; // id -> times answered
  std::vector<std::string> failures;
  std::atomic<int> answered{0}, rows_sent{0};
  std::atomic<bool> killed{false};
  double wa_unanswerable = -1, wb_batches_at_kill = -1;
  int answered_at_kill = -1;
  auto kill_a = [&] {
    // So that the kill must catch batches that B then runs again: A is stopped
    // first, and killed once it holds a batch it cannot have answered, one sent
    // to it after it stopped (or one already presumed lost, past its deadline).
    ::kill(wa->pid(), SIGSTOP);
    auto sent_before = batches("wa");
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    do
      wa_unanswerable = batches("wa") - sent_before
                        + metric_sum(mp, "caf_serving_worker_batches_lost_total", "worker=\"wa\"");
    while (wa_unanswerable < 1 && std::chrono::steady_clock::now() < until);
    wb_batches_at_kill = batches("wb");
    answered_at_kill = answered.load();
    wa->kill_hard();
  };
  const std::vector<std::vector<size_t>> shapes{{0}, {1}, {0, 1}, {1, 0}};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      support::http_client client(port);
      client.timeout = std::chrono::milliseconds(30000);
      for (int i = 0; i < per_client; ++i) {
        request q{"c" + std::to_string(c) + "-" + std::to_string(i),
                  shapes[static_cast<size_t>(c + i) % shapes.size()]};
        rows_sent += static_cast<int>(q.rows.size());
        std::string why, id;
        try {
          why = check_answer(send(client, ref, q), ref, q, id);
        } catch (const std::exception& e) {
          why = "request " + q.id + ": " + e.what();
          client.close();
        }
        {
          std::lock_guard<std::mutex> guard(mutex);
          if (!id.empty())
            ++answers[id];
          if (!why.empty())
            failures.push_back(why);
        }
        if (++answered >= kill_after && !killed.exchange(true))
          kill_a();
      }
    });
  for (auto& t : threads)
    t.join();
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  INFO((failures.empty() ? std::string("no failure") : failures.front()));
  CHECK(killed.load());
  CHECK(failures.empty());
  // Every id answered, each once.
  CHECK(answers.size() == static_cast<size_t>(total));
  int twice = 0;
  for (const auto& [id, n] : answers)
    twice += n != 1;
  CHECK(twice == 0);
  // The server counted each request once: none lost, none answered twice (an
  // HTTP request's response is sent once whatever the pipeline does).
  CHECK(metric_sum(mp, "caf_serving_inference_request_success", "model=\"" + model + "\"")
        == total);
  CHECK(metric_sum(mp, "caf_serving_inference_request_failure", "model=\"" + model + "\"")
        == 0);
  // And computed each row once as far as the answers go: a batch whose results
  // reached the post-processor twice (run again and also answered) counts its rows twice.
  CHECK(metric_sum(mp, "caf_serving_inference_count", "model=\"" + model + "\"")
        == rows_sent.load());
  // A held batches when it was killed; they went back to the queue and B ran them
  // with everything after: B got at least a batch per 8 requests (max_batch_size)
  // of those answered after the kill.
  double lost = metric_sum(mp, "caf_serving_worker_batches_lost_total", "worker=\"wa\"");
  double wb_after = batches("wb") - wb_batches_at_kill;
  MESSAGE("wa held " << wa_unanswerable << " unanswerable batches when killed after "
                     << answered_at_kill << " answers; " << lost
                     << " went back to the queue; wb ran " << wb_after
                     << " batches after the kill; the load took " << seconds << " s");
  CHECK(wa_unanswerable >= 1);
  CHECK(lost >= 1);
  CHECK(wb_after >= std::ceil((total - answered_at_kill) / 8.0));
  // /v2 shows A lost (and B still serving); /metrics counts one worker up.
  CHECK(wait_for_row(port, "wa", "\"state\":\"lost\"", std::chrono::seconds(5)));
  CHECK(worker_row(port, "wb").find(served) != std::string::npos);
  CHECK(metric_sum(mp, "caf_serving_worker_up") == 1);
  CHECK(metric_sum(mp, "caf_serving_worker_batches_in_flight", "worker=\"wa\"") == 0);
}
