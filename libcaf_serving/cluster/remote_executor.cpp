#include "cluster/remote_executor.hpp"

#include "scheduler/cost_model.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <set>

namespace caf_serving::cluster {

int64_t remote_deadline_ns(const remote_timeout_config& cfg, int64_t ahead_ns,
                           int64_t own_ns) {
  using std::chrono::nanoseconds;
  if (own_ns <= 0)
    return nanoseconds(cfg.unmeasured).count();
  auto predicted = static_cast<double>(ahead_ns + own_ns) * cfg.factor;
  return std::max(static_cast<int64_t>(predicted), nanoseconds(cfg.floor).count());
}

namespace {

using deadline_atom = caf::atom_constant<caf::atom("deadline")>;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

struct pending_batch {
  caf::typed_response_promise<batch_result_message> promise;
  /// Not forwarded yet: the worker still holds presumed-lost batches, so this one
  /// waits here, not in the stalled worker's mailbox (see forward_held).
  std::optional<run_batch> held;
  uint32_t rows = 0;
  int64_t sent_ns = 0;
  /// Predicted round trip of this batch alone (0: unmeasured).
  int64_t predicted_ns = 0;
};

struct proxy_state {
  remote_executor_config cfg;
  executor::executor_actor remote;
  uint64_t next_id = 1;
  /// Batches forwarded and not yet answered.
  std::map<uint64_t, pending_batch> pending;
  /// Batches presumed lost (answered executor_lost) whose answer may still come;
  /// that answer is dropped. Bounded: see max_abandoned.
  std::set<uint64_t> abandoned;
  /// The round trip per batch size, measured from when the worker could start
  /// the batch (its send, or the previous answer if later) to its answer.
  scheduler::batch_cost_model cost;
  int64_t last_answer_ns = 0;
  /// Batches presumed lost since the worker last answered.
  size_t timeouts_in_row = 0;
  bool lost = false;
};

/// A worker whose batches are presumed lost this many times in a row, without
/// any answer between, is taken for hung although its node answers heartbeats.
constexpr size_t max_timeouts_in_row = 16;

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
  for (auto& [id, p] : st.pending) {
    st.cfg.counters->in_flight.fetch_sub(1);
    st.cfg.counters->lost.fetch_add(1);
    p.promise.deliver(make_cluster_error(cluster_errc::executor_lost,
                                         "worker '" + st.cfg.node + "' lost: " + why));
  }
  st.pending.clear();
  st.abandoned.clear();
  self->quit(caf::exit_reason::remote_link_unreachable);
}

/// The batch `id` is far past its predicted completion: it goes back to the
/// scheduler, which runs it elsewhere; its late answer will be dropped.
void abandon(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end())
    return;
  auto waited_ms = (now_ns() - it->second.sent_ns) / 1'000'000;
  std::cerr << "caf-serving: a batch of model '" << st.cfg.model << "' on worker '"
            << st.cfg.node << "' is unanswered after " << waited_ms
            << " ms, far past its predicted completion ("
            << it->second.predicted_ns / 1000 << " us); it runs elsewhere and a late answer "
            << "will be dropped" << std::endl;
  st.cfg.counters->in_flight.fetch_sub(1);
  st.cfg.counters->lost.fetch_add(1);
  st.cfg.counters->timed_out.fetch_add(1);
  it->second.promise.deliver(make_cluster_error(
    cluster_errc::executor_lost, "worker '" + st.cfg.node + "' did not answer in time"));
  if (!it->second.held)
    st.abandoned.insert(id); // the worker has it: its answer may still come
  st.pending.erase(it);
  if (++st.timeouts_in_row >= max_timeouts_in_row)
    lose(self, std::to_string(st.timeouts_in_row)
                 + " batches in a row unanswered far past their predicted completion");
}

void forward(self_ptr self, uint64_t id, run_batch batch);

/// The worker answered again: the batches held meanwhile go to it now.
void forward_held(self_ptr self) {
  auto& st = self->state;
  st.timeouts_in_row = 0;
  if (!st.abandoned.empty())
    return;
  for (auto& [id, p] : st.pending) {
    if (!p.held)
      continue;
    auto batch = std::move(*p.held);
    p.held.reset();
    forward(self, id, std::move(batch));
  }
}

/// The worker answered batch `id` (over CAF's link or the bulk channel).
void on_answer(self_ptr self, uint64_t id, batch_result_message& result) {
  auto& st = self->state;
  if (st.lost)
    return;
  auto now = now_ns();
  auto it = st.pending.find(id);
  if (it == st.pending.end()) {
    if (st.abandoned.erase(id) > 0) {
      // Re-run elsewhere already: this answer must not reach anyone.
      st.cfg.counters->late_dropped.fetch_add(1);
      std::cerr << "caf-serving: dropped a late answer of worker '" << st.cfg.node
                << "' to a batch of model '" << st.cfg.model << "' that was re-run elsewhere"
                << std::endl;
    }
    st.last_answer_ns = now;
    forward_held(self);
    return;
  }
  auto start = std::max(it->second.sent_ns, st.last_answer_ns);
  st.cost.observe(it->second.rows, now - start);
  st.last_answer_ns = now;
  st.cfg.counters->in_flight.fetch_sub(1);
  it->second.promise.deliver(std::move(result));
  st.pending.erase(it);
  forward_held(self);
}

/// The worker answered batch `id` with an error, or CAF reported its loss.
void on_error(self_ptr self, uint64_t id, caf::error& err) {
  auto& st = self->state;
  if (st.lost)
    return;
  auto it = st.pending.find(id);
  if (it == st.pending.end()) {
    st.abandoned.erase(id);
    forward_held(self);
    return;
  }
  if (executor_was_lost(err)) {
    // The remote executor is gone.
    lose(self, self->system().render(err));
    return;
  }
  // The worker answered with an error (e.g. it refused this server).
  st.cfg.counters->in_flight.fetch_sub(1);
  it->second.promise.deliver(std::move(err));
  st.pending.erase(it);
  forward_held(self);
}

/// Sends batch `id` to the remote executor and handles its one answer: over the
/// bulk channel when the batch is large and the channel takes it, else (and
/// whenever it is not connected or its queue is full) over CAF's link.
void forward(self_ptr self, uint64_t id, run_batch batch) {
  auto& st = self->state;
  if (st.cfg.bulk && st.cfg.bulk_threshold > 0
      && bulk::wire_bytes(bulk::segments_of(batch)) >= st.cfg.bulk_threshold
      && st.cfg.bulk->send_batch(batch, st.cfg.remote->id(), caf::actor_cast<caf::actor>(self),
                                 id)) {
    st.cfg.counters->bulk_batches.fetch_add(1);
    return; // answered by bulk_answer_atom or bulk_error_atom (the default handler)
  }
  self->request(st.remote, caf::infinite, std::move(batch))
    .then([self, id](batch_result_message& result) { on_answer(self, id, result); },
          [self, id](caf::error& err) { on_error(self, id, err); });
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
    // The deadline timers use a message of their own, outside the typed interface.
    self->set_default_handler([self](caf::scheduled_actor*, caf::message_view& x)
                                -> caf::result<caf::message> {
      auto msg = x.move_content_to_message();
      msg.apply({
        [self](deadline_atom, uint64_t id) { abandon(self, id); },
        [self](bulk_answer_atom, uint64_t id, batch_result_message& result) {
          on_answer(self, id, result);
        },
        [self](bulk_error_atom, uint64_t id, caf::error& err) { on_error(self, id, err); },
        // The bulk channel broke: the worker counts as lost, as when its CAF
        // link drops (its batches run elsewhere; the registry reconnects it).
        [self](bulk_lost_atom, const std::string& why) {
          lose(self, "its bulk channel broke: " + why);
        },
      });
      return caf::message{};
    });
    return {
      [self](run_batch& batch) -> caf::result<batch_result_message> {
        auto& st = self->state;
        if (st.lost)
          return make_cluster_error(cluster_errc::executor_lost,
                                    "worker '" + st.cfg.node + "' was lost");
        auto rp = self->make_response_promise<batch_result_message>();
        auto id = st.next_id++;
        pending_batch p;
        p.promise = rp;
        p.rows = batch.reader().getRows();
        p.sent_ns = now_ns();
        p.predicted_ns = st.cost.predict(p.rows);
        int64_t ahead = 0;
        for (const auto& [other, q] : st.pending)
          ahead += q.predicted_ns;
        auto deadline = remote_deadline_ns(st.cfg.timeout, ahead, p.predicted_ns);
        st.pending.emplace(id, std::move(p));
        st.cfg.counters->in_flight.fetch_add(1);
        st.cfg.counters->batches.fetch_add(1);
        // An untyped timer message (the executor interface has no room for it).
        caf::delayed_anon_send(caf::actor_cast<caf::actor>(self),
                               std::chrono::nanoseconds(deadline), deadline_atom::value, id);
        if (!st.abandoned.empty()) {
          // The worker still holds batches presumed lost: this one waits here
          // until it answers one, or its own deadline sends it elsewhere.
          st.pending.at(id).held = std::move(batch);
        } else {
          forward(self, id, std::move(batch));
        }
        return rp;
      },
    };
  });
}

} // namespace caf_serving::cluster
