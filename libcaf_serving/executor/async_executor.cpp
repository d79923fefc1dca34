#include "executor/async_executor.hpp"

#include "core/clock.hpp"
#include "executor/batch_run.hpp"

#include <atomic>
#include <iostream>
#include <map>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

namespace caf_serving::executor {

namespace {

/// backend thread -> executor: the batch with this sequence number completed.
using batch_done_atom = caf::atom_constant<caf::atom("batchdone")>;

/// What the actor is; it is handed out as an executor_actor (the scheduler and
/// remote peers see only run_batch).
using async_executor_actor
  = executor_actor::extend<caf::reacts_to<batch_done_atom, uint64_t>>;

/// One batch in flight, shared by the actor and the backend's completion: the
/// backend reads the inputs and writes the outputs through it until it calls
/// the completion, which may be after the actor is gone.
struct in_flight_record {
  /// Declared first, destroyed last: the writer refers to it.
  std::shared_ptr<const model_config> config;
  /// Keeps the input bytes that `prepared->view` points into.
  run_batch msg;
  std::unique_ptr<prepared_batch> prepared;
  int64_t submitted_ns = 0;
  /// Written by the completion before it sends batch_done; read by the actor
  /// after it receives that (the mailbox orders the two).
  batch_completion outcome;
  int64_t completed_ns = 0;
  std::atomic<bool> completed{false};
};

struct in_flight_entry {
  caf::typed_response_promise<batch_result_message> promise;
  std::shared_ptr<in_flight_record> record;
};

struct async_state {
  std::shared_ptr<backend> be;
  std::shared_ptr<const model_config> config;
  uint64_t next_seq = 1;
  std::map<uint64_t, in_flight_entry> in_flight;

  async_state() = default;
  async_state(const async_state&) = delete;
  async_state& operator=(const async_state&) = delete;

  /// Runs when the actor stops, however it stops: no batch it holds goes
  /// unanswered. Then the backend goes (its destructor completes what it still
  /// holds; those completions find the actor gone).
  ~async_state() {
    for (auto& [seq, entry] : in_flight)
      entry.promise.deliver(caf::make_error(caf::sec::request_receiver_down));
    in_flight.clear();
    be.reset();
  }
};

using self_ptr = async_executor_actor::stateful_pointer<async_state>;

/// executor_broken: this batch and every other one held are answered as lost
/// (the scheduler sends them again), and the actor stops.
caf::error stop_broken(self_ptr self, const char* why) {
  std::cerr << "caf-serving: model '" << self->state.config->name
            << "': an executor stopped: " << why << std::endl;
  self->quit(caf::sec::runtime_error);
  return caf::make_error(caf::sec::request_receiver_down);
}

completion_handler make_completion(self_ptr self, uint64_t seq,
                                   std::shared_ptr<in_flight_record> record) {
  // Weak: a batch in flight does not keep a stopped actor's memory alive.
  auto weak = caf::actor_cast<caf::weak_actor_ptr>(self);
  return [weak, seq, record = std::move(record)](batch_completion c) {
    if (record->completed.exchange(true)) {
      // A broken invariant of the backend; the first completion answered.
      std::cerr << "caf-serving: bug: a backend completed batch " << record->prepared->batch_id
                << " twice; the second completion is ignored" << std::endl;
      return;
    }
    record->completed_ns = now_ns();
    record->outcome = std::move(c);
    if (auto strong = caf::actor_cast<caf::strong_actor_ptr>(weak))
      caf::anon_send(caf::actor_cast<async_executor_actor>(strong), batch_done_atom::value, seq);
  };
}

} // namespace

executor_actor spawn_async_executor(caf::actor_system& sys, std::shared_ptr<backend> be,
                                    const model_config& config) {
  bool detached = be->blocks();
  auto body = [be = std::move(be), config = std::make_shared<const model_config>(config)](
                self_ptr self) mutable -> async_executor_actor::behavior_type {
    self->state.be = std::move(be);
    self->state.config = std::move(config);
    return {
      [self](run_batch& msg) -> caf::result<batch_result_message> {
        auto& st = self->state;
        auto record = std::make_shared<in_flight_record>();
        record->config = st.config;
        record->msg = std::move(msg);
        record->prepared = prepare_batch(*record->config, record->msg.reader());
        uint64_t seq = st.next_seq++;
        auto promise = self->make_response_promise<batch_result_message>();
        // Registered before submit: a completion may arrive before it returns.
        st.in_flight.emplace(seq, in_flight_entry{promise, record});
        record->submitted_ns = now_ns();
        try {
          st.be->submit(record->prepared->view, *record->prepared->writer,
                        make_completion(self, seq, record));
        } catch (const executor_broken& e) {
          // Answered through the promise: making it took over the request.
          st.in_flight.erase(seq);
          promise.deliver(stop_broken(self, e.what()));
          return promise;
        } catch (...) {
          // Failed before it was queued: this batch alone, as execute's throw.
          st.in_flight.erase(seq);
          batch_end end;
          end.thrown = thrown_text(std::current_exception());
          end.infer_start_ns = record->submitted_ns;
          end.infer_end_ns = now_ns();
          promise.deliver(finish_batch(*record->prepared, *record->config, std::move(end)));
        }
        return promise;
      },
      [self](batch_done_atom, uint64_t seq) {
        auto& st = self->state;
        auto it = st.in_flight.find(seq);
        if (it == st.in_flight.end())
          return; // answered already (cannot happen while the actor runs)
        auto entry = std::move(it->second);
        st.in_flight.erase(it);
        auto& record = *entry.record;
        auto& outcome = record.outcome;
        batch_end end;
        end.status = std::move(outcome.status);
        if (outcome.thrown) {
          try {
            end.thrown = thrown_text(outcome.thrown);
          } catch (const executor_broken& e) {
            entry.promise.deliver(stop_broken(self, e.what()));
            return;
          }
        }
        // The backend's own times where it has them: a batch queued behind
        // another counts its wait as compute_input, not as inference.
        end.infer_start_ns = outcome.compute_start_ns > 0 ? outcome.compute_start_ns
                                                          : record.submitted_ns;
        end.infer_end_ns = outcome.compute_end_ns > 0 ? outcome.compute_end_ns
                                                      : record.completed_ns;
        entry.promise.deliver(finish_batch(*record.prepared, *record.config, std::move(end)));
      },
    };
  };
  async_executor_actor handle = detached ? sys.spawn<caf::detached>(std::move(body))
                                         : sys.spawn(std::move(body));
  return caf::actor_cast<executor_actor>(handle);
}

} // namespace caf_serving::executor
