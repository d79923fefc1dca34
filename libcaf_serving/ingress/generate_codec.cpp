// The responses of the generative APIs (generate_codec.hpp): OpenAI's
// objects, chunks and errors, /v1/models, and Triton's generate responses.
// Every function appends to the caller's string and allocates nothing else.

#include "ingress/generate_codec.hpp"

#include "core/json.hpp"

#include <charconv>
#include <cmath>

namespace caf_serving::ingress {

namespace {

void append_uint(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// The shortest text that reads back as `v`; JSON has no infinities or NaN,
/// so those are written as `fallback`.
void append_double(std::string& out, double v, double fallback = 0.0) {
  if (!std::isfinite(v))
    v = fallback;
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// A log-probability: OpenAI and vLLM write an impossible token's -inf as
/// -9999.0. Floats are written as floats (shortest text of the float).
void append_logprob(std::string& out, float v) {
  if (!std::isfinite(v))
    v = -9999.0f;
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
  // "-1" reads back as an integer; a logprob is a float, as Python writes it.
  std::string_view text(buf, static_cast<size_t>(r.ptr - buf));
  if (text.find_first_of(".e") == std::string_view::npos)
    out += ".0";
}

/// `"key":` with the key known to need no escaping.
void append_key(std::string& out, std::string_view key) {
  out += '"';
  out += key;
  out += "\":";
}

void append_finish(std::string& out, generation_finish finish) {
  if (finish == generation_finish::none)
    out += "null";
  else
    append_json_string(out, to_string(finish));
}

void append_meta(std::string& out, const openai_object_meta& meta, std::string_view object) {
  out += "{\"id\":";
  append_json_string(out, meta.id);
  out += ",\"object\":\"";
  out += object;
  out += "\",\"created\":";
  append_int(out, meta.created);
  out += ",\"model\":";
  append_json_string(out, meta.model);
  if (!meta.system_fingerprint.empty()) {
    out += ",\"system_fingerprint\":";
    append_json_string(out, meta.system_fingerprint);
  }
}

void append_usage(std::string& out, const token_usage& usage) {
  out += "{\"prompt_tokens\":";
  append_uint(out, usage.prompt_tokens);
  out += ",\"completion_tokens\":";
  append_uint(out, usage.completion_tokens);
  out += ",\"total_tokens\":";
  append_uint(out, uint64_t{usage.prompt_tokens} + usage.completion_tokens);
  out += '}';
}

void append_timings(std::string& out, const generation_timings& t) {
  auto per_second = [](uint32_t n, double ms) { return ms > 0.0 ? n * 1000.0 / ms : 0.0; };
  out += "{\"prompt_n\":";
  append_uint(out, t.prompt_tokens);
  out += ",\"prompt_ms\":";
  append_double(out, t.prompt_ms);
  out += ",\"prompt_per_second\":";
  append_double(out, per_second(t.prompt_tokens, t.prompt_ms));
  out += ",\"predicted_n\":";
  append_uint(out, t.predicted_tokens);
  out += ",\"predicted_ms\":";
  append_double(out, t.predicted_ms);
  out += ",\"predicted_per_second\":";
  append_double(out, per_second(t.predicted_tokens, t.predicted_ms));
  out += '}';
}

/// Completions' logprobs object: parallel arrays tokens, token_logprobs,
/// top_logprobs (one {token: logprob} object per position), text_offset.
void append_completion_logprobs(std::string& out, const choice_text& c) {
  if (!c.with_logprobs) {
    out += "null";
    return;
  }
  out += "{\"tokens\":[";
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    if (i > 0)
      out += ',';
    append_json_string(out, c.logprobs[i].token);
  }
  out += "],\"token_logprobs\":[";
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    if (i > 0)
      out += ',';
    append_logprob(out, c.logprobs[i].logprob);
  }
  out += "],\"top_logprobs\":[";
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    if (i > 0)
      out += ',';
    out += '{';
    const auto& top = c.logprobs[i].top;
    for (size_t k = 0; k < top.size(); ++k) {
      if (k > 0)
        out += ',';
      append_json_string(out, top[k].token);
      out += ':';
      append_logprob(out, top[k].logprob);
    }
    out += '}';
  }
  out += "],\"text_offset\":[";
  uint64_t offset = c.text_offset;
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    if (i > 0)
      out += ',';
    append_uint(out, offset);
    offset += c.logprobs[i].token.size();
  }
  out += "]}";
}

/// A token's UTF-8 bytes as a JSON array of numbers (OpenAI's "bytes"): the
/// raw bytes, so a token that ends inside a character still joins with the
/// next one.
void append_bytes(std::string& out, std::string_view token) {
  out += '[';
  for (size_t i = 0; i < token.size(); ++i) {
    if (i > 0)
      out += ',';
    append_uint(out, static_cast<unsigned char>(token[i]));
  }
  out += ']';
}

void append_chat_token(std::string& out, std::string_view token, float logprob) {
  out += "{\"token\":";
  append_json_string(out, token);
  out += ",\"logprob\":";
  append_logprob(out, logprob);
  out += ",\"bytes\":";
  append_bytes(out, token);
}

/// Chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}.
void append_chat_logprobs(std::string& out, const choice_text& c) {
  if (!c.with_logprobs) {
    out += "null";
    return;
  }
  out += "{\"content\":[";
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    if (i > 0)
      out += ',';
    const token_logprob& t = c.logprobs[i];
    append_chat_token(out, t.token, t.logprob);
    out += ",\"top_logprobs\":[";
    for (size_t k = 0; k < t.top.size(); ++k) {
      if (k > 0)
        out += ',';
      append_chat_token(out, t.top[k].token, t.top[k].logprob);
      out += '}';
    }
    out += "]}";
  }
  out += "]}";
}

void append_completion_choice(std::string& out, const choice_text& c) {
  out += "{\"index\":0,\"text\":";
  append_json_string(out, c.text);
  out += ",\"logprobs\":";
  append_completion_logprobs(out, c);
  out += ",\"finish_reason\":";
  append_finish(out, c.finish);
  out += '}';
}

void begin_event(std::string& out) {
  out += "data: ";
}

void end_event(std::string& out) {
  out += "\n\n";
}

} // namespace

std::string_view to_string(generation_finish finish) {
  switch (finish) {
    case generation_finish::stop: return "stop";
    case generation_finish::length: return "length";
    case generation_finish::none: break;
  }
  return "";
}

// -- OpenAI -------------------------------------------------------------------

void append_openai_completion(std::string& out, const openai_result& r) {
  append_meta(out, r.meta, "text_completion");
  out += ",\"choices\":[";
  append_completion_choice(out, r.choice);
  out += "],\"usage\":";
  append_usage(out, r.usage);
  if (r.timings) {
    out += ",\"timings\":";
    append_timings(out, *r.timings);
  }
  out += '}';
}

void append_openai_chat_completion(std::string& out, const openai_result& r) {
  append_meta(out, r.meta, "chat.completion");
  out += ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":";
  append_json_string(out, r.choice.text);
  out += "},\"logprobs\":";
  append_chat_logprobs(out, r.choice);
  out += ",\"finish_reason\":";
  append_finish(out, r.choice.finish);
  out += "}],\"usage\":";
  append_usage(out, r.usage);
  if (r.timings) {
    out += ",\"timings\":";
    append_timings(out, *r.timings);
  }
  out += '}';
}

void append_openai_completion_chunk(std::string& out, const openai_chunk& c) {
  begin_event(out);
  append_meta(out, c.meta, "text_completion");
  out += ",\"choices\":[";
  append_completion_choice(out, c.choice);
  out += ']';
  if (c.include_usage)
    out += ",\"usage\":null";
  out += '}';
  end_event(out);
}

void append_openai_chat_chunk(std::string& out, const openai_chunk& c) {
  begin_event(out);
  append_meta(out, c.meta, "chat.completion.chunk");
  out += ",\"choices\":[{\"index\":0,\"delta\":{";
  // The first delta opens the assistant's message; later ones carry only new
  // text, and the last one may be empty ({}), with the finish reason.
  if (c.first) {
    out += "\"role\":\"assistant\",\"content\":";
    append_json_string(out, c.choice.text);
  } else if (!c.choice.text.empty()) {
    out += "\"content\":";
    append_json_string(out, c.choice.text);
  }
  out += "},\"logprobs\":";
  append_chat_logprobs(out, c.choice);
  out += ",\"finish_reason\":";
  append_finish(out, c.choice.finish);
  out += "}]";
  if (c.include_usage)
    out += ",\"usage\":null";
  out += '}';
  end_event(out);
}

void append_openai_usage_chunk(std::string& out, generate_api api, const openai_object_meta& meta,
                               const token_usage& usage) {
  begin_event(out);
  append_meta(out, meta,
              api == generate_api::openai_chat ? "chat.completion.chunk" : "text_completion");
  out += ",\"choices\":[],\"usage\":";
  append_usage(out, usage);
  out += '}';
  end_event(out);
}

void append_sse_done(std::string& out) {
  out += "data: [DONE]\n\n";
}

openai_error openai_error_of(const serving_error& e) {
  openai_error out;
  out.status = e.status;
  out.message = e.message;
  const int status = static_cast<int>(e.status);
  if (e.status == status_code::too_many_requests) {
    out.type = "requests";
    out.code = "rate_limit_exceeded";
  } else if (status >= 500) {
    out.type = "server_error";
  } else {
    out.type = "invalid_request_error";
    if (e.status == status_code::not_found)
      out.code = "model_not_found";
  }
  return out;
}

void append_openai_error(std::string& out, const openai_error& e) {
  out += "{\"error\":{\"message\":";
  append_json_string(out, e.message);
  out += ",\"type\":";
  append_json_string(out, e.type);
  out += ",\"param\":";
  if (e.param.empty())
    out += "null";
  else
    append_json_string(out, e.param);
  out += ",\"code\":";
  if (e.code.empty())
    out += "null";
  else
    append_json_string(out, e.code);
  out += "}}";
}

void append_openai_error_event(std::string& out, const openai_error& e) {
  begin_event(out);
  append_openai_error(out, e);
  end_event(out);
}

void append_openai_model(std::string& out, const openai_model_card& model) {
  out += "{\"id\":";
  append_json_string(out, model.id);
  out += ",\"object\":\"model\",\"created\":";
  append_int(out, model.created);
  out += ",\"owned_by\":";
  append_json_string(out, model.owned_by);
  out += '}';
}

void append_openai_model_list(std::string& out, list_view<const openai_model_card> models) {
  out += "{\"object\":\"list\",\"data\":[";
  for (size_t i = 0; i < models.size(); ++i) {
    if (i > 0)
      out += ',';
    append_openai_model(out, models[i]);
  }
  out += "]}";
}

// -- Triton -------------------------------------------------------------------

void append_triton_generate_response(std::string& out, const triton_generate_result& r) {
  // Name order, as Triton's std::map of outputs writes them:
  // cumulative_logprob < finish_reason < id < model_name < model_version <
  // num_input_tokens < num_output_tokens < text_output.
  out += '{';
  bool first = true;
  auto key = [&](std::string_view k) {
    if (!first)
      out += ',';
    first = false;
    append_key(out, k);
  };
  if (r.cumulative_logprob) {
    key("cumulative_logprob");
    append_double(out, *r.cumulative_logprob, -9999.0);
  }
  if (r.finish_reason) {
    key("finish_reason");
    // vLLM's backend writes str(finish_reason), "None" while running.
    append_json_string(out, *r.finish_reason == generation_finish::none
                              ? std::string_view{"None"}
                              : to_string(*r.finish_reason));
  }
  if (!r.id.empty()) {
    key("id");
    append_json_string(out, r.id);
  }
  key("model_name");
  append_json_string(out, r.model_name);
  key("model_version");
  append_json_string(out, r.model_version);
  if (r.num_input_tokens) {
    key("num_input_tokens");
    append_uint(out, *r.num_input_tokens);
  }
  if (r.num_output_tokens) {
    key("num_output_tokens");
    append_uint(out, *r.num_output_tokens);
  }
  key("text_output");
  append_json_string(out, r.text_output);
  out += '}';
}

void append_triton_generate_event(std::string& out, const triton_generate_result& r) {
  begin_event(out);
  append_triton_generate_response(out, r);
  end_event(out);
}

void append_triton_error(std::string& out, std::string_view message) {
  out += "{\"error\":";
  append_json_string(out, message);
  out += '}';
}

void append_triton_error_event(std::string& out, std::string_view message) {
  begin_event(out);
  append_triton_error(out, message);
  end_event(out);
}

} // namespace caf_serving::ingress
