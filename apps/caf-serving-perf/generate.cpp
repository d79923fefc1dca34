#include "generate.hpp"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include <simdjson.h>

namespace caf_serving::perf {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) {
      return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    };
    if (lower(a[i]) != lower(b[i]))
      return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty()
         && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

/// A non-negative decimal (base 10) or hex (base 16) number; nullopt if not.
std::optional<int64_t> parse_number(std::string_view s, int base) {
  if (s.empty() || s.size() > 15)
    return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return std::nullopt;
    v = v * base + d;
  }
  return v;
}

void json_quote(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

/// Common English words, each one token in GPT-2-style and SentencePiece
/// vocabularies when preceded by a space: a synthetic prompt of N words is
/// about N tokens (the server's `usage` gives the true count).
constexpr const char* prompt_words[] = {
  "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was",
  "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from",
  "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
  "one", "all", "we", "can", "her", "has", "there", "been", "if", "more",
  "when", "will", "would", "who", "so", "no"};

std::string synthetic_text(int64_t words, std::mt19937_64& rng) {
  constexpr auto count = sizeof(prompt_words) / sizeof(prompt_words[0]);
  std::uniform_int_distribution<std::size_t> pick(0, count - 1);
  std::string text;
  for (int64_t i = 0; i < words; ++i) {
    if (i > 0)
      text += ' ';
    text += prompt_words[pick(rng)];
  }
  return text;
}

} // namespace

std::optional<generate_api> parse_generate_api(std::string_view text) {
  if (text == "openai-completions")
    return generate_api::openai_completions;
  if (text == "openai-chat")
    return generate_api::openai_chat;
  if (text == "triton")
    return generate_api::triton;
  return std::nullopt;
}

std::string_view generate_api_name(generate_api api) {
  switch (api) {
    case generate_api::openai_completions:
      return "openai-completions";
    case generate_api::openai_chat:
      return "openai-chat";
    case generate_api::triton:
      return "triton";
  }
  return "?";
}

parsed_length parse_length_spec(std::string_view text,
                                std::string_view option) {
  parsed_length r;
  auto colon = text.find(':');
  if (colon != std::string_view::npos) {
    auto a = parse_number(text.substr(0, colon), 10);
    auto b = parse_number(text.substr(colon + 1), 10);
    if (a && b && *a >= 1 && *a <= *b) {
      r.value.low = *a;
      r.value.high = *b;
      return r;
    }
    r.error = std::string(option) + " '" + std::string(text)
              + "' is not a range A:B with 1 <= A <= B (e.g. 64:256)";
    return r;
  }
  if (auto n = parse_number(text, 10)) {
    if (*n < 1) {
      r.error = std::string(option) + " must be at least 1";
      return r;
    }
    r.value.low = r.value.high = *n;
    return r;
  }
  std::ifstream in{std::string(text)};
  if (!in) {
    r.error = std::string(option) + " '" + std::string(text)
              + "' is neither a count N, a range A:B nor a readable file "
                "with one count per line";
    return r;
  }
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    auto t = trim(line);
    if (t.empty() || t.front() == '#')
      continue;
    auto n = parse_number(t, 10);
    if (!n || *n < 1) {
      r.error = std::string(option) + " file '" + std::string(text)
                + "', line " + std::to_string(line_no) + ": '"
                + std::string(t) + "' is not a positive token count";
      return r;
    }
    r.value.values.push_back(*n);
  }
  if (r.value.values.empty())
    r.error = std::string(option) + " file '" + std::string(text)
              + "' holds no counts; write one positive count per line";
  return r;
}

std::vector<int64_t> draw_lengths(const length_spec& spec, std::size_t n,
                                  uint64_t seed) {
  std::vector<int64_t> out;
  out.reserve(n);
  if (!spec.values.empty()) {
    for (std::size_t i = 0; i < n; ++i)
      out.push_back(spec.values[i % spec.values.size()]);
    return out;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(spec.low, spec.high);
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(spec.low == spec.high ? spec.low : pick(rng));
  return out;
}

generate_body build_generate_body(const generate_request_config& c) {
  std::mt19937_64 rng(c.seed);
  generate_body r;
  std::string& b = r.body;
  auto max_tokens = std::to_string(c.output_tokens);
  std::string eos = c.ignore_eos ? "true" : "false";
  switch (c.api) {
    case generate_api::openai_completions: {
      r.path = "/v1/completions";
      b = "{\"model\":";
      json_quote(b, c.model);
      b += ",\"prompt\":[";
      std::uniform_int_distribution<int64_t> id(c.first_token_id,
                                                c.last_token_id);
      for (int64_t i = 0; i < c.prompt_tokens; ++i) {
        if (i > 0)
          b += ',';
        b += std::to_string(id(rng));
      }
      b += "]";
      break;
    }
    case generate_api::openai_chat:
      r.path = "/v1/chat/completions";
      b = "{\"model\":";
      json_quote(b, c.model);
      b += ",\"messages\":[{\"role\":\"user\",\"content\":";
      json_quote(b, synthetic_text(c.prompt_tokens, rng));
      b += "}]";
      break;
    case generate_api::triton:
      r.path = "/v2/models/" + c.model + "/generate_stream";
      b = "{\"text_input\":";
      json_quote(b, synthetic_text(c.prompt_tokens, rng));
      b += ",\"parameters\":{\"max_tokens\":" + max_tokens
           + ",\"min_tokens\":" + max_tokens + ",\"temperature\":0"
           + ",\"ignore_eos\":" + eos + "}}";
      return r;
  }
  b += ",\"max_tokens\":" + max_tokens;
  if (c.ignore_eos)
    b += ",\"min_tokens\":" + max_tokens;
  b += ",\"temperature\":0,\"ignore_eos\":" + eos
       + ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
  return r;
}

void stream_decoder::fail(std::string what) {
  state_ = state::failed;
  error_ = std::move(what);
}

void stream_decoder::parse_header() {
  auto end = pending_.find("\r\n\r\n");
  std::string_view head(pending_.data(), end);
  auto line_end = head.find("\r\n");
  auto status_line = head.substr(0, line_end);
  if (status_line.size() < 12 || status_line.substr(0, 5) != "HTTP/") {
    fail("the answer does not start with an HTTP status line");
    return;
  }
  auto code = parse_number(status_line.substr(9, 3), 10);
  if (!code) {
    fail("bad status code in '" + std::string(status_line) + "'");
    return;
  }
  status_ = static_cast<int>(*code);
  bool chunked = false;
  std::optional<int64_t> length;
  std::size_t pos = line_end == std::string_view::npos ? head.size()
                                                       : line_end + 2;
  while (pos < head.size()) {
    auto eol = head.find("\r\n", pos);
    if (eol == std::string_view::npos)
      eol = head.size();
    auto line = head.substr(pos, eol - pos);
    pos = eol + 2;
    auto colon = line.find(':');
    if (colon == std::string_view::npos)
      continue;
    auto name = line.substr(0, colon);
    auto value = trim(line.substr(colon + 1));
    if (iequals(name, "content-length"))
      length = parse_number(value, 10);
    else if (iequals(name, "transfer-encoding"))
      chunked = value.find("chunked") != std::string_view::npos;
    else if (iequals(name, "content-type"))
      event_stream_ = value.substr(0, 17) == "text/event-stream";
  }
  pending_.erase(0, end + 4);
  if (chunked) {
    state_ = state::chunk_size;
  } else if (length) {
    left_ = static_cast<std::size_t>(*length);
    state_ = state::length_body;
  } else {
    fail("the answer has neither Content-Length nor chunked encoding");
  }
}

void stream_decoder::sse_line(std::string_view line, int64_t at_ns) {
  if (line.empty()) {
    if (has_data_)
      events_.push_back({at_ns, std::move(data_)});
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':')
    return;
  auto colon = line.find(':');
  auto field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ')
      value.remove_prefix(1);
  }
  if (field != "data")
    return;
  if (has_data_)
    data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

void stream_decoder::body_bytes(std::string_view bytes, int64_t at_ns) {
  if (!event_stream_) {
    whole_body_.append(bytes);
    return;
  }
  for (char c : bytes) {
    if (c != '\n') {
      line_ += c;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r')
      line_.pop_back();
    sse_line(line_, at_ns);
    line_.clear();
  }
}

void stream_decoder::feed(std::string_view bytes, int64_t at_ns) {
  if (state_ == state::done || state_ == state::failed)
    return;
  pending_.append(bytes);
  for (;;) {
    switch (state_) {
      case state::header:
        if (pending_.find("\r\n\r\n") == std::string::npos) {
          if (pending_.size() > 64 * 1024)
            fail("the answer's header is longer than 64 KiB");
          return;
        }
        parse_header();
        break;
      case state::length_body: {
        auto n = std::min(left_, pending_.size());
        body_bytes(std::string_view(pending_.data(), n), at_ns);
        pending_.erase(0, n);
        left_ -= n;
        if (left_ > 0)
          return;
        state_ = state::done;
        break;
      }
      case state::chunk_size: {
        auto eol = pending_.find("\r\n");
        if (eol == std::string::npos)
          return;
        std::string_view text(pending_.data(), eol);
        if (auto semi = text.find(';'); semi != std::string_view::npos)
          text = text.substr(0, semi);
        auto size = parse_number(trim(text), 16);
        if (!size) {
          fail("bad chunk size line '" + std::string(text) + "'");
          return;
        }
        pending_.erase(0, eol + 2);
        left_ = static_cast<std::size_t>(*size);
        state_ = left_ == 0 ? state::trailers : state::chunk_data;
        break;
      }
      case state::chunk_data: {
        auto n = std::min(left_, pending_.size());
        body_bytes(std::string_view(pending_.data(), n), at_ns);
        pending_.erase(0, n);
        left_ -= n;
        if (left_ > 0)
          return;
        state_ = state::chunk_end;
        break;
      }
      case state::chunk_end:
        if (pending_.size() < 2)
          return;
        if (pending_.compare(0, 2, "\r\n") != 0) {
          fail("a chunk does not end in CRLF");
          return;
        }
        pending_.erase(0, 2);
        state_ = state::chunk_size;
        break;
      case state::trailers: {
        auto eol = pending_.find("\r\n");
        if (eol == std::string::npos)
          return;
        pending_.erase(0, eol + 2);
        if (eol == 0)
          state_ = state::done;
        break;
      }
      case state::done:
        // An event stream's last event ends at a blank line; a stream cut
        // short of one still delivers what it had.
        if (event_stream_ && !line_.empty()) {
          sse_line(line_, at_ns);
          line_.clear();
        }
        if (event_stream_ && has_data_)
          sse_line("", at_ns);
        if (!event_stream_)
          events_.push_back({at_ns, std::move(whole_body_)});
        return;
      case state::failed:
        return;
    }
  }
}

stream_chunk parse_chunk(generate_api api, std::string_view data) {
  stream_chunk r;
  if (trim(data) == "[DONE]") {
    r.done_marker = true;
    return r;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(data.data(), data.size()).get(doc); err) {
    r.error = "a streamed chunk is not JSON ("
              + std::string(simdjson::error_message(err)) + "): "
              + std::string(data.substr(0, 200));
    return r;
  }
  if (auto e = doc["error"]; !e.error()) {
    std::string_view message;
    if (e["message"].get(message) && e.get(message))
      message = "(no message)";
    r.error = "the server streamed an error: " + std::string(message);
    return r;
  }
  std::string_view text;
  if (api == generate_api::triton) {
    r.has_content = !doc["text_output"].get(text) && !text.empty();
    return r;
  }
  simdjson::dom::array choices;
  if (!doc["choices"].get(choices)) {
    for (auto choice : choices) {
      auto field = api == generate_api::openai_chat
                     ? choice["delta"]["content"]
                     : choice["text"];
      if (!field.get(text) && !text.empty())
        r.has_content = true;
    }
  }
  simdjson::dom::object usage;
  if (!doc["usage"].get(usage)) {
    int64_t n = 0;
    if (!usage["prompt_tokens"].get(n))
      r.prompt_tokens = n;
    if (!usage["completion_tokens"].get(n))
      r.completion_tokens = n;
  }
  return r;
}

generation_result read_generation(generate_api api, const completion& done) {
  generation_result r;
  r.value.start_ns = done.start_ns;
  r.value.end_ns = done.end_ns;
  if (done.status != 200) {
    r.error = done.status == 0 ? "the connection failed"
                               : "HTTP " + std::to_string(done.status);
    return r;
  }
  stream_decoder decoder;
  std::size_t from = 0;
  for (const auto& mark : done.reads) {
    decoder.feed(std::string_view(done.response).substr(from, mark.end - from),
                 mark.at_ns);
    from = mark.end;
  }
  if (!decoder.error().empty()) {
    r.error = decoder.error();
    return r;
  }
  if (!decoder.done()) {
    r.error = "the answer ended early";
    return r;
  }
  for (const auto& event : decoder.events()) {
    auto chunk = parse_chunk(api, event.data);
    if (!chunk.error.empty()) {
      r.error = chunk.error;
      return r;
    }
    if (chunk.has_content)
      r.value.content_ns.push_back(event.at_ns);
    if (chunk.prompt_tokens >= 0)
      r.value.prompt_tokens = chunk.prompt_tokens;
    if (chunk.completion_tokens >= 0)
      r.value.output_tokens = chunk.completion_tokens;
  }
  if (r.value.content_ns.empty())
    r.error = "the answer streamed no content";
  return r;
}

token_timing timing_of(const generation_timeline& t,
                       int64_t asked_prompt_tokens) {
  token_timing r;
  r.e2e_ns = t.end_ns - t.start_ns;
  r.ttft_ns = t.content_ns.empty() ? r.e2e_ns : t.content_ns.front() - t.start_ns;
  for (std::size_t i = 1; i < t.content_ns.size(); ++i)
    r.itl_ns.push_back(t.content_ns[i] - t.content_ns[i - 1]);
  r.output_tokens = t.output_tokens >= 0
                      ? t.output_tokens
                      : static_cast<int64_t>(t.content_ns.size());
  r.prompt_tokens = t.prompt_tokens >= 0 ? t.prompt_tokens : asked_prompt_tokens;
  if (r.output_tokens > 1)
    r.tpot_ns = (r.e2e_ns - r.ttft_ns) / (r.output_tokens - 1);
  return r;
}

bool meets_targets(const token_timing& t, const goodput_targets& targets) {
  if (targets.ttft_ms > 0 && static_cast<double>(t.ttft_ns) > targets.ttft_ms * 1e6)
    return false;
  if (targets.tpot_ms > 0 && t.tpot_ns >= 0
      && static_cast<double>(t.tpot_ns) > targets.tpot_ms * 1e6)
    return false;
  return true;
}

generation_summary summarize_generations(const window_summary& w,
                                         const goodput_targets& targets,
                                         double chosen) {
  generation_summary s;
  std::vector<int64_t> ttft, tpot, itl, e2e;
  for (const auto& g : w.generations) {
    ++s.requests;
    s.prompt_tokens += static_cast<uint64_t>(g.prompt_tokens);
    s.output_tokens += static_cast<uint64_t>(g.output_tokens);
    ttft.push_back(g.ttft_ns);
    e2e.push_back(g.e2e_ns);
    if (g.tpot_ns >= 0)
      tpot.push_back(g.tpot_ns);
    itl.insert(itl.end(), g.itl_ns.begin(), g.itl_ns.end());
    if (meets_targets(g, targets))
      ++s.good;
  }
  s.ttft = summarize(std::move(ttft), chosen);
  s.tpot = summarize(std::move(tpot), chosen);
  s.itl = summarize(std::move(itl), chosen);
  s.e2e = summarize(std::move(e2e), chosen);
  if (w.duration_ns > 0) {
    double seconds = static_cast<double>(w.duration_ns) / 1e9;
    s.requests_per_s = static_cast<double>(s.requests) / seconds;
    s.output_tokens_per_s = static_cast<double>(s.output_tokens) / seconds;
    s.goodput = static_cast<double>(s.good) / seconds;
  }
  return s;
}

std::vector<token_timing> read_generations(
  generate_api api, std::vector<completion>& done,
  const std::vector<int64_t>& asked_prompt_tokens) {
  std::vector<token_timing> out;
  for (auto& c : done) {
    if (c.status != 200)
      continue;
    auto g = read_generation(api, c);
    c.response.clear();
    c.response.shrink_to_fit();
    c.reads.clear();
    if (!g.error.empty()) {
      c.status = 0;
      continue;
    }
    int64_t asked = c.request < asked_prompt_tokens.size()
                      ? asked_prompt_tokens[c.request]
                      : 0;
    out.push_back(timing_of(g.value, asked));
  }
  return out;
}

} // namespace caf_serving::perf
