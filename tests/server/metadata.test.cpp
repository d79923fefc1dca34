/// The non-inference endpoints: server metadata, health, model metadata and
/// configuration, readiness, statistics, Prometheus metrics on both ports, and
/// the repository index with a model that failed to load.

#include "server_test.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::server_test;

namespace {

std::string simple_request(int32_t base) {
  std::vector<int32_t> a(16, base), b(16, 1);
  return infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(a)),
                     input_json("INPUT1", "INT32", {1, 16}, json_list(b))});
}

} // namespace

TEST_CASE("server metadata, health and model metadata") {
  test_server server({example_model("simple"), example_model("identity_fp32")});
  auto http = server.client();

  auto r = http.get("/v2");
  REQUIRE(r.status == 200);
  auto doc = json_document::parse(r.body);
  // Triton's name and release (its clients check the name), the engine's own below.
  CHECK(doc.string_at("/name") == "triton");
  CHECK(doc.string_at("/version") == "2.51.0");
  CHECK(doc.string_at("/engine/name") == "caf-serving");
  CHECK_FALSE(doc.string_at("/engine/version").empty());
  auto extensions = json_strings(doc.at("/extensions"));
  for (const char* e : {"binary_tensor_data", "classification", "model_repository", "statistics"})
    CHECK_MESSAGE(std::find(extensions.begin(), extensions.end(), e) != extensions.end(), e);

  CHECK(http.get("/v2/health/live").status == 200);
  CHECK(http.get("/v2/health/ready").status == 200);

  r = http.get("/v2/models/simple");
  REQUIRE(r.status == 200);
  doc = json_document::parse(r.body);
  CHECK(doc.string_at("/name") == "simple");
  CHECK(json_strings(doc.at("/versions")) == std::vector<std::string>{"1"});
  CHECK(doc.string_at("/platform") == "builtin");
  REQUIRE(doc.at("/inputs").get_array().size() == 2);
  CHECK(doc.string_at("/inputs/1/name") == "INPUT1");
  CHECK(doc.string_at("/inputs/0/datatype") == "INT32");
  CHECK(json_ints(doc.at("/inputs/0/shape")) == std::vector<int64_t>{-1, 16});
  REQUIRE(doc.at("/outputs").get_array().size() == 2);
  CHECK(doc.string_at("/outputs/0/name") == "OUTPUT0");

  r = http.get("/v2/models/identity_fp32/versions/1");
  REQUIRE(r.status == 200);
  doc = json_document::parse(r.body);
  CHECK(doc.string_at("/name") == "identity_fp32");
  CHECK(doc.string_at("/inputs/0/datatype") == "FP32");

  CHECK(http.get("/v2/models/simple/ready").status == 200);
  CHECK(http.get("/v2/models/simple/versions/1/ready").status == 200);
  // Triton 2.51's readiness answer: 400 "Model version not ready".
  r = http.get("/v2/models/simple/versions/2/ready");
  CHECK(r.status == 400);
  CHECK(error_message(r.body).find("Request for unknown model: 'simple' version 2 is not found")
        != std::string::npos);
  r = http.get("/v2/models/no_such_model/ready");
  CHECK(r.status == 400);
  CHECK(error_message(r.body).find("Request for unknown model: 'no_such_model' is not found")
        != std::string::npos);

  r = http.get("/v2/models/simple/config");
  REQUIRE(r.status == 200);
  doc = json_document::parse(r.body);
  CHECK(doc.string_at("/name") == "simple");
  CHECK(doc.string_at("/backend") == "builtin");
  CHECK(doc.int_at("/max_batch_size") == 8);
  CHECK(doc.string_at("/input/0/data_type") == "TYPE_INT32");
  CHECK(json_ints(doc.at("/input/0/dims")) == std::vector<int64_t>{16});
  r = http.get("/v2/models/identity_fp32/versions/1/config");
  REQUIRE(r.status == 200);
  CHECK(json_document::parse(r.body).int_at("/max_batch_size") == 64);
}

TEST_CASE("statistics and metrics count what was served") {
  test_server server({example_model("simple"), example_model("identity_fp32")});
  auto http = server.client();
  for (int i = 0; i < 3; ++i) {
    auto r = http.post("/v2/models/simple/infer", simple_request(i), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
  }
  // A batch of two rows counts two inferences in one execution.
  std::vector<int32_t> two_rows(32, 4);
  auto r = http.post("/v2/models/simple/infer",
                     infer_body({input_json("INPUT0", "INT32", {2, 16}, json_list(two_rows)),
                                 input_json("INPUT1", "INT32", {2, 16}, json_list(two_rows))}),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  // One failure: a missing input.
  std::vector<int32_t> one_row(16, 4);
  r = http.post("/v2/models/simple/infer",
                infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(one_row))}),
                json_content);
  CHECK(r.status == 400);

  r = http.get("/v2/models/simple/stats");
  REQUIRE(r.status == 200);
  auto doc = json_document::parse(r.body);
  REQUIRE(doc.at("/model_stats").get_array().size() == 1);
  CHECK(doc.string_at("/model_stats/0/name") == "simple");
  CHECK(doc.string_at("/model_stats/0/version") == "1");
  CHECK(doc.uint_at("/model_stats/0/inference_count") == 5);
  CHECK(doc.uint_at("/model_stats/0/execution_count") == 4);
  CHECK(doc.uint_at("/model_stats/0/inference_stats/success/count") == 4);
  CHECK(doc.uint_at("/model_stats/0/inference_stats/fail/count") == 1);
  CHECK(doc.uint_at("/model_stats/0/inference_stats/compute_infer/count") == 4);
  CHECK(doc.uint_at("/model_stats/0/last_inference") > 0);

  r = http.get("/v2/models/simple/versions/1/stats");
  REQUIRE(r.status == 200);
  CHECK(json_document::parse(r.body).uint_at("/model_stats/0/inference_count") == 5);
  CHECK(http.get("/v2/models/nope/stats").status == 400); // Triton's status for statistics

  r = http.get("/v2/models/stats");
  REQUIRE(r.status == 200);
  doc = json_document::parse(r.body);
  std::vector<std::string> names;
  simdjson::dom::array stats = doc.at("/model_stats").get_array();
  for (auto m : stats)
    names.emplace_back(m["name"].get_string().value());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"identity_fp32", "simple"});

  // The same counts in Prometheus text, on the HTTP port and the metrics port.
  for (uint16_t port : {server.process->http_port(), server.process->metrics_port()}) {
    CAPTURE(port);
    http_client m(port);
    r = m.get("/metrics");
    REQUIRE(r.status == 200);
    CHECK(r.header("content-type").find("text/plain") == 0);
    CHECK(metric_value(r.body, "caf_serving_inference_request_success{model=\"simple\",version=\"1\"}")
          == 4);
    CHECK(metric_value(r.body, "caf_serving_inference_count{model=\"simple\",version=\"1\"}") == 5);
    CHECK(metric_value(r.body, "caf_serving_inference_exec_count{model=\"simple\",version=\"1\"}")
          == 4);
    CHECK(metric_value(r.body,
                 "caf_serving_inference_request_success{model=\"identity_fp32\",version=\"1\"}")
          == 0);
    CHECK(metric_value(r.body, "caf_serving_pending_request_count{model=\"simple\",version=\"1\"}")
          == 0);
  }
  http_client metrics_port(server.process->metrics_port());
  r = metrics_port.get("/v2");
  CHECK(r.status == 404);
  CHECK(error_message(r.body).find("only GET /metrics") != std::string::npos);
  CHECK(metrics_port.post("/metrics", "").status == 405);
}

TEST_CASE("the repository index lists a broken model with its reason") {
  test_server server({example_model("simple"), test_model("identity_bytes"),
                      test_model("broken")});
  CHECK(server.process->output().find("model simple version 1 READY") != std::string::npos);
  CHECK(server.process->output().find("model broken UNAVAILABLE") != std::string::npos);
  auto http = server.client();

  auto r = http.post("/v2/repository/index", "");
  REQUIRE(r.status == 200);
  auto doc = json_document::parse(r.body);
  auto rows = doc.root().get_array().value();
  REQUIRE(rows.size() == 3);
  int seen = 0;
  for (auto row : rows) {
    std::string name(row["name"].get_string().value());
    std::string state(row["state"].get_string().value());
    CAPTURE(name);
    if (name == "broken") {
      CHECK(state == "UNAVAILABLE");
      std::string_view reason;
      REQUIRE(!row["reason"].get(reason));
      CHECK(reason.find("unknown builtin function 'no_such_function'") != std::string::npos);
      ++seen;
    } else {
      CHECK(state == "READY");
      CHECK(std::string_view(row["version"].get_string().value()) == "1");
      seen += name == "simple" || name == "identity_bytes" ? 1 : 0;
    }
  }
  CHECK(seen == 3);
  CHECK(http.get("/v2/repository/index").status == 405);

  // The broken model is not ready and cannot serve; the others can. It has
  // no version to serve: Triton's 404 for inference, 400 for readiness.
  r = http.get("/v2/models/broken/ready");
  CHECK(r.status == 400);
  CHECK(error_message(r.body).find("no_such_function") != std::string::npos);
  std::vector<float> one{1.f};
  r = http.post("/v2/models/broken/infer",
                infer_body({input_json("INPUT0", "FP32", {1, 1}, json_list(one))}), json_content);
  CHECK(r.status == 404);
  r = http.post("/v2/models/identity_bytes/infer",
                infer_body({input_json("INPUT0", "BYTES", {1, 1}, "[\"ok\"]")}), json_content);
  REQUIRE(r.status == 200);
  CHECK(json_strings(json_document::parse(r.body).at("/outputs/0/data"))
        == std::vector<std::string>{"ok"});

  // Strict readiness (the default): not every model is ready.
  // Triton answers "not ready" 400 with no body.
  auto not_ready = http.get("/v2/health/ready");
  CHECK(not_ready.status == 400);
  CHECK(not_ready.body.empty());
  CHECK(http.get("/v2/health/live").status == 200);
}

TEST_CASE("--strict-readiness false: ready although a model failed to load") {
  test_server server({example_model("simple"), test_model("broken")},
                     {"--strict-readiness", "false"});
  auto http = server.client();
  CHECK(http.get("/v2/health/ready").status == 200);
  CHECK(http.get("/v2/models/broken/ready").status == 400);
}
