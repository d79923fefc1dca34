// Generative serving over the network (issue 34): the caf-serving binary on a
// repository with the tiny GPT-2 fixture, driven over HTTP as clients drive
// it. 64 prompts at once with greedy decoding (sequences join and leave
// mid-batch) answer transformers' tokens; Triton's generate and
// generate_stream, OpenAI's completions and chat completions (streamed and
// not); bad input answers 400 naming the field; a cache too small for the
// load preempts without failing or changing an answer, and its gauge returns
// to zero; a client that leaves mid-stream frees its sequence; a request
// whose TTFT target cannot be met is shed with a 503 at once; a Llama
// (grouped-query attention, RoPE) served beside it answers its own references.
#include "generation_metrics.hpp"
#include "support/http_client.hpp"
#include "support/json_document.hpp"
#include "support/server_process.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace caf_serving::generative_test;
using namespace caf_serving::support;

namespace {

const std::string fixtures = CAF_SERVING_GENERATIVE_FIXTURES;

struct reference_case {
  std::string prompt;
  std::vector<int64_t> prompt_ids;
  uint32_t max_tokens = 0;
  std::string text;
};

/// The greedy references of fixture model `model` (tools/generative_fixtures.py).
std::vector<reference_case> load_reference(const std::string& model = "tiny_gpt2") {
  std::ifstream in(fixtures + "/" + model + "_reference.json");
  std::stringstream s;
  s << in.rdbuf();
  auto doc = json_document::parse(s.str());
  std::vector<reference_case> out;
  simdjson::dom::array cases = doc.at("/cases").get_array().value();
  for (simdjson::dom::element c : cases) {
    reference_case r;
    r.prompt = std::string(c["prompt"].get_string().value());
    r.prompt_ids = json_ints(c["prompt_ids"].value());
    r.max_tokens = static_cast<uint32_t>(c["max_tokens"].get_int64().value());
    r.text = std::string(c["generated_text"].get_string().value());
    out.push_back(std::move(r));
  }
  return out;
}

/// A repository holding the fixture model, with `parameters` added to its
/// config.pbtxt.
struct repository {
  temp_repository repo;
  explicit repository(const std::string& parameters = "") {
    repo.add_model(fixtures + "/tiny_gpt2");
    if (!parameters.empty()) {
      std::ifstream in(repo.path() / "tiny_gpt2/config.pbtxt");
      std::stringstream s;
      s << in.rdbuf() << parameters;
      repo.write_file("tiny_gpt2/config.pbtxt", s.str());
    }
  }
};

server_config config_for(const repository& r) {
  server_config c;
  c.binary = CAF_SERVING_BINARY;
  c.model_repository = r.repo.path().string();
  return c;
}

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

/// How a reference kept its end-of-sequence token from ending it:
/// transformers' min_new_tokens = max_new_tokens (tools/generative_fixtures.py)
/// never picks it, which min_tokens = max_tokens matches (ignore_eos would only
/// keep it from stopping: the tiny Llama picks it twice); no end-of-sequence id
/// at all (tools/genai_fixtures.py) picks it and goes on, which ignore_eos
/// matches.
enum class eos_rule { min_tokens, ignore_eos };

/// A greedy completion of `c`'s prompt ids.
std::string completion_body(const std::string& model, const reference_case& c, bool stream,
                            eos_rule rule = eos_rule::min_tokens) {
  std::string n = std::to_string(c.max_tokens);
  return "{\"model\":\"" + model + "\",\"prompt\":" + ids_json(c.prompt_ids)
         + ",\"max_tokens\":" + n
         + (rule == eos_rule::min_tokens ? ",\"min_tokens\":" + n : std::string(",\"ignore_eos\":true"))
         + ",\"temperature\":0" + (stream ? ",\"stream\":true" : "") + "}";
}

/// `text` as a JSON string literal.
std::string json_quote(const std::string& text) {
  std::string s = "\"";
  for (unsigned char ch : text) {
    if (ch == '"' || ch == '\\') {
      s += '\\';
      s += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", ch);
      s += esc;
    } else {
      s += static_cast<char>(ch);
    }
  }
  return s + "\"";
}

/// The JSON objects of an SSE body's `data:` lines, [DONE] left out.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    size_t end = body.find("\n\n", at);
    std::string data = body.substr(at + 6, end - at - 6);
    if (data != "[DONE]")
      out.push_back(data);
    at = end;
  }
  return out;
}

/// Sends the 64 reference prompts of `model` at once; returns how many
/// answers differ.
int run_all(uint16_t port, const std::vector<reference_case>& cases, bool stream,
            const std::string& model = "tiny_gpt2", eos_rule rule = eos_rule::min_tokens) {
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i)
    threads.emplace_back([&, i] {
      http_client client(port);
      client.timeout = std::chrono::seconds(120);
      auto r = client.post("/v1/completions", completion_body(model, cases[i], stream, rule),
                           {{"Content-Type", "application/json"}});
      std::string text;
      if (r.status == 200 && stream) {
        for (const auto& e : sse_events(r.body))
          text += json_document::parse(e).string_at("/choices/0/text");
      } else if (r.status == 200) {
        text = json_document::parse(r.body).string_at("/choices/0/text");
      }
      if (r.status != 200 || text != cases[i].text) {
        ++wrong;
        MESSAGE("case " << i << ": status " << r.status << " body " << r.body.substr(0, 300));
      }
    });
  for (auto& t : threads)
    t.join();
  return wrong;
}

} // namespace

TEST_CASE("64 prompts at once answer transformers' greedy tokens, streamed and not") {
  auto cases = load_reference();
  REQUIRE(cases.size() == 64);
  repository repo;
  server_process server(config_for(repo));
  CHECK(server.output().find("generative:") != std::string::npos);
  CHECK(run_all(server.http_port(), cases, false) == 0);
  CHECK(run_all(server.http_port(), cases, true) == 0);
  // A seeded sampled request gives the same text alone and amid 64 others.
  std::string seeded = "{\"model\":\"tiny_gpt2\",\"prompt\":" + ids_json(cases[3].prompt_ids)
                       + ",\"max_tokens\":24,\"temperature\":0.9,\"top_k\":40,\"seed\":11,"
                         "\"ignore_eos\":true}";
  http_client alone_client(server.http_port());
  auto alone = alone_client.post("/v1/completions", seeded);
  REQUIRE(alone.status == 200);
  std::string crowd_text;
  std::thread crowd([&] { CHECK(run_all(server.http_port(), cases, false) == 0); });
  {
    http_client c2(server.http_port());
    auto in_crowd = c2.post("/v1/completions", seeded);
    REQUIRE(in_crowd.status == 200);
    crowd_text = json_document::parse(in_crowd.body).string_at("/choices/0/text");
  }
  crowd.join();
  CHECK(crowd_text == json_document::parse(alone.body).string_at("/choices/0/text"));
  CHECK(wait_metric(server.http_port(), "caf_serving_generation_running", 0));
  CHECK(metric(server.http_port(), "caf_serving_generation_kv_cache_blocks_used") == 0);
  CHECK(metric(server.http_port(), "caf_serving_generation_tokens_total") > 0);
}

TEST_CASE("Triton's generate endpoints and the OpenAI chat endpoint") {
  auto cases = load_reference();
  repository repo;
  server_process server(config_for(repo));
  http_client client(server.http_port());
  const auto& c = cases[5];
  // /generate: text in, text out; the fixture's prompts tokenize back to
  // their ids, so the answer is the reference's.
  std::string prompt_json = json_quote(c.prompt);
  auto r = client.post("/v2/models/tiny_gpt2/generate",
                       "{\"text_input\":" + prompt_json
                         + ",\"exclude_input_in_output\":true,\"parameters\":{\"max_tokens\":"
                         + std::to_string(c.max_tokens)
                         + ",\"temperature\":0,\"ignore_eos\":true}}");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(doc.string_at("/model_name") == "tiny_gpt2");
  CHECK(doc.string_at("/text_output") == c.text);
  // /generate_stream: the events' text_output add up to the same.
  auto s = client.post("/v2/models/tiny_gpt2/generate_stream",
                       "{\"text_input\":" + prompt_json
                         + ",\"parameters\":{\"max_tokens\":" + std::to_string(c.max_tokens)
                         + ",\"temperature\":0,\"ignore_eos\":true}}");
  REQUIRE_MESSAGE(s.status == 200, s.body);
  CHECK(s.header("content-type").find("text/event-stream") != std::string::npos);
  std::string streamed;
  auto events = sse_events(s.body);
  for (const auto& e : events)
    streamed += json_document::parse(e).string_at("/text_output");
  CHECK(events.size() >= 2);
  CHECK(streamed == c.text);
  // The one-answer endpoint refuses a generative model, in Triton's words.
  auto infer = client.post("/v2/models/tiny_gpt2/infer", "{\"inputs\":[]}");
  CHECK(infer.status == 400);
  CHECK(error_message(infer.body).find("decoupled") != std::string::npos);
  // Chat: the model's template renders the messages.
  auto chat = client.post("/v1/chat/completions",
                          "{\"model\":\"tiny_gpt2\",\"messages\":[{\"role\":\"user\","
                          "\"content\":\"the server\"}],\"max_tokens\":5,\"temperature\":0}");
  REQUIRE_MESSAGE(chat.status == 200, chat.body);
  auto cd = json_document::parse(chat.body);
  CHECK(cd.string_at("/object") == "chat.completion");
  CHECK(cd.string_at("/choices/0/message/role") == "assistant");
  CHECK(cd.uint_at("/usage/completion_tokens") >= 1);
  CHECK(cd.uint_at("/usage/completion_tokens") <= 5);
  // The answer carries its own timings (llama.cpp's fields).
  CHECK(cd.uint_at("/timings/predicted_n") == cd.uint_at("/usage/completion_tokens"));
  CHECK(cd.uint_at("/timings/prompt_n") == cd.uint_at("/usage/prompt_tokens"));
  CHECK(cd.at("/timings/prompt_ms").get_double().value() > 0.0);
  // /v1/models lists it.
  auto models = client.get("/v1/models");
  CHECK(models.status == 200);
  CHECK(json_document::parse(models.body).string_at("/data/0/id") == "tiny_gpt2");
  // The same seed gives the same text; sampling is not greedy.
  std::string sampled = "{\"model\":\"tiny_gpt2\",\"prompt\":" + ids_json(c.prompt_ids)
                        + ",\"max_tokens\":12,\"temperature\":1.0,\"top_p\":0.9,\"seed\":7}";
  auto a = client.post("/v1/completions", sampled);
  auto b = client.post("/v1/completions", sampled);
  REQUIRE(a.status == 200);
  CHECK(json_document::parse(a.body).string_at("/choices/0/text")
        == json_document::parse(b.body).string_at("/choices/0/text"));
}

TEST_CASE("bad generative requests answer 400 naming what was wrong") {
  repository repo;
  server_process server(config_for(repo));
  http_client client(server.http_port());
  struct bad {
    std::string path, body, phrase;
  };
  std::string long_prompt = "[";
  for (int i = 0; i < 300; ++i)
    long_prompt += (i ? "," : "") + std::to_string(i % 200 + 1);
  long_prompt += "]";
  std::vector<bad> cases = {
    {"/v1/completions", R"({"model":"tiny_gpt2","prompt":"a","max_tokens":0})", "max_tokens"},
    {"/v1/completions", R"({"model":"tiny_gpt2","prompt":"a","max_tokens":-3})", "max_tokens"},
    {"/v1/completions", R"({"model":"tiny_gpt2","prompt":"a","temprature":1})", "temprature"},
    {"/v1/completions", "{\"model\":\"tiny_gpt2\",\"prompt\":" + long_prompt + "}", "context"},
    {"/v1/completions", "{\"model\":\"tiny_gpt2\",\"prompt\":\"\xff\xfe\"}", "UTF-8"},
    {"/v1/chat/completions", R"({"model":"tiny_gpt2","messages":[{"content":"hi"}]})", "role"},
    {"/v2/models/tiny_gpt2/generate", R"({"text_input":"a","parameters":{"max_tokens":0}})",
     "max_tokens"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.body);
    auto r = client.post(c.path, c.body);
    CHECK(r.status == 400);
    CHECK_MESSAGE(r.body.find(c.phrase) != std::string::npos, r.body);
  }
  auto unknown = client.post("/v1/completions", R"({"model":"nope","prompt":"a"})");
  CHECK(unknown.status == 404);
  // The server still answers.
  auto ok = client.post("/v1/completions", R"({"model":"tiny_gpt2","prompt":"a","max_tokens":2})");
  CHECK(ok.status == 200);
}

TEST_CASE("a cache too small for 64 long generations preempts, and nothing fails or changes") {
  auto cases = load_reference();
  // 24 blocks of 16 positions for 64 sequences of up to 80 positions.
  repository repo("parameters { key: \"kv_cache_bytes\" value: { string_value: \"393216\" } }\n");
  server_process server(config_for(repo));
  CHECK(server.output().find("KV cache 24 blocks") != std::string::npos);
  CHECK(run_all(server.http_port(), cases, false) == 0);
  CHECK(metric(server.http_port(), "caf_serving_generation_preemptions_total") > 0);
  CHECK(wait_metric(server.http_port(), "caf_serving_generation_kv_cache_blocks_used", 0));
}

TEST_CASE("a client that leaves mid-stream frees its sequence") {
  repository repo;
  server_process server(config_for(repo));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.http_port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  std::string body = R"({"model":"tiny_gpt2","prompt":"the","max_tokens":250,"stream":true,)"
                     R"("ignore_eos":true})";
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nContent-Length: "
                    + std::to_string(body.size()) + "\r\n\r\n" + body;
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  CHECK(got.find("200 OK") != std::string::npos);
  ::close(fd);
  CHECK(wait_metric(server.http_port(), "caf_serving_generation_cancelled_total", 1));
  CHECK(wait_metric(server.http_port(), "caf_serving_generation_running", 0));
  CHECK(wait_metric(server.http_port(), "caf_serving_generation_kv_cache_blocks_used", 0));
}

TEST_CASE("a full queue answers 503 at once, and every request gets an answer") {
  // Two sequences run, two wait; the rest of 24 concurrent requests are
  // refused with a 503 naming the queue, not left hanging.
  repository repo("parameters { key: \"max_sequences\" value: { string_value: \"2\" } }\n"
                  "parameters { key: \"max_waiting\" value: { string_value: \"2\" } }\n"
                  "parameters { key: \"max_step_tokens\" value: { string_value: \"8\" } }\n");
  server_process server(config_for(repo));
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 24; ++i)
    threads.emplace_back([&] {
      http_client client(server.http_port());
      auto r = client.post("/v1/completions",
                           R"({"model":"tiny_gpt2","prompt":"the server","max_tokens":64,)"
                           R"("ignore_eos":true,"temperature":0})");
      if (r.status == 200)
        ++ok;
      else if (r.status == 503 && r.body.find("queue") != std::string::npos)
        ++refused;
      else {
        ++other;
        MESSAGE(r.status << " " << r.body);
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(ok >= 2);
  CHECK(refused >= 1);
  CHECK(other == 0);
  CHECK(ok + refused == 24);
  CHECK(wait_metric(server.http_port(), "caf_serving_generation_kv_cache_blocks_used", 0));
}

TEST_CASE("a request whose first token cannot come within its TTFT target is shed with a "
          "503 at once; a looser one waits its turn and answers") {
  // One running slot: behind 250-token generations, a request's first token
  // waits for all of them, which the scheduler's replay of the steps ahead sees.
  repository repo("parameters { key: \"max_sequences\" value: { string_value: \"1\" } }\n");
  server_process server(config_for(repo));
  http_client client(server.http_port());
  client.timeout = std::chrono::seconds(120);
  auto completion = [&](int max_tokens, const std::string& extra) {
    return client.post("/v1/completions",
                       R"({"model":"tiny_gpt2","prompt":"the server","temperature":0,)"
                       R"("ignore_eos":true,"max_tokens":)"
                         + std::to_string(max_tokens) + extra + "}",
                       {{"Content-Type", "application/json"}});
  };
  // Steps of two sizes (a prefill, then decodes) teach the step cost model.
  REQUIRE(completion(24, "").status == 200);
  // Six 250-token generations for the one slot: once four wait, a thousand steps or more are
  // ahead of any new request, however fast this machine runs them.
  std::vector<http_response> long_ones(6);
  std::vector<std::thread> runners;
  for (auto& r : long_ones)
    runners.emplace_back([&, at = &r] {
      http_client c(server.http_port());
      c.timeout = std::chrono::seconds(120);
      *at = c.post("/v1/completions",
                   R"({"model":"tiny_gpt2","prompt":"the","max_tokens":250,)"
                   R"("ignore_eos":true,"temperature":0})",
                   {{"Content-Type", "application/json"}});
    });
  auto waiting_at_least = [&](double n) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      if (metric(server.http_port(), "caf_serving_generation_waiting") >= n)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  REQUIRE(waiting_at_least(4));
  auto shed = completion(4, R"(,"ttft_target_ms":1)");
  CHECK(shed.status == 503);
  CHECK(shed.body.find("time-to-first-token target of 1 ms") != std::string::npos);
  CHECK(metric(server.http_port(), "caf_serving_generation_shed_total") == 1);
  auto waited = completion(4, R"(,"ttft_target_ms":600000)");
  CHECK(waited.status == 200);
  CHECK(json_document::parse(waited.body).int_at("/usage/completion_tokens") == 4);
  for (auto& t : runners)
    t.join();
  for (const auto& r : long_ones) {
    CHECK(r.status == 200);
    if (r.status == 200)
      CHECK(json_document::parse(r.body).int_at("/usage/completion_tokens") == 250);
  }
  CHECK(metric(server.http_port(), "caf_serving_generation_ttft_lateness_ratio") > 0);
  // Where the steps' time went: the model's run is most of it, and every stage is there.
  auto stage = [&](const std::string& name) {
    auto body = client.get("/metrics").body;
    std::string key = "caf_serving_generation_step_stage_us_total{model=\"tiny_gpt2\","
                      "version=\"1\",stage=\"" + name + "\"} ";
    auto at = body.find(key);
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + key.size()));
  };
  const double model = stage("model"), sample = stage("sample");
  CHECK(model > 0);
  CHECK(sample > 0);
  CHECK(stage("handoff") >= 0);
  CHECK(stage("scheduler") >= 0);
}

TEST_CASE("a Llama served beside GPT-2 answers its 64 prompts at once with transformers' tokens") {
  auto llama = load_reference("tiny_llama");
  REQUIRE(llama.size() == 64);
  repository repo;
  repo.repo.add_model(fixtures + "/tiny_llama");
  server_process server(config_for(repo));
  // 2 KV heads (grouped-query attention) for 4 query heads.
  CHECK(server.output().find("tiny_llama (1): generative: 2 layers, 2 KV heads of 16")
        != std::string::npos);
  CHECK(run_all(server.http_port(), llama, false, "tiny_llama") == 0);
  CHECK(run_all(server.http_port(), llama, true, "tiny_llama") == 0);
  // The other model still answers its own.
  auto gpt2 = load_reference();
  http_client client(server.http_port());
  auto r = client.post("/v1/completions", completion_body("tiny_gpt2", gpt2[3], false),
                       {{"Content-Type", "application/json"}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json_document::parse(r.body).string_at("/choices/0/text") == gpt2[3].text);
  auto models = client.get("/v1/models");
  CHECK(models.body.find("\"tiny_llama\"") != std::string::npos);
  CHECK(models.body.find("\"tiny_gpt2\"") != std::string::npos);
}

TEST_CASE("onnxruntime-genai's builds (GroupQueryAttention; int4 MatMulNBits) served beside "
          "each other answer their 64 prompts at once") {
  // The loader reads genai_config.json: the head size, the left-aligned past
  // of GroupQueryAttention, eos; the references keep end-of-sequence tokens.
  repository repo;
  for (const char* model : {"genai_llama_fp32", "genai_llama_int4"})
    repo.repo.add_model(fixtures + "/" + model);
  server_process server(config_for(repo));
  for (const char* model : {"genai_llama_fp32", "genai_llama_int4"}) {
    CAPTURE(model);
    auto cases = load_reference(model);
    REQUIRE(cases.size() == 64);
    CHECK(run_all(server.http_port(), cases, false, model, eos_rule::ignore_eos) == 0);
    CHECK(run_all(server.http_port(), cases, true, model, eos_rule::ignore_eos) == 0);
  }
}
