// Chat templates rendered as jinja2 renders them (issue 34). The expected
// outputs and errors come from jinja2 3.1.6 itself, run by
// tools/chat_template_fixtures.py with transformers' environment, and are
// compared byte for byte.
#include "text/chat_template.hpp"

#include "text/jinja_builtins.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <sstream>

using namespace caf_serving;
using namespace caf_serving::text;

namespace {

const std::string fixtures = CAF_SERVING_CHAT_TEMPLATE_FIXTURES;

std::string read_file(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The first line where `got` and `want` differ, with both lines shown.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i])
    ++i;
  size_t line_start = want.rfind('\n', i == 0 ? 0 : i - 1);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  size_t line_no = static_cast<size_t>(std::count(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(line_start), '\n')) + 1;
  auto line_at = [&](const std::string& s) {
    if (line_start > s.size())
      return std::string{"<ends before this line>"};
    size_t e = s.find('\n', line_start);
    return s.substr(line_start, e == std::string::npos ? std::string::npos : e - line_start);
  };
  std::ostringstream out;
  out << "first difference at byte " << i << " (output line " << line_no << ")\n"
      << "  jinja2: " << jinja::to_python_repr(jinja::value{line_at(want)}) << "\n"
      << "  ours:   " << jinja::to_python_repr(jinja::value{line_at(got)}) << "\n"
      << "  lengths: jinja2 " << want.size() << ", ours " << got.size();
  return out.str();
}

const jinja::value& field(const jinja::value& obj, std::string_view key) {
  static const jinja::value missing;
  const jinja::value* v = obj.as_object().find(key);
  return v != nullptr ? *v : missing;
}

} // namespace

TEST_CASE("every fixture renders as jinja2 renders it") {
  auto doc = jinja::value::from_json(read_file(fixtures + "/cases.json"));
  REQUIRE_MESSAGE(doc.ok(), doc.error().message);
  const auto& cases = field(*doc, "cases").as_array();
  REQUIRE(cases.size() > 200);
  size_t passed = 0;
  for (const auto& c : cases) {
    std::string name = field(c, "name").as_string();
    CAPTURE(name);
    std::string source = field(c, "source").is_string()
                           ? field(c, "source").as_string()
                           : read_file(fixtures + "/" + field(c, "template_file").as_string());
    auto tmpl = chat_template::parse(source);
    const auto& error = field(c, "error");
    if (!error.is_undefined()) {
      std::string type = field(error, "type").as_string();
      std::string message = field(error, "message").as_string();
      if (!tmpl) {
        // A syntax error: ours names the line jinja2 names.
        CHECK_MESSAGE(field(error, "raised").as_bool() == false, tmpl.error().message);
        if (field(error, "lineno").is_int())
          CHECK_MESSAGE(tmpl.error().message.find(
                          "line " + std::to_string(field(error, "lineno").as_int()) + ",")
                          != std::string::npos,
                        "jinja2: line " << field(error, "lineno").as_int() << ": " << message
                                        << "\nours: " << tmpl.error().message);
        ++passed;
        continue;
      }
      CHECK_MESSAGE(type != "TemplateSyntaxError",
                    "jinja2 refuses this template at parse time (" << message << "), we parse it");
      auto out = tmpl->render(field(c, "context").as_object());
      if (out.ok()) {
        FAIL_CHECK("jinja2 fails with " << type << ": " << message << "\nwe render: " << *out);
        continue;
      }
      CHECK(out.error().status == status_code::bad_request);
      if (field(error, "raised").as_bool())
        CHECK_MESSAGE(out.error().message == message, "raise_exception's message must come back as it is");
      else
        CHECK_MESSAGE(out.error().message.rfind("chat template line ", 0) == 0, out.error().message);
      ++passed;
      continue;
    }
    REQUIRE_MESSAGE(tmpl.ok(), tmpl.error().message);
    auto out = tmpl->render(field(c, "context").as_object());
    if (!out.ok()) {
      FAIL_CHECK("render failed: " << out.error().message);
      continue;
    }
    const std::string& want = field(c, "expected").as_string();
    if (*out != want)
      FAIL_CHECK(first_difference(*out, want));
    else
      ++passed;
  }
  MESSAGE(passed << " of " << cases.size() << " cases match jinja2");
}

TEST_CASE("a syntax error names line, column and what was expected") {
  auto t = chat_template::parse("ok\n{% for m in messages %}\n  {{ m.role + }}\n{% endfor %}");
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().message
        == "chat template syntax error at line 3, column 15: unexpected end of print statement "
           "'}}', expected an expression");
  auto unclosed = chat_template::parse("{% if x %}\n{% for m in messages %}\n");
  REQUIRE_FALSE(unclosed.ok());
  CHECK(unclosed.error().message.find("expected 'endfor' or 'else' to close the 'for' at line 2")
        != std::string::npos);
  auto stray = chat_template::parse("{% if x %}{% endfor %}");
  REQUIRE_FALSE(stray.ok());
  CHECK(stray.error().message
        == "chat template syntax error at line 1, column 14: unknown tag 'endfor', expected "
           "'elif' or 'else' or 'endif' to close the 'if' at line 1");
}

TEST_CASE("a runtime error names the template line") {
  auto t = chat_template::parse("a\nb\n{% if true %}\n  {{ nope() }}\n{% endif %}");
  REQUIRE(t.ok());
  auto out = t->render(jinja::object{});
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().message == "chat template line 4: 'nope' is undefined");
}

TEST_CASE("raise_exception's message comes back verbatim as a 400") {
  auto t = chat_template::parse("{{ raise_exception('System role not supported') }}");
  REQUIRE(t.ok());
  auto out = t->render(jinja::object{});
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().status == status_code::bad_request);
  CHECK(out.error().message == "System role not supported");
}

TEST_CASE("a render stops at the step and output limits") {
  // range() is bounded by the sandbox, but nested loops are not.
  std::string loops = "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                      "{% endfor %}{% endfor %}{% endfor %}";
  render_limits limits;
  limits.max_steps = 100'000;
  auto t = chat_template::parse(loops, limits);
  REQUIRE(t.ok());
  auto out = t->render(jinja::object{});
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().message.find("stopped after 100000 steps") != std::string::npos);

  render_limits small_output;
  small_output.max_output_bytes = 1000;
  auto big = chat_template::parse("{% for a in range(100) %}{{ 'x' * 100 }}{% endfor %}", small_output);
  REQUIRE(big.ok());
  auto out2 = big->render(jinja::object{});
  REQUIRE_FALSE(out2.ok());
  CHECK(out2.error().message.find("max_output_bytes") != std::string::npos);

  render_limits shallow;
  shallow.max_call_depth = 10;
  auto rec = chat_template::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", shallow);
  REQUIRE(rec.ok());
  auto out3 = rec->render(jinja::object{});
  REQUIRE_FALSE(out3.ok());
  CHECK(out3.error().message.find("max_call_depth") != std::string::npos);
}

TEST_CASE("chat_inputs pass what transformers passes") {
  auto t = chat_template::parse(
    "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
    "{{ tools is none }}/{{ documents is none }}/{{ add_generation_prompt }}/{{ enable_thinking }}");
  REQUIRE(t.ok());
  chat_inputs in;
  auto messages = jinja::value::from_json(R"([{"role": "user", "content": "hi"}])");
  REQUIRE(messages.ok());
  in.messages = *messages;
  in.bos_token = "<s>";
  in.add_generation_prompt = true;
  in.extra.set("enable_thinking", false);
  auto out = t->render(in);
  REQUIRE_MESSAGE(out.ok(), out.error().message);
  CHECK(*out == "<s>user:hi;True/True/True/False");
}

TEST_CASE("strftime_now formats the current time") {
  auto t = chat_template::parse("{{ strftime_now('%Y') }}");
  REQUIRE(t.ok());
  auto out = t->render(jinja::object{});
  REQUIRE(out.ok());
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  CHECK(*out == std::to_string(tm.tm_year + 1900));
}

TEST_CASE("JSON text becomes values as Python's json.loads reads it") {
  auto v = jinja::value::from_json(R"({"b": 1, "a": [1.0, -2, 1e2, "\u00e9\ud83d\ude00", null, true], "b": 3})");
  REQUIRE(v.ok());
  CHECK(jinja::to_python_str(*v) == "{'b': 3, 'a': [1.0, -2, 100.0, 'é😀', None, True]}");
  CHECK_FALSE(jinja::value::from_json("[1, 2").ok());
  CHECK_FALSE(jinja::value::from_json("{\"a\" 1}").ok());
  CHECK(jinja::value::from_json("[1] x").error().message.find("offset 4") != std::string::npos);
}

// Not a check: how long a render takes per message for typical templates, run
// by hand with `text.chat_template.test --no-skip -tc='*render time*'`.
TEST_CASE("render time per message" * doctest::skip()) {
  jinja::array messages;
  messages.emplace_back(jinja::object{{"role", "system"}, {"content", "You are a helpful assistant."}});
  for (int i = 0; i < 100; ++i)
    messages.emplace_back(jinja::object{
      {"role", i % 2 == 0 ? "user" : "assistant"},
      {"content", std::string(200, static_cast<char>('a' + i % 26)) + " message " + std::to_string(i)}});
  auto tools = jinja::value::from_json(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Get the weather", "parameters": {"type": "object", "properties": {"city":
    {"type": "string"}}, "required": ["city"]}}}])");
  REQUIRE(tools.ok());
  for (const char* file : {"chatml_qwen2.jinja", "llama31_tools.jinja", "mistral_v3.jinja", "gemma.jinja"}) {
    auto tmpl = chat_template::parse(read_file(fixtures + "/" + file));
    REQUIRE(tmpl.ok());
    chat_inputs in;
    in.messages = jinja::value{messages};
    in.add_generation_prompt = true;
    in.bos_token = "<s>";
    if (std::string{file} != "gemma.jinja")
      in.tools = *tools;
    else
      in.messages = jinja::value{jinja::array(messages.begin() + 1, messages.end())};
    auto context = in.to_context();
    auto first = tmpl->render(context);
    REQUIRE_MESSAGE(first.ok(), first.error().message);
    const int rounds = 200;
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r)
      CHECK(tmpl->render(context).ok());
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count()
                / rounds;
    MESSAGE(std::string{file} << ": " << us << " us per render of " << in.messages.as_array().size()
                 << " messages (" << us / static_cast<double>(in.messages.as_array().size())
                 << " us per message), " << first->size() << " bytes");
  }
}
