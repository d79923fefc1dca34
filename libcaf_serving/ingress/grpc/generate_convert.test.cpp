#include "ingress/grpc/generate_convert.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

using namespace caf_serving;
using namespace caf_serving::ingress;
namespace pb = inference;

namespace {

/// The generative model's inputs as server/generative_loader.cpp declares
/// them (dims [1], max_batch_size 0).
generate_model_info model_info() {
  generate_model_info m;
  m.name = "gpt";
  auto in = [&](const char* name, datatype dt, bool optional) {
    generate_input_info i;
    i.name = name;
    i.dtype = dt;
    i.dims = {1};
    i.optional = optional;
    m.inputs.push_back(i);
  };
  in("text_input", datatype::bytes, false);
  in("stream", datatype::bool_, true);
  in("sampling_parameters", datatype::bytes, true);
  in("exclude_input_in_output", datatype::bool_, true);
  in("return_finish_reason", datatype::bool_, true);
  in("return_num_input_tokens", datatype::bool_, true);
  in("return_num_output_tokens", datatype::bool_, true);
  return m;
}

/// A BYTES element as tritonclient serializes it: 4-byte little-endian
/// length, then the bytes.
std::string bytes_element(const std::string& s) {
  std::string out(4, '\0');
  uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + s;
}

void add_raw(pb::ModelInferRequest& r, const char* name, const char* dtype, std::string raw,
             std::vector<int64_t> shape = {1}) {
  auto* t = r.add_inputs();
  t->set_name(name);
  t->set_datatype(dtype);
  for (auto d : shape)
    t->add_shape(d);
  r.add_raw_input_contents(std::move(raw));
}

std::string message_of(const result<grpc_api::stream_generate_request>& r) {
  return r ? std::string() : r.error().message;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("raw inputs and typed parameters, as tritonclient sends them, become the request") {
  // vLLM's example client: text_input, stream, sampling_parameters as JSON
  // with numbers as strings; the rest as request parameters.
  pb::ModelInferRequest r;
  r.set_model_name("gpt");
  r.set_id("req-7");
  add_raw(r, "text_input", "BYTES", bytes_element("Hello \"world\"\n"));
  add_raw(r, "stream", "BOOL", std::string(1, '\1'));
  add_raw(r, "sampling_parameters", "BYTES",
          bytes_element(R"({"temperature":"0.5","max_tokens":"7","top_k":3,"stop":["x","yz"]})"));
  add_raw(r, "exclude_input_in_output", "BOOL", std::string(1, '\1'));
  (*r.mutable_parameters())["top_p"].set_double_param(0.25);
  (*r.mutable_parameters())["seed"].set_int64_param(11);
  (*r.mutable_parameters())["ignore_eos"].set_bool_param(true);
  (*r.mutable_parameters())["triton_enable_empty_final_response"].set_bool_param(true);
  (*r.mutable_parameters())["priority"].set_uint64_param(2);
  auto read = grpc_api::to_generate_request(r, model_info(), {});
  REQUIRE_MESSAGE(read.ok(), message_of(read));
  const auto& q = read->request;
  CHECK(q.prompt == "Hello \"world\"\n");
  CHECK(q.request_id == "req-7");
  CHECK(q.stream);
  CHECK_FALSE(q.echo);
  CHECK(q.sampling.temperature == 0.5f);
  CHECK(q.sampling.top_k == 3);
  CHECK(q.sampling.top_p == 0.25f);
  CHECK(q.sampling.seed == std::optional<uint64_t>(11));
  CHECK(q.stop.max_tokens == std::optional<uint32_t>(7));
  CHECK(q.stop.ignore_eos);
  CHECK(q.stop.stop == std::vector<std::string>{"x", "yz"});
  CHECK(read->empty_final_response);
}

TEST_CASE("typed contents are read as raw ones; without stream the prompt is echoed") {
  pb::ModelInferRequest r;
  auto* t = r.add_inputs();
  t->set_name("text_input");
  t->set_datatype("BYTES");
  t->add_shape(1);
  t->mutable_contents()->add_bytes_contents("abc");
  auto* f = r.add_inputs();
  f->set_name("return_finish_reason");
  f->set_datatype("BOOL");
  f->add_shape(1);
  f->mutable_contents()->add_bool_contents(true);
  (*r.mutable_parameters())["max_tokens"].set_string_param("4");
  auto read = grpc_api::to_generate_request(r, model_info(), {});
  REQUIRE_MESSAGE(read.ok(), message_of(read));
  CHECK(read->request.prompt == "abc");
  CHECK_FALSE(read->request.stream);
  // vLLM's backend: the prompt leads the text unless streaming.
  CHECK(read->request.echo);
  CHECK(read->request.triton.return_finish_reason);
  CHECK(read->request.stop.max_tokens == std::optional<uint32_t>(4));
  CHECK_FALSE(read->empty_final_response);
}

TEST_CASE("bad generative requests are 400s naming what was wrong") {
  struct bad_case {
    const char* what;
    pb::ModelInferRequest request;
    const char* phrase;
  };
  std::vector<bad_case> cases;
  auto with_prompt = [] {
    pb::ModelInferRequest r;
    add_raw(r, "text_input", "BYTES", bytes_element("hi"));
    return r;
  };
  {
    pb::ModelInferRequest r;
    add_raw(r, "stream", "BOOL", std::string(1, '\0'));
    cases.push_back({"no prompt", r, "text_input"});
  }
  {
    pb::ModelInferRequest r;
    add_raw(r, "text_input", "BYTES", bytes_element("a") + bytes_element("b"));
    cases.push_back({"two elements in shape [1]", r, "shape"});
  }
  {
    pb::ModelInferRequest r;
    add_raw(r, "text_input", "BYTES", std::string("\x09\0\0\0abc", 7));
    cases.push_back({"a length past the data", r, "9 bytes"});
  }
  {
    pb::ModelInferRequest r;
    add_raw(r, "text_input", "BYTES", bytes_element("\xff\xfe"));
    cases.push_back({"not UTF-8", r, "UTF-8"});
  }
  {
    auto r = with_prompt();
    add_raw(r, "sampling_parameters", "BYTES", bytes_element(R"({"temprature":1})"));
    cases.push_back({"unknown sampling field", r, "temprature"});
  }
  {
    auto r = with_prompt();
    (*r.mutable_parameters())["max_tokens"].set_int64_param(0);
    cases.push_back({"max_tokens 0", r, "max_tokens"});
  }
  {
    auto r = with_prompt();
    (*r.mutable_parameters())["temperature"].set_double_param(std::nan(""));
    cases.push_back({"NaN", r, "temperature"});
  }
  {
    auto r = with_prompt();
    add_raw(r, "stream", "BOOL", std::string(1, '\1'));
    add_raw(r, "exclude_input_in_output", "BOOL", std::string(1, '\0'));
    cases.push_back({"echo while streaming", r, "exclude_input_in_output"});
  }
  {
    auto r = with_prompt();
    (*r.mutable_parameters())["triton_enable_empty_final_response"].set_string_param("yes");
    cases.push_back({"flag not a bool", r, "triton_enable_empty_final_response"});
  }
  for (const auto& c : cases) {
    CAPTURE(c.what);
    auto read = grpc_api::to_generate_request(c.request, model_info(), {});
    REQUIRE_FALSE(read.ok());
    CHECK(read.error().status == status_code::bad_request);
    CHECK_MESSAGE(contains(read.error().message, c.phrase), read.error().message);
  }
}

TEST_CASE("a step's response carries text_output as one BYTES element and the final flag") {
  grpc_api::generate_response step;
  step.meta = {"id-1", "gpt", "1"};
  step.text_output = std::string_view("tok\xc3\xa9");
  step.final = false;
  auto r = grpc_api::to_generate_response(step);
  CHECK(r.error_message().empty());
  const auto& infer = r.infer_response();
  CHECK(infer.id() == "id-1");
  CHECK(infer.model_name() == "gpt");
  CHECK(infer.model_version() == "1");
  REQUIRE(infer.outputs_size() == 1);
  CHECK(infer.outputs(0).name() == "text_output");
  CHECK(infer.outputs(0).datatype() == "BYTES");
  REQUIRE(infer.outputs(0).shape_size() == 1);
  CHECK(infer.outputs(0).shape(0) == 1);
  REQUIRE(infer.raw_output_contents_size() == 1);
  CHECK(infer.raw_output_contents(0) == std::string("\x05\0\0\0tok\xc3\xa9", 9));
  CHECK_FALSE(infer.parameters().at("triton_final_response").bool_param());

  // The last one, with vLLM's optional outputs.
  step.final = true;
  step.finish_reason = generation_finish::length;
  step.num_input_tokens = 3;
  step.num_output_tokens = 258;
  auto last = grpc_api::to_generate_response(step).infer_response();
  CHECK(last.parameters().at("triton_final_response").bool_param());
  REQUIRE(last.outputs_size() == 4);
  CHECK(last.outputs(1).name() == "finish_reason");
  CHECK(last.raw_output_contents(1) == std::string("\x06\0\0\0length", 10));
  CHECK(last.outputs(3).name() == "num_output_tokens");
  CHECK(last.outputs(3).datatype() == "UINT32");
  CHECK(last.raw_output_contents(3) == std::string("\x02\x01\0\0", 4));

  // Triton's empty final response: no outputs at all.
  grpc_api::generate_response empty;
  empty.meta = step.meta;
  empty.final = true;
  auto e = grpc_api::to_generate_response(empty).infer_response();
  CHECK(e.outputs_size() == 0);
  CHECK(e.raw_output_contents_size() == 0);
  CHECK(e.parameters().at("triton_final_response").bool_param());
}

TEST_CASE("an error response names the request and ends it") {
  auto r = grpc_api::to_generate_error({"id-2", "gpt", "1"}, "max_tokens must be at least 1");
  CHECK(r.error_message() == "max_tokens must be at least 1");
  CHECK(r.infer_response().id() == "id-2");
  CHECK(r.infer_response().outputs_size() == 0);
  CHECK(r.infer_response().parameters().at("triton_final_response").bool_param());
}
