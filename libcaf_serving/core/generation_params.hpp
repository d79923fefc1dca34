#pragma once
/// What a generative request asks of its tokens (issue 34): how each next token
/// is chosen and when the sequence stops. Filled by the request codecs (Triton's
/// generate endpoints, the OpenAI endpoints, gRPC parameters) and read by the
/// post-processor's sampler and stop checks. Plain data: no behaviour, no wire
/// types, so every stage can hold it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving {

/// How the next token is chosen from the model's logits. The defaults sample
/// from the model's own distribution; `temperature` 0 is greedy (the highest
/// logit, the lowest id among equals).
struct sampling_params {
  /// Logits are divided by it; 0: greedy.
  float temperature = 1.0f;
  /// Only the k likeliest tokens are candidates; 0: all.
  uint32_t top_k = 0;
  /// Only the likeliest tokens whose probabilities sum to top_p; 1: all.
  float top_p = 1.0f;
  /// Only tokens at least min_p times as likely as the likeliest; 0: all.
  float min_p = 0.0f;
  /// Hugging Face's repetition penalty over prompt and generated tokens: a
  /// positive logit is divided by it, a negative one multiplied; 1: none.
  float repetition_penalty = 1.0f;
  /// OpenAI's penalties over generated tokens: presence once per token seen,
  /// frequency once per occurrence, subtracted from the logit; 0: none.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  /// The request's own seed: the same seed gives the same tokens whatever else
  /// shares its steps. Unset: a fresh random seed per request.
  std::optional<uint64_t> seed;
  /// Whether each chosen token's log-probability is returned, and how many of
  /// the likeliest alternatives with theirs (0: none).
  bool logprobs = false;
  uint32_t top_logprobs = 0;
};

/// When a sequence stops.
struct stop_params {
  /// Generated tokens at most; unset: until the model's context is full.
  std::optional<uint32_t> max_tokens;
  /// Generated tokens before an end-of-sequence token or a stop string may end
  /// the sequence.
  uint32_t min_tokens = 0;
  /// Whether end-of-sequence tokens are ignored (the sequence runs to
  /// max_tokens), for benchmarks that need outputs of a set length.
  bool ignore_eos = false;
  /// Texts that end the sequence; the text returned stops before them.
  std::vector<std::string> stop;
  /// Token ids that end the sequence, besides the model's end-of-sequence ids.
  std::vector<int32_t> stop_token_ids;
};

} // namespace caf_serving
