#pragma once
/// Continuous batching for generative models (issue 34): which sequences run
/// at each decoding step, how many tokens each computes, and what the KV cache
/// holds. A plain object with the clock passed in, like the batching policies:
/// no CAF, no threads, no clock reads.
///
/// A sequence holds `prompt` tokens and, as it runs, `generated` ones; the
/// model has computed (and the cache holds) the first `computed` of them.
/// Each step a running sequence computes some of the rest: a chunk of its
/// prompt (prefill, bounded so that a step's work stays bounded) or its one
/// newest token (decode). A step that computes everything a sequence holds
/// yields its next token. Prefill and decode share steps; a sequence joins the
/// running batch at the step after it is admitted and leaves when it finishes.
///
/// The cache is `cache_blocks` blocks of `block_tokens` tokens. A sequence
/// takes blocks as it grows and frees them all when it finishes or is
/// cancelled. When a running sequence cannot grow, the youngest running
/// sequence is preempted: its blocks are freed and it waits again, at the head
/// of the queue, to recompute what it had (prompt and generated tokens alike).
/// A request whose prompt and max_tokens could never fit the context or the
/// whole cache is refused up front, so the oldest sequence always fits alone
/// and every sequence finishes.
///
/// ## Usage (what the scheduler actor does)
///
/// ```
/// generation_policy policy{limits};
/// // a request arrives:   answer a refusal (400, or 503 when the queue is full)
/// //                      else step when no step runs
/// auto plan = policy.plan_step();         // nothing to run: wait for a request
/// // drop the cache of every plan.preempted; run plan.work on the executor;
/// // sample a token for every item whose emits_token is set
/// policy.step_done();                     // finished ones leave (max_tokens)
/// policy.finish(id);                      // a stop string or EOS was sampled
/// policy.cancel(id);                      // the client went away
/// policy.observe_step(tokens, took);      // each step's wall time (targets)
/// ```
///
/// ## Latency targets (issue 35)
///
/// With a time-per-output-token target, a step computes at most the tokens
/// that the step cost model (step_cost.hpp, fitted from the steps run) prices
/// within it, and no sequence joins the running batch beyond that many: the
/// step size follows the target instead of max_step_tokens. Every decoding
/// sequence still decodes each step (a step never leaves one behind). With a
/// time-to-first-token target, a request whose first token cannot come in time
/// is refused at once with a 503, rather than queued to miss it: the steps
/// ahead are replayed as they would be planned (the queue's prompts, the
/// running batch's decodes, a slot freed only when a sequence reaches its
/// max_tokens) and priced by the cost model. The replay is calibrated by how
/// late first tokens have come: the scheduler reports each admitted request's
/// actual wait for its first token, and the prediction is scaled by a running
/// estimate of the 90th percentile of actual over predicted (1 until known),
/// so that about nine in ten admitted requests meet the target. Until the cost model has seen enough steps, neither
/// applies.
#include "scheduler/batching_policy.hpp"
#include "scheduler/step_cost.hpp"

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::scheduler {

/// The limits of one generative model's continuous batching.
struct generation_limits {
  /// Sequences in the running batch at most.
  uint32_t max_running = 64;
  /// Tokens computed in one step at most (prefill chunks and one per decoding
  /// sequence); at least max_running, so every running sequence can decode.
  uint32_t max_step_tokens = 512;
  /// Tokens a KV cache block holds.
  uint32_t block_tokens = 16;
  /// Blocks of the cache's budget.
  uint32_t cache_blocks = 1024;
  /// Prompt and generated tokens one sequence may hold (the model's context).
  uint32_t max_context = 2048;
  /// Requests waiting for admission at most; beyond, a request is refused.
  uint32_t max_waiting = 1024;
  /// Latency targets (above); zero: none.
  clock_type::duration ttft_target{0};
  clock_type::duration tpot_target{0};
};

/// Whether `limits` can run: the reason when not.
std::optional<std::string> check_limits(const generation_limits& limits);

/// A refused request: `status` 400 when the request itself can never run (its
/// message names the limit), 503 when the queue is full now.
struct generation_refused {
  uint16_t status = 400;
  std::string message;
};

/// What one sequence does in a step.
struct step_work {
  uint64_t id = 0;
  /// The position of its first token computed in this step (the cache holds
  /// the tokens before it).
  uint32_t first_position = 0;
  /// Tokens computed in this step.
  uint32_t tokens = 0;
  /// Whether this step yields the sequence's next token (it computes all the
  /// sequence holds): sample one for it.
  bool emits_token = false;
};

/// One step: the work of each running sequence, in admission order, and the
/// sequences preempted before it (drop their cache; they run again later).
struct step_plan {
  std::vector<step_work> work;
  std::vector<uint64_t> preempted;
  uint32_t tokens = 0;
};

class generation_policy {
public:
  explicit generation_policy(generation_limits limits);

  /// Queues a request of `prompt_tokens` that may generate `max_tokens`, or
  /// refuses it. `ttft_target` (non-zero) is the request's own, where tighter
  /// than the model's.
  std::optional<generation_refused> admit(uint64_t id, uint32_t prompt_tokens,
                                          uint32_t max_tokens, time_point now,
                                          clock_type::duration ttft_target = {});

  /// A step of `tokens` took `took` (plan sent to samples back): the cost
  /// model behind the latency targets learns from it.
  void observe_step(uint32_t tokens, clock_type::duration took) { cost_.observe(tokens, took); }
  const step_cost& cost() const { return cost_; }
  /// The predicted time until a new request of `prompt_tokens` has its first
  /// token, given the running batch and the queue (the steps ahead replayed
  /// and priced); zero while the cost model knows nothing. With `give_up`,
  /// the replay stops once past it (and returns what it reached).
  clock_type::duration predicted_first_token(uint32_t prompt_tokens,
                                             clock_type::duration give_up = {}) const;
  /// Sequence `id` got its first token `waited` after its admission: the
  /// TTFT prediction learns how late it was (once per sequence; nothing when
  /// no prediction was made for it).
  void observe_first_token(uint64_t id, clock_type::duration waited);
  /// The factor predictions are scaled by before they are held against a
  /// TTFT target: the running 90th percentile of actual over predicted waits.
  double first_token_lateness() const { return lateness_; }
  /// Requests refused for a latency target so far.
  uint64_t shed() const { return shed_; }

  /// The next step: empty when nothing waits or runs. Until step_done() a
  /// plan with work or preemptions stands: a second call returns the same; an
  /// empty one does not (a request admitted after it runs at the next call).
  const step_plan& plan_step();

  /// The planned step ran: the cache holds what it computed, and every item
  /// that emitted a token has one more. Returns the sequences that reached
  /// their max_tokens and left.
  std::vector<uint64_t> step_done();

  /// A sequence stops before max_tokens (a stop string, an end-of-sequence
  /// token): it leaves and frees its blocks. Nothing when it is unknown.
  void finish(uint64_t id);
  /// The client went away: as finish(), also for a sequence still waiting.
  void cancel(uint64_t id) { finish(id); }

  uint32_t free_blocks() const { return free_blocks_; }
  uint32_t used_blocks() const { return limits_.cache_blocks - free_blocks_; }
  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  /// Preemptions so far.
  uint64_t preemptions() const { return preemptions_; }
  /// Tokens generated so far by sequence `id` (0 when unknown).
  uint32_t generated(uint64_t id) const;
  /// How long the oldest waiting request has waited at `now` (the queue's
  /// age, for /metrics); zero when none waits.
  clock_type::duration oldest_waiting(time_point now) const;

private:
  struct sequence {
    uint64_t id = 0;
    uint32_t prompt = 0;
    uint32_t max_tokens = 0;
    uint32_t generated = 0;
    uint32_t computed = 0;
    uint32_t blocks = 0;
    time_point arrived;
    uint64_t order = 0; ///< admission order: lower is older
    /// The predicted wait for its first token at admission (zero: none made).
    clock_type::duration predicted{0};
  };

  uint32_t blocks_for(uint32_t tokens) const;
  /// The tokens a step may compute: max_step_tokens, or what the cost model
  /// prices within the TPOT target.
  uint32_t step_tokens() const;
  void release(sequence& s);
  /// Preempts the youngest running sequence; returns the tokens of the work
  /// this step had planned for it, taken back.
  uint32_t preempt_youngest();

  generation_limits limits_;
  std::map<uint64_t, sequence> sequences_;
  /// Ids in admission order (oldest first).
  std::vector<uint64_t> running_;
  /// Ids waiting, the next to admit first (preempted ones at the head).
  std::deque<uint64_t> waiting_;
  uint32_t free_blocks_ = 0;
  uint64_t next_order_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t shed_ = 0;
  double lateness_ = 1.0;
  step_cost cost_;
  step_plan plan_;
  /// The admission order of each item of plan_.work (an id may leave and come
  /// back while a step runs; its old work is not its new sequence's).
  std::vector<uint64_t> plan_orders_;
  bool planned_ = false;
};

} // namespace caf_serving::scheduler
