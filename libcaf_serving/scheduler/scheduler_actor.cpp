#include "scheduler/scheduler_actor.hpp"

#include "core/clock.hpp"
#include "postprocess/response_builder.hpp"

#include <caf/typed_event_based_actor.hpp>

#include <cstring>
#include <map>
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
  uint32_t in_flight = 0;
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
  size_t batches_in_flight = 0;
  /// preserve_ordering: finished batches wait here until all earlier ones are done.
  uint64_t next_to_release = 1;
  std::map<uint64_t, finished_batch> finished_early;
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

executor_slot* free_executor(scheduler_state& st) {
  executor_slot* best = nullptr;
  for (auto& e : st.executors)
    if (e.in_flight < st.cfg.executor_depth && (!best || e.in_flight < best->in_flight))
      best = &e;
  return best;
}

void answer_error(scheduler_state&, const infer_job& job, const serving_error& e) {
  job.sink->deliver(postprocess::error_response(job.request.reader(), e));
}

void maybe_finish_drain(self_ptr self) {
  auto& st = self->state;
  if (!st.draining || !st.queued.empty() || st.batches_in_flight > 0)
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

void poll_policy(self_ptr self);

void send_batch(self_ptr self, executor_slot& slot, const dispatch& d) {
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
  auto batch = gather_batch(st.cfg.model, batch_id, jobs);
  ++slot.in_flight;
  ++st.batches_in_flight;
  auto handle = slot.handle;
  auto shared_jobs = std::make_shared<std::vector<batched_job>>(std::move(jobs));
  auto done = [self, handle, batch_id](std::shared_ptr<std::vector<batched_job>> jobs,
                                       batch_result_message result) {
    auto& st = self->state;
    for (auto& e : st.executors)
      if (e.handle == handle && e.in_flight > 0)
        --e.in_flight;
    --st.batches_in_flight;
    int64_t received = now_ns();
    auto r = result.reader();
    finished_batch fb;
    fb.compute_end_ns = received - r.getComputeOutputNs();
    fb.compute_start_ns = fb.compute_end_ns - r.getComputeInferNs();
    fb.result = std::move(result);
    fb.jobs = std::move(*jobs);
    release(self, batch_id, std::move(fb));
    poll_policy(self);
    maybe_finish_drain(self);
  };
  self->request(handle, caf::infinite, run_batch{std::move(batch)})
    .then(
      [done, shared_jobs](batch_result_message& result) { done(shared_jobs, std::move(result)); },
      [self, done, shared_jobs, batch_id](caf::error& err) {
        // The executor died with the batch: answer its requests with the reason.
        auto msg = batch_result_message::create();
        auto e = msg.builder().initError();
        e.setStatus(500);
        e.setMessage("model '" + self->state.cfg.model.name
                     + "': the executor failed while running the batch: "
                     + self->system().render(err));
        e.setReason(wire::FailureReason::INTERNAL);
        msg.builder().setBatchId(batch_id);
        done(shared_jobs, std::move(msg));
      });
}

void poll_policy(self_ptr self) {
  auto& st = self->state;
  for (;;) {
    auto now = clock_type::now();
    auto* slot = free_executor(st);
    auto r = st.policy->poll(now, slot != nullptr);
    for (auto& rej : r.expired) {
      auto it = st.queued.find(rej.id);
      answer_error(st, it->second.job,
                   {status_code::unavailable, rej.message, failure_reason::timeout});
      st.queued.erase(it);
    }
    if (auto* d = std::get_if<dispatch>(&r.next)) {
      send_batch(self, *slot, *d);
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
    for (auto& e : cfg.executors)
      st.executors.push_back({e, 0});
    st.cfg = std::move(cfg);
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
    };
  });
}

} // namespace caf_serving::scheduler
