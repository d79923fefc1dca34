#pragma once
/// Choosing a generative sequence's next token from the model's logits
/// (issue 34). Plain C++: no CAF, no threads, no wire types. The post-processor
/// keeps one `sequence_sampler` per sequence and calls `next` once per step
/// with that sequence's row of logits.
///
/// ## What `next` does, in order (Hugging Face's and vLLM's order)
///
/// 1. Penalties, on a copy of the logits (only when some penalty is set, or
///    tokens are suppressed until min_tokens; those become -inf first):
///    Hugging Face's repetition penalty over every token of the prompt and of
///    the generated text (a positive logit divided by it, any other
///    multiplied), then OpenAI's frequency penalty (times the token's count in
///    the generated text) and presence penalty (once if it occurs there),
///    both subtracted.
/// 2. `temperature` 0: greedy, the highest logit, the lowest id among equals
///    (torch.argmax). Nothing below applies.
/// 3. Otherwise the candidates are filtered, as Hugging Face's warpers do in
///    this order: top-k (every token at least as likely as the k-th likeliest,
///    equals at the edge kept), top-p over what top-k kept (the likeliest
///    tokens while the probability before them is below top_p; equals are
///    ordered by id), min-p (tokens at least min_p times as likely as the
///    likeliest). Probabilities are softmax(logit / temperature).
/// 4. One uniform draw picks a token from what is left, by its probability.
///
/// Log-probabilities are log-softmax of the model's raw logits, before
/// penalties and temperature, as vLLM returns them by default.
///
/// ## Randomness
///
/// The draw at step n is a pure function of (seed, n): a counter-based
/// generator (splitmix64's output n). A sequence's tokens therefore depend on
/// its seed, its prompt and its logits only, never on what else shares the
/// batch or in which order the sequences of a step are sampled. Without a
/// seed, each sampler takes a fresh one from a process-wide source.
///
/// ## Cost
///
/// O(V) per token for a vocabulary of V: vectorized passes over the row
/// (logit_scan.hpp), a heap of k for top-k, and for top-p a weighted
/// quickselect over the few tokens that can be in the nucleus: nothing sorts
/// the vocabulary. The buffers are the sampler's own and are reused: after the
/// first token, `next` allocates nothing (the penalties' token table grows
/// only when a new distinct token appears, doubling).
///
/// ## Usage
///
/// ```
/// if (auto why = check(params)) reject the request (400) with *why;
/// sequence_sampler sampler{params, prompt_ids};
/// auto s = sampler.next(logits_row);      // once per step
/// if (!s) fail the sequence with s.error() (the model's logits were NaN)
/// else    s->token, s->logprob, s->top_logprobs()
/// ```
#include "core/error.hpp"
#include "core/generation_params.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::postprocess {

/// A read-only view of contiguous values: the part of C++20's std::span this
/// library needs (the engine builds as C++17).
template <class T>
class const_span {
public:
  constexpr const_span() = default;
  constexpr const_span(const T* data, std::size_t size) : data_(data), size_(size) {}
  const_span(const std::vector<T>& values) : data_(values.data()), size_(values.size()) {}
  template <std::size_t N>
  constexpr const_span(const std::array<T, N>& values) : data_(values.data()), size_(N) {}
  constexpr const T* data() const { return data_; }
  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr const T& operator[](std::size_t i) const { return data_[i]; }
  constexpr const T* begin() const { return data_; }
  constexpr const T* end() const { return data_ + size_; }

private:
  const T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The most alternatives `top_logprobs` may ask for (OpenAI's limit).
constexpr uint32_t max_top_logprobs = 20;

/// Why `params` cannot be sampled with: names the field, its value and the
/// range it must lie in. nullopt: they can.
std::optional<std::string> check(const sampling_params& params);

/// A token and its log-probability under the model's raw logits.
struct token_logprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

/// What `next` chose.
struct sampled {
  int32_t token = 0;
  /// Its log-probability; set when the params ask for logprobs (`logprobs`,
  /// or `top_logprobs` above 0).
  std::optional<float> logprob;
  /// The likeliest tokens, likeliest first (the lowest id first among
  /// equals), `params.top_logprobs` of them or the vocabulary if smaller.
  /// Kept inline, so that sampling allocates nothing.
  std::array<token_logprob, max_top_logprobs> top{};
  uint32_t top_count = 0;

  const_span<token_logprob> top_logprobs() const {
    return {top.data(), top_count};
  }
};

/// The sampler of one sequence: its parameters, its random stream and the
/// tokens it has seen (prompt and generated, for the penalties).
class sequence_sampler {
public:
  /// `params` must pass `check` (a sampler with others is a bug, asserted).
  /// Prompt ids outside the vocabulary of a later `next` are never penalized.
  sequence_sampler(const sampling_params& params, const_span<int32_t> prompt);

  /// Chooses the next token from `logits` (one value per vocabulary id) and
  /// records it as generated. NaN logits are never chosen; +inf logits, when
  /// any, share all the probability. Fails (status 500) when no logit is a
  /// number above -inf: the model misbehaved, and the sequence must end.
  result<sampled> next(const_span<float> logits);

  /// `tokens` are never chosen while fewer than `until` tokens have been
  /// generated (min_tokens: a sequence's ending ids, `ending_tokens` in
  /// stop_strings.hpp). Ids outside the vocabulary are ignored.
  void suppress(std::vector<int32_t> tokens, uint64_t until);

  /// Tokens generated so far (the step of the next draw).
  uint64_t generated() const { return step_; }
  /// The seed of the random stream: the request's, or the one drawn for it.
  uint64_t seed() const { return seed_; }

private:
  /// A token the penalties apply to: whether it is in the prompt and how often
  /// it has been generated.
  struct seen_token {
    int32_t token = -1; // -1: an empty slot
    bool in_prompt = false;
    uint32_t generated = 0;
  };
  /// A candidate of the draw: a logit, then a weight (unnormalized probability).
  struct candidate {
    float value = 0.0f;
    int32_t token = 0;
  };

  seen_token& slot_of(int32_t token);
  const float* penalized(const_span<float> logits);
  int32_t draw(const float* logits, std::size_t vocab);
  /// Draws from candidates_[0, n), their values weights; `total` the mass
  /// top-p measures against.
  int32_t draw_from_candidates(std::size_t n, double total, double u);
  void reserve_for(std::size_t vocab);
  float kth_largest(const float* logits, std::size_t vocab, uint32_t k);
  sampled with_logprobs(const_span<float> logits, int32_t token) const;

  sampling_params params_;
  uint64_t seed_ = 0;
  uint64_t step_ = 0;
  bool penalties_ = false;
  /// Open addressing, linear probing, a power of two in size, at most half full.
  std::vector<seen_token> seen_;
  std::size_t seen_count_ = 0;
  std::vector<int32_t> suppressed_;
  uint64_t suppressed_until_ = 0;
  std::vector<float> work_;
  std::vector<candidate> candidates_;
  std::vector<float> weights_;
  std::vector<double> block_sums_;
  std::vector<float> kth_buffer_;
};

} // namespace caf_serving::postprocess
