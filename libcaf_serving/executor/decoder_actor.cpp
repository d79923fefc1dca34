#include "executor/decoder_actor.hpp"

#include "core/clock.hpp"

#include <caf/typed_event_based_actor.hpp>

namespace caf_serving::executor {

decoder_actor spawn_decoder_actor(caf::actor_system& sys, decoder_actor_config config) {
  auto body = [cfg = std::move(config)](decoder_actor::pointer self) mutable
    -> decoder_actor::behavior_type {
    auto runner = std::make_shared<decoder_runner>(std::move(cfg.signature), std::move(cfg.model),
                                                   cfg.cache, cfg.runner);
    auto sampler = std::move(cfg.sampler);
    return {
      [self, runner, sampler](generation_run_atom,
                              generation_step_plan& plan) -> caf::result<generation_samples> {
        for (uint64_t seq : plan.releases)
          runner->release(seq);
        if (plan.items.empty())
          return generation_samples{};
        std::vector<decoder_step_item> items;
        items.reserve(plan.items.size());
        std::vector<uint64_t> emitting;
        for (const auto& i : plan.items) {
          items.push_back({i.seq, i.first_position, plan.tokens.data() + i.offset, i.count,
                           i.emits});
          if (i.emits)
            emitting.push_back(i.seq);
        }
        const int64_t started = now_ns();
        auto logits = runner->run(items);
        const int64_t model_ns = now_ns() - started;
        if (!logits) {
          generation_samples failed;
          failed.error = std::move(logits.error());
          failed.model_ns = model_ns;
          return failed;
        }
        if (emitting.empty()) {
          generation_samples none;
          none.model_ns = model_ns;
          return none;
        }
        generation_logits rows;
        rows.seqs = std::move(emitting);
        rows.values = std::make_shared<const std::vector<float>>(std::move(*logits));
        rows.vocab = runner->signature().vocab;
        rows.model_ns = model_ns;
        return self->delegate(sampler, generation_sample_atom::value, std::move(rows));
      },
      [runner](generation_release_atom, const std::vector<uint64_t>& seqs) {
        for (uint64_t seq : seqs)
          runner->release(seq);
      },
    };
  };
  return sys.spawn<caf::detached>(std::move(body));
}

} // namespace caf_serving::executor
