#include "kserve.hpp"

#include <cstring>

#include <doctest/doctest.h>

using namespace caf_serving::perf;

namespace {

const char* identity_meta = R"({"name":"identity_fp32","versions":["1"],
  "platform":"onnxruntime_onnx",
  "inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,16]}],
  "outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,16]}]})";

model_metadata identity() {
  auto m = parse_model_metadata(identity_meta);
  REQUIRE(m.error.empty());
  return m.value;
}

} // namespace

TEST_CASE("metadata lists inputs and outputs with shapes") {
  auto m = identity();
  CHECK(m.name == "identity_fp32");
  REQUIRE(m.inputs.size() == 1);
  CHECK(m.inputs[0].datatype == "FP32");
  CHECK(m.inputs[0].shape == std::vector<int64_t>{-1, 16});
  REQUIRE(m.outputs.size() == 1);
  CHECK_FALSE(parse_model_metadata("{\"name\":\"x\"}").error.empty());
  CHECK_FALSE(parse_model_metadata("not json").error.empty());
}

TEST_CASE("-b fills the batch dimension; --shape may omit it or give all") {
  auto m = identity();
  auto a = resolve_shapes(m, {4, {}});
  REQUIRE(a.error.empty());
  CHECK(a.inputs[0].shape == std::vector<int64_t>{4, 16});
  CHECK(a.inputs[0].element_count == 64);
  auto b = resolve_shapes(m, {2, {{"INPUT0", {16}}}});
  REQUIRE(b.error.empty());
  CHECK(b.inputs[0].shape == std::vector<int64_t>{2, 16});
  auto c = resolve_shapes(m, {1, {{"INPUT0", {3, 16}}}});
  REQUIRE(c.error.empty());
  CHECK(c.inputs[0].shape == std::vector<int64_t>{3, 16});
}

TEST_CASE("shapes that contradict the model are refused with the reason") {
  auto m = identity();
  auto bad = resolve_shapes(m, {1, {{"INPUT0", {1, 7}}}});
  CHECK(bad.error.find("[1,7]") != std::string::npos);
  CHECK(bad.error.find("[-1,16]") != std::string::npos);
  CHECK(resolve_shapes(m, {1, {{"NOPE", {16}}}}).error.find("INPUT0")
        != std::string::npos);
  model_metadata var = m;
  var.inputs[0].shape = {-1, -1};
  auto need = resolve_shapes(var, {1, {}});
  CHECK(need.error.find("--shape INPUT0") != std::string::npos);
}

TEST_CASE("zero and random data have the right size; random is seeded") {
  auto shapes = resolve_shapes(identity(), {2, {}});
  auto z = make_input_data(shapes.inputs, {input_data_kind::zero, {}, 1});
  REQUIRE(z.sets.size() == 1);
  CHECK(z.sets[0][0].bytes == std::string(2 * 16 * 4, '\0'));
  auto r1 = make_input_data(shapes.inputs, {input_data_kind::random, {}, 5});
  auto r2 = make_input_data(shapes.inputs, {input_data_kind::random, {}, 5});
  CHECK(r1.sets[0][0].bytes.size() == 128);
  CHECK(r1.sets[0][0].bytes == r2.sets[0][0].bytes);
  CHECK(r1.sets[0][0].bytes != z.sets[0][0].bytes);
}

TEST_CASE("file data: plain arrays, content objects, and batch repetition") {
  model_metadata m;
  m.name = "simple";
  m.inputs = {{"A", "INT32", {-1, 2}}};
  auto shapes = resolve_shapes(m, {2, {}});
  auto d = make_input_data(
    shapes.inputs,
    {input_data_kind::file,
     R"({"data":[{"A":[1,2]},{"A":{"content":[[3,4],[5,6]],"shape":[2,2]}}]})",
     1});
  REQUIRE_MESSAGE(d.error.empty(), d.error);
  REQUIRE(d.sets.size() == 2);
  // The first entry gives one sample; it is repeated for the batch of 2.
  int32_t v[4];
  REQUIRE(d.sets[0][0].bytes.size() == 16);
  std::memcpy(v, d.sets[0][0].bytes.data(), 16);
  CHECK((v[0] == 1 && v[1] == 2 && v[2] == 1 && v[3] == 2));
  std::memcpy(v, d.sets[1][0].bytes.data(), 16);
  CHECK((v[0] == 3 && v[3] == 6));
  auto wrong = make_input_data(shapes.inputs, {input_data_kind::file,
                                               R"({"data":[{"A":[1,2,3]}]})",
                                               1});
  CHECK(wrong.error.find("3 values") != std::string::npos);
  CHECK_FALSE(make_input_data(shapes.inputs,
                              {input_data_kind::file, R"({"x":1})", 1})
                .error.empty());
}

TEST_CASE("binary bodies carry the JSON header length and the raw tensor") {
  tensor_value t{"INPUT0", "FP32", {1, 2}, std::string(8, '\0')};
  float ones[2] = {1.0f, 2.5f};
  std::memcpy(t.bytes.data(), ones, 8);
  auto b = build_infer_body({t}, {tensor_format::binary, tensor_format::binary,
                                  {"OUTPUT0"}});
  auto header = std::string(
    R"({"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32",)"
    R"("parameters":{"binary_data_size":8}}],"outputs":[{"name":"OUTPUT0",)"
    R"("parameters":{"binary_data":true}}]})");
  CHECK(b.body == header + t.bytes);
  CHECK(b.headers.find("Inference-Header-Content-Length: "
                       + std::to_string(header.size()))
        != std::string::npos);
  auto j = build_infer_body({t}, {tensor_format::json, tensor_format::json,
                                  {"OUTPUT0"}});
  CHECK(j.body == R"({"inputs":[{"name":"INPUT0","shape":[1,2],)"
                  R"("datatype":"FP32","data":[1,2.5]}]})");
  CHECK(j.headers.find("application/json") != std::string::npos);
}

TEST_CASE("--request-parameter values go into the request's parameters object") {
  auto timeout = parse_request_parameter("timeout:50000:int");
  REQUIRE(timeout.error.empty());
  auto tag = parse_request_parameter("tag:a:b \"c\":string");
  REQUIRE(tag.error.empty());
  auto flag = parse_request_parameter("sequence_start:true:bool");
  REQUIRE(flag.error.empty());
  tensor_value t{"INPUT0", "INT32", {1, 1}, std::string(4, '\0')};
  infer_body_config config{tensor_format::json, tensor_format::json, {}};
  config.parameters = {timeout.value, tag.value, flag.value};
  auto j = build_infer_body({t}, config);
  CHECK(j.body == R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"INT32",)"
                  R"("data":[0]}],"parameters":{"timeout":50000,"tag":"a:b \"c\"",)"
                  R"("sequence_start":true}})");
  CHECK(parse_request_parameter("timeout:soon:int").error.find("'soon' is not a whole number")
        != std::string::npos);
  CHECK(parse_request_parameter("timeout:5").error.find("NAME:VALUE:TYPE") != std::string::npos);
  CHECK(parse_request_parameter("x:1:float").error.find("int, string or bool")
        != std::string::npos);
  CHECK(parse_request_parameter("x:maybe:bool").error.find("not true or false")
        != std::string::npos);
}

TEST_CASE("stats parse Triton's fields and deltas give per-request means") {
  auto doc = [](int n, int64_t queue_ns) {
    return R"({"model_stats":[{"name":"m","version":"1","inference_count":)"
           + std::to_string(n) + R"(,"execution_count":)" + std::to_string(n)
           + R"(,"inference_stats":{"success":{"count":)" + std::to_string(n)
           + R"(,"ns":)" + std::to_string(n * 10000)
           + R"(},"queue":{"count":)" + std::to_string(n) + R"(,"ns":)"
           + std::to_string(queue_ns)
           + R"(},"compute_input":{"count":)" + std::to_string(n)
           + R"(,"ns":0},"compute_infer":{"count":)" + std::to_string(n)
           + R"(,"ns":)" + std::to_string(n * 6000)
           + R"(},"compute_output":{"count":0,"ns":0}}}]})";
  };
  auto a = parse_model_stats(doc(10, 10 * 1000), "m");
  auto b = parse_model_stats(doc(30, 10 * 1000 + 20 * 3000), "m");
  REQUIRE(a.error.empty());
  REQUIRE(b.error.empty());
  auto d = stats_delta(a.value, b.value);
  CHECK(d.valid);
  CHECK(d.request_count == 20);
  CHECK(d.request_us == doctest::Approx(10));
  CHECK(d.queue_us == doctest::Approx(3));
  CHECK(d.compute_infer_us == doctest::Approx(6));
  CHECK(d.overhead_us == doctest::Approx(1));
  CHECK_FALSE(parse_model_stats(doc(1, 1), "other").error.empty());
  CHECK_FALSE(stats_delta(b.value, a.value).valid);
}
