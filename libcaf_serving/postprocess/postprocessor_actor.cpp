#include "postprocess/postprocessor_actor.hpp"

#include <caf/typed_event_based_actor.hpp>

namespace caf_serving::postprocess {

void record_success(model_stats& stats, const wire::StageTimes::Reader& t, uint32_t rows) {
  auto span = [](int64_t from, int64_t to) -> uint64_t {
    return from > 0 && to >= from ? static_cast<uint64_t>(to - from) : 0;
  };
  uint64_t queue = span(t.getEnqueuedNs(), t.getBatchFormedNs());
  uint64_t infer = span(t.getComputeStartNs(), t.getComputeEndNs());
  stats.queue.add(queue);
  stats.compute_input.add(span(t.getBatchFormedNs(), t.getComputeStartNs()));
  stats.compute_infer.add(infer);
  stats.compute_output.add(span(t.getComputeEndNs(), t.getPostprocessEndNs()));
  stats.inference_count.fetch_add(rows, std::memory_order_relaxed);
  stats.queue_us.observe(static_cast<double>(queue) / 1e3);
  stats.compute_us.observe(static_cast<double>(infer) / 1e3);
}

postprocessor_actor spawn_postprocessor(caf::actor_system& sys, postprocessor_config config) {
  auto cfg = std::make_shared<postprocessor_config>(std::move(config));
  return sys.spawn([cfg](postprocessor_actor::pointer self) -> postprocessor_actor::behavior_type {
    return {
      [cfg](finished_batch& fb) {
        auto responses = split_batch(fb, cfg->responses);
        // Every count is recorded before the first response leaves, so a
        // client that reads /stats after its answer sees its own batch.
        uint32_t rows = 0;
        for (size_t i = 0; i < responses.size(); ++i) {
          auto r = responses[i].reader();
          uint32_t request_rows = fb.jobs[i].job.request.reader().getRows();
          rows += request_rows;
          if (r.getError().getStatus() == 0)
            record_success(*cfg->stats, r.getTimes(), request_rows);
        }
        cfg->stats->execution_count.fetch_add(1, std::memory_order_relaxed);
        cfg->stats->batch_size.observe(rows);
        for (size_t i = 0; i < responses.size(); ++i)
          fb.jobs[i].job.sink->deliver(std::move(responses[i]));
      },
      [self](drain_atom) { self->quit(); },
    };
  });
}

} // namespace caf_serving::postprocess
