// OpenAI's /v1/completions and /v1/chat/completions requests (generate_codec.hpp).

#include "ingress/generate_codec.hpp"
#include "ingress/generate_fields.hpp"

#include <array>
#include <limits>

namespace caf_serving::ingress {

using namespace generate_detail;

namespace {

/// Fields an OpenAI request may carry at most once; a repeated key is refused
/// rather than silently taking one of the two values (Python's json takes
/// the last, other parsers the first).
class seen_fields {
public:
  void add(std::string_view key) {
    for (size_t i = 0; i < count_; ++i)
      if (seen_[i] == key)
        fail("field " + in_quotes(key) + " appears more than once; send it once");
    // Every key is known (an unknown one fails first), so there are few.
    if (count_ < seen_.size())
      seen_[count_++] = key;
  }

private:
  std::array<std::string_view, 64> seen_{};
  size_t count_ = 0;
};

/// Documented fields that this server does not implement, and the values
/// that mean "not used" (accepted because the result is the same).
[[noreturn]] void unsupported(std::string_view key, std::string_view accepted) {
  fail(in_quotes(key) + " is not supported by this server; " + std::string{accepted});
}

[[noreturn]] void unknown_field(std::string_view key, std::string_view api) {
  fail("unknown field " + in_quotes(key) + " in a " + std::string{api}
       + " request; see the OpenAI API reference for the fields allowed");
}

const field_reader strict{"", false};

/// stream_options, read once the whole request is known.
struct stream_options_state {
  std::optional<dom::element> value;
};

void read_model(dom::element v, generate_request& req) {
  std::string_view s = strict.string("model", v);
  if (s.empty())
    fail("'model' is empty; name one of the models of /v1/models");
  req.model = std::string{s};
}

void read_stream_options(const stream_options_state& so, generate_request& req) {
  if (!so.value || so.value->is_null())
    return;
  if (!req.stream)
    fail("'stream_options' is only allowed when 'stream' is true");
  dom::object obj;
  if (so.value->get_object().get(obj) != simdjson::SUCCESS)
    strict.wrong("stream_options", *so.value, "an object");
  for (auto field : obj) {
    if (field.key == "include_usage") {
      if (!field.value.is_null())
        req.include_usage = strict.boolean("stream_options.include_usage", field.value);
    } else if (field.key == "continuous_usage_stats") {
      // vLLM: usage on every chunk; accepted only off.
      if (!field.value.is_null() && strict.boolean("stream_options.continuous_usage_stats",
                                                   field.value))
        unsupported("stream_options.continuous_usage_stats", "leave it out or set it false");
    } else {
      fail("unknown field " + in_quotes(field.key)
           + " in 'stream_options'; the one allowed is include_usage");
    }
  }
}

/// Fields both OpenAI APIs share beyond the sampling fields. Returns false
/// when `key` is none of them.
bool apply_openai_field(std::string_view key, dom::element v, generate_request& req,
                        stream_options_state& so) {
  if (key == "model") {
    read_model(v, req);
  } else if (key == "stream") {
    if (!v.is_null())
      req.stream = strict.boolean(key, v);
  } else if (key == "stream_options") {
    so.value = v;
  } else if (key == "user") {
    if (!v.is_null())
      req.user = std::string{strict.string(key, v)};
  } else if (key == "request_id") {
    if (!v.is_null())
      req.request_id = std::string{strict.string(key, v)};
  } else if (key == "logit_bias") {
    dom::object obj;
    if (v.is_null())
      return true;
    if (v.get_object().get(obj) != simdjson::SUCCESS)
      strict.wrong(key, v, "an object mapping token ids to biases");
    if (obj.size() > 0)
      unsupported(key, "leave it out (or send null or {})");
  } else {
    return false;
  }
  return true;
}

void add_prompt_token(dom::element e, const generate_codec_limits& limits,
                      generate_request& req) {
  if (req.prompt_token_ids.size() >= limits.max_prompt_tokens)
    fail("'prompt' holds more than " + std::to_string(limits.max_prompt_tokens)
         + " token ids; send a shorter prompt");
  req.prompt_token_ids.push_back(static_cast<int32_t>(
    strict.integer("prompt", e, 0, std::numeric_limits<int32_t>::max())));
}

/// A completion's prompt: a string, an array of one string, an array of
/// token ids, or an array of one array of token ids.
void read_prompt(dom::element v, const generate_codec_limits& limits, generate_request& req) {
  constexpr std::string_view allowed =
    "a string, an array of token ids, or an array holding one of these";
  std::string_view text;
  dom::array arr;
  auto take_text = [&](std::string_view s) {
    if (s.size() > limits.max_prompt_bytes)
      fail("'prompt' has " + std::to_string(s.size()) + " bytes; at most "
           + std::to_string(limits.max_prompt_bytes) + " are allowed");
    req.prompt = std::string{s};
  };
  if (v.get_string().get(text) == simdjson::SUCCESS) {
    take_text(text);
  } else if (v.get_array().get(arr) == simdjson::SUCCESS) {
    size_t size = arr.size();
    if (size == 0)
      fail("'prompt' is an empty array; send " + std::string{allowed});
    dom::element first = arr.at(0).value_unsafe();
    if (first.is_string() || first.is_array()) {
      if (size > 1)
        fail("'prompt' holds " + std::to_string(size)
             + " prompts, but this server takes one prompt per request; send them as "
               "separate requests");
      if (first.get_string().get(text) == simdjson::SUCCESS) {
        take_text(text);
      } else {
        dom::array ids = first.get_array().value_unsafe();
        for (dom::element e : ids)
          add_prompt_token(e, limits, req);
        if (req.prompt_token_ids.empty())
          fail("'prompt' holds an empty array of token ids; send at least one token");
      }
    } else if (first.is_number()) {
      for (dom::element e : arr)
        add_prompt_token(e, limits, req);
    } else {
      strict.wrong("prompt", v, allowed);
    }
  } else {
    strict.wrong("prompt", v, allowed);
  }
  if (req.prompt.empty() && req.prompt_token_ids.empty())
    fail("'prompt' is empty; send the text (or token ids) to continue");
}

dom::object top_object(dom::element doc, std::string_view api) {
  dom::object top;
  if (doc.get_object().get(top) != simdjson::SUCCESS)
    fail("the request body must be a JSON object (an OpenAI " + std::string{api}
         + " request), not " + shown(doc));
  return top;
}

/// A parser per thread, reused; a huge document would leave its buffers in
/// it forever, so those get a parser of their own.
constexpr size_t cached_parser_limit = size_t{8} << 20;

template <class Parse>
result<generate_request> guarded(std::string_view body, Parse&& parse) {
  thread_local dom::parser cached;
  dom::parser one_off;
  dom::parser& parser = body.size() <= cached_parser_limit ? cached : one_off;
  try {
    return parse(parse_document(parser, body, "the request body"));
  } catch (const field_failure& f) {
    return f.error;
  }
}

// -- chat messages ------------------------------------------------------------

bool known_role(std::string_view role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool"
         || role == "developer";
}

/// The text of a message's content: a string, or an array of text parts.
void read_content(dom::element v, const std::string& where, chat_message& m) {
  std::string_view s;
  if (v.get_string().get(s) == simdjson::SUCCESS) {
    m.content = std::string{s};
    return;
  }
  dom::array parts;
  if (v.get_array().get(parts) != simdjson::SUCCESS)
    fail(where + "'content' must be a string or an array of content parts, got "
         + shown(v));
  size_t index = 0;
  for (dom::element part : parts) {
    std::string at = where + "content part " + std::to_string(index++) + ": ";
    dom::object obj;
    if (part.get_object().get(obj) != simdjson::SUCCESS)
      fail(at + "must be an object {\"type\": \"text\", \"text\": ...}, got " + shown(part));
    std::string_view type;
    if (obj["type"].get_string().get(type) != simdjson::SUCCESS)
      fail(at + "needs a string 'type'; the type supported is \"text\"");
    if (type != "text")
      fail(at + "type " + in_quotes(type)
           + " is not supported by this server; send text parts only");
    std::string_view text;
    if (obj["text"].get_string().get(text) != simdjson::SUCCESS)
      fail(at + "needs a string 'text'");
    if (index > 1)
      m.content += '\n';
    m.content += text;
  }
}

chat_message read_message(dom::element v, size_t index) {
  std::string where = "messages[" + std::to_string(index) + "]: ";
  dom::object obj;
  if (v.get_object().get(obj) != simdjson::SUCCESS)
    fail(where + "must be an object with 'role' and 'content', got " + shown(v));
  chat_message m;
  bool has_role = false, content_seen = false, has_content = false, has_tool_calls = false,
       has_tool_call_id = false;
  for (auto field : obj) {
    auto once = [&](bool& seen) {
      if (seen)
        fail(where + "field " + in_quotes(field.key) + " appears more than once; send it once");
      seen = true;
    };
    if (field.key == "role") {
      once(has_role);
      std::string_view role;
      if (field.value.get_string().get(role) != simdjson::SUCCESS)
        fail(where + "'role' must be a string, got " + shown(field.value));
      m.role = std::string{role};
    } else if (field.key == "content") {
      once(content_seen);
      has_content = !field.value.is_null();
      if (has_content)
        read_content(field.value, where, m);
    } else if (field.key == "name") {
      std::string_view name;
      if (!m.name.empty() || field.value.get_string().get(name) != simdjson::SUCCESS)
        fail(where + "'name' must be one string, got " + shown(field.value));
      m.name = std::string{name};
    } else if (field.key == "tool_calls") {
      once(has_tool_calls);
      if (!field.value.is_array())
        fail(where + "'tool_calls' must be an array, got " + shown(field.value));
    } else if (field.key == "tool_call_id") {
      once(has_tool_call_id);
      if (!field.value.is_string())
        fail(where + "'tool_call_id' must be a string, got " + shown(field.value));
    }
    // Other fields go to the chat template as they are.
  }
  if (!has_role)
    fail(where + "has no 'role'; use system, user, assistant, tool or developer");
  if (!known_role(m.role))
    fail(where + "role " + in_quotes(m.role)
         + " is not one of system, user, assistant, tool, developer");
  if (!has_content && !(m.role == "assistant" && has_tool_calls))
    fail(where + "has no 'content'; a " + m.role + " message needs one"
         + (m.role == "assistant" ? " (or 'tool_calls')" : ""));
  if (has_tool_calls && m.role != "assistant")
    fail(where + "'tool_calls' belongs to assistant messages only");
  if (m.role == "tool" && !has_tool_call_id)
    fail(where + "a tool message needs 'tool_call_id', the id of the call it answers");
  m.json = simdjson::minify(v);
  return m;
}

void read_messages(dom::element v, const generate_codec_limits& limits, generate_request& req) {
  dom::array arr;
  if (v.get_array().get(arr) != simdjson::SUCCESS)
    strict.wrong("messages", v, "an array of message objects");
  size_t total_bytes = 0;
  for (dom::element e : arr) {
    if (req.messages.size() >= limits.max_messages)
      fail("'messages' holds more than " + std::to_string(limits.max_messages)
           + " messages; send at most " + std::to_string(limits.max_messages));
    req.messages.push_back(read_message(e, req.messages.size()));
    total_bytes += req.messages.back().content.size();
    if (total_bytes > limits.max_prompt_bytes)
      fail("the messages' contents have more than " + std::to_string(limits.max_prompt_bytes)
           + " bytes together; send a shorter conversation");
  }
  if (req.messages.empty())
    fail("'messages' is empty; send at least one message");
}

} // namespace

// -- /v1/completions ----------------------------------------------------------

result<generate_request> parse_openai_completion(std::string_view body,
                                                 const generate_codec_limits& limits) {
  return guarded(body, [&](dom::element doc) -> result<generate_request> {
    generate_request req;
    req.api = generate_api::openai_completion;
    // OpenAI's documented default for completions (chat has none).
    req.stop.max_tokens = 16;
    seen_fields seen;
    stream_options_state so;
    bool has_model = false, has_prompt = false;
    for (auto field : top_object(doc, "completions")) {
      std::string_view key = field.key;
      dom::element v = field.value;
      if (key == "prompt") {
        seen.add(key);
        has_prompt = true;
        read_prompt(v, limits, req);
      } else if (key == "echo") {
        seen.add(key);
        if (!v.is_null())
          req.echo = strict.boolean(key, v);
      } else if (key == "logprobs") {
        seen.add(key);
        if (!v.is_null()) {
          req.sampling.logprobs = true;
          req.sampling.top_logprobs = static_cast<uint32_t>(
            strict.integer(key, v, 0, limits.max_completion_logprobs));
        }
      } else if (key == "suffix") {
        seen.add(key);
        std::string_view s;
        if (!v.is_null() && (v.get_string().get(s) != simdjson::SUCCESS || !s.empty()))
          unsupported(key, "leave it out (or send null)");
      } else if (key == "best_of") {
        seen.add(key);
        if (!v.is_null() && strict.integer(key, v, 1, std::numeric_limits<int32_t>::max()) != 1)
          unsupported("best_of > 1", "set 'best_of' to 1 or leave it out");
      } else if (apply_openai_field(key, v, req, so)
                 || apply_shared_field(key, v, strict, limits, req)) {
        seen.add(key);
        has_model = has_model || key == "model";
      } else {
        unknown_field(key, "completions");
      }
    }
    if (!has_model)
      fail("the request has no 'model'; name one of the models of /v1/models");
    if (!has_prompt)
      fail("the request has no 'prompt'; send the text (or token ids) to continue");
    read_stream_options(so, req);
    check_across_fields(req, "");
    return req;
  });
}

// -- /v1/chat/completions -----------------------------------------------------

result<generate_request> parse_openai_chat(std::string_view body,
                                           const generate_codec_limits& limits) {
  return guarded(body, [&](dom::element doc) -> result<generate_request> {
    generate_request req;
    req.api = generate_api::openai_chat;
    seen_fields seen;
    stream_options_state so;
    bool has_model = false, has_messages = false;
    std::optional<uint32_t> max_completion_tokens;
    std::optional<uint32_t> top_logprobs;
    for (auto field : top_object(doc, "chat completions")) {
      std::string_view key = field.key;
      dom::element v = field.value;
      seen.add(key);
      if (key == "messages") {
        has_messages = true;
        read_messages(v, limits, req);
      } else if (key == "max_completion_tokens") {
        if (!v.is_null())
          max_completion_tokens = static_cast<uint32_t>(
            strict.integer(key, v, 1, std::numeric_limits<uint32_t>::max()));
      } else if (key == "logprobs") {
        if (!v.is_null())
          req.sampling.logprobs = strict.boolean(key, v);
      } else if (key == "top_logprobs") {
        if (!v.is_null())
          top_logprobs = static_cast<uint32_t>(strict.integer(key, v, 0, limits.max_top_logprobs));
      } else if (key == "response_format") {
        if (v.is_null())
          continue;
        dom::object obj;
        std::string_view type;
        if (v.get_object().get(obj) != simdjson::SUCCESS
            || obj["type"].get_string().get(type) != simdjson::SUCCESS)
          strict.wrong(key, v, "an object with a string 'type'");
        if (type != "text")
          unsupported("response_format " + in_quotes(type),
                      "structured output is not implemented; send {\"type\": \"text\"} or "
                      "leave it out");
      } else if (key == "tools") {
        dom::array arr;
        if (v.is_null())
          continue;
        if (v.get_array().get(arr) != simdjson::SUCCESS)
          strict.wrong(key, v, "an array of tools");
        if (arr.size() > 0)
          unsupported(key, "tool calling is not implemented; leave 'tools' out");
      } else if (key == "tool_choice") {
        std::string_view choice;
        if (v.is_null())
          continue;
        if (v.get_string().get(choice) != simdjson::SUCCESS || (choice != "none" && choice != "auto"))
          unsupported("tool_choice " + shown(v),
                      "tool calling is not implemented; send \"none\" or leave it out");
      } else if (key == "functions" || key == "function_call") {
        if (!v.is_null())
          unsupported(key, "function calling is not implemented; leave it out");
      } else if (key == "parallel_tool_calls" || key == "store") {
        if (!v.is_null())
          strict.boolean(key, v);
      } else if (key == "metadata") {
        if (!v.is_null() && !v.is_object())
          strict.wrong(key, v, "an object of strings");
      } else if (key == "add_generation_prompt") {
        if (!v.is_null())
          req.add_generation_prompt = strict.boolean(key, v);
      } else if (key == "chat_template_kwargs") {
        if (v.is_null())
          continue;
        if (!v.is_object())
          strict.wrong(key, v, "an object");
        req.chat_template_kwargs = simdjson::minify(v);
      } else if (apply_openai_field(key, v, req, so)
                 || apply_shared_field(key, v, strict, limits, req)) {
        has_model = has_model || key == "model";
      } else {
        unknown_field(key, "chat completions");
      }
    }
    if (!has_model)
      fail("the request has no 'model'; name one of the models of /v1/models");
    if (!has_messages)
      fail("the request has no 'messages'; send the conversation as an array of messages");
    if (max_completion_tokens)
      req.stop.max_tokens = max_completion_tokens;
    if (top_logprobs) {
      if (!req.sampling.logprobs)
        fail("'top_logprobs' needs 'logprobs' set to true");
      req.sampling.top_logprobs = *top_logprobs;
    }
    read_stream_options(so, req);
    check_across_fields(req, "");
    return req;
  });
}

} // namespace caf_serving::ingress
