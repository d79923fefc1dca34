#include "cluster/remote_executor.hpp"

#include <caf/actor_cast.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <iostream>
#include <map>

namespace caf_serving::cluster {

namespace {

struct proxy_state {
  remote_executor_config cfg;
  executor::executor_actor remote;
  uint64_t next_id = 1;
  /// Batches forwarded and not yet answered.
  std::map<uint64_t, caf::typed_response_promise<batch_result_message>> pending;
  bool lost = false;
};

using self_ptr = executor::executor_actor::stateful_pointer<proxy_state>;

/// Answers every batch held with executor_lost and quits.
void lose(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.lost)
    return;
  st.lost = true;
  std::cerr << "caf-serving: executor of model '" << st.cfg.model << "' on worker '"
            << st.cfg.node << "' lost (" << why << "); " << st.pending.size()
            << " batch(es) go back to the queue" << std::endl;
  for (auto& [id, rp] : st.pending) {
    st.cfg.counters->in_flight.fetch_sub(1);
    st.cfg.counters->lost.fetch_add(1);
    rp.deliver(make_cluster_error(cluster_errc::executor_lost,
                                  "worker '" + st.cfg.node + "' lost: " + why));
  }
  st.pending.clear();
  self->quit(caf::exit_reason::remote_link_unreachable);
}

} // namespace

executor::executor_actor spawn_remote_executor(caf::actor_system& sys,
                                               remote_executor_config config) {
  return sys.spawn([cfg = std::move(config)](self_ptr self) mutable
                   -> executor::executor_actor::behavior_type {
    auto& st = self->state;
    st.remote = caf::actor_cast<executor::executor_actor>(cfg.remote);
    st.cfg = std::move(cfg);
    self->monitor(st.cfg.remote);
    self->set_down_handler([self](caf::down_msg& dm) {
      lose(self, "its node went down: " + self->system().render(dm.reason));
    });
    return {
      [self](run_batch& batch) -> caf::result<batch_result_message> {
        auto& st = self->state;
        if (st.lost)
          return make_cluster_error(cluster_errc::executor_lost,
                                    "worker '" + st.cfg.node + "' was lost");
        auto rp = self->make_response_promise<batch_result_message>();
        auto id = st.next_id++;
        st.pending.emplace(id, rp);
        st.cfg.counters->in_flight.fetch_add(1);
        st.cfg.counters->batches.fetch_add(1);
        auto timeout = std::chrono::duration_cast<caf::timespan>(st.cfg.request_timeout);
        self->request(st.remote, timeout, std::move(batch))
          .then(
            [self, id](batch_result_message& result) {
              auto& st = self->state;
              auto it = st.pending.find(id);
              if (it == st.pending.end())
                return; // answered executor_lost already; this late answer is dropped
              st.cfg.counters->in_flight.fetch_sub(1);
              it->second.deliver(std::move(result));
              st.pending.erase(it);
            },
            [self, id](caf::error& err) {
              auto& st = self->state;
              auto it = st.pending.find(id);
              if (it == st.pending.end())
                return;
              if (executor_was_lost(err)) {
                // No answer in time, or the node is gone: it is lost either way.
                lose(self, self->system().render(err));
                return;
              }
              // The worker answered with an error (e.g. it refused this server).
              st.cfg.counters->in_flight.fetch_sub(1);
              it->second.deliver(std::move(err));
              st.pending.erase(it);
            });
        return rp;
      },
    };
  });
}

} // namespace caf_serving::cluster
