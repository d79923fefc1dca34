#pragma once
/// The post-processor of a generative model (issue 34): the actor that owns a
/// generation_postprocessor (the samplers, detokenizers and stop checks of the
/// model's sequences). The scheduler opens and closes sequences; the executor
/// delegates each step's request to it with the logits, and its samples
/// answer the scheduler (core/generation_messages.hpp). Sampling a step is
/// O(vocabulary) per row and never blocks: it runs on CAF's shared workers.

#include "core/generation_messages.hpp"
#include "postprocess/generation_postprocessor.hpp"

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <memory>

namespace caf_serving::postprocess {

using generation_postprocessor_actor = generation_sampler_actor::extend<
  caf::reacts_to<generation_open_atom, std::shared_ptr<const generation_sequence>>,
  caf::reacts_to<generation_close_atom, uint64_t>>;

generation_postprocessor_actor spawn_generation_postprocessor(caf::actor_system& sys,
                                                              generation_postprocessor_config config);

} // namespace caf_serving::postprocess
