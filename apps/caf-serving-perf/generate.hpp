/// The generative mode of caf-serving-perf: request bodies for OpenAI's
/// completions and chat completions and Triton's generate_stream, a decoder
/// of their streamed answers (HTTP framing, chunked transfer encoding and
/// server-sent events, fed in pieces as they arrived) that times each
/// content chunk, and the token latencies read off that timeline.
///
///   auto timeline = read_generation(generate_api::openai_completions, done);
///   auto timing = timing_of(timeline.value);         // TTFT, ITL, TPOT, e2e
///   auto summary = summarize_generations(window, targets, 99);
///
/// Definitions (also in the README):
///   TTFT = request sent (or due, open loop) -> first non-empty content chunk
///   ITL  = the gaps between successive content chunks
///   TPOT = (e2e - TTFT) / (output tokens - 1)
///   e2e  = request sent -> the answer's last byte
///   goodput = requests per second whose TTFT and TPOT are both within their
///             targets (DistServe's definition)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "latency.hpp"
#include "load_loop.hpp"

namespace caf_serving::perf {

/// Which generate endpoint is measured.
enum class generate_api {
  /// POST /v1/completions; prompts are token-id arrays of the exact length.
  openai_completions,
  /// POST /v1/chat/completions; prompts are synthetic text.
  openai_chat,
  /// POST /v2/models/{m}/generate_stream; prompts are synthetic text.
  triton,
};

/// "openai-completions", "openai-chat", "triton"; nullopt for anything else.
std::optional<generate_api> parse_generate_api(std::string_view text);
std::string_view generate_api_name(generate_api api);

/// Token counts of prompts or outputs: one value, a uniform range, or the
/// values of a file (drawn from in turn).
struct length_spec {
  int64_t low = 0;
  int64_t high = 0;
  /// From a file; when not empty, `low` and `high` are unused.
  std::vector<int64_t> values;
};

struct parsed_length {
  length_spec value;
  std::string error;
};

/// Parses "N", "A:B" (uniform in [A, B]) or the path of a file with one
/// positive count per line (blank lines and '#' comments skipped).
/// `option` names the option in error messages.
parsed_length parse_length_spec(std::string_view text, std::string_view option);

/// `n` counts drawn from `spec` with `seed`: the file's values in turn,
/// else uniform in [low, high].
std::vector<int64_t> draw_lengths(const length_spec& spec, std::size_t n,
                                  uint64_t seed);

/// One request's body and path.
struct generate_request_config {
  generate_api api = generate_api::openai_completions;
  std::string model;
  int64_t prompt_tokens = 1;
  int64_t output_tokens = 1;
  /// Sent as `ignore_eos` so the output has the asked length.
  bool ignore_eos = true;
  /// Token ids of completions' prompts are drawn uniformly from
  /// [first, last] (ids every vocabulary has: plain tokens, no specials).
  int64_t first_token_id = 100;
  int64_t last_token_id = 499;
  uint64_t seed = 1;
};

struct generate_body {
  std::string path;
  std::string body;
};

/// The JSON body: streamed (`stream: true` with usage for OpenAI), greedy
/// (temperature 0), `max_tokens` (and `min_tokens`) the asked output length.
generate_body build_generate_body(const generate_request_config& config);

/// One server-sent event's data and when its last byte arrived.
struct sse_event {
  int64_t at_ns = 0;
  std::string data;
};

/// Decodes one HTTP response fed in pieces: the header, then a body framed
/// by Content-Length or chunked transfer encoding. A `text/event-stream`
/// body is split into events ("data:" lines, joined with '\n', end at a
/// blank line); any other body is one event when the response ends.
class stream_decoder {
public:
  /// Adds bytes that arrived at `at_ns`.
  void feed(std::string_view bytes, int64_t at_ns);

  /// Events completed so far, in order.
  const std::vector<sse_event>& events() const {
    return events_;
  }
  /// Whether the whole response has been read.
  bool done() const {
    return state_ == state::done;
  }
  int status() const {
    return status_;
  }
  /// What was malformed; empty when nothing was.
  const std::string& error() const {
    return error_;
  }

private:
  enum class state { header, length_body, chunk_size, chunk_data, chunk_end,
                     trailers, done, failed };

  void fail(std::string what);
  void parse_header();
  void body_bytes(std::string_view bytes, int64_t at_ns);
  void sse_line(std::string_view line, int64_t at_ns);

  state state_ = state::header;
  std::string pending_;
  int status_ = 0;
  bool event_stream_ = false;
  std::size_t left_ = 0;
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  std::string whole_body_;
  std::vector<sse_event> events_;
  std::string error_;
};

/// What one streamed chunk says.
struct stream_chunk {
  /// Non-empty generated text.
  bool has_content = false;
  /// From a `usage` object; -1 when absent.
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  /// OpenAI's "[DONE]".
  bool done_marker = false;
  /// An "error" the server streamed, or JSON that did not parse.
  std::string error;
};

stream_chunk parse_chunk(generate_api api, std::string_view data);

/// A generative request's timeline.
struct generation_timeline {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  /// Arrival of each content chunk.
  std::vector<int64_t> content_ns;
  /// From `usage`; -1 when the server gave none (Triton's generate_stream).
  int64_t prompt_tokens = -1;
  int64_t output_tokens = -1;
};

struct generation_result {
  generation_timeline value;
  /// Why the answer is not a usable generation (HTTP status, a streamed
  /// error, no content); empty when it is.
  std::string error;
};

/// Replays a completion's captured bytes (response_capture::timed_bytes)
/// through the decoder and reads its chunks.
generation_result read_generation(generate_api api, const completion& done);

/// The token latencies of a timeline. Output tokens are `usage`'s count,
/// else the number of content chunks; prompt tokens `usage`'s, else
/// `asked_prompt_tokens` (the length the synthetic prompt was made for).
token_timing timing_of(const generation_timeline& timeline,
                       int64_t asked_prompt_tokens);

/// TTFT and TPOT targets in milliseconds; 0 for none.
struct goodput_targets {
  double ttft_ms = 0;
  double tpot_ms = 0;
};

/// Whether a request meets both targets (a one-token answer has no TPOT and
/// meets any TPOT target).
bool meets_targets(const token_timing& timing, const goodput_targets& targets);

/// A window of generative requests.
struct generation_summary {
  uint64_t requests = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  uint64_t prompt_tokens = 0;
  uint64_t output_tokens = 0;
  latency_summary ttft;
  latency_summary tpot;
  latency_summary itl;
  latency_summary e2e;
  /// Requests meeting both targets (all of them without targets).
  uint64_t good = 0;
  double goodput = 0;
};

generation_summary summarize_generations(const window_summary& window,
                                         const goodput_targets& targets,
                                         double chosen_percentile);

/// Turns a window's completions into timings: a failed generation (a
/// streamed error, no content) becomes a failure with status 0. Returns the
/// timings of the successful ones. `asked_prompt_tokens[i]` is the prompt
/// length request i was made for (as in timing_of).
std::vector<token_timing> read_generations(
  generate_api api, std::vector<completion>& done,
  const std::vector<int64_t>& asked_prompt_tokens);

} // namespace caf_serving::perf
