#pragma once
/// The messages of a generative model's decoding loop (issue 34), in one
/// place: what its three actors send each other at every step.
///
/// ```
///            step plan                 logits (moved)
/// scheduler ──────────► executor ──────────────────► post-processor
///     ▲                 (decoder_runner,             (samplers, detokenizers,
///     │                  KV cache)                    stop checks)
///     └────────────────── samples (the reply to the plan) ───┘
/// ```
///
/// The scheduler (scheduler/generation_actor.hpp) requests a step of the
/// executor (executor/decoder_actor.hpp); the executor runs it and delegates
/// the request, with the emitting rows' logits, to the post-processor
/// (postprocess/generation_postprocessor_actor.hpp), whose answer goes
/// straight back to the scheduler: three hops per step, and the logits never
/// pass through the scheduler. A step that emits no token (a prefill chunk)
/// or fails is answered by the executor itself.
///
/// Plain C++ structs that never leave the process; the logits travel behind a
/// shared_ptr, so no hop copies them.

#include "core/error.hpp"
#include "core/generation_params.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace caf_serving {

// -- scheduler -> executor ----------------------------------------------------

/// What one sequence computes in a step (the policy's step_work, with where
/// its tokens sit in the plan).
struct generation_step_item {
  uint64_t seq = 0;
  /// The position of its first token; the cache holds the positions before it.
  uint32_t first_position = 0;
  /// Its tokens are the plan's tokens[offset, offset + count).
  uint32_t offset = 0;
  uint32_t count = 0;
  /// Whether the step's last token's logits are wanted (a token is sampled).
  bool emits = false;
};

/// One step for the executor. `releases` are applied first: the cache of every
/// sequence that finished, was cancelled or was preempted since the last plan
/// is freed before the step's items take blocks.
struct generation_step_plan {
  std::vector<generation_step_item> items;
  /// The tokens every item computes, one after the other (copied: the
  /// scheduler may forget a sequence while the step runs).
  std::vector<int32_t> tokens;
  std::vector<uint64_t> releases;
};

// -- executor -> post-processor -----------------------------------------------

/// The logits of a step's emitting items, in the plan's order: row i (vocab
/// floats) belongs to seqs[i].
struct generation_logits {
  std::vector<uint64_t> seqs;
  std::shared_ptr<const std::vector<float>> values;
  uint32_t vocab = 0;
  /// How long the executor's model run took, nanoseconds (carried on to the
  /// samples).
  int64_t model_ns = 0;
};

// -- post-processor -> scheduler (the answer to the plan) --------------------

/// What a sequence's row gave: a token and its text, or an error.
struct generation_sample {
  uint64_t seq = 0;
  int32_t token = 0;
  /// Set when the sequence asked for logprobs: the token's and the likeliest
  /// alternatives' (token, log-probability), likeliest first.
  std::optional<float> logprob;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  /// New text: whole UTF-8 characters, stop strings held back or left out.
  std::string text;
  /// Set when the sequence ended with this token: "stop" or "length". The
  /// post-processor has then forgotten it.
  std::optional<std::string> finish_reason;
  /// Set when no token could be chosen (the model's logits were not numbers);
  /// the sequence must end with it, and the post-processor has forgotten it.
  std::optional<serving_error> error;
};

/// The answer to a step plan: one sample per emitting item the post-processor
/// knew, or the error that failed the whole step (every item fails).
struct generation_samples {
  std::vector<generation_sample> rows;
  std::optional<serving_error> error;
  /// Where the step's time went, nanoseconds: the executor's model run, and
  /// the post-processor's sampling, detokenizing and stop checks (zero when
  /// no token was sampled). The scheduler takes the rest as hand-offs.
  int64_t model_ns = 0;
  int64_t sample_ns = 0;
};

// -- scheduler -> post-processor ----------------------------------------------

/// A sequence the post-processor must sample for, sent once before its first
/// step. `stop.max_tokens` is set: the scheduler's limit for it (the request's
/// or the context's room), so that "length" ends it in the same step as the
/// policy.
struct generation_sequence {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  sampling_params sampling;
  stop_params stop;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
};

using generation_run_atom = caf::atom_constant<caf::atom("genrun")>;
using generation_release_atom = caf::atom_constant<caf::atom("genrelease")>;
using generation_sample_atom = caf::atom_constant<caf::atom("gensample")>;
using generation_open_atom = caf::atom_constant<caf::atom("genopen")>;
using generation_close_atom = caf::atom_constant<caf::atom("genclose")>;

/// The part of the post-processor's interface that the executor delegates a
/// step's request to.
using generation_sampler_actor = caf::typed_actor<
  caf::replies_to<generation_sample_atom, generation_logits>::with<generation_samples>>;

} // namespace caf_serving

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::generation_step_plan)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::generation_logits)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::generation_samples)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const caf_serving::generation_sequence>)
