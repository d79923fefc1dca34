#include "executor/executor_actor.hpp"

#include "core/clock.hpp"
#include "executor/async_executor.hpp"
#include "executor/batch_run.hpp"

#include <iostream>

#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace caf_serving::executor {

batch_result_message run_one_batch(backend& be, const model_config& cfg,
                                   const wire::Batch::Reader& batch) {
  auto prepared = prepare_batch(cfg, batch);
  batch_end end;
  end.infer_start_ns = now_ns();
  // A backend that throws fails this batch, not the executor: the clients get a
  // KServe error naming the model; the exception's text goes to the log only.
  try {
    end.status = be.execute(prepared->view, *prepared->writer);
  } catch (...) {
    end.thrown = thrown_text(std::current_exception()); // executor_broken goes on up
  }
  end.infer_end_ns = now_ns();
  return finish_batch(*prepared, cfg, std::move(end));
}

executor_actor spawn_executor(caf::actor_system& sys, std::shared_ptr<backend> be,
                              const model_config& config) {
  if (be->asynchronous())
    return spawn_async_executor(sys, std::move(be), config);
  auto body = [be, config](executor_actor::pointer self) -> executor_actor::behavior_type {
    return {
      [self, be, config](run_batch& msg) -> caf::result<batch_result_message> {
        try {
          return run_one_batch(*be, config, msg.reader());
        } catch (const executor_broken& e) {
          // The batch gets this error; the scheduler sees the actor stop.
          std::cerr << "caf-serving: model '" << config.name
                    << "': an executor stopped: " << e.what() << std::endl;
          self->quit(caf::sec::runtime_error);
          return caf::make_error(caf::sec::request_receiver_down);
        }
      },
    };
  };
  if (be->blocks())
    return sys.spawn<caf::detached>(body);
  return sys.spawn(body);
}

} // namespace caf_serving::executor
