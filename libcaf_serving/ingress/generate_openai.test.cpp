// OpenAI's /v1/completions and /v1/chat/completions requests. The request
// bodies follow the OpenAI API reference (and vLLM's documented extra
// fields); the expected values are the ones those bodies state.

#include "ingress/generate_codec.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

std::string completion_error(const std::string& body, const generate_codec_limits& limits = {}) {
  auto r = parse_openai_completion(body, limits);
  INFO("body: " << body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  return r.error().message;
}

std::string chat_error(const std::string& body, const generate_codec_limits& limits = {}) {
  auto r = parse_openai_chat(body, limits);
  INFO("body: " << body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  return r.error().message;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

#define CHECK_HAS(text, part)                                                                      \
  do {                                                                                             \
    std::string text_ = (text);                                                                    \
    INFO("message: " << text_);                                                                    \
    CHECK(contains(text_, part));                                                                  \
  } while (false)

} // namespace

TEST_CASE("openai completion: the reference's minimal request and its defaults") {
  auto r = parse_openai_completion(R"({"model": "gpt-3.5-turbo-instruct", "prompt": "Say this is a test"})");
  REQUIRE(r.ok());
  CHECK(r->api == generate_api::openai_completion);
  CHECK(r->model == "gpt-3.5-turbo-instruct");
  CHECK(r->prompt == "Say this is a test");
  CHECK(r->prompt_token_ids.empty());
  // max_tokens defaults to 16 for completions; temperature and top_p to 1.
  CHECK(r->stop.max_tokens == uint32_t{16});
  CHECK(r->sampling.temperature == 1.0f);
  CHECK(r->sampling.top_p == 1.0f);
  CHECK_FALSE(r->stream);
  CHECK_FALSE(r->echo);
  CHECK_FALSE(r->sampling.logprobs);
  CHECK(r->n == 1);
}

TEST_CASE("openai completion: every field") {
  auto r = parse_openai_completion(R"({
    "model": "m", "prompt": ["once upon"], "max_tokens": 7, "temperature": 0.25, "top_p": 0.5,
    "n": 1, "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n", "The end"],
    "seed": 1234, "presence_penalty": -0.5, "frequency_penalty": 1.5, "logprobs": 3, "echo": true,
    "logit_bias": {}, "user": "u-1", "suffix": null, "best_of": 1,
    "top_k": 50, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": true, "min_tokens": 2,
    "stop_token_ids": [13, 2], "skip_special_tokens": false, "include_stop_str_in_output": true,
    "request_id": "req-9"})");
  REQUIRE(r.ok());
  CHECK(r->prompt == "once upon");
  CHECK(r->stop.max_tokens == uint32_t{7});
  CHECK(r->sampling.temperature == 0.25f);
  CHECK(r->sampling.top_p == 0.5f);
  CHECK(r->stream);
  CHECK(r->include_usage);
  CHECK(r->stop.stop == std::vector<std::string>{"\n", "The end"});
  CHECK(r->sampling.seed == uint64_t{1234});
  CHECK(r->sampling.presence_penalty == -0.5f);
  CHECK(r->sampling.frequency_penalty == 1.5f);
  CHECK(r->sampling.logprobs);
  CHECK(r->sampling.top_logprobs == 3);
  CHECK(r->echo);
  CHECK(r->user == "u-1");
  CHECK(r->sampling.top_k == 50);
  CHECK(r->sampling.min_p == 0.1f);
  CHECK(r->sampling.repetition_penalty == 1.2f);
  CHECK(r->stop.ignore_eos);
  CHECK(r->stop.min_tokens == 2);
  CHECK(r->stop.stop_token_ids == std::vector<int32_t>{13, 2});
  CHECK_FALSE(r->skip_special_tokens);
  CHECK(r->include_stop_str_in_output);
  CHECK(r->request_id == "req-9");
}

TEST_CASE("openai completion: the prompt's four forms") {
  auto r = parse_openai_completion(R"({"model": "m", "prompt": [1, 2, 3]})");
  REQUIRE(r.ok());
  CHECK(r->prompt.empty());
  CHECK(r->prompt_token_ids == std::vector<int32_t>{1, 2, 3});
  r = parse_openai_completion(R"({"model": "m", "prompt": [[4, 5]]})");
  REQUIRE(r.ok());
  CHECK(r->prompt_token_ids == std::vector<int32_t>{4, 5});
  r = parse_openai_completion(R"({"model": "m", "prompt": "a \"quoted\" \u00e9 \ud83d\ude00"})");
  REQUIRE(r.ok());
  CHECK(r->prompt == "a \"quoted\" \xC3\xA9 \xF0\x9F\x98\x80");

  CHECK_HAS(completion_error(R"({"model": "m", "prompt": ["a", "b"]})"),
            "'prompt' holds 2 prompts, but this server takes one prompt per request");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": [[1], [2]]})"), "holds 2 prompts");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": []})"), "'prompt' is an empty array");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": ""})"), "'prompt' is empty");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": [1, "a"]})"), "'prompt' must be an integer");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": [-1]})"),
            "'prompt' must be an integer between 0 and 2147483647, got -1");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": 5})"),
            "'prompt' must be a string, an array of token ids, or an array holding one of these");
  CHECK_HAS(completion_error(R"({"model": "m"})"), "the request has no 'prompt'");
  CHECK_HAS(completion_error(R"({"prompt": "x"})"), "the request has no 'model'");
}

TEST_CASE("openai completion: validation errors name the field and what is allowed") {
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "max_tokens": 0})"),
            "'max_tokens' must be an integer between 1 and 4294967295, got 0");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "max_tokens": -3})"),
            "'max_tokens' must be an integer between 1");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "max_tokens": 2.5})"),
            "'max_tokens' must be an integer between 1 and 4294967295, got a number (2.5)");
  // An integral float is an integer, as Pydantic takes it.
  CHECK(parse_openai_completion(R"({"model": "m", "prompt": "x", "max_tokens": 16.0})")->stop.max_tokens
        == uint32_t{16});
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "x": 1})"), "unknown field 'x'");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "temperature": "hot"})"),
            "'temperature' must be a number between 0 and 2, got a string (\"hot\")");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "temperature": 2.5})"),
            "'temperature' must be a number between 0 and 2, got 2.5");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "top_p": 0})"),
            "'top_p' must be a number greater than 0 and at most 1");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "presence_penalty": -3})"),
            "'presence_penalty' must be a number between -2 and 2");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stream": "yes"})"),
            "'stream' must be true or false");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "logprobs": 6})"),
            "'logprobs' must be an integer between 0 and 5, got 6");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "logit_bias": {"50256": -100}})"),
            "'logit_bias' is not supported by this server");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "suffix": "end"})"),
            "'suffix' is not supported by this server");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "best_of": 3})"),
            "'best_of > 1' is not supported by this server");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "n": 2})"),
            "'n' is 2, but this server returns one choice per request");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "n": 0})"),
            "'n' must be an integer between 1 and 2147483647, got 0");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}})"),
            "'stream_options' is only allowed when 'stream' is true");
  CHECK_HAS(completion_error(
              R"({"model": "m", "prompt": "x", "stream": true, "stream_options": {"other": 1}})"),
            "unknown field 'other' in 'stream_options'");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stop": ""})"),
            "'stop' holds an empty string");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stop": [1]})"),
            "'stop' must be a string or an array of strings");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "max_tokens": 3, "min_tokens": 4})"),
            "'min_tokens' (4) is more than 'max_tokens' (3)");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "model": "n"})"),
            "field 'model' appears more than once");
  CHECK_HAS(completion_error(R"({"model": "", "prompt": "x"})"), "'model' is empty");
  CHECK_HAS(completion_error(R"({"model": 3, "prompt": "x"})"), "'model' must be a string");
}

TEST_CASE("openai: what is wrong with the JSON itself") {
  CHECK_HAS(completion_error("{\"model\": \"m\", \"prompt\": \"\xC3\x28\"}"), "not valid UTF-8");
  CHECK_HAS(chat_error("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"\xED\xA0\x80\"}]}"),
            "not valid UTF-8");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "temperature": 1e999})"),
            "number JSON cannot carry");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "temperature": NaN})"), "not valid JSON");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x")"), "not valid JSON");
  CHECK_HAS(completion_error(""), "the request body is empty");
  CHECK_HAS(completion_error("[]"), "the request body must be a JSON object");
  CHECK_HAS(chat_error("\"text\""), "the request body must be a JSON object");
}

TEST_CASE("openai completion: limits") {
  generate_codec_limits limits;
  limits.max_prompt_bytes = 8;
  limits.max_prompt_tokens = 3;
  limits.max_stop_strings = 2;
  limits.max_stop_string_bytes = 4;
  limits.max_stop_token_ids = 1;
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "123456789"})", limits),
            "'prompt' has 9 bytes; at most 8 are allowed");
  CHECK(parse_openai_completion(R"({"model": "m", "prompt": "12345678"})", limits).ok());
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": [1, 2, 3, 4]})", limits),
            "'prompt' holds more than 3 token ids");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stop": ["a", "b", "c"]})", limits),
            "'stop' holds more than 2 strings");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stop": "abcde"})", limits),
            "'stop' holds a string of 5 bytes; at most 4 bytes are allowed");
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stop_token_ids": [1, 2]})", limits),
            "'stop_token_ids' holds more than 1 ids");
  // OpenAI's own limit of four stop strings is the default.
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]})"),
            "'stop' holds more than 4 strings");
}

TEST_CASE("openai chat: the reference's request") {
  auto r = parse_openai_chat(R"({
    "model": "gpt-4o",
    "messages": [
      {"role": "developer", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Hello!", "name": "ann"}
    ]})");
  REQUIRE(r.ok());
  CHECK(r->api == generate_api::openai_chat);
  CHECK(r->model == "gpt-4o");
  REQUIRE(r->messages.size() == 2);
  CHECK(r->messages[0].role == "developer");
  CHECK(r->messages[0].content == "You are a helpful assistant.");
  CHECK(r->messages[1].role == "user");
  CHECK(r->messages[1].name == "ann");
  // Chat has no default max_tokens: until the context is full.
  CHECK_FALSE(r->stop.max_tokens.has_value());
  CHECK(r->add_generation_prompt);
  CHECK(r->prompt.empty());
}

TEST_CASE("openai chat: content parts, tool turns and the raw message for the template") {
  auto r = parse_openai_chat(R"({
    "model": "m",
    "messages": [
      {"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]},
      {"role": "user", "content": "Weather?", "custom_field": {"k": [1, 2]}},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ],
    "max_tokens": 5, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 4,
    "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
    "parallel_tool_calls": true, "store": false, "metadata": {"a": "b"},
    "add_generation_prompt": false, "chat_template_kwargs": {"enable_thinking": false}})");
  REQUIRE(r.ok());
  REQUIRE(r->messages.size() == 4);
  // Text parts joined by a newline, as vLLM joins them.
  CHECK(r->messages[0].content == "Be brief.\nBe kind.");
  CHECK(r->messages[2].content.empty());
  CHECK(r->messages[3].role == "tool");
  // max_completion_tokens wins over the deprecated max_tokens.
  CHECK(r->stop.max_tokens == uint32_t{9});
  CHECK(r->sampling.logprobs);
  CHECK(r->sampling.top_logprobs == 4);
  CHECK_FALSE(r->add_generation_prompt);

  // The template sees every field the client sent, the unknown ones too.
  simdjson::dom::parser p;
  simdjson::dom::element raw = p.parse(r->messages[1].json);
  CHECK(std::string_view(raw["role"]) == "user");
  CHECK(int64_t(raw["custom_field"]["k"].at(1)) == 2);
  simdjson::dom::parser p2;
  simdjson::dom::element call = p2.parse(r->messages[2].json);
  CHECK(std::string_view(call["tool_calls"].at(0)["id"]) == "c1");
  simdjson::dom::parser p3;
  simdjson::dom::element kwargs = p3.parse(r->chat_template_kwargs);
  CHECK_FALSE(bool(kwargs["enable_thinking"]));
}

TEST_CASE("openai chat: validation errors") {
  const std::string user = R"({"role": "user", "content": "hi"})";
  auto with = [&](const std::string& extra) {
    return R"({"model": "m", "messages": [)" + user + "]" + extra + "}";
  };
  CHECK_HAS(chat_error(R"({"model": "m", "messages": []})"), "'messages' is empty");
  CHECK_HAS(chat_error(R"({"model": "m"})"), "the request has no 'messages'");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": {}})"),
            "'messages' must be an array of message objects");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"content": "hi"}]})"),
            "messages[0]: has no 'role'");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "robot", "content": "hi"}]})"),
            "messages[0]: role 'robot' is not one of system, user, assistant, tool, developer");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": 1, "content": "hi"}]})"),
            "messages[0]: 'role' must be a string");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user"}]})"),
            "messages[0]: has no 'content'");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user", "content": 5}]})"),
            "'content' must be a string or an array of content parts");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})"),
            "content part 0: type 'image_url' is not supported by this server");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "tool", "content": "x"}]})"),
            "a tool message needs 'tool_call_id'");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]})"),
            "'tool_calls' belongs to assistant messages only");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user", "role": "system", "content": "x"}]})"),
            "field 'role' appears more than once");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [5]})"), "messages[0]: must be an object");
  CHECK_HAS(chat_error(with(R"(, "max_tokens": 0)")), "'max_tokens' must be an integer between 1");
  CHECK_HAS(chat_error(with(R"(, "max_completion_tokens": -1)")),
            "'max_completion_tokens' must be an integer between 1");
  CHECK_HAS(chat_error(with(R"(, "x": 1)")), "unknown field 'x'");
  CHECK_HAS(chat_error(with(R"(, "echo": true)")), "unknown field 'echo'");
  CHECK_HAS(chat_error(with(R"(, "logprobs": 2)")), "'logprobs' must be true or false");
  CHECK_HAS(chat_error(with(R"(, "top_logprobs": 2)")), "'top_logprobs' needs 'logprobs' set to true");
  CHECK_HAS(chat_error(with(R"(, "logprobs": true, "top_logprobs": 21)")),
            "'top_logprobs' must be an integer between 0 and 20");
  CHECK_HAS(chat_error(with(R"(, "tools": [{"type": "function", "function": {"name": "f"}}])")),
            "'tools' is not supported by this server");
  CHECK_HAS(chat_error(with(R"(, "tool_choice": "required")")), "is not supported by this server");
  CHECK_HAS(chat_error(with(R"(, "response_format": {"type": "json_object"})")),
            "'response_format 'json_object'' is not supported");
  CHECK_HAS(chat_error(with(R"(, "logit_bias": {"1": 5})")), "'logit_bias' is not supported");
  CHECK_HAS(chat_error(with(R"(, "functions": [{"name": "f"}])")), "'functions' is not supported");
  CHECK_HAS(chat_error(with(R"(, "n": 3)")), "'n' is 3");
  CHECK_HAS(chat_error(with(R"(, "stream": false, "stream_options": {"include_usage": true})")),
            "'stream_options' is only allowed when 'stream' is true");
  CHECK_HAS(chat_error(with(R"(, "seed": "abc")")), "'seed' must be a 64-bit integer");
  CHECK_HAS(chat_error(with(R"(, "top_k": -2)")), "'top_k' must be an integer between -1");
  CHECK_HAS(chat_error(with(R"(, "repetition_penalty": 0)")),
            "'repetition_penalty' must be a number greater than 0");
}

TEST_CASE("openai chat: limits") {
  generate_codec_limits limits;
  limits.max_messages = 2;
  limits.max_prompt_bytes = 5;
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]})",
                       limits),
            "'messages' holds more than 2 messages");
  CHECK_HAS(chat_error(R"({"model": "m", "messages": [{"role": "user", "content": "abc"}, {"role": "user", "content": "def"}]})",
                       limits),
            "the messages' contents have more than 5 bytes together");
}

TEST_CASE("openai chat: streaming with usage") {
  auto r = parse_openai_chat(
    R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}})");
  REQUIRE(r.ok());
  CHECK(r->stream);
  CHECK(r->include_usage);
  r = parse_openai_chat(
    R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": null, "temperature": null, "stop": null})");
  REQUIRE(r.ok());
  CHECK_FALSE(r->include_usage);
  CHECK(r->sampling.temperature == 1.0f);
  CHECK(r->stop.stop.empty());
}

TEST_CASE("the engine's ttft_target_ms: a request's own time-to-first-token target") {
  auto r = parse_openai_completion(R"({"model": "m", "prompt": "x", "ttft_target_ms": 250})");
  REQUIRE(r.ok());
  REQUIRE(r->ttft_target_ms);
  CHECK(*r->ttft_target_ms == 250u);
  CHECK_FALSE(parse_openai_completion(R"({"model": "m", "prompt": "x"})")->ttft_target_ms);
  CHECK_HAS(completion_error(R"({"model": "m", "prompt": "x", "ttft_target_ms": 0})"),
            "'ttft_target_ms' must be an integer between 1 and 16777216, got 0");
  auto chat = parse_openai_chat(
    R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "ttft_target_ms": 40})");
  REQUIRE(chat.ok());
  CHECK(*chat->ttft_target_ms == 40u);
}
