#pragma once
/// The executor of a generative model (issue 34): owns its decoder_runner and
/// with it the KV cache, and runs the steps its scheduler plans
/// (core/generation_messages.hpp). A detached actor: a step blocks its thread
/// for milliseconds.
///
/// For each plan it frees the cache of the plan's `releases`, runs the items,
/// and delegates the request with the emitting rows' logits to the
/// post-processor (`sampler`), whose samples answer the scheduler. A plan that
/// emits nothing is answered with no rows, a failed step with its error; both
/// by the executor itself.

#include "core/generation_messages.hpp"
#include "executor/decoder_runner.hpp"

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace caf_serving::executor {

using decoder_actor = caf::typed_actor<
  caf::replies_to<generation_run_atom, generation_step_plan>::with<generation_samples>,
  caf::reacts_to<generation_release_atom, std::vector<uint64_t>>>;

struct decoder_actor_config {
  decoder_signature signature;
  std::shared_ptr<backend> model;
  kv_cache_layout cache;
  decoder_runner_config runner;
  /// Where the logits go to be sampled.
  generation_sampler_actor sampler;
};

decoder_actor spawn_decoder_actor(caf::actor_system& sys, decoder_actor_config config);

} // namespace caf_serving::executor
