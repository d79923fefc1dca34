#pragma once
/// The generation actor (one per generative model version, issue 34): the
/// scheduler of continuous batching, and the handle the ingress sends
/// requests and cancellations to. The decoding loop is three actors, each
/// doing its own layer's job (core/generation_messages.hpp):
///
/// - this one, the scheduler: before every step its policy
///   (generation_policy.hpp) decides which sequences take part and how much of
///   each waiting prompt is prefilled; it admits requests, takes
///   cancellations, sends every sequence's updates to its sink and keeps the
///   stats. It never blocks: it runs on CAF's shared workers.
/// - the executor (executor/decoder_actor.hpp, detached: a step blocks for
///   milliseconds) owns the decoder_runner and its KV cache and runs each
///   step's plan;
/// - the post-processor (postprocess/generation_postprocessor_actor.hpp) owns
///   each sequence's sampler, detokenizer and stop checks, and turns the
///   step's logits into tokens, text and finish reasons.
///
/// A step is three hops: the plan to the executor, the logits (moved, not
/// copied) on to the post-processor, its samples back here. Requests and
/// cancellations that arrive while a step runs are taken at once and join the
/// next; a cancelled sequence's cache blocks are freed before the next step
/// (the plan's releases). Every job gets exactly one final update through its
/// sink (tokens, an error, or a cancellation acknowledged by nobody).
/// generation_stop_atom answers every job and ends all three actors.

#include "core/error.hpp"
#include "core/generation_params.hpp"
#include "core/stats.hpp"
#include "executor/decoder_runner.hpp"
#include "scheduler/generation_policy.hpp"

#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::text {
class tokenizer;
}

namespace caf_serving::scheduler {

/// What one sequence produced since its last update, or how it ended.
struct generation_update {
  /// New text: whole UTF-8 characters, stop strings left out.
  std::string text;
  /// The tokens generated since the last update, and with sampling_params's
  /// logprobs each one's log-probability and alternatives.
  std::vector<int32_t> tokens;
  struct token_logprobs {
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
  };
  std::vector<token_logprobs> logprobs;
  /// Set on the last update: "stop" (end-of-sequence token, stop token or
  /// string) or "length" (max_tokens or the context).
  std::optional<std::string> finish_reason;
  /// Set when the request failed (refused up front: 400 or 503; a model
  /// failure: 500). A failed update is the last.
  std::optional<serving_error> error;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  /// Nanoseconds (now_ns) the job arrived at the actor, its first token was
  /// ready, and this update was sent; 0 until known.
  int64_t queued_ns = 0;
  int64_t first_token_ns = 0;
  int64_t sent_ns = 0;

  bool last() const { return finish_reason.has_value() || error.has_value(); }
};

/// Where a sequence's updates go; called on the actor's thread.
class generation_sink {
public:
  virtual ~generation_sink() = default;
  virtual void deliver(generation_update update) = 0;
};

/// A generative request, tokenized (ingress -> generation actor).
struct generation_job {
  /// From next_generation_id(): what a cancellation names.
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  sampling_params sampling;
  stop_params stop;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  std::shared_ptr<generation_sink> sink;
  /// When the ingress received the request (now_ns); 0: unknown, then the
  /// time to first token counts from the actor's arrival.
  int64_t received_ns = 0;
  /// The request's own time-to-first-token target (zero: the model's).
  clock_type::duration ttft_target{0};
};

/// A process-wide unique id for a generation job.
uint64_t next_generation_id();

using generate_atom = caf::atom_constant<caf::atom("generate")>;
using cancel_generation_atom = caf::atom_constant<caf::atom("gencancel")>;
using generation_step_atom = caf::atom_constant<caf::atom("genstep")>;
using generation_stop_atom = caf::atom_constant<caf::atom("genstop")>;

using generation_actor
  = caf::typed_actor<caf::reacts_to<generate_atom, std::shared_ptr<generation_job>>,
                     caf::reacts_to<cancel_generation_atom, uint64_t>,
                     caf::reacts_to<generation_step_atom>, caf::reacts_to<generation_stop_atom>>;

/// Gauges and counters of one generative model, read by /metrics.
struct generation_stats {
  generation_stats();
  /// Arrival at the actor to the first token, and between two tokens of one
  /// sequence, in microseconds.
  histogram ttft_us;
  histogram itl_us;
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<uint64_t> preemptions{0};
  std::atomic<uint64_t> shed{0};
  /// generation_policy::first_token_lateness(), x1000.
  std::atomic<uint32_t> ttft_lateness_milli{1000};
  std::atomic<uint64_t> steps{0};
  /// The steps' time by stage, microseconds (render_generation_stats).
  std::atomic<uint64_t> model_us{0};
  std::atomic<uint64_t> sample_us{0};
  std::atomic<uint64_t> handoff_us{0};
  std::atomic<uint64_t> scheduler_us{0};
  std::atomic<uint32_t> running{0};
  std::atomic<uint32_t> waiting{0};
  std::atomic<uint32_t> cache_blocks_used{0};
  std::atomic<uint32_t> cache_blocks_total{0};
  std::atomic<uint64_t> finished{0};
  std::atomic<uint64_t> cancelled{0};
  std::atomic<uint64_t> failed{0};
};

struct generation_actor_config {
  std::string model_name;
  generation_limits limits;
  executor::decoder_runner_config runner;
  executor::decoder_signature signature;
  std::shared_ptr<executor::backend> backend;
  std::shared_ptr<const text::tokenizer> tokenizer;
  /// The model's end-of-sequence ids (generation_config.json, the tokenizer).
  std::vector<int32_t> eos_ids;
  std::shared_ptr<generation_stats> stats;
};

generation_actor spawn_generation_actor(caf::actor_system& sys, generation_actor_config config);

/// The Prometheus lines of one model's generation (`labels` names it).
void render_generation_stats(std::string& out, const generation_stats& s,
                             const std::string& labels);

} // namespace caf_serving::scheduler

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<caf_serving::scheduler::generation_job>)
