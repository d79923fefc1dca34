#include "generate.hpp"

#include <cstdio>
#include <fstream>

#include <unistd.h>

#include <doctest/doctest.h>
#include <simdjson.h>

using namespace caf_serving::perf;

namespace {

/// A chunked HTTP response written by hand: each piece one chunk.
std::string chunked_response(const std::vector<std::string>& pieces) {
  std::string r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                  "Content-Type: text/event-stream\r\n\r\n";
  for (const auto& p : pieces) {
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", p.size());
    r += size + p + "\r\n";
  }
  return r + "0\r\n\r\n";
}

std::string completion_event(const std::string& text) {
  return "data: {\"choices\":[{\"index\":0,\"text\":\"" + text
         + "\",\"finish_reason\":null}],\"usage\":null}\n\n";
}

const std::string usage_event =
  "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
  "\"completion_tokens\":3,\"total_tokens\":10}}\n\n";

} // namespace

TEST_CASE("the decoder finds the same events wherever the bytes are split") {
  // Two events in one chunk, one event split over two chunks, a comment,
  // CRLF line ends, a multi-line data field, and [DONE].
  auto first = completion_event("a") + completion_event("b");
  auto second = completion_event("c");
  auto response = chunked_response(
    {first, second.substr(0, 9), second.substr(9),
     ": keep-alive\r\ndata: x\r\ndata: y\r\n\r\n", usage_event,
     "data: [DONE]\n\n"});
  std::vector<std::string> expected{
    completion_event("a").substr(6, completion_event("a").size() - 8),
    completion_event("b").substr(6, completion_event("b").size() - 8),
    completion_event("c").substr(6, completion_event("c").size() - 8),
    "x\ny", usage_event.substr(6, usage_event.size() - 8), "[DONE]"};
  for (std::size_t cut = 0; cut <= response.size(); ++cut) {
    stream_decoder d;
    d.feed(std::string_view(response).substr(0, cut), 1);
    d.feed(std::string_view(response).substr(cut), 2);
    REQUIRE(d.error().empty());
    REQUIRE(d.done());
    CHECK(d.status() == 200);
    REQUIRE(d.events().size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i)
      CHECK(d.events()[i].data == expected[i]);
  }
  // Byte by byte, byte i arriving at time i: an event is timed by the
  // arrival of the blank line that ends it.
  stream_decoder d;
  for (std::size_t i = 0; i < response.size(); ++i)
    d.feed(std::string_view(response).substr(i, 1), static_cast<int64_t>(i));
  REQUIRE(d.done());
  REQUIRE(d.events().size() == expected.size());
  auto end_of = [&](const std::string& event_text, std::size_t from) {
    return static_cast<int64_t>(response.find(event_text, from) + event_text.size() - 1);
  };
  auto header_end = response.find("\r\n\r\n") + 4;
  CHECK(d.events()[0].at_ns == end_of(completion_event("a"), header_end));
  CHECK(d.events()[1].at_ns == end_of(completion_event("b"), header_end));
  // The third event's last byte is in the third chunk.
  auto third_chunk = response.find(second.substr(9));
  CHECK(d.events()[2].at_ns
        == static_cast<int64_t>(third_chunk + second.size() - 9 - 1));
}

TEST_CASE("the decoder reads Content-Length bodies and reports bad framing") {
  std::string body = "{\"choices\":[{\"text\":\"hi\"}]}";
  std::string response = "HTTP/1.1 400 Bad Request\r\nContent-Length: "
                         + std::to_string(body.size())
                         + "\r\nContent-Type: application/json\r\n\r\n" + body;
  stream_decoder d;
  d.feed(response.substr(0, 20), 5);
  CHECK_FALSE(d.done());
  d.feed(response.substr(20), 9);
  REQUIRE(d.done());
  CHECK(d.status() == 400);
  REQUIRE(d.events().size() == 1);
  CHECK(d.events()[0].data == body);
  CHECK(d.events()[0].at_ns == 9);

  stream_decoder bad;
  bad.feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 1);
  CHECK_FALSE(bad.error().empty());
  stream_decoder not_http;
  not_http.feed("hello there, not http\r\n\r\n", 1);
  CHECK_FALSE(not_http.error().empty());
}

TEST_CASE("chunks of each API: content, usage, [DONE], errors") {
  auto c = parse_chunk(generate_api::openai_completions,
                       "{\"choices\":[{\"text\":\"x\"}],\"usage\":null}");
  CHECK(c.has_content);
  CHECK(c.completion_tokens == -1);
  c = parse_chunk(generate_api::openai_completions,
                  "{\"choices\":[{\"text\":\"\"}]}");
  CHECK_FALSE(c.has_content);
  c = parse_chunk(generate_api::openai_completions,
                  usage_event.substr(6, usage_event.size() - 8));
  CHECK_FALSE(c.has_content);
  CHECK(c.prompt_tokens == 7);
  CHECK(c.completion_tokens == 3);
  // Chat: the role-only first delta is not content; null content is not.
  c = parse_chunk(generate_api::openai_chat,
                  "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}");
  CHECK_FALSE(c.has_content);
  c = parse_chunk(generate_api::openai_chat,
                  "{\"choices\":[{\"delta\":{\"content\":null}}]}");
  CHECK_FALSE(c.has_content);
  c = parse_chunk(generate_api::openai_chat,
                  "{\"choices\":[{\"delta\":{\"content\":\" so\"}}]}");
  CHECK(c.has_content);
  c = parse_chunk(generate_api::triton,
                  "{\"model_name\":\"m\",\"text_output\":\" the\"}");
  CHECK(c.has_content);
  c = parse_chunk(generate_api::triton, "{\"text_output\":\"\"}");
  CHECK_FALSE(c.has_content);
  CHECK(parse_chunk(generate_api::openai_chat, " [DONE]").done_marker);
  CHECK(parse_chunk(generate_api::triton, "{\"error\":\"bad input\"}").error
        == "the server streamed an error: bad input");
  CHECK(parse_chunk(generate_api::openai_chat,
                    "{\"error\":{\"message\":\"too long\"}}")
          .error
        == "the server streamed an error: too long");
  CHECK_FALSE(parse_chunk(generate_api::openai_chat, "{oops").error.empty());
}

TEST_CASE("token latencies of a hand-made timeline") {
  generation_timeline t;
  t.start_ns = 1'000'000;
  t.content_ns = {11'000'000, 13'000'000, 16'000'000, 16'000'000};
  t.end_ns = 21'000'000;
  t.output_tokens = 5;
  t.prompt_tokens = 9;
  auto m = timing_of(t, 100);
  CHECK(m.ttft_ns == 10'000'000);
  CHECK(m.e2e_ns == 20'000'000);
  // (20 - 10) ms over 5 - 1 tokens.
  CHECK(m.tpot_ns == 2'500'000);
  CHECK(m.itl_ns == std::vector<int64_t>{2'000'000, 3'000'000, 0});
  CHECK(m.prompt_tokens == 9);
  CHECK(m.output_tokens == 5);

  // No usage (Triton): chunks count as tokens, the asked prompt length is
  // used; a single token has no TPOT.
  generation_timeline one;
  one.start_ns = 0;
  one.content_ns = {4};
  one.end_ns = 6;
  auto s = timing_of(one, 100);
  CHECK(s.output_tokens == 1);
  CHECK(s.prompt_tokens == 100);
  CHECK(s.tpot_ns == -1);
  CHECK(s.itl_ns.empty());
}

TEST_CASE("goodput counts requests meeting both TTFT and TPOT targets") {
  window_summary w;
  w.duration_ns = 2'000'000'000;
  auto timing = [](int64_t ttft_ms, int64_t tpot_ms, int64_t out) {
    token_timing t;
    t.ttft_ns = ttft_ms * 1'000'000;
    t.tpot_ns = tpot_ms < 0 ? -1 : tpot_ms * 1'000'000;
    t.e2e_ns = t.ttft_ns + (out - 1) * std::max<int64_t>(tpot_ms, 0) * 1'000'000;
    t.output_tokens = out;
    t.prompt_tokens = 10;
    return t;
  };
  w.generations = {timing(100, 20, 11),   // good
                   timing(300, 20, 11),   // TTFT too slow
                   timing(100, 60, 11),   // TPOT too slow
                   timing(200, 50, 11),   // both exactly at the target: good
                   timing(150, -1, 1)};   // one token, no TPOT: good
  auto s = summarize_generations(w, {200, 50}, 99);
  CHECK(s.requests == 5);
  CHECK(s.good == 3);
  CHECK(s.goodput == doctest::Approx(1.5));
  CHECK(s.requests_per_s == doctest::Approx(2.5));
  CHECK(s.output_tokens == 45);
  CHECK(s.output_tokens_per_s == doctest::Approx(22.5));
  CHECK(s.prompt_tokens == 50);
  CHECK(s.tpot.count == 4);
  CHECK(s.ttft.max_us == doctest::Approx(300'000));
  // Without targets every request is good.
  CHECK(summarize_generations(w, {}, 99).good == 5);
  CHECK(meets_targets(timing(300, 20, 11), {0, 50}));
  CHECK_FALSE(meets_targets(timing(300, 20, 11), {250, 0}));
}

TEST_CASE("a completion's captured bytes are replayed into a timeline") {
  auto response = chunked_response({completion_event("a"), completion_event("b"),
                                    completion_event("c") + usage_event,
                                    "data: [DONE]\n\n"});
  completion done;
  done.start_ns = 100;
  done.end_ns = 900;
  done.status = 200;
  done.response = response;
  // Pieces arrive at 200 (the first event and half the second), 300, 400.
  auto second_at = response.find(completion_event("b")) + 10;
  auto third_at = response.find(completion_event("c"));
  done.reads = {{200, second_at}, {300, third_at + 5}, {400, response.size()}};
  auto g = read_generation(generate_api::openai_completions, done);
  REQUIRE(g.error.empty());
  CHECK(g.value.content_ns == std::vector<int64_t>{200, 300, 400});
  CHECK(g.value.output_tokens == 3);
  CHECK(g.value.prompt_tokens == 7);

  auto cut = done;
  cut.response = response.substr(0, third_at);
  cut.reads = {{200, third_at}};
  CHECK(read_generation(generate_api::openai_completions, cut).error
        == "the answer ended early");
  auto refused = done;
  refused.status = 400;
  CHECK(read_generation(generate_api::openai_completions, refused).error == "HTTP 400");

  std::vector<completion> window{done, refused, cut};
  auto timings = read_generations(generate_api::openai_completions, window, {});
  REQUIRE(timings.size() == 1);
  CHECK(timings[0].ttft_ns == 100);
  CHECK(window[0].status == 200);
  CHECK(window[1].status == 400);
  CHECK(window[2].status == 0);
}

TEST_CASE("request bodies ask for the lengths given") {
  generate_request_config c;
  c.model = "tiny \"gpt\"";
  c.prompt_tokens = 37;
  c.output_tokens = 12;
  c.first_token_id = 5;
  c.last_token_id = 9;
  simdjson::dom::parser parser;
  auto body = build_generate_body(c);
  CHECK(body.path == "/v1/completions");
  auto doc = parser.parse(body.body);
  CHECK(std::string_view(doc["model"]) == "tiny \"gpt\"");
  simdjson::dom::array prompt = doc["prompt"];
  CHECK(prompt.size() == 37);
  for (auto id : prompt) {
    CHECK(int64_t(id) >= 5);
    CHECK(int64_t(id) <= 9);
  }
  CHECK(int64_t(doc["max_tokens"]) == 12);
  CHECK(int64_t(doc["min_tokens"]) == 12);
  CHECK(bool(doc["ignore_eos"]));
  CHECK(bool(doc["stream"]));
  CHECK(bool(doc["stream_options"]["include_usage"]));

  c.api = generate_api::openai_chat;
  c.ignore_eos = false;
  body = build_generate_body(c);
  CHECK(body.path == "/v1/chat/completions");
  doc = parser.parse(body.body);
  std::string_view content = doc["messages"].at(0)["content"];
  CHECK(std::count(content.begin(), content.end(), ' ') == 36);
  CHECK_FALSE(bool(doc["ignore_eos"]));
  CHECK(doc["min_tokens"].error() == simdjson::NO_SUCH_FIELD);

  c.api = generate_api::triton;
  c.model = "m";
  body = build_generate_body(c);
  CHECK(body.path == "/v2/models/m/generate_stream");
  doc = parser.parse(body.body);
  std::string_view text = doc["text_input"];
  CHECK(std::count(text.begin(), text.end(), ' ') == 36);
  CHECK(int64_t(doc["parameters"]["max_tokens"]) == 12);
}

TEST_CASE("lengths: a value, a range, a file") {
  auto fixed = parse_length_spec("64", "--prompt-tokens");
  REQUIRE(fixed.error.empty());
  CHECK(draw_lengths(fixed.value, 3, 1) == std::vector<int64_t>{64, 64, 64});
  auto range = parse_length_spec("10:13", "--output-tokens");
  REQUIRE(range.error.empty());
  auto drawn = draw_lengths(range.value, 400, 7);
  std::vector<int> seen(4);
  for (auto n : drawn) {
    REQUIRE(n >= 10);
    REQUIRE(n <= 13);
    ++seen[static_cast<std::size_t>(n - 10)];
  }
  for (int count : seen)
    CHECK(count > 50);
  CHECK(draw_lengths(range.value, 5, 7) == draw_lengths(range.value, 5, 7));
  CHECK(parse_length_spec("0", "--prompt-tokens").error
        == "--prompt-tokens must be at least 1");
  CHECK_FALSE(parse_length_spec("9:3", "--prompt-tokens").error.empty());
  CHECK_FALSE(parse_length_spec("/no/such/file", "--prompt-tokens").error.empty());

  std::string path = std::string("/tmp/caf-serving-perf-lengths-")
              + std::to_string(getpid());
  {
    std::ofstream out(path);
    out << "# lengths\n5\n\n7\n 9 \n";
  }
  auto file = parse_length_spec(path, "--prompt-tokens");
  REQUIRE(file.error.empty());
  CHECK(draw_lengths(file.value, 5, 1) == std::vector<int64_t>{5, 7, 9, 5, 7});
  {
    std::ofstream out(path);
    out << "5\nlots\n";
  }
  CHECK(parse_length_spec(path, "--prompt-tokens").error.find("line 2")
        != std::string::npos);
  std::remove(path.c_str());
  CHECK(parse_generate_api("openai-chat") == generate_api::openai_chat);
  CHECK_FALSE(parse_generate_api("vllm"));
}
