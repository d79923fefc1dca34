#include "ingress/grpc/convert.hpp"

#include <doctest/doctest.h>

#include <cstring>

using namespace caf_serving;
using namespace caf_serving::ingress;
namespace pb = inference;

namespace {

pb::ModelInferRequest::InferInputTensor* add_input(pb::ModelInferRequest& r, const char* name,
                                                   const char* dtype,
                                                   std::vector<int64_t> shape) {
  auto* t = r.add_inputs();
  t->set_name(name);
  t->set_datatype(dtype);
  for (auto d : shape)
    t->add_shape(d);
  return t;
}

template <class T>
std::vector<T> values_of(std::string_view bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("typed contents become the raw little-endian bytes of the datatype") {
  pb::ModelInferRequest r;
  auto* a = add_input(r, "A", "FP32", {1, 3});
  for (float v : {1.5f, -2.0f, 3.25f})
    a->mutable_contents()->add_fp32_contents(v);
  auto* b = add_input(r, "B", "INT16", {2});
  b->mutable_contents()->add_int_contents(-7);
  b->mutable_contents()->add_int_contents(300);
  auto* c = add_input(r, "C", "BYTES", {2});
  c->mutable_contents()->add_bytes_contents("hi");
  c->mutable_contents()->add_bytes_contents("");
  auto* d = add_input(r, "D", "BOOL", {2});
  d->mutable_contents()->add_bool_contents(true);
  d->mutable_contents()->add_bool_contents(false);
  auto parsed = grpc_api::to_infer_request(r, {});
  REQUIRE(parsed.ok());
  REQUIRE(parsed->inputs.size() == 4);
  CHECK(parsed->inputs[0].dtype == datatype::fp32);
  CHECK(values_of<float>(parsed->inputs[0].data) == std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(values_of<int16_t>(parsed->inputs[1].data) == std::vector<int16_t>{-7, 300});
  CHECK(parsed->inputs[2].data == std::string_view("\x02\0\0\0hi\0\0\0\0", 10));
  CHECK(parsed->inputs[3].data == std::string_view("\x01\x00", 2));
  CHECK(parsed->inputs[0].owns_data());
}

TEST_CASE("raw contents are viewed in place, one entry per input") {
  pb::ModelInferRequest r;
  add_input(r, "A", "FP16", {2});
  add_input(r, "B", "INT64", {1});
  r.add_raw_input_contents(std::string("\x00\x3c\x00\x40", 4));
  r.add_raw_input_contents(std::string(8, '\x01'));
  auto parsed = grpc_api::to_infer_request(r, {});
  REQUIRE(parsed.ok());
  CHECK(parsed->inputs[0].data.data() == r.raw_input_contents(0).data());
  CHECK(parsed->inputs[1].data.size() == 8);

  r.add_raw_input_contents("extra");
  auto wrong = grpc_api::to_infer_request(r, {});
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().status == status_code::bad_request);
  CHECK(contains(wrong.error().message, "2 inputs but 3 raw_input_contents"));
}

TEST_CASE("typed contents that do not fit the input are refused with what to send instead") {
  SUBCASE("the wrong field for the datatype") {
    pb::ModelInferRequest r;
    add_input(r, "X", "FP32", {2})->mutable_contents()->add_int_contents(1);
    auto p = grpc_api::to_infer_request(r, {});
    REQUIRE_FALSE(p.ok());
    CHECK(contains(p.error().message, "input 'X' has datatype FP32 but its data is in "
                                      "int_contents; FP32 data goes in fp32_contents"));
  }
  SUBCASE("a count that does not match the shape") {
    pb::ModelInferRequest r;
    auto* t = add_input(r, "X", "INT32", {1, 4});
    for (int i = 0; i < 3; ++i)
      t->mutable_contents()->add_int_contents(i);
    auto p = grpc_api::to_infer_request(r, {});
    REQUIRE_FALSE(p.ok());
    CHECK(contains(p.error().message, "3 values in int_contents but shape [1,4] holds 4"));
  }
  SUBCASE("FP16 has no typed field") {
    pb::ModelInferRequest r;
    add_input(r, "X", "FP16", {1})->mutable_contents()->add_fp32_contents(1);
    auto p = grpc_api::to_infer_request(r, {});
    REQUIRE_FALSE(p.ok());
    CHECK(contains(p.error().message, "send it in raw_input_contents"));
  }
  SUBCASE("raw and typed together") {
    pb::ModelInferRequest r;
    add_input(r, "X", "FP32", {1})->mutable_contents()->add_fp32_contents(1);
    r.add_raw_input_contents(std::string(4, '\0'));
    auto p = grpc_api::to_infer_request(r, {});
    REQUIRE_FALSE(p.ok());
    CHECK(contains(p.error().message, "both typed contents"));
  }
  SUBCASE("no data at all") {
    pb::ModelInferRequest r;
    add_input(r, "X", "FP32", {2});
    auto p = grpc_api::to_infer_request(r, {});
    REQUIRE_FALSE(p.ok());
    CHECK(contains(p.error().message, "input 'X' has no data"));
  }
  SUBCASE("an unknown datatype") {
    pb::ModelInferRequest r;
    add_input(r, "X", "FLOAT", {1});
    auto p = grpc_api::to_infer_request(r, {});
    REQUIRE_FALSE(p.ok());
    CHECK(contains(p.error().message, "'FLOAT', which is not a KServe datatype"));
  }
}

TEST_CASE("request parameters: priority, timeout, classification and shared memory") {
  pb::ModelInferRequest r;
  r.set_id("req-7");
  (*r.mutable_parameters())["priority"].set_int64_param(2);
  (*r.mutable_parameters())["timeout"].set_uint64_param(5000);
  (*r.mutable_parameters())["custom"].set_bool_param(true);
  auto* in = add_input(r, "X", "FP32", {4});
  (*in->mutable_parameters())["shared_memory_region"].set_string_param("in0");
  (*in->mutable_parameters())["shared_memory_byte_size"].set_int64_param(16);
  (*in->mutable_parameters())["shared_memory_offset"].set_int64_param(32);
  auto* out = r.add_outputs();
  out->set_name("Y");
  (*out->mutable_parameters())["classification"].set_int64_param(3);
  auto p = grpc_api::to_infer_request(r, {});
  REQUIRE(p.ok());
  CHECK(p->id == "req-7");
  CHECK(p->priority == 2);
  CHECK(p->timeout_us == 5000);
  CHECK(p->parameters.at("custom") == "true");
  REQUIRE(p->inputs[0].shared_memory);
  CHECK(p->inputs[0].shared_memory->region == "in0");
  CHECK(p->inputs[0].shared_memory->offset == 32);
  CHECK(p->inputs[0].shared_memory->byte_size == 16);
  REQUIRE(p->outputs.size() == 1);
  CHECK(p->outputs[0].classification == 3);

  (*r.mutable_parameters())["priority"].set_int64_param(-1);
  auto negative = grpc_api::to_infer_request(r, {});
  REQUIRE_FALSE(negative.ok());
  CHECK(contains(negative.error().message, "'priority' must be a non-negative integer"));
}

TEST_CASE("answers carry raw contents aligned with the outputs") {
  response_view v;
  v.model_name = "m";
  v.model_version = "3";
  v.id = "x";
  output_view a;
  a.name = "A";
  a.dtype = datatype::int32;
  a.shape = {1, 2};
  a.data = std::string_view("\x01\0\0\0\x02\0\0\0", 8);
  output_view b = a;
  b.name = "B";
  v.outputs = {a, b};
  requested_output in_shm;
  in_shm.name = "A";
  in_shm.shared_memory = shared_memory_ref{"out0", 0, 8};
  auto reply = grpc_api::to_infer_response(v, {in_shm});
  CHECK(reply.model_name() == "m");
  CHECK(reply.model_version() == "3");
  CHECK(reply.id() == "x");
  REQUIRE(reply.outputs_size() == 2);
  CHECK(reply.outputs(1).datatype() == "INT32");
  CHECK(reply.outputs(1).shape_size() == 2);
  REQUIRE(reply.raw_output_contents_size() == 2);
  CHECK(reply.raw_output_contents(0).empty());
  CHECK(reply.raw_output_contents(1) == std::string(b.data));
  CHECK(reply.outputs(0).parameters().at("shared_memory_region").string_param() == "out0");
}

TEST_CASE("errors map to Triton's gRPC status codes") {
  using grpc::StatusCode;
  CHECK(grpc_api::to_status(bad_request("x")).error_code() == StatusCode::INVALID_ARGUMENT);
  CHECK(grpc_api::to_status(not_found("x")).error_code() == StatusCode::NOT_FOUND);
  CHECK(grpc_api::to_status(unavailable("x")).error_code() == StatusCode::UNAVAILABLE);
  CHECK(grpc_api::to_status({status_code::too_many_requests, "x"}).error_code()
        == StatusCode::UNAVAILABLE);
  CHECK(grpc_api::to_status({status_code::payload_too_large, "x"}).error_code()
        == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(grpc_api::to_status({status_code::internal, "boom"}).error_message() == "boom");
}

TEST_CASE("versions and base64") {
  CHECK(*grpc_api::parse_version("", "m") == 0);
  CHECK(*grpc_api::parse_version("12", "m") == 12);
  CHECK_FALSE(grpc_api::parse_version("1a", "m").ok());
  CHECK_FALSE(grpc_api::parse_version("0", "m").ok());
  CHECK(grpc_api::base64_encode("") == "");
  CHECK(grpc_api::base64_encode("f") == "Zg==");
  CHECK(grpc_api::base64_encode("fo") == "Zm8=");
  CHECK(grpc_api::base64_encode("foobar") == "Zm9vYmFy");
}
