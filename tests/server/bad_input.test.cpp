/// Each class of bad request gets its own exact HTTP status and a message that
/// names the problem, in a KServe error body; afterwards the server still
/// answers good requests.

#include "server_test.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::server_test;

namespace {

test_server& server() {
  static test_server s({example_model("simple"), example_model("identity_fp32"),
                        test_model("identity_bytes")},
                       {"--max-body-bytes", "4096"});
  return s;
}

std::vector<int32_t> ints(size_t n, int32_t v = 1) {
  return std::vector<int32_t>(n, v);
}

std::string int_input(const std::string& name, std::vector<int64_t> shape, size_t n) {
  return input_json(name, "INT32", std::move(shape), json_list(ints(n)));
}

/// A request that simple accepts.
std::string good_simple() {
  return infer_body({int_input("INPUT0", {1, 16}, 16), int_input("INPUT1", {1, 16}, 16)});
}

/// Checks status, a JSON error body and a message substring.
void expect_error(const http_response& r, int status, const std::string& fragment) {
  CHECK_MESSAGE(r.status == status, r.body);
  CHECK(r.header("content-type") == "application/json");
  std::string message;
  try {
    message = error_message(r.body);
  } catch (const std::exception& e) {
    FAIL_CHECK("not a KServe error body: " << e.what());
    return;
  }
  CHECK_MESSAGE(message.find(fragment) != std::string::npos,
                "message \"" << message << "\" lacks \"" << fragment << "\"");
}

http_response post_json(const std::string& model, const std::string& body) {
  auto http = server().client();
  return http.post("/v2/models/" + model + "/infer", body, json_content);
}

} // namespace

TEST_CASE("malformed JSON is a 400") {
  expect_error(post_json("simple", "{\"inputs\":[{\"name\":\"INPUT0\","), 400, "not valid JSON");
  expect_error(post_json("simple", "[1,2,3]"), 400, "must be a JSON object");
  expect_error(post_json("simple", ""), 400, "empty");
  expect_error(post_json("simple", "{\"id\":\"x\"}"), 400, "has no \"inputs\"");
  expect_error(post_json("simple", good_simple() + "}"), 400, "after its JSON object");
}

TEST_CASE("wrong and unknown datatypes are a 400") {
  expect_error(post_json("simple", infer_body({input_json("INPUT0", "FP32", {1, 16},
                                                          json_list(std::vector<float>(16, 1.5f))),
                                               int_input("INPUT1", {1, 16}, 16)})),
               400, "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects "
                    "'INT32'");
  expect_error(post_json("simple", infer_body({input_json("INPUT0", "FLOAT", {1, 16},
                                                          json_list(ints(16))),
                                               int_input("INPUT1", {1, 16}, 16)})),
               400, "unknown datatype 'FLOAT'");
  // A string where INT32 data belongs.
  expect_error(post_json("simple", infer_body({input_json("INPUT0", "INT32", {1, 1}, "[\"7\"]"),
                                               int_input("INPUT1", {1, 16}, 16)})),
               400, "is not an integer");
}

TEST_CASE("wrong shapes and element counts are a 400") {
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 8}, 8),
                                               int_input("INPUT1", {1, 16}, 16)})),
               400, "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], "
                    "got [1,8].");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {16}, 16),
                                               int_input("INPUT1", {16}, 16)})),
               400, "Expected [-1,16], got [16]. The model batches (max_batch_size 8)");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 15),
                                               int_input("INPUT1", {1, 16}, 16)})),
               400, "has 15 data elements but its shape [1,16] needs 16");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 17),
                                               int_input("INPUT1", {1, 16}, 16)})),
               400, "more data elements than its shape [1,16] holds");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 16),
                                               int_input("INPUT1", {2, 16}, 32)})),
               400, "input 'INPUT1' batch size does not match other inputs for 'simple'");
}

TEST_CASE("missing, unknown and repeated inputs and unknown outputs are a 400") {
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 16)})), 400,
               "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
               "but missing required input(s) ['INPUT1']");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 16),
                                               int_input("INPUT1", {1, 16}, 16),
                                               int_input("INPUT7", {1, 16}, 16)})),
               400, "unexpected inference input 'INPUT7' for model 'simple'");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 16),
                                               int_input("INPUT0", {1, 16}, 16)})),
               400, "input 'INPUT0' already exists in request");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {1, 16}, 16),
                                               int_input("INPUT1", {1, 16}, 16)},
                                              ",\"outputs\":[{\"name\":\"OUTPUT9\"}]")),
               400, "unexpected inference output 'OUTPUT9' for model 'simple'");
  expect_error(post_json("identity_bytes",
                         infer_body({input_json("INPUT0", "BYTES", {1, 1}, "[\"a\"]")},
                                    ",\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":"
                                    "{\"classification\":1}}]")),
               400, "is not numeric");
}

TEST_CASE("a batch over max_batch_size is a 400") {
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {9, 16}, 144),
                                               int_input("INPUT1", {9, 16}, 144)})),
               400, "inference request batch-size must be <= 8 for 'simple': input 'INPUT0' has "
                    "batch size 9 (shape [9,16])");
  expect_error(post_json("simple", infer_body({int_input("INPUT0", {0, 16}, 0),
                                               int_input("INPUT1", {0, 16}, 0)})),
               400, "batch size 0");
}

TEST_CASE("binary sizes that do not fit the body are a 400") {
  auto http = server().client();
  std::string raw(32, '\x01');
  auto json = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, 64)});
  expect_error(http.post("/v2/models/identity_fp32/infer", json + raw,
                         {{"Inference-Header-Content-Length", std::to_string(json.size())}}),
               400, "has binary_data_size 64 but only 32 bytes of binary data remain");
  expect_error(http.post("/v2/models/identity_fp32/infer", json + raw,
                         {{"Inference-Header-Content-Length", std::to_string(json.size() + 100)}}),
               400, "but the body has only");
  expect_error(http.post("/v2/models/identity_fp32/infer", json + raw,
                         {{"Inference-Header-Content-Length", "12abc"}}),
               400, "is not a number");
  auto extra = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, 64)});
  expect_error(http.post("/v2/models/identity_fp32/infer", extra + std::string(80, '\0'),
                         {{"Inference-Header-Content-Length", std::to_string(extra.size())}}),
               400, "16 bytes of binary data after the JSON header");
  // binary_data_size that disagrees with the shape.
  auto small = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, 32)});
  expect_error(http.post("/v2/models/identity_fp32/infer", small + raw,
                         {{"Inference-Header-Content-Length", std::to_string(small.size())}}),
               400, "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. "
                    "Expected 64, got 32");
  // BYTES elements whose length runs past the data.
  std::string bad_bytes("\x10\x00\x00\x00" "abc", 7);
  auto b = infer_body({binary_input_json("INPUT0", "BYTES", {1, 1}, bad_bytes.size())});
  expect_error(http.post("/v2/models/identity_bytes/infer", b + bad_bytes,
                         {{"Inference-Header-Content-Length", std::to_string(b.size())}}),
               400, "BYTES element 0 of length 16 but only 3 bytes of data remain");
}

TEST_CASE("an absurd shape is a 400, not an allocation") {
  expect_error(post_json("identity_fp32",
                         infer_body({input_json("INPUT0", "FP32", {1, 999999999999}, "[]")})),
               400, "more than the limit of");
  auto http = server().client();
  auto json = infer_body({binary_input_json("INPUT0", "FP32", {999999999999, 16}, 0)});
  expect_error(http.post("/v2/models/identity_fp32/infer", json,
                         {{"Inference-Header-Content-Length", std::to_string(json.size())}}),
               400, "more than the limit of");
  expect_error(post_json("identity_fp32",
                         infer_body({input_json("INPUT0", "FP32", {-1, 16}, "[]")})),
               400, "negative dimension");
}

TEST_CASE("broken UTF-8 in JSON is a 400") {
  expect_error(post_json("identity_bytes",
                         infer_body({input_json("INPUT0", "BYTES", {1, 1}, "[\"ab\xff\xfe\"]")})),
               400, "not valid UTF-8");
  // A truncated multi-byte sequence in a key.
  expect_error(post_json("identity_bytes", "{\"inp\xC3\":[]}"), 400, "not valid UTF-8");
}

TEST_CASE("a body over --max-body-bytes is Triton's 400, in Triton's words") {
  std::vector<int32_t> big(16, 123456789);
  auto body = infer_body({int_input("INPUT0", {1, 16}, 16), int_input("INPUT1", {1, 16}, 16)},
                         ",\"id\":\"" + std::string(5000, 'x') + "\"");
  REQUIRE(body.size() > 4096);
  auto http = server().client();
  expect_error(http.post("/v2/models/simple/infer", body, json_content), 400,
               "request JSON size of " + std::to_string(body.size())
                 + " bytes exceeds the maximum allowed input size of 4096 bytes. Use "
                   "--http-max-input-size to increase the limit (this server's --max-body-bytes");
  // A raw body (qa/L0_http/http_input_size_limit_test.py).
  expect_error(http.post("/v2/models/simple/infer", std::string(5000, '\1'),
                         {{"Inference-Header-Content-Length", "0"}}),
               400, "Raw input has a byte_size (5000 bytes) that exceeds the maximum allowed value "
                    "of 4096 bytes.");
  // Without a Content-Length: a chunked body is cut off at the limit.
  http_client chunked(server().port());
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", body.size());
  auto r = chunked.raw_request("POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                               "Content-Type: application/json\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n"
                               + std::string(size_line) + body + "\r\n0\r\n\r\n");
  expect_error(r, 400, "exceeds the maximum allowed input size of 4096 bytes");
  // A small gzip body that inflates past the limit.
  auto bomb = gzip("{\"inputs\":[],\"id\":\"" + std::string(100000, 'y') + "\"}");
  REQUIRE(bomb.size() < 4096);
  expect_error(http.post("/v2/models/simple/infer", bomb,
                         {{"Content-Type", "application/json"}, {"Content-Encoding", "gzip"}}),
               400, "Decompressed data size exceeds the maximum allowed value of 4096 bytes");
  expect_error(http.post("/v2/models/simple/infer", good_simple(),
                         {{"Content-Type", "application/json"}, {"Content-Encoding", "br"}}),
               501, "Unsupported compression type: Content-Encoding 'br'");
}

TEST_CASE("a malformed body is a 400 that says so, not a body too large") {
  // Every failure to read the body used to be reported as too large.
  auto body = good_simple();
  http_client chunked(server().port());
  auto r = chunked.raw_request("POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                               "Content-Type: application/json\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n"
                               "zz-not-a-size\r\n" + body + "\r\n0\r\n\r\n");
  expect_error(r, 400, "chunked");
  CHECK(r.body.find("kj") == std::string::npos);
}

TEST_CASE("wrong methods are a 405, unknown models and paths a 404") {
  auto http = server().client();
  expect_error(http.get("/v2/models/simple/infer"), 405, "inference takes POST");
  expect_error(http.post("/v2/health/live", ""), 405, "this endpoint takes GET");
  expect_error(http.post("/v2/models/simple/config", ""), 405, "this endpoint takes GET");
  expect_error(http.get("/v2/repository/index"), 405, "this endpoint takes POST");
  expect_error(http.post("/v2/models/no_such_model/infer", good_simple(), json_content), 404,
               "Request for unknown model: 'no_such_model' is not found");
  expect_error(http.get("/v2/models/no_such_model"), 404,
               "Request for unknown model: 'no_such_model' is not found");
  expect_error(http.get("/v3/models"), 404, "unknown path");
  expect_error(http.get("/v2/models/simple/frobnicate"), 404, "unknown path");
  expect_error(http.post("/v2/models/simple/versions/abc/infer", good_simple(), json_content), 404,
               "Not Found: version 'abc' of model 'simple' is not a positive integer");
}

TEST_CASE("after every bad request the server still answers good ones") {
  // Runs last (doctest keeps file order); every case above used this server.
  auto http = server().client();
  auto r = http.post("/v2/models/simple/infer", good_simple(), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(json_ints(doc.at("/outputs/0/data")) == std::vector<int64_t>(16, 2));
  CHECK(json_ints(doc.at("/outputs/1/data")) == std::vector<int64_t>(16, 0));
  r = http.post("/v2/models/identity_bytes/infer",
                infer_body({input_json("INPUT0", "BYTES", {1, 1}, "[\"still here\"]")}),
                json_content);
  REQUIRE(r.status == 200);
  CHECK(json_strings(json_document::parse(r.body).at("/outputs/0/data"))
        == std::vector<std::string>{"still here"});
  // Failures were counted, successes too, and nothing is left pending.
  auto metrics = http_client(server().process->metrics_port()).get("/metrics").body;
  CHECK(metric_value(metrics, "caf_serving_inference_request_failure{model=\"simple\","
                              "version=\"1\",reason=\"bad_request\"}")
        > 10);
  CHECK(metric_value(metrics, "caf_serving_pending_request_count{model=\"simple\",version=\"1\"}")
        == 0);
  CHECK(metric_value(metrics, "caf_serving_inference_request_success{model=\"simple\","
                              "version=\"1\"}")
        == 1);
}
