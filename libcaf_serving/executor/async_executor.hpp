#pragma once
/// The executor actor of an asynchronous backend (backend::asynchronous): it
/// submits each batch it is sent and returns at once, so the scheduler may hand
/// it the next batch while the previous one computes (its credit window,
/// scheduler_config::executor_depth, is at least the backend's pipeline depth).
///
/// Each batch in flight keeps its Batch message, its result message and the
/// response promise of its run_batch request. The backend's completion (on a
/// thread of the backend's own) stores how the batch ended and sends the actor a
/// `batch_done` message; the actor then fulfils that batch's promise, so every
/// answer leaves from the actor, never from the backend's thread. Completions
/// may come in any order; each answers its own batch.
///
/// Failures behave as with a synchronous backend (executor_actor.cpp): an error
/// value or a throw fails that batch alone; executor_broken (thrown by submit
/// or carried by a completion) stops the actor, and every batch it holds is
/// answered `request_receiver_down`, which the scheduler treats as a lost
/// executor (it sends the batch again). An actor that stops for any reason
/// (killed by the scheduler as hung, its model unloaded) answers its batches the
/// same way; a completion that arrives afterwards finds the actor gone and its
/// batch's memory still alive (the completion owns a share of it).

#include "executor/executor_actor.hpp"

namespace caf_serving::executor {

/// `be` must be asynchronous. Spawned detached when `be->blocks()` (submit may
/// wait for a free pipeline slot), else on CAF's workers.
executor_actor spawn_async_executor(caf::actor_system& sys, std::shared_ptr<backend> be,
                                    const model_config& config);

} // namespace caf_serving::executor
