// The responses of the generative APIs. Expected shapes come from the
// protocol documents: Triton's extension_generate.md (and its http_server.cc,
// which writes the fields in name order, compactly), the OpenAI API reference
// for completion, chat completion, chunk, model list and error objects. Each
// output is parsed back with simdjson and checked field by field.

#include "ingress/generate_codec.hpp"

#include "core/json.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

// Counts allocations, to check that the encoders allocate nothing beyond the
// caller's string.
namespace {
std::atomic<size_t> allocations{0};
}

void* operator new(size_t size) {
  ++allocations;
  if (void* p = std::malloc(size ? size : 1))
    return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

using namespace caf_serving;
using namespace caf_serving::ingress;
namespace dom = simdjson::dom;

namespace {

/// Parses one JSON document (failing the test when it is not valid JSON,
/// UTF-8 included). The parser must outlive the element.
dom::element parse(dom::parser& parser, const std::string& text) {
  dom::element e;
  auto err = parser.parse(text).get(e);
  INFO("JSON: " << text);
  REQUIRE(err == simdjson::SUCCESS);
  return e;
}

/// The JSON texts of the SSE events in `stream`, checking the framing: each
/// event is "data: " + one line + "\n\n".
std::vector<std::string> sse_events(const std::string& stream) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < stream.size()) {
    REQUIRE(stream.compare(pos, 6, "data: ") == 0);
    size_t end = stream.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    std::string data = stream.substr(pos + 6, end - pos - 6);
    CHECK(data.find('\n') == std::string::npos);
    events.push_back(data);
    pos = end + 2;
  }
  return events;
}

std::string_view str(dom::element e) {
  return std::string_view(e);
}

const openai_object_meta meta{"cmpl-1", 1700000000, "my-model", ""};

} // namespace

// -- Triton -------------------------------------------------------------------

TEST_CASE("triton generate response: the extension document's example") {
  std::string out;
  append_triton_generate_response(out, {"42", "mymodel", "1", "model output"});
  // extension_generate.md's example, as Triton's JSON writer writes it
  // (compact, the fields in name order).
  CHECK(out == R"({"id":"42","model_name":"mymodel","model_version":"1","text_output":"model output"})");

  out.clear();
  append_triton_generate_response(out, {"", "mymodel", "1", "x"});
  dom::parser p;
  auto doc = parse(p, out);
  // test_request_id: no id in the request, none in the response.
  CHECK(doc["id"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(str(doc["text_output"]) == "x");
}

TEST_CASE("triton generate response: vLLM's optional outputs, in name order") {
  triton_generate_result r{"7", "vllm_model", "1", "Hello"};
  r.finish_reason = generation_finish::length;
  r.num_input_tokens = 5;
  r.num_output_tokens = 3;
  r.cumulative_logprob = -1.5;
  std::string out;
  append_triton_generate_response(out, r);
  CHECK(out == R"({"cumulative_logprob":-1.5,"finish_reason":"length","id":"7","model_name":"vllm_model","model_version":"1","num_input_tokens":5,"num_output_tokens":3,"text_output":"Hello"})");
  // Mid-stream, vLLM's backend writes str(None).
  r.finish_reason = generation_finish::none;
  out.clear();
  append_triton_generate_response(out, r);
  dom::parser p;
  CHECK(str(parse(p, out)["finish_reason"]) == "None");
}

TEST_CASE("triton generate_stream events and errors") {
  std::string out;
  append_triton_generate_event(out, {"", "mock_llm", "1", "hello world"});
  append_triton_error_event(out, "An Error Occurred");
  auto events = sse_events(out);
  REQUIRE(events.size() == 2);
  dom::parser p;
  CHECK(str(parse(p, events[0])["text_output"]) == "hello world");
  CHECK(str(parse(p, events[1])["error"]) == "An Error Occurred");

  std::string body;
  append_triton_error(body, "error message");
  CHECK(body == R"({"error":"error message"})");
}

// -- OpenAI objects -----------------------------------------------------------

TEST_CASE("openai completion object") {
  openai_result r;
  r.meta = {"cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7", 1589478378, "gpt-3.5-turbo-instruct", "fp_44709d6fcb"};
  r.choice.text = "\n\nThis is indeed a test";
  r.choice.finish = generation_finish::length;
  r.usage = {5, 7};
  std::string out;
  append_openai_completion(out, r);
  dom::parser p;
  auto doc = parse(p, out);
  CHECK(str(doc["id"]) == "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7");
  CHECK(str(doc["object"]) == "text_completion");
  CHECK(int64_t(doc["created"]) == 1589478378);
  CHECK(str(doc["model"]) == "gpt-3.5-turbo-instruct");
  CHECK(str(doc["system_fingerprint"]) == "fp_44709d6fcb");
  dom::array choices = doc["choices"];
  REQUIRE(choices.size() == 1);
  auto c = choices.at(0).value();
  CHECK(int64_t(c["index"]) == 0);
  CHECK(str(c["text"]) == "\n\nThis is indeed a test");
  CHECK(c["logprobs"].is_null());
  CHECK(str(c["finish_reason"]) == "length");
  CHECK(int64_t(doc["usage"]["prompt_tokens"]) == 5);
  CHECK(int64_t(doc["usage"]["completion_tokens"]) == 7);
  CHECK(int64_t(doc["usage"]["total_tokens"]) == 12);
  CHECK(doc["timings"].error() == simdjson::NO_SUCH_FIELD);
}

TEST_CASE("openai chat completion object, with llama.cpp's timings") {
  openai_result r;
  r.meta = {"chatcmpl-123", 1677652288, "gpt-4o-mini", ""};
  r.choice.text = "Hello there, how may I assist you today?";
  r.choice.finish = generation_finish::stop;
  r.usage = {9, 12};
  r.timings = generation_timings{9, 4.5, 12, 60.0};
  std::string out;
  append_openai_chat_completion(out, r);
  dom::parser p;
  auto doc = parse(p, out);
  CHECK(str(doc["object"]) == "chat.completion");
  CHECK(doc["system_fingerprint"].error() == simdjson::NO_SUCH_FIELD);
  auto c = doc["choices"].at(0).value();
  CHECK(str(c["message"]["role"]) == "assistant");
  CHECK(str(c["message"]["content"]) == "Hello there, how may I assist you today?");
  CHECK(c["logprobs"].is_null());
  CHECK(str(c["finish_reason"]) == "stop");
  CHECK(int64_t(doc["usage"]["total_tokens"]) == 21);
  CHECK(int64_t(doc["timings"]["predicted_n"]) == 12);
  CHECK(double(doc["timings"]["predicted_per_second"]) == doctest::Approx(200.0));
  CHECK(double(doc["timings"]["prompt_per_second"]) == doctest::Approx(2000.0));
}

TEST_CASE("openai logprobs: completions' parallel arrays, chat's content list") {
  const top_logprob alts0[] = {{"Hello", -0.25f}, {"Hi", -1.5f}};
  const top_logprob alts1[] = {{" world", -0.5f}};
  const token_logprob tokens[] = {{"Hello", -0.25f, {alts0, 2}},
                                  {" world", -std::numeric_limits<float>::infinity(), {alts1, 1}},
                                  {"\xE2\x82", -2.0f, {}}};
  openai_result r;
  r.meta = meta;
  r.choice.text = "Hello world\xE2\x82";
  r.choice.logprobs = {tokens, 3};
  r.choice.with_logprobs = true;
  r.choice.text_offset = 10;
  std::string out;
  append_openai_completion(out, r);
  dom::parser p;
  auto lp = parse(p, out)["choices"].at(0)["logprobs"];
  dom::array toks = lp["tokens"];
  REQUIRE(toks.size() == 3);
  CHECK(str(toks.at(1)) == " world");
  // A token that ends inside a character: each of its bytes is written as
  // U+FFFD (append_json_string's rule, core/json.hpp).
  CHECK(str(toks.at(2)) == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(double(lp["token_logprobs"].at(0)) == -0.25);
  // -inf, which JSON cannot hold, is OpenAI's -9999.0.
  CHECK(double(lp["token_logprobs"].at(1)) == -9999.0);
  CHECK(double(lp["top_logprobs"].at(0)["Hi"]) == -1.5);
  CHECK(dom::object(lp["top_logprobs"].at(2)).size() == 0);
  // Each token's offset: where the text starts plus the tokens before it.
  CHECK(int64_t(lp["text_offset"].at(0)) == 10);
  CHECK(int64_t(lp["text_offset"].at(1)) == 15);
  CHECK(int64_t(lp["text_offset"].at(2)) == 21);

  out.clear();
  append_openai_chat_completion(out, r);
  dom::parser p2;
  auto content = parse(p2, out)["choices"].at(0)["logprobs"]["content"];
  CHECK(str(content.at(0)["token"]) == "Hello");
  CHECK(double(content.at(0)["logprob"]) == -0.25);
  dom::array bytes0 = content.at(0)["bytes"];
  CHECK(bytes0.size() == 5);
  CHECK(int64_t(bytes0.at(0)) == 'H');
  CHECK(str(content.at(0)["top_logprobs"].at(1)["token"]) == "Hi");
  // "bytes" keeps the raw bytes of a partial character, so clients can join them.
  dom::array bytes2 = content.at(2)["bytes"];
  REQUIRE(bytes2.size() == 2);
  CHECK(int64_t(bytes2.at(0)) == 0xE2);
  CHECK(int64_t(bytes2.at(1)) == 0x82);
}

TEST_CASE("openai chat stream: role first, content deltas, finish, usage, [DONE]") {
  openai_object_meta m{"chatcmpl-7", 1694268190, "gpt-4o-mini", ""};
  std::string out;
  openai_chunk c;
  c.meta = m;
  c.include_usage = true;
  c.first = true;
  append_openai_chat_chunk(out, c);
  c.first = false;
  c.choice.text = "Hello";
  append_openai_chat_chunk(out, c);
  c.choice.text = "";
  c.choice.finish = generation_finish::stop;
  append_openai_chat_chunk(out, c);
  append_openai_usage_chunk(out, generate_api::openai_chat, m, {4, 2});
  append_sse_done(out);
  CHECK(out.size() >= 14);
  CHECK(out.compare(out.size() - 14, 14, "data: [DONE]\n\n") == 0);

  auto events = sse_events(out);
  REQUIRE(events.size() == 5);
  CHECK(events[4] == "[DONE]");
  dom::parser p0, p1, p2, p3;
  auto e0 = parse(p0, events[0]);
  CHECK(str(e0["object"]) == "chat.completion.chunk");
  CHECK(str(e0["id"]) == "chatcmpl-7");
  auto d0 = e0["choices"].at(0)["delta"];
  CHECK(str(d0["role"]) == "assistant");
  CHECK(str(d0["content"]) == "");
  CHECK(e0["choices"].at(0)["finish_reason"].is_null());
  CHECK(e0["usage"].is_null());
  auto e1 = parse(p1, events[1]);
  CHECK(e1["choices"].at(0)["delta"]["role"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(str(e1["choices"].at(0)["delta"]["content"]) == "Hello");
  auto e2 = parse(p2, events[2]);
  CHECK(dom::object(e2["choices"].at(0)["delta"]).size() == 0);
  CHECK(str(e2["choices"].at(0)["finish_reason"]) == "stop");
  auto e3 = parse(p3, events[3]);
  CHECK(dom::array(e3["choices"]).size() == 0);
  CHECK(int64_t(e3["usage"]["prompt_tokens"]) == 4);
  CHECK(int64_t(e3["usage"]["total_tokens"]) == 6);

  // Without include_usage the chunks carry no "usage" at all.
  out.clear();
  c.include_usage = false;
  append_openai_chat_chunk(out, c);
  dom::parser p4;
  CHECK(parse(p4, sse_events(out)[0])["usage"].error() == simdjson::NO_SUCH_FIELD);
}

TEST_CASE("openai completion stream chunks") {
  std::string out;
  openai_chunk c;
  c.meta = meta;
  c.choice.text = " there";
  append_openai_completion_chunk(out, c);
  append_openai_usage_chunk(out, generate_api::openai_completion, meta, {1, 1});
  auto events = sse_events(out);
  REQUIRE(events.size() == 2);
  dom::parser p0, p1;
  auto e0 = parse(p0, events[0]);
  CHECK(str(e0["object"]) == "text_completion");
  CHECK(str(e0["choices"].at(0)["text"]) == " there");
  CHECK(e0["choices"].at(0)["finish_reason"].is_null());
  auto e1 = parse(p1, events[1]);
  CHECK(str(e1["object"]) == "text_completion");
  CHECK(dom::array(e1["choices"]).size() == 0);
}

TEST_CASE("openai errors and the model list") {
  std::string out;
  append_openai_error(out, openai_error_of(bad_request("'max_tokens' must be ...")));
  dom::parser p;
  auto err = parse(p, out)["error"];
  CHECK(str(err["message"]) == "'max_tokens' must be ...");
  CHECK(str(err["type"]) == "invalid_request_error");
  CHECK(err["param"].is_null());
  CHECK(err["code"].is_null());

  auto nf = openai_error_of(not_found("The model 'x' does not exist"));
  CHECK(nf.status == status_code::not_found);
  CHECK(nf.code == "model_not_found");
  auto busy = openai_error_of({status_code::too_many_requests, "slow down"});
  CHECK(busy.type == "requests");
  CHECK(openai_error_of(unavailable("draining")).type == "server_error");

  out.clear();
  openai_error with_param{status_code::bad_request, "bad", "invalid_request_error", "messages", "x"};
  append_openai_error_event(out, with_param);
  auto events = sse_events(out);
  REQUIRE(events.size() == 1);
  dom::parser p2;
  CHECK(str(parse(p2, events[0])["error"]["param"]) == "messages");

  const openai_model_card cards[] = {{"llama", 1686935002, "caf-serving"},
                                     {"qwen", 1686935003, "caf-serving"}};
  out.clear();
  append_openai_model_list(out, {cards, 2});
  CHECK(out == R"({"object":"list","data":[{"id":"llama","object":"model","created":1686935002,"owned_by":"caf-serving"},{"id":"qwen","object":"model","created":1686935003,"owned_by":"caf-serving"}]})");
  out.clear();
  append_openai_model_list(out, {});
  CHECK(out == R"({"object":"list","data":[]})");
}

// -- properties ---------------------------------------------------------------

TEST_CASE("encoders write valid JSON whatever bytes the model produced") {
  std::mt19937 rng(34);
  auto random_bytes = [&] {
    std::string s(rng() % 24, '\0');
    for (auto& ch : s)
      ch = static_cast<char>(rng() % 256);
    return s;
  };
  for (int round = 0; round < 2000; ++round) {
    std::string text = random_bytes(), token = random_bytes(), id = random_bytes();
    std::string model = random_bytes();
    const top_logprob top[] = {{token, -1.0f}, {text, std::numeric_limits<float>::quiet_NaN()}};
    const token_logprob lp[] = {{token, -0.5f, {top, 2}}};
    openai_object_meta m{id, -5, model, token};
    openai_result r{m, {text, {lp, 1}, true, 0, generation_finish::stop}, {1, 2}, {}};
    openai_chunk c{m, r.choice, round % 2 == 0, true};
    std::string out;
    append_openai_completion(out, r);
    std::vector<std::string> docs{out};
    out.clear();
    append_openai_chat_completion(out, r);
    docs.push_back(out);
    out.clear();
    append_openai_chat_chunk(out, c);
    append_openai_completion_chunk(out, c);
    append_openai_error_event(out, openai_error_of(bad_request(text)));
    append_triton_generate_event(out, {id, model, token, text, generation_finish::length});
    append_triton_error_event(out, text);
    for (auto& e : sse_events(out))
      docs.push_back(e);
    const openai_model_card card{text, 0, token};
    out.clear();
    append_openai_model_list(out, {&card, 1});
    docs.push_back(out);
    for (const auto& d : docs) {
      dom::parser p;
      INFO("round " << round);
      CHECK(p.parse(d).error() == simdjson::SUCCESS);
    }
  }
}

TEST_CASE("encoders allocate nothing beyond the caller's string") {
  const top_logprob top[] = {{"a", -1.0f}};
  const token_logprob lp[] = {{"a", -0.5f, {top, 1}}};
  openai_result r{meta, {"some text", {lp, 1}, true, 0, generation_finish::stop}, {3, 4},
                  generation_timings{3, 1.0, 4, 2.0}};
  openai_chunk c{meta, r.choice, true, true};
  const openai_model_card card{"m", 0, "o"};
  openai_error e{status_code::bad_request, "bad", "invalid_request_error", "", ""};
  std::string out;
  out.reserve(1 << 16);
  size_t before = allocations.load();
  append_openai_completion(out, r);
  append_openai_chat_completion(out, r);
  append_openai_completion_chunk(out, c);
  append_openai_chat_chunk(out, c);
  append_openai_usage_chunk(out, generate_api::openai_chat, meta, {1, 1});
  append_sse_done(out);
  append_openai_error(out, e);
  append_openai_model_list(out, {&card, 1});
  append_triton_generate_event(out, {"1", "m", "1", "text", generation_finish::stop, -1.0, 1, 2});
  append_triton_error(out, "bad");
  CHECK(allocations.load() == before);
}

// -- round trips --------------------------------------------------------------

TEST_CASE("round trip: an answer's text becomes the next request's input unchanged") {
  const std::string text = "line one\nline \"two\"\t\\ \xC3\xA9\xF0\x9F\x98\x80 \x01";
  openai_result r{meta, {text}, {1, 1}, {}};
  std::string answer;
  append_openai_chat_completion(answer, r);
  dom::parser p;
  std::string_view content = parse(p, answer)["choices"].at(0)["message"]["content"];
  // The next turn carries the assistant message back, as a client does.
  std::string next = R"({"model": "m", "messages": [{"role": "assistant", "content": )";
  append_json_string(next, content);
  next += "}]}";
  auto req = parse_openai_chat(next);
  REQUIRE(req.ok());
  CHECK(req->messages[0].content == text);

  std::string triton;
  append_triton_generate_response(triton, {"", "m", "1", text});
  dom::parser p2;
  std::string_view out = parse(p2, triton)["text_output"];
  std::string again = R"({"text_input": )";
  append_json_string(again, out);
  again += "}";
  generate_model_info info;
  info.name = "m";
  info.inputs = {{"text_input", datatype::bytes, {1}, false}};
  auto treq = parse_triton_generate(again, info);
  REQUIRE(treq.ok());
  CHECK(treq->prompt == text);
}
