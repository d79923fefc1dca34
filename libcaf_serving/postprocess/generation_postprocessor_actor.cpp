#include "postprocess/generation_postprocessor_actor.hpp"

#include "core/clock.hpp"

#include <caf/typed_event_based_actor.hpp>

namespace caf_serving::postprocess {

generation_postprocessor_actor spawn_generation_postprocessor(caf::actor_system& sys,
                                                              generation_postprocessor_config config) {
  auto body = [cfg = std::move(config)](generation_postprocessor_actor::pointer) mutable
    -> generation_postprocessor_actor::behavior_type {
    auto post = std::make_shared<generation_postprocessor>(std::move(cfg));
    return {
      [post](generation_sample_atom, const generation_logits& logits) {
        const int64_t started = now_ns();
        auto samples = post->sample(logits);
        samples.model_ns = logits.model_ns;
        samples.sample_ns = now_ns() - started;
        return samples;
      },
      [post](generation_open_atom, const std::shared_ptr<const generation_sequence>& seq) {
        post->open(*seq);
      },
      [post](generation_close_atom, uint64_t id) { post->close(id); },
    };
  };
  return sys.spawn(std::move(body));
}

} // namespace caf_serving::postprocess
