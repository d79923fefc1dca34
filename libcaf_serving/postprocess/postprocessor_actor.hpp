#pragma once
/// The post-processor actor (one per model): splits each finished batch into
/// per-request responses, runs classification where asked, records the queue and
/// compute statistics, and hands every response to its request's sink.

#include "core/stats.hpp"
#include "postprocess/response_builder.hpp"

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace caf_serving::postprocess {

using postprocessor_actor
  = caf::typed_actor<caf::reacts_to<finished_batch>, caf::reacts_to<drain_atom>>;

struct postprocessor_config {
  std::shared_ptr<model_stats> stats;
  response_config responses;
};

postprocessor_actor spawn_postprocessor(caf::actor_system& sys, postprocessor_config config);

/// Adds one answered request to `stats` (queue, compute, histograms).
void record_success(model_stats& stats, const wire::StageTimes::Reader& t, uint32_t rows);

} // namespace caf_serving::postprocess
