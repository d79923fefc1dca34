#pragma once
/// The executor actor: one per model instance. It owns a backend and turns each
/// batch it is sent into a BatchResult. A backend that blocks (milliseconds per
/// batch) gets an actor with a thread of its own, so CAF's shared workers never wait
/// on it; a cheap backend runs on the shared workers and saves two thread hand-offs.

#include "core/model_config.hpp"
#include "core/pipeline_messages.hpp"
#include "executor/backend.hpp"

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace caf_serving::executor {

using executor_actor
  = caf::typed_actor<caf::replies_to<run_batch>::with<batch_result_message>>;

/// An asynchronous backend (backend::asynchronous) gets the executor of
/// async_executor.hpp: several batches in flight, each answered when it completes.
executor_actor spawn_executor(caf::actor_system& sys, std::shared_ptr<backend> be,
                              const model_config& config);

/// Runs one batch through `be` outside any actor: the executor actor's body, and
/// what benchmarks and tests call directly.
batch_result_message run_one_batch(backend& be, const model_config& config,
                                   const wire::Batch::Reader& batch);

} // namespace caf_serving::executor
