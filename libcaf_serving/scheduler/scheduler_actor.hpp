#pragma once
/// The scheduler actor (one per model version): feeds the batching policy the
/// requests that arrive, executors that free up and timer ticks; gathers each
/// dispatched batch into one Batch message; sends it to a free executor; and
/// passes the result with its requests to the post-processor. It tracks every
/// batch in flight until it is answered.
///
/// Executors are local or remote (libcaf_serving/cluster/): remote ones arrive
/// while serving (`add_executor_atom`) and leave when their node is lost. The
/// batch goes to the executor with the earliest predicted completion
/// (cluster/executor_choice.hpp). A batch whose executor was lost before answering
/// (`executor_was_lost`) is sent again, whole, to another executor ahead of new
/// batches; each request is answered exactly once, by the one result that arrives.

#include "core/model_config.hpp"
#include "core/pipeline_messages.hpp"
#include "core/stats.hpp"
#include "executor/executor_actor.hpp"
#include "postprocess/postprocessor_actor.hpp"
#include "scheduler/batching_policy.hpp"

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

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
  /// Batches each executor may hold at once. 1 keeps batches in the queue (where
  /// they can still grow) until an executor can start them.
  uint32_t executor_depth = 1;
  /// How often one batch may be sent again after its executor was lost before its
  /// requests are answered 503 (a batch that kills every executor stops here).
  uint32_t max_batch_attempts = 4;
};

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config config);

/// Gathers the requests' inputs along the batch dimension into one Batch. A batch
/// of one request references that request's bytes instead of copying them.
/// Inputs of every request are in the model's input order (the ingress orders them).
batch_message gather_batch(const model_config& model, uint64_t batch_id,
                           const std::vector<batched_job>& jobs);

} // namespace caf_serving::scheduler

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::scheduler::executor_entry)
