/// Triton's HTTP protocol to the letter, where Triton's own tests and clients
/// depend on it: which outputs come back binary, raw binary requests and their
/// binary answers, the status and wording of unknown models and versions, the
/// repository index's "ready" filter, nested "data" up to Triton's depth
/// limit, and the phrases Triton's tests match in error messages (each
/// followed by this server's own explanation).

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace caf_serving::server_test;

namespace {

test_server& server() {
  static test_server s({example_model("simple"), example_model("identity_fp32"),
                        test_model("identity_bytes"), test_model("broken")},
                       {"--strict-readiness", "false"});
  return s;
}

std::vector<int32_t> iota32(int32_t from, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<int32_t>(i);
  return v;
}

std::string simple_body(const std::string& rest = "") {
  return infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(iota32(10, 16))),
                     input_json("INPUT1", "INT32", {1, 16}, json_list(iota32(0, 16)))},
                    rest);
}

/// The error message of `r`, checking the status and that it is a KServe
/// error body.
std::string error_of(const http_response& r, int status) {
  CHECK_MESSAGE(r.status == status, r.body);
  CHECK(r.header("content-type") == "application/json");
  return error_message(r.body);
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

std::string nested(size_t depth, const std::string& inner) {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

} // namespace

TEST_CASE("binary_data_output: listed outputs follow their own binary_data, as in Triton") {
  auto http = server().client();
  // OUTPUT0 listed without binary_data: JSON, although binary_data_output is
  // true; OUTPUT1 asks for binary itself.
  auto r = http.post("/v2/models/simple/infer",
                     simple_body(",\"parameters\":{\"binary_data_output\":true},\"outputs\":["
                                 "{\"name\":\"OUTPUT0\"},{\"name\":\"OUTPUT1\",\"parameters\":"
                                 "{\"binary_data\":true}}]"),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto parts = split_binary(r);
  auto doc = json_document::parse(parts.json);
  CHECK(doc.string_at("/outputs/0/name") == "OUTPUT0");
  auto sums = json_ints(doc.at("/outputs/0/data"));
  REQUIRE(sums.size() == 16);
  for (size_t i = 0; i < 16; ++i)
    CHECK(sums[i] == 10 + 2 * static_cast<int64_t>(i));
  CHECK_FALSE(doc.has("/outputs/0/parameters/binary_data_size"));
  CHECK(doc.string_at("/outputs/1/name") == "OUTPUT1");
  CHECK(doc.uint_at("/outputs/1/parameters/binary_data_size") == 64);
  CHECK(from_bytes<int32_t>(parts.binary) == std::vector<int32_t>(16, 10));

  SUBCASE("a listed output with binary_data false and the default true: JSON") {
    r = http.post("/v2/models/simple/infer",
                  simple_body(",\"parameters\":{\"binary_data_output\":true},\"outputs\":["
                              "{\"name\":\"OUTPUT1\",\"parameters\":{\"binary_data\":false}}]"),
                  json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(r.header("inference-header-content-length").empty());
    auto d = json_document::parse(r.body);
    CHECK(json_ints(d.at("/outputs/0/data")) == std::vector<int64_t>(16, 10));
  }
  SUBCASE("no outputs listed: every output follows binary_data_output") {
    r = http.post("/v2/models/simple/infer",
                  simple_body(",\"parameters\":{\"binary_data_output\":true}"), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    auto all = split_binary(r);
    auto d = json_document::parse(all.json);
    CHECK(d.uint_at("/outputs/0/parameters/binary_data_size") == 64);
    CHECK(d.uint_at("/outputs/1/parameters/binary_data_size") == 64);
    CHECK(all.binary.size() == 128);
  }
}

TEST_CASE("a raw binary request (Inference-Header-Content-Length: 0) is answered in binary") {
  auto http = server().client();
  std::vector<float> v(16);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i) * 0.5f - 3.f;
  auto input = to_bytes(v);
  auto r = http.post("/v2/models/identity_fp32/infer", input,
                     {{"Inference-Header-Content-Length", "0"}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  // What Triton's test_raw_binary reads: the header, then the bytes after it.
  auto header = r.header("inference-header-content-length");
  REQUIRE_FALSE(header.empty());
  size_t json_size = std::stoul(header);
  REQUIRE(json_size < r.body.size());
  CHECK(r.header("content-type") == "application/octet-stream");
  CHECK(r.body.substr(json_size) == input);
  auto doc = json_document::parse(r.body.substr(0, json_size));
  CHECK(doc.string_at("/outputs/0/name") == "OUTPUT0");
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{1, 16});
  CHECK(doc.uint_at("/outputs/0/parameters/binary_data_size") == 64);

  SUBCASE("BYTES: the output is one length-prefixed element (Triton's test_byte)") {
    r = http.post("/v2/models/identity_bytes/infer", "427",
                  {{"Inference-Header-Content-Length", "0"}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    size_t n = std::stoul(r.header("inference-header-content-length"));
    CHECK(r.body.substr(n + 4) == "427");
  }
  SUBCASE("a model with two inputs: Triton's message (test_multi_inputs)") {
    auto msg = error_of(http.post("/v2/models/simple/infer", std::string(128, '\1'),
                                  {{"Inference-Header-Content-Length", "0"}}),
                        400);
    CHECK_MESSAGE(starts_with(msg, "Raw request must only have 1 input (found 1) to be deduced "
                                   "but got 2 inputs in 'simple' model configuration"),
                  msg);
  }
}

TEST_CASE("raw BYTES bodies need a model input of shape [1] (Triton's test_byte_too_many_elements)") {
  test_server s({test_model("identity_bytes")}, model_control_api());
  // identity_bytes with dims [-1]: a raw body cannot say how many elements.
  s.repo.write_file("identity_bytes_any/config.pbtxt",
                    "name: \"identity_bytes_any\"\n"
                    "backend: \"builtin\"\n"
                    "max_batch_size: 64\n"
                    "input [ { name: \"INPUT0\" data_type: TYPE_STRING dims: [ -1 ] } ]\n"
                    "output [ { name: \"OUTPUT0\" data_type: TYPE_STRING dims: [ -1 ] } ]\n"
                    "parameters { key: \"function\" value: { string_value: \"identity\" } }\n");
  s.repo.write_file("identity_bytes_any/1/model.builtin", "");
  auto http = s.client();
  REQUIRE_MESSAGE(http.post("/v2/repository/models/identity_bytes_any/load", "").status == 200,
                  "loading the [-1] variant");
  auto msg = error_of(http.post("/v2/models/identity_bytes_any/infer", "427",
                                {{"Inference-Header-Content-Length", "0"}}),
                      400);
  CHECK_MESSAGE(starts_with(msg, "For BYTE datatype raw input 'INPUT0', the model must have "
                                 "input shape [1]"),
                msg);
  // JSON requests to it still work.
  auto r = http.post("/v2/models/identity_bytes_any/infer",
                     infer_body({input_json("INPUT0", "BYTES", {1, 2}, "[\"a\",\"b\"]")}),
                     json_content);
  CHECK_MESSAGE(r.status == 200, r.body);
  CHECK(http.get("/v2/health/live").status == 200);
}

TEST_CASE("unknown models and versions: Triton's status and wording first") {
  auto http = server().client();
  const std::string unknown = "Request for unknown model: 'no_such_model' is not found";
  for (const std::string path : {"/v2/models/no_such_model", "/v2/models/no_such_model/config",
                                 "/v2/models/no_such_model/versions/1"}) {
    CAPTURE(path);
    auto msg = error_of(http.get(path), 404);
    CHECK_MESSAGE(starts_with(msg, unknown), msg);
    CHECK(msg.find("/v2/repository/index") != std::string::npos); // the engine's hint
  }
  auto msg = error_of(http.post("/v2/models/no_such_model/infer", simple_body(), json_content),
                      404);
  CHECK_MESSAGE(starts_with(msg, unknown), msg);

  for (const std::string path : {"/v2/models/simple/versions/7",
                                 "/v2/models/simple/versions/7/config"}) {
    CAPTURE(path);
    msg = error_of(http.get(path), 404);
    CHECK_MESSAGE(starts_with(msg, "Request for unknown model: 'simple' version 7 is not found"),
                  msg);
    CHECK(msg.find("versions served: 1") != std::string::npos);
  }
  msg = error_of(http.post("/v2/models/simple/versions/7/infer", simple_body(), json_content),
                 404);
  CHECK(starts_with(msg, "Request for unknown model: 'simple' version 7 is not found"));

  // A model that failed to load has no version to serve: 404, with why.
  msg = error_of(http.get("/v2/models/broken"), 404);
  CHECK_MESSAGE(starts_with(msg, "Request for unknown model: 'broken' has no available "
                                 "versions; model 'broken' is not ready: "),
                msg);
  msg = error_of(http.post("/v2/models/broken/versions/1/infer", simple_body(), json_content),
                 503);
  CHECK_MESSAGE(starts_with(msg, "Request for unknown model: 'broken' version 1 is not at ready "
                                 "state"),
                msg);

  // Readiness: Triton 2.51 answers 400 "Model version not ready" for all of
  // these; the reason follows in later Triton's words.
  const std::vector<std::pair<std::string, std::string>> not_ready{
    {"/v2/models/no_such_model/ready", unknown},
    {"/v2/models/simple/versions/7/ready",
     "Request for unknown model: 'simple' version 7 is not found"},
    {"/v2/models/broken/ready", "Request for unknown model: 'broken' has no available versions"},
    {"/v2/models/broken/versions/1/ready",
     "Request for unknown model: 'broken' version 1 is not at ready state"}};
  for (const auto& [path, reason] : not_ready) {
    CAPTURE(path);
    msg = error_of(http.get(path), 400);
    CHECK_MESSAGE(starts_with(msg, "Model version not ready: " + reason), msg);
  }
  CHECK(http.get("/v2/models/simple/ready").status == 200);
  CHECK(http.get("/v2/models/simple/versions/1/ready").status == 200);

  // Statistics answer 400 with Triton's own statistics wording.
  msg = error_of(http.get("/v2/models/no_such_model/stats"), 400);
  CHECK_MESSAGE(starts_with(msg, "requested model 'no_such_model' is not available"), msg);
  msg = error_of(http.get("/v2/models/broken/stats"), 400);
  CHECK_MESSAGE(starts_with(msg, "requested model 'broken' is not available"), msg);
  msg = error_of(http.get("/v2/models/simple/versions/7/stats"), 400);
  CHECK_MESSAGE(starts_with(msg, "requested model version is not available for model 'simple'"),
                msg);
  CHECK(http.get("/v2/models/simple/versions/1/stats").status == 200);
}

TEST_CASE("repository index: {\"ready\": true} lists only ready models; bad bodies are a 400") {
  auto http = server().client();
  auto names = [](const http_response& r) {
    std::vector<std::string> out;
    auto doc = json_document::parse(r.body);
    for (auto row : doc.root().get_array()) {
      auto object = row.get_object().value();
      out.emplace_back(std::string_view(object["name"].get_string().value()));
      // Triton's row fields, nothing else.
      for (auto field : object) {
        std::string_view key = field.key;
        CHECK_MESSAGE((key == "name" || key == "version" || key == "state" || key == "reason"),
                      key);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::vector<std::string> everything{"broken", "identity_bytes", "identity_fp32",
                                            "simple"};
  const std::vector<std::string> ready{"identity_bytes", "identity_fp32", "simple"};
  for (const std::string body : {"", "{}", "{\"ready\":false}", " "}) {
    auto r = http.post("/v2/repository/index", body, json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK_MESSAGE(names(r) == everything, body);
  }
  auto r = http.post("/v2/repository/index", "{\"ready\": true}", json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(names(r) == ready);

  for (const std::string& body : std::vector<std::string>{"{\"ready\":\"true\"}", "{\"ready\":1}",
                                 // Triton's test: 250,000 nested arrays.
                                 "{\"ready\":" + nested(250000, "true") + "}"}) {
    auto msg = error_of(http.post("/v2/repository/index", body, json_content), 400);
    CHECK_MESSAGE(starts_with(msg, "Invalid value for 'ready': expected a boolean"), msg);
  }
  auto msg = error_of(http.post("/v2/repository/index", "{\"ready\":", json_content), 400);
  CHECK(msg.find("not valid JSON") != std::string::npos);
  CHECK(http.get("/v2/health/live").status == 200);
}

TEST_CASE("nested data: any nesting, up to Triton's limit of 100 (test_json_recursion_depth_limit)") {
  auto http = server().client();
  auto ints = [&](const std::string& data) {
    auto r = http.post("/v2/models/simple/infer",
                       infer_body({input_json("INPUT0", "INT32", {1, 16}, data),
                                   input_json("INPUT1", "INT32", {1, 16}, json_list(iota32(0, 16)))},
                                  ",\"outputs\":[{\"name\":\"OUTPUT1\"}]"),
                       json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    return json_ints(json_document::parse(r.body).at("/outputs/0/data"));
  };
  auto flat = json_list(iota32(10, 16));
  const std::vector<int64_t> tens(16, 10);
  CHECK(ints(flat) == tens);
  CHECK(ints("[" + flat + "]") == tens);          // as the shape [1,16] nests
  CHECK(ints(nested(50, flat)) == tens);         // deeper than the shape
  CHECK(ints("[[10,11,12,13],[14,15,16,17],[18,19,20,21],[22,23,24,25]]") == tens);

  auto bytes = [&](size_t depth) {
    return http.post("/v2/models/identity_bytes/infer",
                     infer_body({input_json("INPUT0", "BYTES", {1, 1}, nested(depth, "\"hello\""))}),
                     json_content);
  };
  auto r = bytes(50);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json_strings(json_document::parse(r.body).at("/outputs/0/data"))
        == std::vector<std::string>{"hello"});
  for (size_t depth : {size_t{100}, size_t{120}}) {
    auto msg = error_of(bytes(depth), 400);
    CHECK_MESSAGE(starts_with(msg, "JSON nesting depth exceeds maximum allowed limit (100)"), msg);
    msg = error_of(http.post("/v2/models/identity_fp32/infer",
                             infer_body({input_json("INPUT0", "FP32", {1, 16},
                                                    nested(depth, json_list(iota32(0, 16))))}),
                             json_content),
                   400);
    CHECK_MESSAGE(starts_with(msg, "JSON nesting depth exceeds maximum allowed limit (100)"), msg);
  }
}

TEST_CASE("error texts begin with the phrases Triton's tests match on") {
  auto http = server().client();
  auto post = [&](const std::string& body) {
    return http.post("/v2/models/simple/infer", body, json_content);
  };
  auto ints = [](size_t n) { return json_list(iota32(0, n)); };
  struct expectation {
    std::string body;
    std::string phrase;
  };
  const std::vector<expectation> cases{
    // qa/L0_http/http_test.py test_duplicate_output_names
    {simple_body(",\"outputs\":[{\"name\":\"OUTPUT0\"},{\"name\":\"OUTPUT0\"}]"),
     "output 'OUTPUT0' already exists in request"},
    // test_buffer_size_overflow, both payloads
    {infer_body({input_json("INPUT0", "INT32", {16, (int64_t{1} << 60) + 2}, "[1]"),
                 input_json("INPUT1", "INT32", {1, 16}, ints(16))}),
     "invalid shape for input 'INPUT0': shape [16,1152921504606846978] causes total element "
     "count to exceed maximum size of 9223372036854775807"},
    {infer_body({input_json("INPUT0", "INT32", {4, (int64_t{1} << 60) + 2}, "[1]"),
                 input_json("INPUT1", "INT32", {1, 16}, ints(16))}),
     "byte size overflow for input 'INPUT0'"},
    // core's request checks
    {infer_body({input_json("INPUT0", "INT32", {1, 8}, ints(8)),
                 input_json("INPUT1", "INT32", {1, 16}, ints(16))}),
     "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]."},
    {infer_body({input_json("INPUT0", "INT32", {1, 16}, ints(16))}),
     "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
     "missing required input(s) ['INPUT1']. Please provide all required input(s)."},
    {infer_body({input_json("INPUT0", "INT32", {1, 16}, ints(16)),
                 input_json("INPUT0", "INT32", {1, 16}, ints(16))}),
     "input 'INPUT0' already exists in request"},
    {infer_body({input_json("INPUT0", "INT32", {1, 16}, ints(16)),
                 input_json("INPUT1", "INT32", {1, 16}, ints(16)),
                 input_json("INPUT7", "INT32", {1, 16}, ints(16))}),
     "unexpected inference input 'INPUT7' for model 'simple'"},
    {simple_body(",\"outputs\":[{\"name\":\"OUTPUT9\"}]"),
     "unexpected inference output 'OUTPUT9' for model 'simple'"},
    {infer_body({input_json("INPUT0", "FP32", {1, 16}, ints(16)),
                 input_json("INPUT1", "INT32", {1, 16}, ints(16))}),
     "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"},
    {infer_body({input_json("INPUT0", "INT32", {9, 16}, ints(144)),
                 input_json("INPUT1", "INT32", {9, 16}, ints(144))}),
     "inference request batch-size must be <= 8 for 'simple'"},
    {infer_body({input_json("INPUT0", "INT32", {1, 16}, ints(16)),
                 input_json("INPUT1", "INT32", {2, 16}, ints(32))}),
     "input 'INPUT1' batch size does not match other inputs for 'simple'"},
    {infer_body({input_json("INPUT0", "INT32", {1, 16}, ints(15)),
                 input_json("INPUT1", "INT32", {1, 16}, ints(16))}),
     "Unable to parse 'data': Shape does not match true shape of 'data' field"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.phrase);
    auto msg = error_of(post(c.body), 400);
    CHECK_MESSAGE(starts_with(msg, c.phrase), msg);
  }
  auto msg = error_of(http.post("/v2/models/identity_bytes/infer",
                                infer_body({input_json("INPUT0", "BYTES", {2, 1}, "[\"a\"]")}),
                                json_content),
                      400);
  CHECK(msg.find("has 1 data elements but its shape [2,1] needs 2") != std::string::npos);

  // Binary data that does not add up (Triton's EVBufferToInput wording).
  auto fp32 = to_bytes(std::vector<float>(16, 1.f));
  auto header = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, 64)});
  msg = error_of(http.post("/v2/models/identity_fp32/infer", header + fp32.substr(0, 32),
                           {{"Inference-Header-Content-Length", std::to_string(header.size())}}),
                 400);
  CHECK_MESSAGE(starts_with(msg, "unexpected size for input 'INPUT0', expecting 32 additional "
                                 "bytes for model 'identity_fp32'"),
                msg);
  msg = error_of(http.post("/v2/models/identity_fp32/infer", header + fp32 + "abcd",
                           {{"Inference-Header-Content-Length", std::to_string(header.size())}}),
                 400);
  CHECK_MESSAGE(starts_with(msg, "unexpected additional input data for model 'identity_fp32'"),
                msg);

  // HTTP-level refusals: Triton's status and reason phrase first.
  msg = error_of(http.get("/v2/models/simple/infer"), 405);
  CHECK_MESSAGE(starts_with(msg, "Method Not Allowed"), msg);
  msg = error_of(http.post("/v2/health/live", ""), 405);
  CHECK_MESSAGE(starts_with(msg, "Method Not Allowed"), msg);
  msg = error_of(http.get("/v2/frobnicate"), 404);
  CHECK_MESSAGE(starts_with(msg, "Not Found"), msg);
  msg = error_of(http.get("/v2/models/simple/versions/abc"), 404);
  CHECK_MESSAGE(starts_with(msg, "Not Found"), msg);
  msg = error_of(http.post("/v2/models/simple/infer", simple_body(),
                           {{"Content-Type", "application/json"}, {"Content-Encoding", "br"}}),
                 501);
  CHECK_MESSAGE(starts_with(msg, "Unsupported compression type"), msg);
  CHECK(http.get("/v2/health/live").status == 200);
}
