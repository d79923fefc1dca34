#include "scheduler/scheduler_actor.hpp"

#include "core/clock.hpp"
#include "postprocess/response_builder.hpp"

#include <caf/typed_event_based_actor.hpp>

#include "cluster/executor_choice.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

namespace caf_serving::scheduler {

batch_message gather_batch(const model_config& model, uint64_t batch_id,
                           const std::vector<batched_job>& jobs) {
  size_t total = 0;
  for (const auto& j : jobs)
    for (auto t : j.job.request.reader().getInputs())
      total += t.getData().size();
  auto msg = batch_message::create(jobs.size() == 1 ? 2048 : total + 2048);
  auto b = msg.builder();
  b.setBatchId(batch_id);
  b.setModelName(model.name);
  auto first = jobs.front().job.request.reader();
  b.setModelVersion(first.getModelVersion());
  auto request_rows = b.initRequestRows(static_cast<unsigned>(jobs.size()));
  uint32_t rows = 0;
  for (unsigned i = 0; i < jobs.size(); ++i) {
    uint32_t r = jobs[i].job.request.reader().getRows();
    request_rows.set(i, r);
    rows += r;
  }
  b.setRows(rows);
  auto first_inputs = first.getInputs();
  auto inputs = b.initInputs(first_inputs.size());
  for (unsigned i = 0; i < first_inputs.size(); ++i) {
    auto src = first_inputs[i];
    auto dst = inputs[i];
    dst.setName(src.getName());
    dst.setDatatype(src.getDatatype());
    auto src_shape = src.getShape();
    auto shape = dst.initShape(src_shape.size());
    for (unsigned d = 0; d < src_shape.size(); ++d)
      shape.set(d, d == 0 && model.max_batch_size > 0 ? int64_t{rows} : src_shape[d]);
    if (jobs.size() == 1) {
      dst.adoptData(msg.reference(src.getData(), jobs[0].job.request.owner()));
      continue;
    }
    size_t bytes = 0;
    for (const auto& j : jobs)
      bytes += j.job.request.reader().getInputs()[i].getData().size();
    auto data = dst.initData(static_cast<unsigned>(bytes));
    size_t at = 0;
    for (const auto& j : jobs) {
      auto d = j.job.request.reader().getInputs()[i].getData();
      std::memcpy(data.begin() + at, d.begin(), d.size());
      at += d.size();
    }
  }
  return msg;
}

namespace {

struct executor_slot {
  executor::executor_actor handle;
  uint32_t depth = 1;
  std::string node;
  /// Batch ids in flight here, oldest first, with their rows and send times.
  struct sent {
    uint64_t batch_id;
    uint32_t rows;
    int64_t sent_ns;
  };
  std::vector<sent> in_flight;
  /// When this executor last answered (the earliest its next batch could start).
  int64_t last_answer_ns = 0;
  cluster::batch_cost_model cost;
};

/// A batch sent to an executor and not yet answered. It keeps its requests and
/// its Batch message so that it can be sent again if the executor is lost.
struct pending_batch {
  batch_message batch;
  std::shared_ptr<std::vector<batched_job>> jobs;
  uint32_t rows = 0;
  uint32_t attempts = 0;
};

struct scheduler_state {
  scheduler_config cfg;
  std::unique_ptr<batching_policy> policy;
  std::vector<executor_slot> executors;
  /// Queued requests by the id the policy knows them by.
  std::unordered_map<uint64_t, batched_job> queued;
  uint64_t next_request_id = 1;
  uint64_t next_batch_id = 1;
  /// When the armed timer fires; none armed when empty.
  std::optional<time_point> timer_due;
  bool draining = false;
  /// Every batch formed and not yet answered, by batch id.
  std::map<uint64_t, pending_batch> pending;
  /// Batches whose executor was lost, to send again before any new batch.
  std::set<uint64_t> resend;
  /// preserve_ordering: finished batches wait here until all earlier ones are done.
  uint64_t next_to_release = 1;
  std::map<uint64_t, finished_batch> finished_early;
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

/// The executor predicted to finish a batch of `rows` first, among those with a
/// free credit; nullptr when every one is full.
executor_slot* choose(scheduler_state& st, uint32_t rows) {
  int64_t now = now_ns();
  std::vector<cluster::executor_load> loads;
  loads.reserve(st.executors.size());
  for (auto& e : st.executors) {
    cluster::executor_load l;
    l.cost = &e.cost;
    l.depth = e.depth;
    for (auto& s : e.in_flight)
      l.in_flight_rows.push_back(s.rows);
    if (!e.in_flight.empty())
      l.oldest_elapsed_ns = now - std::max(e.in_flight.front().sent_ns, e.last_answer_ns);
    loads.push_back(std::move(l));
  }
  auto i = cluster::choose_executor(loads, rows);
  return i ? &st.executors[*i] : nullptr;
}

bool any_free(const scheduler_state& st) {
  for (auto& e : st.executors)
    if (e.in_flight.size() < e.depth)
      return true;
  return false;
}

executor_slot* find_slot(scheduler_state& st, const caf::actor_addr& addr) {
  for (auto& e : st.executors)
    if (e.handle.address() == addr)
      return &e;
  return nullptr;
}

void answer_error(scheduler_state&, const infer_job& job, const serving_error& e) {
  job.sink->deliver(postprocess::error_response(job.request.reader(), e));
}

/// Answers every request of a pending batch with `e`, for a batch that cannot run.
void fail_batch(self_ptr self, uint64_t batch_id, const serving_error& e);

void maybe_finish_drain(self_ptr self) {
  auto& st = self->state;
  if (!st.draining || !st.queued.empty())
    return;
  if (st.executors.empty()) {
    // Nothing is left to run the batches of lost executors.
    auto ids = st.resend;
    for (auto id : ids)
      fail_batch(self, id, {status_code::unavailable,
                            "model '" + st.cfg.model.name
                              + "' was unloaded after every executor of this batch was lost",
                            failure_reason::unavailable});
  }
  if (!st.pending.empty())
    return;
  for (auto& e : st.executors)
    self->send_exit(e.handle, caf::exit_reason::user_shutdown);
  // The post-processor finishes what is in its mailbox first: a plain message
  // queues behind the batches sent to it.
  self->send(st.cfg.postprocessor, drain_atom::value);
  self->quit();
}

void release(self_ptr self, uint64_t batch_id, finished_batch fb) {
  auto& st = self->state;
  if (!st.cfg.policy.dynamic_batching.preserve_ordering) {
    self->send(st.cfg.postprocessor, std::move(fb));
    return;
  }
  st.finished_early.emplace(batch_id, std::move(fb));
  while (!st.finished_early.empty() && st.finished_early.begin()->first == st.next_to_release) {
    self->send(st.cfg.postprocessor, std::move(st.finished_early.begin()->second));
    st.finished_early.erase(st.finished_early.begin());
    ++st.next_to_release;
  }
}

void fail_batch(self_ptr self, uint64_t batch_id, const serving_error& e) {
  auto& st = self->state;
  auto it = st.pending.find(batch_id);
  if (it == st.pending.end())
    return;
  auto msg = batch_result_message::create();
  auto err = msg.builder().initError();
  err.setStatus(static_cast<uint16_t>(e.status));
  err.setMessage(e.message);
  err.setReason(static_cast<wire::FailureReason>(reason_of(e)));
  msg.builder().setBatchId(batch_id);
  finished_batch fb;
  fb.result = std::move(msg);
  fb.jobs = std::move(*it->second.jobs);
  st.pending.erase(it);
  st.resend.erase(batch_id);
  release(self, batch_id, std::move(fb));
}

void poll_policy(self_ptr self);

/// Sends pending batch `batch_id` to `slot` and handles its one answer.
void send_pending(self_ptr self, executor_slot& slot, uint64_t batch_id) {
  auto& st = self->state;
  auto& p = st.pending.at(batch_id);
  ++p.attempts;
  int64_t sent = now_ns();
  slot.in_flight.push_back({batch_id, p.rows, sent});
  auto handle = slot.handle;
  // Takes the batch off its executor's books; the measured service time feeds the
  // executor choice when the batch was answered.
  auto settle = [self, addr = handle.address(), batch_id](bool answered) {
    auto* e = find_slot(self->state, addr);
    if (!e)
      return;
    auto it = std::find_if(e->in_flight.begin(), e->in_flight.end(),
                           [&](const auto& s) { return s.batch_id == batch_id; });
    if (it == e->in_flight.end())
      return;
    int64_t now = now_ns();
    if (answered)
      e->cost.observe(it->rows, now - std::max(it->sent_ns, e->last_answer_ns));
    e->last_answer_ns = now;
    e->in_flight.erase(it);
  };
  self->request(handle, caf::infinite, run_batch{p.batch, nullptr})
    .then(
      [self, settle, batch_id](batch_result_message& result) {
        auto& st = self->state;
        settle(true);
        auto it = st.pending.find(batch_id);
        if (it == st.pending.end())
          return; // answered already (cannot happen: one answer per request)
        int64_t received = now_ns();
        auto r = result.reader();
        finished_batch fb;
        fb.compute_end_ns = received - r.getComputeOutputNs();
        fb.compute_start_ns = fb.compute_end_ns - r.getComputeInferNs();
        fb.result = std::move(result);
        fb.jobs = std::move(*it->second.jobs);
        st.pending.erase(it);
        release(self, batch_id, std::move(fb));
        poll_policy(self);
        maybe_finish_drain(self);
      },
      [self, settle, batch_id, node = slot.node](caf::error& err) {
        auto& st = self->state;
        settle(false);
        auto it = st.pending.find(batch_id);
        if (it == st.pending.end())
          return;
        if (executor_was_lost(err) && it->second.attempts < st.cfg.max_batch_attempts) {
          // Not answered: the same batch goes out again, before any new one.
          st.resend.insert(batch_id);
        } else {
          bool lost = executor_was_lost(err);
          fail_batch(self, batch_id,
                     {lost ? status_code::unavailable : status_code::internal,
                      "model '" + st.cfg.model.name + "': "
                        + (lost ? "the batch was lost with " + std::to_string(it->second.attempts)
                                    + " executors in a row; last on node '" + node + "': "
                                : std::string("the executor failed while running the batch: "))
                        + self->system().render(err),
                      lost ? failure_reason::unavailable : failure_reason::internal});
        }
        poll_policy(self);
        maybe_finish_drain(self);
      });
}

void send_batch(self_ptr self, const dispatch& d) {
  auto& st = self->state;
  int64_t formed = now_ns();
  std::vector<batched_job> jobs;
  jobs.reserve(d.ids.size());
  for (auto id : d.ids) {
    auto it = st.queued.find(id);
    it->second.batch_formed_ns = formed;
    jobs.push_back(std::move(it->second));
    st.queued.erase(it);
  }
  uint64_t batch_id = st.next_batch_id++;
  pending_batch p;
  p.batch = gather_batch(st.cfg.model, batch_id, jobs);
  p.rows = p.batch.reader().getRows();
  p.jobs = std::make_shared<std::vector<batched_job>>(std::move(jobs));
  st.pending.emplace(batch_id, std::move(p));
  st.resend.insert(batch_id);
}

/// Sends the batches waiting to be sent (again), oldest first, while executors
/// have credit. True when none is left waiting.
bool send_waiting(self_ptr self) {
  auto& st = self->state;
  while (!st.resend.empty()) {
    auto id = *st.resend.begin();
    auto* slot = choose(st, st.pending.at(id).rows);
    if (!slot)
      return false;
    st.resend.erase(st.resend.begin());
    send_pending(self, *slot, id);
  }
  return true;
}

void poll_policy(self_ptr self) {
  auto& st = self->state;
  for (;;) {
    auto now = clock_type::now();
    bool free = send_waiting(self) && any_free(st);
    auto r = st.policy->poll(now, free);
    for (auto& rej : r.expired) {
      auto it = st.queued.find(rej.id);
      answer_error(st, it->second.job,
                   {status_code::unavailable, rej.message, failure_reason::timeout});
      st.queued.erase(it);
    }
    if (auto* d = std::get_if<dispatch>(&r.next)) {
      send_batch(self, *d);
      continue;
    }
    if (auto* w = std::get_if<wait_until>(&r.next)) {
      if (!st.timer_due || w->when < *st.timer_due) {
        st.timer_due = w->when;
        self->delayed_send(self, w->when - now, tick_atom::value);
      }
    }
    return;
  }
}

} // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config config) {
  return sys.spawn([cfg = std::move(config)](self_ptr self) mutable
                   -> scheduler_actor::behavior_type {
    auto& st = self->state;
    st.policy = std::make_unique<batching_policy>(cfg.policy);
    for (auto& e : cfg.executors) {
      executor_slot slot;
      slot.handle = e;
      slot.depth = cfg.executor_depth;
      slot.node = "local";
      self->monitor(e);
      st.executors.push_back(std::move(slot));
    }
    st.cfg = std::move(cfg);
    // An executor that is gone (its proxy quit when the node was lost) takes no
    // more batches; its batches in flight come back through their error handlers.
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& ex = self->state.executors;
      ex.erase(std::remove_if(ex.begin(), ex.end(),
                              [&](const executor_slot& e) { return e.handle.address() == dm.source; }),
               ex.end());
      maybe_finish_drain(self);
    });
    return {
      [self](infer_job& job) {
        auto& st = self->state;
        auto req = job.request.reader();
        if (st.draining) {
          answer_error(st, job,
                       {status_code::unavailable,
                        "model '" + st.cfg.model.name
                          + "' is being unloaded; load it again or use another model",
                        failure_reason::unavailable});
          return;
        }
        uint64_t id = st.next_request_id++;
        request_info info{id, req.getRows(), req.getPriority(), req.getTimeoutUs()};
        auto now = clock_type::now();
        auto admitted = st.policy->enqueue(info, now);
        if (auto* rej = std::get_if<rejected>(&admitted)) {
          auto reason = rej->reason == reject_reason::queue_full ? failure_reason::queue_full
                                                                  : failure_reason::bad_request;
          auto status = rej->reason == reject_reason::too_many_rows ? status_code::bad_request
                                                                    : status_code::unavailable;
          answer_error(st, job, {status, rej->message, reason});
          return;
        }
        st.queued.emplace(id, batched_job{std::move(job), to_ns(now), 0});
        poll_policy(self);
      },
      [self](tick_atom) {
        auto& st = self->state;
        if (st.timer_due && clock_type::now() >= *st.timer_due)
          st.timer_due.reset();
        poll_policy(self);
      },
      [self](drain_atom) {
        self->state.draining = true;
        maybe_finish_drain(self);
      },
      [self](add_executor_atom, executor_entry& entry) {
        auto& st = self->state;
        if (st.draining || !entry.handle) {
          if (entry.handle)
            self->send_exit(entry.handle, caf::exit_reason::user_shutdown);
          return;
        }
        executor_slot slot;
        slot.handle = std::move(entry.handle);
        slot.depth = std::max<uint32_t>(entry.depth, 1);
        slot.node = std::move(entry.node);
        self->monitor(slot.handle);
        st.executors.push_back(std::move(slot));
        poll_policy(self);
      },
    };
  });
}

} // namespace caf_serving::scheduler
