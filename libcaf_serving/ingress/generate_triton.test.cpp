// Triton's generate extension requests. The expected messages are Triton's
// own, as its qa/L0_http/generate_endpoint_test.py checks them against the
// mock_llm model of qa/python_models/generate_models; the vLLM cases follow
// vllm_backend's src/model.py (its inputs) and src/utils/request.py.

#include "ingress/generate_codec.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

/// qa/python_models/generate_models/mock_llm/config.pbtxt (max_batch_size 0).
generate_model_info mock_llm() {
  generate_model_info m;
  m.name = "mock_llm";
  m.inputs = {{"PROMPT", datatype::bytes, {1, 1}, false},
              {"STREAM", datatype::bool_, {1, 1}, false},
              {"input_ids", datatype::int32, {1, -1}, true}};
  m.prompt_input = "PROMPT";
  m.stream_input = "STREAM";
  return m;
}

/// vLLM's backend's inputs (auto_complete_config in src/model.py).
generate_model_info vllm_model() {
  generate_model_info m;
  m.name = "vllm_model";
  m.inputs = {{"text_input", datatype::bytes, {1}, false},
              {"stream", datatype::bool_, {1}, true},
              {"sampling_parameters", datatype::bytes, {1}, true},
              {"exclude_input_in_output", datatype::bool_, {1}, true},
              {"return_finish_reason", datatype::bool_, {1}, true},
              {"return_cumulative_logprob", datatype::bool_, {1}, true},
              {"return_logprobs", datatype::bool_, {1}, true},
              {"return_num_input_tokens", datatype::bool_, {1}, true},
              {"return_num_output_tokens", datatype::bool_, {1}, true}};
  return m;
}

/// TensorRT-LLM's ensemble takes the sampling fields as inputs of their own.
generate_model_info trtllm_model() {
  generate_model_info m;
  m.name = "ensemble";
  m.inputs = {{"text_input", datatype::bytes, {-1}, false},
              {"max_tokens", datatype::int32, {-1}, false},
              {"temperature", datatype::fp32, {1}, true},
              {"top_k", datatype::int32, {1}, true},
              {"random_seed", datatype::uint64, {1}, true},
              {"stop_words", datatype::bytes, {-1}, true},
              {"stream", datatype::bool_, {1}, true}};
  return m;
}

std::string error_of(const result<generate_request>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  return r.error().message;
}

void expect_failure(const generate_model_info& m, const std::string& body, const std::string& msg) {
  auto r = parse_triton_generate(body, m);
  INFO("body: " << body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  INFO("message: " << r.error().message);
  CHECK(r.error().message.find(msg) != std::string::npos);
}

} // namespace

TEST_CASE("triton generate: test_generate, test_generate_with_all_inputs, test_request_id") {
  auto r = parse_triton_generate(R"({"PROMPT": "hello world", "STREAM": false})", mock_llm());
  REQUIRE(r.ok());
  CHECK(r->api == generate_api::triton_generate);
  CHECK(r->model == "mock_llm");
  CHECK(r->prompt == "hello world");
  CHECK_FALSE(r->stream);
  CHECK(r->request_id.empty());

  r = parse_triton_generate(R"({"PROMPT": "hello world", "STREAM": false, "input_ids": [100, 200]})",
                            mock_llm());
  REQUIRE(r.ok());
  REQUIRE(r->triton.inputs.size() == 1);
  CHECK(r->triton.inputs[0].name == "input_ids");
  CHECK(r->triton.inputs[0].json == "[100,200]");

  r = parse_triton_generate(R"({"PROMPT": "hello world", "id": "42", "STREAM": false})", mock_llm());
  REQUIRE(r.ok());
  CHECK(r->request_id == "42");
  // "id" is the request's id, not a parameter.
  CHECK(r->triton.parameters.empty());
}

TEST_CASE("triton generate: a prompt sent as a one-element array, parameters anywhere") {
  auto r = parse_triton_generate(
    R"({"PROMPT": ["hello world"], "STREAM": true, "REPETITION": 3, "DELAY": 2})", mock_llm());
  REQUIRE(r.ok());
  CHECK(r->prompt == "hello world");
  CHECK(r->stream);
  REQUIRE(r->triton.parameters.size() == 2);
  CHECK(r->triton.parameters[0].name == "REPETITION");
  CHECK(r->triton.parameters[0].json == "3");
  CHECK(r->triton.parameters[1].name == "DELAY");

  // test_parameters: the reserved "parameters" object maps the same way.
  r = parse_triton_generate(R"({"PROMPT": ["hello"], "STREAM": true, "parameters": {"REPETITION": 3}})",
                            mock_llm());
  REQUIRE(r.ok());
  REQUIRE(r->triton.parameters.size() == 1);
  CHECK(r->triton.parameters[0].name == "REPETITION");

  // An input may come inside "parameters" too.
  r = parse_triton_generate(R"({"PROMPT": "x", "parameters": {"STREAM": true}})", mock_llm());
  REQUIRE(r.ok());
  CHECK(r->stream);
}

TEST_CASE("triton generate: test_missing_inputs") {
  for (const char* body : {"{}", R"({"abc": 123})", ""})
    expect_failure(mock_llm(), body, "expected number of inputs between 2 and 3 but got 0");
  for (const char* body :
       {R"({"PROMPT": "hello"})", R"({"STREAM": false})", R"({"STREAM": false, "other": "param"})"})
    expect_failure(mock_llm(), body, "expected number of inputs between 2 and 3 but got 1");
  // The whole message, as Triton's core words it.
  expect_failure(mock_llm(), R"({"PROMPT": "hello"})",
                 "expected number of inputs between 2 and 3 but got 1 inputs for model "
                 "'mock_llm'. Got input(s) ['PROMPT'], but missing required input(s) "
                 "['STREAM']. Please provide all required input(s).");
  // No optional inputs: "expected N inputs".
  auto all_required = mock_llm();
  all_required.inputs.pop_back();
  expect_failure(all_required, R"({"PROMPT": "hello"})", "expected 2 inputs but got 1 inputs");
}

TEST_CASE("triton generate: test_invalid_input_types, parsed in order") {
  const std::string invalid_bool = "attempt to access JSON non-boolean as boolean";
  const std::string invalid_string = "attempt to access JSON non-string as string";
  expect_failure(mock_llm(), R"({"PROMPT": 123, "STREAM": false})", invalid_string);
  expect_failure(mock_llm(), R"({"PROMPT": "hello", "STREAM": "false"})", invalid_bool);
  expect_failure(mock_llm(), R"({"PROMPT": true, "STREAM": 123})", invalid_string);
  expect_failure(mock_llm(), R"({"STREAM": 123, "PROMPT": true})", invalid_bool);
  // test_complex_schema: an object for a model input.
  expect_failure(mock_llm(), R"({"PROMPT": {"USER": "hello", "BOT": "world"}, "STREAM": true})",
                 invalid_string);
  expect_failure(mock_llm(), R"({"PROMPT": "x", "STREAM": true, "input_ids": [1.5]})",
                 "attempt to access JSON non-signed-integer as signed-integer");
  expect_failure(mock_llm(), R"({"PROMPT": "x", "STREAM": true, "input_ids": [3000000000]})",
                 "INT32 cannot hold");
}

TEST_CASE("triton generate: test_duplicate_inputs") {
  const std::string dupe_prompt = "input 'PROMPT' already exists in request";
  const std::string dupe_stream = "input 'STREAM' already exists in request";
  expect_failure(mock_llm(), R"({"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate"})",
                 dupe_prompt);
  expect_failure(mock_llm(), R"({"PROMPT": "hello", "STREAM": false, "STREAM": false})",
                 dupe_stream);
  expect_failure(mock_llm(),
                 R"({"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate", "STREAM": true})",
                 dupe_prompt);
  expect_failure(mock_llm(),
                 R"({"PROMPT": "hello", "STREAM": false, "STREAM": true, "PROMPT": "duplicate"})",
                 dupe_stream);
}

TEST_CASE("triton generate: test_complex_schema and test_parameters") {
  expect_failure(mock_llm(),
                 R"({"PROMPT": "hello world", "STREAM": true, "PARAMS": {"PARAM_0": 0}})",
                 "parameter 'PARAMS' has invalid type");
  expect_failure(mock_llm(), R"({"PROMPT": ["x"], "STREAM": true, "parameters": 1})",
                 "Expected JSON object for keyword: 'parameters'");
  expect_failure(mock_llm(),
                 R"({"PROMPT": ["x"], "STREAM": true, "parameters": {"nested": {"twice": 1}}})",
                 "Converting keyword: 'parameters': parameter 'nested' has invalid type.");
  expect_failure(mock_llm(), R"({"PROMPT": "x", "STREAM": true, "p": null})",
                 "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.");
}

TEST_CASE("triton generate: test_json_dtype_size_expansion_exceeds_limit_error") {
  generate_codec_limits limits;
  limits.max_triton_input_bytes = 1000;
  limits.max_prompt_bytes = 1 << 20;
  std::string big(2000, 'a');
  auto r = parse_triton_generate(R"({"PROMPT": ")" + big + R"(", "STREAM": false})", mock_llm(),
                                 limits);
  std::string msg = error_of(r);
  CHECK(msg.find(" bytes exceeds the maximum allowed input size of ") != std::string::npos);
  CHECK(msg.find("input 'PROMPT' of size 2004 bytes") != std::string::npos);
}

TEST_CASE("triton generate: the extension document's example and its parameters") {
  // docs/protocol/extension_generate.md, "Example Request", on vLLM's inputs.
  auto r = parse_triton_generate(
    R"({"id" : "42", "text_input" : "client input", "parameters" : {"stream": false, "temperature": 0}})",
    vllm_model());
  REQUIRE(r.ok());
  CHECK(r->request_id == "42");
  CHECK(r->prompt == "client input");
  CHECK_FALSE(r->stream);
  CHECK(r->sampling.temperature == 0.0f);
  // vLLM's backend: without exclude_input_in_output the prompt leads the
  // text, except when streaming.
  CHECK(r->echo);
  r = parse_triton_generate(R"({"text_input": "a", "stream": true})", vllm_model());
  REQUIRE(r.ok());
  CHECK_FALSE(r->echo);
  r = parse_triton_generate(R"({"text_input": "a", "exclude_input_in_output": true})", vllm_model());
  REQUIRE(r.ok());
  CHECK_FALSE(r->echo);
  expect_failure(vllm_model(),
                 R"({"text_input": "a", "stream": true, "exclude_input_in_output": false})",
                 "When streaming, `exclude_input_in_output` = False is not allowed.");
}

TEST_CASE("triton generate: vLLM's sampling_parameters input, numbers as strings") {
  // vllm_backend's samples/client.py sends the values as strings.
  auto r = parse_triton_generate(
    R"({"text_input": "What is Triton?", "stream": false, "sampling_parameters": "{\"temperature\": \"0.1\", \"top_p\": \"0.95\", \"max_tokens\": \"100\", \"stop\": [\"\\n\\n\", \"END\"], \"stop_token_ids\": [2], \"ignore_eos\": \"true\", \"seed\": 7, \"top_k\": -1}", "return_finish_reason": true, "return_num_output_tokens": true})",
    vllm_model());
  REQUIRE(r.ok());
  CHECK(r->sampling.temperature == 0.1f);
  CHECK(r->sampling.top_p == 0.95f);
  CHECK(r->sampling.top_k == 0);
  CHECK(r->sampling.seed == uint64_t{7});
  CHECK(r->stop.max_tokens == uint32_t{100});
  CHECK(r->stop.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r->stop.stop_token_ids == std::vector<int32_t>{2});
  CHECK(r->stop.ignore_eos);
  CHECK(r->triton.return_finish_reason);
  CHECK(r->triton.return_num_output_tokens);
  CHECK_FALSE(r->triton.return_num_input_tokens);

  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "{\"temperature\": \"NaN\"}"})",
                 "sampling_parameters: 'temperature' must be a finite number");
  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "{\"max_tokens\": 0}"})",
                 "sampling_parameters: 'max_tokens' must be an integer between 1 and");
  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "{\"bogus\": 1}"})",
                 "sampling_parameters: unknown field 'bogus'");
  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "{\"use_beam_search\": true}"})",
                 "'use_beam_search' is not supported");
  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "not json"})",
                 "input 'sampling_parameters' is not valid JSON");
  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "[1]"})",
                 "must hold a JSON object of sampling fields");
  expect_failure(vllm_model(), R"({"text_input": "a", "sampling_parameters": "{\"ignore_eos\": \"yes\"}"})",
                 "'ignore_eos' must be true or false");
  expect_failure(vllm_model(), R"({"text_input": "a", "return_logprobs": true})",
                 "'return_logprobs' is not supported");
}

TEST_CASE("triton generate: sampling fields as request parameters") {
  auto r = parse_triton_generate(
    R"({"text_input": "a", "max_tokens": 8, "parameters": {"top_k": 40, "min_p": "0.05", "repetition_penalty": 1.1, "stop": "###", "seed": -1, "custom": "kept"}})",
    vllm_model());
  REQUIRE(r.ok());
  CHECK(r->stop.max_tokens == uint32_t{8});
  CHECK(r->sampling.top_k == 40);
  CHECK(r->sampling.min_p == 0.05f);
  CHECK(r->sampling.repetition_penalty == 1.1f);
  CHECK(r->stop.stop == std::vector<std::string>{"###"});
  CHECK(r->sampling.seed == ~uint64_t{0});
  REQUIRE(r->triton.parameters.size() == 1);
  CHECK(r->triton.parameters[0].name == "custom");
  CHECK(r->triton.parameters[0].json == "\"kept\"");

  expect_failure(vllm_model(), R"({"text_input": "a", "max_tokens": 0})",
                 "parameter 'max_tokens' must be an integer between 1 and 4294967295, got 0");
  expect_failure(vllm_model(), R"({"text_input": "a", "max_tokens": -5})", "'max_tokens'");
  expect_failure(vllm_model(), R"({"text_input": "a", "parameters": {"temperature": 3}})",
                 "Converting keyword: 'parameters': parameter 'temperature' must be a number "
                 "between 0 and 2, got 3");
  expect_failure(vllm_model(), R"({"text_input": "a", "n": 2})", "'n' is 2");
  expect_failure(vllm_model(), R"({"text_input": "a", "min_tokens": 9, "max_tokens": 4})",
                 "'min_tokens' (9) is more than 'max_tokens' (4)");
}

TEST_CASE("triton generate: sampling fields as inputs of their own (TensorRT-LLM)") {
  auto r = parse_triton_generate(
    R"({"text_input": "a", "max_tokens": [20], "temperature": 0.5, "top_k": 3, "random_seed": 18446744073709551615, "stop_words": ["x"]})",
    trtllm_model());
  REQUIRE(r.ok());
  CHECK(r->stop.max_tokens == uint32_t{20});
  CHECK(r->sampling.temperature == 0.5f);
  CHECK(r->sampling.top_k == 3);
  CHECK(r->sampling.seed == ~uint64_t{0});
  // Not a field the codec knows: passed on, type-checked.
  REQUIRE(r->triton.inputs.size() == 1);
  CHECK(r->triton.inputs[0].name == "stop_words");
  expect_failure(trtllm_model(), R"({"text_input": "a", "max_tokens": 0})",
                 "input 'max_tokens': 'max_tokens' must be an integer between 1");
  expect_failure(trtllm_model(), R"({"text_input": "a", "max_tokens": [1, 2]})",
                 "input 'max_tokens' must hold one value, got 2 elements");
  expect_failure(trtllm_model(), R"({"text_input": "a", "max_tokens": 4, "temperature": [1, 2]})",
                 "The schema can not convert input 'temperature' to tensor with proper shape");
  expect_failure(trtllm_model(), R"({"text_input": "a", "max_tokens": "4"})",
                 "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer");
  expect_failure(trtllm_model(), R"({"text_input": "a", "max_tokens": 4, "temperature": "hot"})",
                 "Unable to parse 'data': attempt to access JSON non-number as double");
  expect_failure(trtllm_model(), R"({"text_input": ["a", "b"], "max_tokens": 4})",
                 "input 'text_input' must hold one prompt string, got 2 elements");
}

TEST_CASE("triton generate: bodies that are not a request") {
  expect_failure(vllm_model(), "[1, 2]", "the request body must be a JSON object");
  expect_failure(vllm_model(), R"({"text_input": "a")", "the request body is not valid JSON");
  expect_failure(vllm_model(), "{\"text_input\": \"\xff\xfe\"}", "not valid UTF-8");
  expect_failure(vllm_model(), R"({"text_input": "a", "temperature": 1e999})",
                 "holds a number JSON cannot carry");
  expect_failure(vllm_model(), R"({"id": 42, "text_input": "a"})",
                 "Unable to parse 'id': attempt to access JSON non-string as string");
  generate_codec_limits limits;
  limits.max_prompt_bytes = 4;
  CHECK(error_of(parse_triton_generate(R"({"text_input": "hello"})", vllm_model(), limits))
          .find("input 'text_input' has 5 bytes of prompt; at most 4") != std::string::npos);
  // The prompt input optional and left out.
  auto optional_prompt = vllm_model();
  optional_prompt.inputs[0].optional = true;
  CHECK(error_of(parse_triton_generate(R"({"stream": true})", optional_prompt))
          .find("the request has no prompt") != std::string::npos);
}

TEST_CASE("triton generate: a model without the prompt input is a server error") {
  auto m = vllm_model();
  m.prompt_input = "prompt";
  auto r = parse_triton_generate(R"({"text_input": "a"})", m);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::internal);
}

TEST_CASE("triton generate: generate_model_info_of shows the batch dimension") {
  model_config config;
  config.name = "batched";
  config.max_batch_size = 8;
  config.inputs = {{"text_input", datatype::bytes, {1}}, {"stream", datatype::bool_, {1}}};
  config.inputs[1].optional = true;
  auto info = generate_model_info_of(config);
  REQUIRE(info.inputs.size() == 2);
  CHECK(info.inputs[0].dims == std::vector<int64_t>{-1, 1});
  CHECK(info.inputs[1].optional);
  // Triton's padding: the one string fills [-1, 1] as [1, 1].
  auto r = parse_triton_generate(R"({"text_input": ["hi"]})", info);
  REQUIRE(r.ok());
  CHECK(r->prompt == "hi");
}
