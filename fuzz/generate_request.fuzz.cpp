/// The generate codec's three request parsers (ingress/generate_codec.hpp):
/// Triton's generate extension (on vLLM's backend's inputs and on Triton's
/// mock_llm test model), OpenAI's completions and chat completions.
///
/// Input: one control byte, then the body.
///   control % 4 == 0: Triton generate, vLLM's inputs
///   control % 4 == 1: Triton generate, mock_llm's inputs (PROMPT, STREAM, input_ids)
///   control % 4 == 2: /v1/completions
///   control % 4 == 3: /v1/chat/completions
///
/// Beyond "no crash, no sanitizer report", it checks what the rest of the
/// server relies on: every failure is a 400 whose error bodies (Triton's and
/// OpenAI's) are valid JSON; every accepted request keeps the limits (prompt
/// bytes, stop strings, n = 1, min_tokens <= max_tokens), its chat messages'
/// raw JSON parses, and a response echoing its prompt is valid JSON.

#include "ingress/generate_codec.hpp"

#include <simdjson.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

generate_model_info vllm_model() {
  generate_model_info m;
  m.name = "vllm_model";
  m.inputs = {{"text_input", datatype::bytes, {1}, false},
              {"stream", datatype::bool_, {1}, true},
              {"sampling_parameters", datatype::bytes, {1}, true},
              {"exclude_input_in_output", datatype::bool_, {1}, true},
              {"return_finish_reason", datatype::bool_, {1}, true},
              {"return_num_output_tokens", datatype::bool_, {1}, true},
              {"max_tokens", datatype::int32, {-1}, true},
              {"temperature", datatype::fp32, {1}, true},
              {"random_seed", datatype::uint64, {1}, true},
              {"stop", datatype::bytes, {-1}, true},
              {"half", datatype::fp16, {1}, true}};
  return m;
}

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

[[noreturn]] void broken(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "invariant broken: %s %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

void check_json(const std::string& text, const char* what) {
  simdjson::dom::parser parser;
  if (parser.parse(text).error())
    broken(what, text);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  static const generate_model_info vllm = vllm_model();
  static const generate_model_info mock = mock_llm();
  generate_codec_limits limits;
  limits.max_prompt_bytes = 4096;
  limits.max_messages = 64;
  const uint8_t control = data[0];
  // An exact-size copy, so that reads past the body are caught.
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  result<generate_request> r = [&] {
    switch (control % 4) {
      case 0: return parse_triton_generate(body, vllm, limits);
      case 1: return parse_triton_generate(body, mock, limits);
      case 2: return parse_openai_completion(body, limits);
      default: return parse_openai_chat(body, limits);
    }
  }();

  std::string out;
  if (!r.ok()) {
    if (r.error().status != status_code::bad_request)
      broken("a refused request is not a 400:", r.error().message);
    if (r.error().message.empty())
      broken("a refused request has no message");
    append_triton_error(out, r.error().message);
    check_json(out, "Triton error body");
    out.clear();
    append_openai_error(out, openai_error_of(r.error()));
    check_json(out, "OpenAI error body");
    return 0;
  }

  const generate_request& req = *r;
  if (req.n != 1)
    broken("n is not 1");
  if (req.prompt.size() > limits.max_prompt_bytes)
    broken("prompt over the limit");
  if (req.prompt_token_ids.size() > limits.max_prompt_tokens)
    broken("prompt tokens over the limit");
  if (req.stop.stop.size() > limits.max_stop_strings)
    broken("too many stop strings");
  for (const auto& s : req.stop.stop)
    if (s.empty() || s.size() > limits.max_stop_string_bytes)
      broken("a stop string is empty or too long");
  if (req.stop.max_tokens && (*req.stop.max_tokens == 0 || req.stop.min_tokens > *req.stop.max_tokens))
    broken("max_tokens is 0 or below min_tokens");
  if (req.api == generate_api::openai_chat) {
    if (req.messages.empty() || req.messages.size() > limits.max_messages)
      broken("chat messages empty or over the limit");
    for (const auto& m : req.messages)
      check_json(m.json, "a chat message's raw JSON");
  } else if (req.prompt.empty() == req.prompt_token_ids.empty() && req.api != generate_api::triton_generate) {
    broken("a completion without exactly one prompt form");
  }
  if (req.sampling.top_logprobs > limits.max_top_logprobs)
    broken("top_logprobs over the limit");

  // Answer with the prompt as the text: still valid JSON.
  std::string_view text = req.api == generate_api::openai_chat ? std::string_view{req.messages[0].content}
                                                               : std::string_view{req.prompt};
  openai_result res{{req.request_id, 0, req.model, ""}, {text}, {1, 1}, {}};
  append_openai_chat_completion(out, res);
  check_json(out, "chat completion");
  out.clear();
  append_openai_completion(out, res);
  check_json(out, "completion");
  out.clear();
  append_triton_generate_response(out, {req.request_id, req.model, "1", text});
  check_json(out, "Triton response");
  return 0;
}
