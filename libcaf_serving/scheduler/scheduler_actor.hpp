#pragma once
/// The scheduler actor (one per model version): feeds the batching policy the
/// requests that arrive, executors that free up and timer ticks; gathers each
/// dispatched batch into one Batch message (gather_batch.hpp); sends it to a
/// free executor; and passes the result with its requests to the
/// post-processor. It tracks every batch in flight until it is answered.
///
/// Executors are local or remote (libcaf_serving/cluster/): remote ones arrive
/// while serving (`add_executor_atom`) and leave when their node is lost. The
/// batch goes to the executor with the earliest predicted completion
/// (scheduler/executor_choice.hpp). A batch whose executor was lost before answering
/// (`executor_was_lost`) is sent again, whole, to another executor ahead of new
/// batches; each request is answered exactly once, by the one result that arrives.
///
/// The decisions are plain objects with the clock passed in; the actor feeds
/// them events with now_ns() and carries out what they decide: the batching
/// policy, whichever the model has, through scheduling_policy.hpp, and
/// supervision (quarantines, respawns, the hang check, sending a batch again)
/// in supervision_policy.hpp.

#include "core/model_config.hpp"
#include "core/pipeline_messages.hpp"
#include "core/stats.hpp"
#include "executor/executor_actor.hpp"
#include "postprocess/postprocessor_actor.hpp"
#include "scheduler/batching_policy.hpp"
#include "scheduler/padded_batching.hpp"
#include "scheduler/slo_policy.hpp"

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <functional>

namespace caf_serving::scheduler {

/// An executor that joins a running scheduler (a remote executor's proxy).
struct executor_entry {
  executor::executor_actor handle;
  /// Batches it may hold at once: its credit window.
  uint32_t depth = 1;
  /// Where it runs: "local" or the worker's name.
  std::string node = "local";
};

using add_executor_atom = caf::atom_constant<caf::atom("addexec")>;

using scheduler_actor
  = caf::typed_actor<caf::reacts_to<infer_job>, caf::reacts_to<tick_atom>,
                     caf::reacts_to<drain_atom>, caf::reacts_to<add_executor_atom, executor_entry>>;

struct scheduler_config {
  model_config model;
  policy_config policy;
  std::vector<executor::executor_actor> executors;
  postprocess::postprocessor_actor postprocessor;
  std::shared_ptr<model_stats> stats;
  /// Padded batching (padded_batching.hpp); disabled when it has no inputs.
  padded_batching_config padding;
  /// Batches each executor may hold at once. 1 keeps batches in the queue (where
  /// they can still grow) until an executor can start them; an asynchronous
  /// backend needs at least its pipeline depth to overlap batches (the model
  /// manager sets that).
  uint32_t executor_depth = 1;
  /// How often one batch may be sent again after its executor was lost before its
  /// requests are answered 503 (a batch that kills every executor stops here).
  uint32_t max_batch_attempts = 4;
  /// Starts a new local executor in place of one that stopped (supervision);
  /// empty: executors that stop are not replaced (a server without local ones).
  std::function<executor::executor_actor()> respawn_executor;
  /// Starts a new post-processor in place of one that stopped; the batches
  /// sent to the stopped one are answered 500 by their requests' sinks.
  std::function<postprocess::postprocessor_actor()> respawn_postprocessor;
  /// A local executor that has not answered a batch after this long is taken
  /// for hung: it is replaced and the batch sent once more (a thread stuck in a
  /// backend cannot be stopped; it ends when the backend returns). 0: never.
  std::chrono::milliseconds local_batch_timeout{60000};
  /// A batch whose local executor stopped while running it is sent once more;
  /// if that executor stops too, its requests get a 500 naming the model.
  uint32_t max_local_attempts = 2;
  /// Internal failures in a row after which an executor is quarantined: it gets
  /// no batches for a backoff that starts at quarantine_backoff and doubles up
  /// to max_quarantine_backoff while it keeps failing after each return.
  uint32_t quarantine_after_failures = 3;
  std::chrono::milliseconds quarantine_backoff{1000};
  std::chrono::milliseconds max_quarantine_backoff{30000};
  /// Why the model has no executor when it has none (for the 503 that answers
  /// its requests at once); empty means "every executor stopped".
  std::string no_executor_reason;
  /// The model's latency target (config parameter latency_target_ms): set, the
  /// latency-target policy (slo_policy.hpp) batches instead of the dynamic
  /// batcher, and sheds what it cannot serve in time.
  std::optional<std::chrono::microseconds> latency_target;
  /// Held back from every deadline (slo_policy_config::margin); 0: the default
  /// for the target (default_slo_margin).
  std::chrono::microseconds slo_margin{0};
};

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config config);

} // namespace caf_serving::scheduler

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::scheduler::executor_entry)
