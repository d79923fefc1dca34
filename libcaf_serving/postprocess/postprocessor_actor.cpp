#include "postprocess/postprocessor_actor.hpp"

#include "core/responses.hpp"

#include <caf/typed_event_based_actor.hpp>
#include <kj/exception.h>

#include <iostream>

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

namespace {

/// Answers every request of a batch whose responses could not be built with a
/// 500 naming the model; the cause goes to the log, not to the clients.
std::vector<response_message> failed_batch(const finished_batch& fb,
                                           const postprocessor_config& cfg,
                                           const std::string& cause) {
  std::cerr << "caf-serving: model '" << cfg.stats->name << "': the responses of a batch could "
            << "not be built: " << cause << std::endl;
  serving_error e{status_code::internal,
                  "model '" + cfg.stats->name + "': the response could not be built from the "
                  "model's outputs; the server log has the details",
                  failure_reason::internal};
  std::vector<response_message> out;
  for (const auto& j : fb.jobs)
    out.push_back(error_response(j.job.request.reader(), e));
  return out;
}

} // namespace

postprocessor_actor spawn_postprocessor(caf::actor_system& sys, postprocessor_config config) {
  auto cfg = std::make_shared<postprocessor_config>(std::move(config));
  return sys.spawn([cfg](postprocessor_actor::pointer self) -> postprocessor_actor::behavior_type {
    return {
      [cfg](finished_batch& fb) {
        std::vector<response_message> responses;
        try {
          responses = split_batch(fb, cfg->responses);
        } catch (const kj::Exception& e) {
          responses = failed_batch(fb, *cfg, e.getDescription().cStr());
        } catch (const std::exception& e) {
          responses = failed_batch(fb, *cfg, e.what());
        }
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
