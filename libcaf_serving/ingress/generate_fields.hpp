#pragma once
/// Private to the generate codec (generate_codec.hpp): reading JSON values as
/// the sampling and stop fields that every generative API shares, with the
/// messages a 400 carries. Parsing stops at the first failure by throwing
/// field_failure, caught at the top of each parse_* function: the walk reads
/// straight, and only requests that are refused anyway pay for it.

#include "ingress/generate_codec.hpp"

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace caf_serving::ingress::generate_detail {

namespace dom = simdjson::dom;

/// A refused request, thrown while walking the JSON.
struct field_failure {
  serving_error error;
};

[[noreturn]] void fail(std::string message);

/// `'name'` as the messages quote names.
std::string in_quotes(std::string_view name);

/// The value as short JSON text for a message ("got ..."), cut at 40 bytes.
std::string shown(dom::element value);

/// Parses `body` as one JSON document with `parser` (which then owns it), or
/// fails with a message that says what is wrong with the JSON ("the request
/// body is not valid UTF-8", ...). `what` names the text ("the request
/// body", "input 'sampling_parameters'").
dom::element parse_document(dom::parser& parser, std::string_view body, std::string_view what);

/// How values are read.
struct field_reader {
  /// Prefix of every message, e.g. "" or "sampling_parameters: ".
  std::string_view where;
  /// Triton's parameters and sampling_parameters: numbers and booleans may
  /// come as strings ("0.7", "true"), as vLLM's backend converts them.
  bool lenient = false;

  /// A finite number in [lo, hi]; `lo_open` excludes lo.
  double number(std::string_view key, dom::element v, double lo, double hi,
                bool lo_open = false) const;
  /// An integer in [lo, hi] (an integral float such as 16.0 counts, as
  /// Pydantic, which OpenAI-compatible servers use, accepts it).
  int64_t integer(std::string_view key, dom::element v, int64_t lo, int64_t hi) const;
  /// Any 64-bit integer, signed or not, as its bits (a seed).
  uint64_t bits64(std::string_view key, dom::element v) const;
  bool boolean(std::string_view key, dom::element v) const;
  std::string_view string(std::string_view key, dom::element v) const;

  [[noreturn]] void wrong(std::string_view key, dom::element v, std::string_view expected) const;
};

/// Applies one of the fields every API shares: temperature, top_p, top_k,
/// min_p, repetition_penalty, presence_penalty, frequency_penalty, seed,
/// max_tokens, min_tokens, ignore_eos, stop, stop_token_ids,
/// skip_special_tokens, include_stop_str_in_output, n. Null leaves the
/// default. Returns false when `key` is none of them.
bool apply_shared_field(std::string_view key, dom::element v, const field_reader& reader,
                        const generate_codec_limits& limits, generate_request& req);

/// Whether `key` is one of the fields apply_shared_field takes.
bool is_shared_field(std::string_view key);

/// Checks what holds across fields (min_tokens <= max_tokens); call once all
/// fields are read.
void check_across_fields(const generate_request& req, std::string_view where);

} // namespace caf_serving::ingress::generate_detail
