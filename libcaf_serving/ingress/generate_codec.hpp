#pragma once
/// The request and response codec of the generative APIs (issue 34): bytes of a
/// request body in, a validated plain `generate_request` out; generated text,
/// finish reasons, token counts and log-probabilities in, the exact JSON or
/// server-sent-event bytes each API answers out. No networking, no CAF: the
/// HTTP ingress calls it, the tokenizer and the generation loop read its structs.
///
/// Two families of APIs:
///  - Triton's generate extension (docs/protocol/extension_generate.md):
///    `POST /v2/models/M[/versions/V]/generate` answers one JSON object,
///    `.../generate_stream` answers server-sent events `data: {...}\n\n`.
///    Every top-level key of the body, and every key of its "parameters"
///    object, is an input tensor when the model declares an input of that name
///    and a request parameter otherwise (Triton's http_server.cc).
///  - OpenAI's `/v1/completions`, `/v1/chat/completions` (streaming as SSE,
///    ending `data: [DONE]\n\n`) and `/v1/models`, as vLLM, TGI, llama.cpp's
///    server and Triton's OpenAI front end serve them, with vLLM's extra
///    sampling fields (top_k, min_p, repetition_penalty, ignore_eos, ...).
///
/// Usage:
///
///   auto req = ingress::parse_openai_chat(body);
///   if (!req) { std::string b; ingress::append_openai_error(b, ingress::openai_error_of(req.error())); ... }
///   ...                                   // template, tokenize, generate
///   std::string out;
///   ingress::append_openai_chat_chunk(out, chunk);   // one SSE event per step
///   ingress::append_sse_done(out);
///
/// Encoders append to the caller's string and allocate nothing else, so a
/// stream reuses one buffer for all its events. Every string they write goes
/// through append_json_string: model text that is not valid UTF-8 becomes
/// U+FFFD, and the output is always valid JSON.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/generation_params.hpp"
#include "core/model_config.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

// -- requests -----------------------------------------------------------------

/// Which API a request came through; it decides the response's shape.
enum class generate_api { triton_generate, openai_completion, openai_chat };

/// What one generative request may ask for; over a limit is a 400 naming it.
struct generate_codec_limits {
  /// Bytes of prompt text: the prompt, or all chat messages' contents together.
  size_t max_prompt_bytes = size_t{1} << 20;
  /// Bytes of all inputs of a Triton generate request together, as Triton's
  /// --http-max-input-size (64 MiB by default) bounds them.
  size_t max_triton_input_bytes = size_t{64} << 20;
  /// Token ids of a prompt given as token ids.
  size_t max_prompt_tokens = size_t{1} << 17;
  /// Messages of one chat request.
  size_t max_messages = 1024;
  /// Stop strings (OpenAI's limit is 4) and the bytes of each.
  size_t max_stop_strings = 4;
  size_t max_stop_string_bytes = 256;
  /// Stop token ids (vLLM's stop_token_ids).
  size_t max_stop_token_ids = 64;
  /// Alternatives per token: OpenAI's completions allow logprobs up to 5, chat
  /// top_logprobs up to 20.
  uint32_t max_completion_logprobs = 5;
  uint32_t max_top_logprobs = 20;
};

/// One chat message. The chat template reads `json`, which keeps every field
/// the client sent (tool_calls, tool_call_id, ...); the other members are the
/// ones the codec checks.
struct chat_message {
  /// system, user, assistant, tool or developer.
  std::string role;
  /// The text: the content string, or the text parts joined by "\n" (as vLLM
  /// joins them); empty for an assistant message that has only tool_calls.
  std::string content;
  /// The "name" field; empty when absent.
  std::string name;
  /// The message object as the client sent it, minified JSON.
  std::string json;
};

/// An input or parameter of a Triton generate request that the codec passes
/// on without interpreting it.
struct triton_value {
  std::string name;
  /// The value as minified JSON text (a string keeps its quotes).
  std::string json;
};

/// Triton-only parts of a generate request.
struct triton_generate_extras {
  /// Model inputs present in the request that the codec does not interpret,
  /// each checked against its declared datatype.
  std::vector<triton_value> inputs;
  /// Request parameters (neither inputs nor sampling fields the codec knows).
  std::vector<triton_value> parameters;
  /// vLLM's backend's optional outputs, asked for by BOOL inputs of the same
  /// names (return_finish_reason, ...).
  bool return_finish_reason = false;
  bool return_cumulative_logprob = false;
  bool return_num_input_tokens = false;
  bool return_num_output_tokens = false;
};

/// A generative request, whatever API it came through.
struct generate_request {
  generate_api api = generate_api::openai_completion;
  /// OpenAI: the "model" field. Triton: the model of the URL (the caller's
  /// generate_model_info::name).
  std::string model;
  /// Triton: the "id" field, returned in every response; OpenAI: vLLM's
  /// "request_id" extra. Empty when absent.
  std::string request_id;
  /// The prompt as text (completions, Triton); empty for chat requests and
  /// for prompts given as token ids.
  std::string prompt;
  /// The prompt as token ids (OpenAI completions accept them); when not
  /// empty, `prompt` is empty and the tokenizer is skipped.
  std::vector<int32_t> prompt_token_ids;
  /// Chat requests only, in order.
  std::vector<chat_message> messages;
  sampling_params sampling;
  stop_params stop;
  /// OpenAI: "stream". Triton: the model's "stream" input (vLLM's backend
  /// sends one response per step when set); the URL decides the framing.
  bool stream = false;
  /// OpenAI: stream_options.include_usage.
  bool include_usage = false;
  /// Whether the response's text starts with the prompt: OpenAI completions'
  /// "echo"; Triton: not exclude_input_in_output, which vLLM's backend
  /// defaults to true except when streaming.
  bool echo = false;
  /// Choices per prompt; only 1 is supported (more is a 400).
  uint32_t n = 1;
  /// The engine's extension "ttft_target_ms" (Triton: among the parameters;
  /// OpenAI: a body field): the request's own time-to-first-token target,
  /// which binds where tighter than the model's (generation_policy.hpp).
  std::optional<uint32_t> ttft_target_ms;
  /// Whether special tokens are left out of the text (vLLM's default: yes).
  bool skip_special_tokens = true;
  /// Whether the text returned ends with the stop string that ended it.
  bool include_stop_str_in_output = false;
  /// Chat: whether the template ends with the assistant's turn opening
  /// (vLLM's add_generation_prompt; default true).
  bool add_generation_prompt = true;
  /// Chat: vLLM's chat_template_kwargs as minified JSON; empty when absent.
  std::string chat_template_kwargs;
  /// OpenAI: the "user" field (accepted, kept for logs).
  std::string user;
  triton_generate_extras triton;
};

/// One input a model declares, as its metadata exposes it.
struct generate_input_info {
  std::string name;
  datatype dtype = datatype::bytes;
  /// Without the batch dimension; -1 is variable. Empty: not checked.
  std::vector<int64_t> dims;
  bool optional = false;
};

/// What parse_triton_generate needs to know about the model of the URL.
struct generate_model_info {
  std::string name;
  std::vector<generate_input_info> inputs;
  /// The BYTES input that carries the prompt (vLLM's and TensorRT-LLM's
  /// backends call it text_input).
  std::string prompt_input = "text_input";
  /// The BOOL input that asks for one response per step (vLLM's "stream").
  std::string stream_input = "stream";
};

/// The inputs of `model` as generate_model_info.
generate_model_info generate_model_info_of(const model_config& model);

/// Parses a body of Triton's generate or generate_stream. Inputs are mapped
/// as Triton maps them and checked against their declared types with Triton's
/// messages ("Unable to parse 'data': attempt to access JSON non-string as
/// string", "input 'x' already exists in request", "expected number of inputs
/// between 2 and 3 but got 1 inputs for model 'm'..."). Sampling fields come
/// from inputs of their names, from the "sampling_parameters" input (a JSON
/// string, as vLLM's backend takes it), or from request parameters (top-level
/// keys that are not inputs, and the "parameters" object); a number there may
/// be sent as a string ("0.7"), as vLLM's backend converts it. Every failure
/// is a 400.
result<generate_request> parse_triton_generate(std::string_view body,
                                               const generate_model_info& model,
                                               const generate_codec_limits& limits = {});

/// Parses a body of OpenAI's /v1/completions. Unknown fields, wrong types,
/// values out of range, n > 1, several prompts, and documented fields that
/// would change the result but are not supported (suffix, logit_bias,
/// best_of > 1) are each a 400 naming the field and what is allowed.
result<generate_request> parse_openai_completion(std::string_view body,
                                                 const generate_codec_limits& limits = {});

/// Parses a body of OpenAI's /v1/chat/completions, as parse_openai_completion
/// does; tools, tool_choice other than "none", response_format other than
/// text, and content parts other than text are 400s saying so.
result<generate_request> parse_openai_chat(std::string_view body,
                                           const generate_codec_limits& limits = {});

// -- responses: common --------------------------------------------------------

/// A read-only run of T that the caller owns (C++17 has no std::span).
template <class T>
class list_view {
public:
  list_view() = default;
  list_view(const T* data, size_t size) : data_(data), size_(size) {}
  list_view(const std::vector<T>& v) : data_(v.data()), size_(v.size()) {}
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T& operator[](size_t i) const { return data_[i]; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

/// Why a sequence ended, or `none` while it runs.
enum class generation_finish { none, stop, length };

/// OpenAI's finish_reason text: "stop", "length"; "" for none (written null).
std::string_view to_string(generation_finish finish);

/// One of the likeliest alternatives at a position.
struct top_logprob {
  std::string_view token;
  /// Natural log; -inf is written as -9999.0, as OpenAI and vLLM write it.
  float logprob = 0.0f;
};

/// The chosen token at a position, with its alternatives.
struct token_logprob {
  std::string_view token;
  float logprob = 0.0f;
  list_view<const top_logprob> top;
};

/// The text of one choice: a whole result or one step's piece of it.
struct choice_text {
  /// Text generated (new text only, for a stream chunk).
  std::string_view text;
  /// One entry per token of `text` when the request asked for logprobs.
  list_view<const token_logprob> logprobs;
  /// Whether the request asked for logprobs: "logprobs" is an object even
  /// when `logprobs` is empty, else null.
  bool with_logprobs = false;
  /// Completions: where `text` starts within the whole returned text, for
  /// the text_offset of each token.
  uint32_t text_offset = 0;
  generation_finish finish = generation_finish::none;
};

struct token_usage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
};

/// llama.cpp's server's "timings" extension of a final result.
struct generation_timings {
  uint32_t prompt_tokens = 0;
  double prompt_ms = 0.0;
  uint32_t predicted_tokens = 0;
  double predicted_ms = 0.0;
};

/// The fields every OpenAI response object starts with.
struct openai_object_meta {
  /// "cmpl-..." or "chatcmpl-...", the same for every chunk of a stream.
  std::string_view id;
  /// Unix seconds.
  int64_t created = 0;
  std::string_view model;
  /// Omitted when empty.
  std::string_view system_fingerprint;
};

// -- responses: OpenAI --------------------------------------------------------

/// A non-streamed result (n = 1: one choice, index 0).
struct openai_result {
  openai_object_meta meta;
  choice_text choice;
  token_usage usage;
  std::optional<generation_timings> timings;
};

/// One step of a stream.
struct openai_chunk {
  openai_object_meta meta;
  choice_text choice;
  /// Chat: the first chunk's delta carries "role": "assistant".
  bool first = false;
  /// stream_options.include_usage: every chunk carries "usage": null, and a
  /// last chunk (append_openai_usage_chunk) carries the counts.
  bool include_usage = false;
};

/// `{"object":"text_completion",...}`.
void append_openai_completion(std::string& out, const openai_result& r);
/// `{"object":"chat.completion",...}` with message {"role":"assistant",...}.
void append_openai_chat_completion(std::string& out, const openai_result& r);
/// `data: {"object":"text_completion",...}\n\n`.
void append_openai_completion_chunk(std::string& out, const openai_chunk& c);
/// `data: {"object":"chat.completion.chunk",...}\n\n`.
void append_openai_chat_chunk(std::string& out, const openai_chunk& c);
/// The include_usage chunk: `data: {..., "choices": [], "usage": {...}}\n\n`;
/// `api` picks the object name (completion or chat).
void append_openai_usage_chunk(std::string& out, generate_api api, const openai_object_meta& meta,
                               const token_usage& usage);
/// `data: [DONE]\n\n`, the end of every OpenAI stream.
void append_sse_done(std::string& out);

/// OpenAI's error object.
struct openai_error {
  /// The HTTP status to answer with.
  status_code status = status_code::bad_request;
  std::string message;
  /// "invalid_request_error", "server_error", ...
  std::string type = "invalid_request_error";
  /// The request field at fault; null when empty.
  std::string param;
  /// A machine-readable code ("model_not_found"); null when empty.
  std::string code;
};

/// The OpenAI error for a serving_error, as OpenAI types them: 4xx are
/// invalid_request_error (404 with code "model_not_found": the generative
/// endpoints answer 404 only for an unknown model), 429 "requests" with code
/// "rate_limit_exceeded", 5xx "server_error". `param` stays empty: the
/// parsers name the field in the message.
openai_error openai_error_of(const serving_error& e);

/// `{"error":{"message":...,"type":...,"param":...,"code":...}}`.
void append_openai_error(std::string& out, const openai_error& e);
/// The same as an SSE event, for an error after a stream has started.
void append_openai_error_event(std::string& out, const openai_error& e);

/// One model of /v1/models.
struct openai_model_card {
  std::string_view id;
  int64_t created = 0;
  std::string_view owned_by;
};

/// `{"object":"list","data":[{"id":...,"object":"model","created":...,"owned_by":...}]}`.
void append_openai_model_list(std::string& out, list_view<const openai_model_card> models);
/// One model object, for /v1/models/{id}.
void append_openai_model(std::string& out, const openai_model_card& model);

// -- responses: Triton --------------------------------------------------------

/// One response of Triton's generate endpoints. Written as Triton writes it:
/// the fields in name order (Triton collects them in a std::map), "id" only
/// when not empty, one-element outputs as scalars.
struct triton_generate_result {
  std::string_view id;
  std::string_view model_name;
  std::string_view model_version;
  std::string_view text_output;
  /// vLLM's backend's optional outputs, written when set; finish_reason as
  /// vLLM writes str(finish_reason): "stop", "length", or "None" while running.
  std::optional<generation_finish> finish_reason;
  std::optional<double> cumulative_logprob;
  std::optional<uint32_t> num_input_tokens;
  std::optional<uint32_t> num_output_tokens;
};

/// The JSON object of /generate.
void append_triton_generate_response(std::string& out, const triton_generate_result& r);
/// One event of /generate_stream: `data: {...}\n\n`.
void append_triton_generate_event(std::string& out, const triton_generate_result& r);
/// Triton's error body `{"error":"..."}`.
void append_triton_error(std::string& out, std::string_view message);
/// The same as an event of /generate_stream: `data: {"error":"..."}\n\n`.
void append_triton_error_event(std::string& out, std::string_view message);

} // namespace caf_serving::ingress
