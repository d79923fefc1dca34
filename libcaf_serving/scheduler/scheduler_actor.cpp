#include "scheduler/scheduler_actor.hpp"

#include "core/clock.hpp"
#include "core/message_size.hpp"
#include "core/responses.hpp"
#include "core/timed_sharing.hpp"
#include "scheduler/executor_book.hpp"
#include "scheduler/executor_choice.hpp"
#include "scheduler/gather_batch.hpp"
#include "scheduler/padded_request.hpp"
#include "scheduler/scheduling_policy.hpp"
#include "scheduler/supervision_policy.hpp"

#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <unordered_map>

namespace caf_serving::scheduler {

namespace {

struct executor_slot {
  executor::executor_actor handle;
  uint32_t depth = 1;
  std::string node;
  /// Started by this scheduler (respawned when it stops), not a remote proxy.
  bool local = false;
  /// Its batches in flight, its cost model and when it is predicted to be free.
  executor_book book;
  /// What the supervision policy knows it by (its health, its quarantine).
  uint64_t id = 0;
};

/// A batch sent to an executor and not yet answered. It keeps its requests and
/// its Batch message so that it can be sent again if the executor is lost.
struct pending_batch {
  batch_message batch;
  std::shared_ptr<std::vector<batched_job>> jobs;
  uint32_t rows = 0;
  uint32_t attempts = 0;
  /// The attempt in flight (0: none, the batch waits to be sent again). An
  /// answer that arrives for an earlier attempt, one given up as hung, is
  /// ignored: that attempt's batch was sent elsewhere.
  uint64_t attempt_id = 0;
  /// The executor of the attempt in flight.
  caf::actor_addr executor;
};

struct scheduler_state {
  scheduler_config cfg;
  /// The dynamic batcher, or the latency-target policy when the model has a
  /// target (make_policy: the one place that tells them apart).
  std::unique_ptr<scheduling_policy> policy;
  /// The latency-target figures on /metrics (batch sizes, waits, the first
  /// executor's cost curve): set when the model has a target and stats.
  slo_stats* slo_figures = nullptr;
  /// Shed log lines: at most one a second, with how many were not logged.
  int64_t last_shed_log_ns = 0;
  uint64_t sheds_not_logged = 0;
  std::vector<executor_slot> executors;
  /// Queued requests by the id the policy knows them by.
  std::unordered_map<uint64_t, batched_job> queued;
  uint64_t next_request_id = 1;
  uint64_t next_batch_id = 1;
  uint64_t next_warm_up_id = 1;
  /// When the armed timer fires; none armed when empty.
  std::optional<time_point> timer_due;
  /// Identifies each attempt to run a batch (pending_batch::attempt_id).
  uint64_t next_attempt_id = 1;
  /// Executor health and quarantines, respawns, the hang check of local
  /// attempts (one timer for all batches in flight, not a request timeout each:
  /// CAF files each of those with its clock thread, two wake-ups of that thread
  /// a batch), and what a batch whose attempt got no answer does next.
  supervision_policy supervision;
  /// Identifies each executor to the supervision policy (executor_slot::id).
  uint64_t next_executor_id = 1;
  bool draining = false;
  /// Every batch formed and not yet answered, by batch id.
  std::map<uint64_t, pending_batch> pending;
  /// Batches whose executor was lost, to send again before any new batch.
  std::set<uint64_t> resend;
  /// preserve_ordering: finished batches wait here until all earlier ones are done.
  uint64_t next_to_release = 1;
  std::map<uint64_t, finished_batch> finished_early;
  /// Whether the model has had an executor at all (what a 503 says).
  bool had_executor = false;
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

/// Publishes how many executors are alive and healthy (readiness, /metrics).
void publish_health(scheduler_state& st) {
  int64_t now = now_ns();
  uint32_t healthy = 0;
  for (const auto& e : st.executors)
    healthy += st.supervision.quarantined(e.id, now) ? 0 : 1;
  if (st.cfg.stats) {
    st.cfg.stats->live_executors.store(static_cast<uint32_t>(st.executors.size()));
    st.cfg.stats->healthy_executors.store(healthy);
  }
}

/// What executor choice and the batching policy see of the executors that may
/// take batches (quarantined ones left out), and which slot each is.
struct executor_view {
  std::vector<executor_load> loads;
  std::vector<size_t> slot;
};

executor_view view_executors(scheduler_state& st, int64_t now) {
  executor_view v;
  v.loads.reserve(st.executors.size());
  v.slot.reserve(st.executors.size());
  for (size_t i = 0; i < st.executors.size(); ++i) {
    auto& e = st.executors[i];
    if (st.supervision.quarantined(e.id, now))
      continue;
    v.loads.push_back(e.book.load(now, e.depth));
    v.slot.push_back(i);
  }
  return v;
}

/// Whether an executor that may take batches has a free credit (what the
/// dynamic batcher asks, without the loads).
bool any_free(scheduler_state& st, int64_t now) {
  for (const auto& e : st.executors)
    if (e.book.in_flight() < e.depth && !st.supervision.quarantined(e.id, now))
      return true;
  return false;
}

/// The executor predicted to finish a batch of `rows` first, among those with a
/// free credit and not quarantined; nullptr when none is.
executor_slot* choose(scheduler_state& st, uint32_t rows) {
  auto v = view_executors(st, now_ns());
  auto i = choose_executor(v.loads, rows);
  return i ? &st.executors[v.slot[*i]] : nullptr;
}

/// A fresh policy for the model: the latency-target one when it has a target.
void make_policy(scheduler_state& st) {
  if (!st.cfg.latency_target) {
    st.policy = make_dynamic_batching_policy(st.cfg.policy);
    return;
  }
  slo_policy_config c;
  c.base = st.cfg.policy;
  c.target = *st.cfg.latency_target;
  c.margin = st.cfg.slo_margin.count() > 0 ? st.cfg.slo_margin : default_slo_margin(c.target);
  st.policy = make_latency_target_policy(c);
  st.slo_figures = st.cfg.stats ? &st.cfg.stats->slo : nullptr;
}

/// Answers a shed request: 503 with Retry-After, counted, and explained in the
/// log (at most one line a second; the next line says how many were not logged).
void answer_shed(scheduler_state& st, const infer_job& job, const shed& s) {
  serving_error e{status_code::unavailable, s.message, failure_reason::unavailable,
                  s.retry_after_s};
  job.sink->deliver(error_response(job.request.reader(), e));
  if (st.cfg.stats)
    st.cfg.stats->slo.shed.fetch_add(1, std::memory_order_relaxed);
  int64_t now = now_ns();
  if (now - st.last_shed_log_ns < int64_t{1'000'000'000}) {
    ++st.sheds_not_logged;
    return;
  }
  std::cerr << "caf-serving: model '" << st.cfg.model.name << "': " << s.message;
  if (st.sheds_not_logged > 0)
    std::cerr << " (and " << st.sheds_not_logged << " more shed since the last such line)";
  std::cerr << std::endl;
  st.last_shed_log_ns = now;
  st.sheds_not_logged = 0;
}

executor_slot* find_slot(scheduler_state& st, const caf::actor_addr& addr) {
  for (auto& e : st.executors)
    if (e.handle.address() == addr)
      return &e;
  return nullptr;
}

void answer_error(scheduler_state&, const infer_job& job, const serving_error& e) {
  job.sink->deliver(error_response(job.request.reader(), e));
}

/// The 503 for a request that no executor can run.
serving_error no_executor_error(const scheduler_state& st) {
  std::string why = !st.cfg.no_executor_reason.empty() && !st.had_executor
                      ? st.cfg.no_executor_reason
                      : std::string("every executor of it stopped or its worker was lost");
  return {status_code::unavailable,
          "model '" + st.cfg.model.name + "' has no executor that can run it: " + why,
          failure_reason::unavailable};
}

/// Whether requests may wait for an executor: one is there or is being started.
bool can_execute(const scheduler_state& st) {
  return !st.executors.empty() || st.supervision.respawns_waiting();
}

/// Answers every request of a pending batch with `e`, for a batch that cannot run.
void fail_batch(self_ptr self, uint64_t batch_id, const serving_error& e);

/// With no executor left and none being started, nothing can run the queued
/// requests or the batches waiting to be sent again: answer them at once.
void fail_unrunnable(self_ptr self) {
  auto& st = self->state;
  if (can_execute(st))
    return;
  auto err = no_executor_error(st);
  auto ids = st.resend;
  for (auto id : ids)
    fail_batch(self, id, err);
  for (auto& [id, job] : st.queued)
    answer_error(st, job.job, err);
  st.queued.clear();
  // The policy still holds their ids: a fresh one forgets them.
  make_policy(st);
}

void maybe_finish_drain(self_ptr self) {
  auto& st = self->state;
  if (!st.draining)
    return;
  if (st.executors.empty())
    // Nothing is left to run the batches of lost executors.
    st.supervision.cancel_respawns();
  fail_unrunnable(self);
  if (!st.queued.empty() || !st.pending.empty())
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

finished_batch error_result(uint64_t batch_id, const serving_error& e) {
  auto msg = batch_result_message::create();
  auto err = msg.builder().initError();
  err.setStatus(static_cast<uint16_t>(e.status));
  err.setMessage(e.message);
  err.setReason(static_cast<wire::FailureReason>(reason_of(e)));
  msg.builder().setBatchId(batch_id);
  finished_batch fb;
  fb.result = std::move(msg);
  return fb;
}

void fail_batch(self_ptr self, uint64_t batch_id, const serving_error& e) {
  auto& st = self->state;
  auto it = st.pending.find(batch_id);
  if (it == st.pending.end())
    return;
  auto fb = error_result(batch_id, e);
  fb.jobs = std::move(*it->second.jobs);
  st.pending.erase(it);
  st.supervision.attempt_ended(batch_id);
  st.resend.erase(batch_id);
  release(self, batch_id, std::move(fb));
}

void poll_policy(self_ptr self);
void executor_stopped(self_ptr self, const caf::actor_addr& addr);

/// Wakes the scheduler at `when_ns` (steady clock), for the batching policy's
/// wait or for supervision: a tick is always safe to handle early or twice.
void tick_at(self_ptr self, int64_t when_ns) {
  send_at(self->system(), when_ns, caf::actor_cast<caf::strong_actor_ptr>(self),
          caf::make_message(tick_atom::value));
}

/// How an attempt ended, as its executor's book and health count it.
struct attempt_outcome {
  /// The executor's own measurement of a batch that succeeded; none otherwise
  /// (a fast failure must not make an executor look fast).
  std::optional<int64_t> service_ns;
  /// An internal failure (status 500 and above: not the request's fault), or a
  /// remote batch presumed lost.
  bool internal_failure = false;
};

/// Takes batch `batch_id` off the books of the executor at `addr` (if it is
/// still there); a success feeds its cost model. The executor's health counts
/// the outcome (supervision_policy): an internal failure in a row past the
/// limit quarantines it, anything else clears the count.
void settle(self_ptr self, const caf::actor_addr& addr, uint64_t batch_id,
            const attempt_outcome& outcome) {
  auto& st = self->state;
  auto* e = find_slot(st, addr);
  if (!e)
    return;
  if (!e->book.answered(batch_id, now_ns(), outcome.service_ns))
    return;
  if (outcome.service_ns && st.slo_figures && e == &st.executors.front()) {
    // The first executor's curve stands for the model's on /metrics.
    st.slo_figures->publish_cost_curve(e->book.cost().curve());
  }
  if (!outcome.internal_failure) {
    st.supervision.clear_failures(e->id);
    return;
  }
  if (st.cfg.stats)
    st.cfg.stats->executor_failures.fetch_add(1, std::memory_order_relaxed);
  auto decision = st.supervision.internal_failure(e->id, now_ns());
  auto* q = std::get_if<quarantine>(&decision);
  if (!q)
    return;
  if (st.cfg.stats)
    st.cfg.stats->executor_quarantines.fetch_add(1, std::memory_order_relaxed);
  std::cerr << "caf-serving: model '" << st.cfg.model.name << "': an executor on node '"
            << e->node << "' failed " << st.cfg.quarantine_after_failures
            << " batches in a row; it gets no batches for " << q->backoff.count() << " ms"
            << std::endl;
  tick_at(self, q->until_ns);
  publish_health(st);
}

/// Where an attempt ran: its executor, that executor's node, and whether it is local.
struct attempt_site {
  caf::actor_addr executor;
  std::string node;
  bool local = false;
};

/// How an attempt that got no answer ended, from the error its request got.
attempt_end end_of(const caf::error& err) {
  if (err == caf::sec::request_timeout)
    return attempt_end::timed_out;
  return executor_was_lost(err) ? attempt_end::stopped : attempt_end::failed;
}

/// The attempt in flight of pending batch `batch_id` ended without a result
/// (`err`): its executor stopped, was lost, or did not answer in time. The
/// batch is sent again or its requests are answered with an error, as the
/// supervision policy decides.
void attempt_failed(self_ptr self, uint64_t batch_id, const attempt_site& site,
                    const caf::error& err) {
  auto& st = self->state;
  // A local executor that did not answer has stopped: no batch may be sent
  // to it again, not even before its down message arrives.
  if (site.local && executor_was_lost(err))
    executor_stopped(self, site.executor);
  auto it = st.pending.find(batch_id);
  if (it == st.pending.end())
    return;
  it->second.attempt_id = 0;
  st.supervision.attempt_ended(batch_id);
  uint32_t attempts = it->second.attempts;
  std::cerr << "caf-serving: model '" << st.cfg.model.name << "': batch " << batch_id
            << " got no answer from its executor on node '" << site.node << "' (attempt "
            << attempts << "): " << self->system().render(err) << std::endl;
  auto decision = st.supervision.attempt_failed({attempts, site.local, end_of(err)});
  if (std::holds_alternative<send_again>(decision)) {
    // Not answered: the same batch goes out again, before any new one.
    st.resend.insert(batch_id);
    if (st.cfg.stats)
      st.cfg.stats->batch_retries.fetch_add(1, std::memory_order_relaxed);
  } else if (auto* lost = std::get_if<fail_unavailable>(&decision)) {
    fail_batch(self, batch_id,
               {status_code::unavailable,
                "model '" + st.cfg.model.name + "': the batch was lost with "
                  + std::to_string(lost->attempts) + " executors in a row, last on node '"
                  + site.node + "'; retry the request",
                failure_reason::unavailable});
  } else {
    // No internals in the answer: the log line above has them.
    const auto& failed = std::get<fail_internal>(decision);
    std::string what
      = failed.how == attempt_end::failed
          ? std::string("the executor failed while running the batch")
          : std::string(failed.how == attempt_end::timed_out
                          ? "the executor running this batch did not answer within "
                            "--executor-timeout-ms, "
                          : "the executor running this batch stopped, ")
              + std::to_string(failed.attempts)
              + " times in a row; the request was not tried again";
    fail_batch(self, batch_id,
               {status_code::internal,
                "model '" + st.cfg.model.name + "': " + what + "; the server log has the details",
                failure_reason::internal});
  }
  fail_unrunnable(self);
  poll_policy(self);
  maybe_finish_drain(self);
}

/// Gives up, as a request timeout would, every local attempt that has run past
/// local_batch_timeout (the supervision policy's hang check, when it is due),
/// and arms the next check for the oldest one left.
void check_hung(self_ptr self) {
  auto& st = self->state;
  auto check = st.supervision.check_hung(now_ns());
  for (auto id : check.hung) {
    auto it = st.pending.find(id);
    if (it == st.pending.end() || it->second.attempt_id == 0)
      continue; // answered or given up while an earlier one was handled
    auto addr = it->second.executor;
    auto* slot = find_slot(st, addr);
    std::string node = slot ? slot->node : std::string("local");
    settle(self, addr, id, {});
    attempt_failed(self, id, {addr, node, true}, caf::make_error(caf::sec::request_timeout));
  }
  if (check.next)
    tick_at(self, check.next->when_ns);
}

/// Sends pending batch `batch_id` to `slot` and handles its one answer.
void send_pending(self_ptr self, executor_slot& slot, uint64_t batch_id) {
  auto& st = self->state;
  auto& p = st.pending.at(batch_id);
  ++p.attempts;
  int64_t sent = now_ns();
  slot.book.dispatched(batch_id, p.rows, sent);
  auto handle = slot.handle;
  uint64_t attempt = st.next_attempt_id++;
  p.attempt_id = attempt;
  p.executor = handle.address();
  // A local executor that does not answer in time is taken for hung: it is
  // replaced and the batch sent once more (check_hung). A remote proxy applies
  // its own timeout.
  if (slot.local)
    if (auto check = st.supervision.local_attempt_sent(batch_id, sent))
      tick_at(self, check->when_ns);
  self->request(handle, caf::infinite, run_batch{p.batch, nullptr})
    .then(
      [self, batch_id, attempt, addr = handle.address()](batch_result_message& result) {
        auto& st = self->state;
        auto r = result.reader();
        uint16_t status = r.getError().getStatus();
        // The executor's own time around the backend call (run_one_batch).
        int64_t service = r.getComputeInputNs() + r.getComputeInferNs() + r.getComputeOutputNs();
        settle(self, addr, batch_id,
               {status == 0 ? std::optional<int64_t>{service} : std::nullopt, status >= 500});
        if (status == 0)
          st.supervision.batch_succeeded(); // executors that succeed are not in a crash loop
        auto it = st.pending.find(batch_id);
        if (it == st.pending.end() || it->second.attempt_id != attempt)
          return; // an attempt given up as hung: the batch went elsewhere
        int64_t received = now_ns();
        finished_batch fb;
        fb.compute_end_ns = received - r.getComputeOutputNs();
        fb.compute_start_ns = fb.compute_end_ns - r.getComputeInferNs();
        fb.result = std::move(result);
        fb.jobs = std::move(*it->second.jobs);
        st.pending.erase(it);
        st.supervision.attempt_ended(batch_id);
        release(self, batch_id, std::move(fb));
        poll_policy(self);
        maybe_finish_drain(self);
      },
      [self, batch_id, attempt, addr = handle.address(), node = slot.node,
       local = slot.local](caf::error& err) {
        auto& st = self->state;
        // A remote batch presumed lost counts against its executor: one that keeps
        // timing out (a stalled worker) is quarantined instead of chosen again.
        settle(self, addr, batch_id, {std::nullopt, !local && executor_was_lost(err)});
        auto it = st.pending.find(batch_id);
        if (it == st.pending.end() || it->second.attempt_id != attempt) {
          // Given up already; a stopped local executor stays stopped.
          if (local && executor_was_lost(err))
            executor_stopped(self, addr);
          return;
        }
        attempt_failed(self, batch_id, {addr, node, local}, err);
      });
}

/// Gathers the queued requests `ids` into a pending batch and returns its id;
/// nothing when gathering failed (its requests are answered).
std::optional<uint64_t> form_batch(self_ptr self, const std::vector<uint64_t>& ids) {
  auto& st = self->state;
  int64_t formed = now_ns();
  std::vector<batched_job> jobs;
  jobs.reserve(ids.size());
  for (auto id : ids) {
    auto it = st.queued.find(id);
    it->second.batch_formed_ns = formed;
    jobs.push_back(std::move(it->second));
    st.queued.erase(it);
  }
  uint64_t batch_id = st.next_batch_id++;
  auto batch = gather_batch(st.cfg.model, batch_id, jobs, st.cfg.padding);
  if (!batch) {
    std::cerr << "caf-serving: " << batch.error().message << std::endl;
    auto fb = error_result(batch_id, batch.error());
    fb.jobs = std::move(jobs);
    release(self, batch_id, std::move(fb));
    return std::nullopt;
  }
  if (st.cfg.stats && st.cfg.padding.enabled()) {
    // A batch of requests of different lengths: padding happened.
    uint64_t first = padded_length(st.cfg.padding, jobs.front().job.request.reader());
    for (const auto& j : jobs)
      if (padded_length(st.cfg.padding, j.job.request.reader()) != first) {
        st.cfg.stats->padded_batches.fetch_add(1, std::memory_order_relaxed);
        break;
      }
  }
  pending_batch p;
  p.batch = std::move(*batch);
  p.rows = p.batch.reader().getRows();
  p.jobs = std::make_shared<std::vector<batched_job>>(std::move(jobs));
  st.pending.emplace(batch_id, std::move(p));
  return batch_id;
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

/// Publishes how many requests wait in the queue and how many are in batches
/// at executors (/metrics; tests wait on them instead of sleeping).
void publish_queue(scheduler_state& st) {
  if (!st.cfg.stats)
    return;
  int64_t executing = 0;
  for (const auto& [id, p] : st.pending)
    executing += static_cast<int64_t>(p.jobs->size());
  st.cfg.stats->queued.store(static_cast<int64_t>(st.queued.size()), std::memory_order_relaxed);
  st.cfg.stats->executing.store(executing, std::memory_order_relaxed);
}

void poll_queue(self_ptr self);

/// Lets the policy dispatch what it will, then publishes the queue's counts:
/// every event that changes the queue or the batches in flight ends here.
void poll_policy(self_ptr self) {
  poll_queue(self);
  publish_queue(self->state);
}

void poll_queue(self_ptr self) {
  auto& st = self->state;
  for (;;) {
    poll_input in;
    in.now = clock_type::now();
    in.resends_waiting = !send_waiting(self);
    int64_t now = to_ns(in.now);
    in.executor_free = any_free(st, now);
    executor_view view;
    if (st.policy->plans_on_executors()) {
      view = view_executors(st, now);
      in.executors = std::move(view.loads);
    }
    auto r = st.policy->poll(in);
    for (auto& rej : r.timed_out) {
      auto it = st.queued.find(rej.id);
      answer_error(st, it->second.job, rejection_error(rej));
      st.queued.erase(it);
    }
    for (auto& s : r.late) {
      auto it = st.queued.find(s.id);
      answer_shed(st, it->second.job, s);
      st.queued.erase(it);
    }
    if (auto* d = std::get_if<batch_dispatch>(&r.next)) {
      if (st.slo_figures) {
        st.slo_figures->batch_size.observe(d->rows);
        int64_t at = to_ns(in.now);
        for (auto id : d->ids)
          st.slo_figures->wait_us.observe(
            static_cast<double>(at - st.queued.at(id).enqueued_ns) / 1e3);
      }
      if (auto batch_id = form_batch(self, d->ids)) {
        if (d->executor)
          send_pending(self, st.executors[view.slot[*d->executor]], *batch_id);
        else
          st.resend.insert(*batch_id); // sent when an executor has a credit
      }
      continue;
    }
    if (auto* w = std::get_if<wait_until>(&r.next)) {
      if (!st.timer_due || w->when < *st.timer_due) {
        st.timer_due = w->when;
        tick_at(self, to_ns(w->when));
      }
    }
    return;
  }
}

/// Warm-up batch ids: apart from the requests' batches (whose ids order the
/// release under preserve_ordering).
constexpr uint64_t warm_up_id_bit = uint64_t{1} << 63;

/// A batch of `rows` rows of zeros for the model's inputs; nothing when an
/// input has a variable dimension or variable-length (BYTES) elements, whose
/// content a synthetic batch cannot know.
std::optional<batch_message> synthetic_batch(const model_config& model, uint64_t batch_id,
                                             uint32_t rows) {
  bool batched = model.max_batch_size > 0;
  uint64_t total = 0;
  for (const auto& in : model.inputs) {
    if (element_size(in.dtype) == 0)
      return std::nullopt;
    uint64_t n = element_size(in.dtype) * (batched ? rows : 1);
    for (auto d : in.dims) {
      if (d < 0)
        return std::nullopt;
      n *= static_cast<uint64_t>(d);
    }
    if (n > max_data_field_bytes)
      return std::nullopt;
    total += n;
  }
  size_t hint = capnp_words_bytes(model.name.size() + 1) + 8 + static_cast<size_t>(total);
  for (const auto& in : model.inputs)
    hint += tensor_metadata_bytes(in.name.size(), in.dims.size() + 1) + 8;
  auto msg = batch_message::create(hint);
  auto b = msg.builder();
  b.setBatchId(batch_id);
  b.setModelName(model.name);
  b.setRows(rows);
  b.initRequestRows(1).set(0, rows);
  auto inputs = b.initInputs(static_cast<unsigned>(model.inputs.size()));
  for (unsigned i = 0; i < model.inputs.size(); ++i) {
    const auto& in = model.inputs[i];
    auto t = inputs[i];
    t.setName(in.name);
    t.setDatatype(static_cast<wire::DataType>(in.dtype));
    auto shape = t.initShape(static_cast<unsigned>(in.dims.size() + (batched ? 1 : 0)));
    unsigned d = 0;
    if (batched)
      shape.set(d++, rows);
    uint64_t n = element_size(in.dtype) * (batched ? rows : 1);
    for (auto dim : in.dims) {
      shape.set(d++, dim);
      n *= static_cast<uint64_t>(dim);
    }
    t.initData(static_cast<unsigned>(n)); // zeros
  }
  return msg;
}

/// Runs the policy's warm-up batches on the executor at `addr`, one after the
/// other (scheduling_policy::warm_up_runs: the latency-target policy measures a
/// new executor before it plans on it). `runs`: those still to do, the next last.
void warm_up(self_ptr self, caf::actor_addr addr, std::vector<warm_up_run> runs) {
  auto& st = self->state;
  auto* slot = find_slot(st, addr);
  if (!slot || runs.empty() || st.draining)
    return;
  auto [rows, learn] = runs.back();
  runs.pop_back();
  uint64_t id = warm_up_id_bit | st.next_warm_up_id++;
  auto batch = synthetic_batch(st.cfg.model, id, rows);
  if (!batch)
    return;
  slot->book.dispatched_warm_up(id, rows, now_ns());
  auto timeout = slot->local && st.cfg.local_batch_timeout.count() > 0
                   ? caf::duration{st.cfg.local_batch_timeout}
                   : caf::duration{caf::infinite};
  self->request(slot->handle, timeout, run_batch{std::move(*batch), nullptr})
    .then(
      [self, addr, id, runs, learn = learn](batch_result_message& result) {
        auto& st = self->state;
        auto r = result.reader();
        bool ok = r.getError().getStatus() == 0;
        int64_t service = r.getComputeInputNs() + r.getComputeInferNs() + r.getComputeOutputNs();
        if (auto* e = find_slot(st, addr)) {
          e->book.answered(id, now_ns(),
                           ok && learn ? std::optional<int64_t>{service} : std::nullopt);
          if (ok && learn && st.slo_figures && e == &st.executors.front())
            st.slo_figures->publish_cost_curve(e->book.cost().curve());
        }
        if (!ok)
          std::cerr << "caf-serving: model '" << st.cfg.model.name
                    << "': a warm-up batch of zeros failed (" << r.getError().getMessage().cStr()
                    << "); the latency-target scheduler learns its costs from requests instead"
                    << std::endl;
        else
          warm_up(self, addr, runs);
        poll_policy(self);
        maybe_finish_drain(self);
      },
      [self, addr, id](caf::error&) {
        auto& st = self->state;
        if (auto* e = find_slot(st, addr))
          e->book.answered(id, now_ns(), std::nullopt);
        // A lost executor goes through the down handler; nothing to resend.
        poll_policy(self);
        maybe_finish_drain(self);
      });
}

void add_slot(self_ptr self, executor_slot slot) {
  auto& st = self->state;
  self->monitor(slot.handle);
  // A local executor dies with its scheduler when that stops abnormally (a
  // normal exit does not propagate over a link); remote proxies live on their own.
  if (slot.local)
    self->link_to(slot.handle);
  // Captured CUDA-graph sizes are cheap: a batch is priced at the size it
  // is padded to.
  cost_model_config cost;
  cost.captured_sizes = st.cfg.policy.captured_batch_sizes;
  slot.book = executor_book{cost};
  slot.id = st.next_executor_id++;
  st.supervision.add_executor(slot.id);
  auto addr = slot.handle.address();
  st.executors.push_back(std::move(slot));
  st.had_executor = true;
  publish_health(st);
  auto max_rows = static_cast<uint32_t>(std::max(st.cfg.model.max_batch_size, 1));
  warm_up(self, addr, st.policy->warm_up_runs(max_rows));
}

executor_slot local_slot(const scheduler_config& cfg, executor::executor_actor handle) {
  executor_slot slot;
  slot.handle = std::move(handle);
  slot.depth = std::max<uint32_t>(cfg.executor_depth, 1);
  slot.node = "local";
  slot.local = true;
  return slot;
}

/// Starts `count` local executors in place of ones that stopped (none while
/// draining).
void start_executors(self_ptr self, uint32_t count) {
  auto& st = self->state;
  for (; count > 0 && !st.draining; --count) {
    add_slot(self, local_slot(st.cfg, st.cfg.respawn_executor()));
    if (st.cfg.stats)
      st.cfg.stats->executor_restarts.fetch_add(1, std::memory_order_relaxed);
    std::cerr << "caf-serving: model '" << st.cfg.model.name << "': started a new executor"
              << std::endl;
  }
}

/// An executor stopped (its actor went down, or it answered a batch that it
/// stopped while running): it takes no more batches, and a local one is started
/// again at once, or after a doubling delay when executors keep stopping (a
/// crash loop). Its batches in flight come back through their error handlers.
/// Safe to call twice for one executor.
void executor_stopped(self_ptr self, const caf::actor_addr& addr) {
  auto& st = self->state;
  auto& ex = st.executors;
  auto it = std::find_if(ex.begin(), ex.end(),
                         [&](const executor_slot& e) { return e.handle.address() == addr; });
  if (it == ex.end())
    return;
  bool local = it->local;
  // A hung executor is still alive: it stops when its batch returns (the
  // answer is dropped; that batch was sent elsewhere).
  if (local)
    self->send_exit(it->handle, caf::exit_reason::kill);
  st.supervision.remove_executor(it->id);
  ex.erase(it);
  publish_health(st);
  if (!local || st.draining || !st.cfg.respawn_executor)
    return;
  auto decision = st.supervision.local_executor_stopped(now_ns());
  if (auto* at_once = std::get_if<respawn_now>(&decision)) {
    start_executors(self, at_once->executors);
    return;
  }
  const auto& later = std::get<respawn_later>(decision);
  std::cerr << "caf-serving: model '" << st.cfg.model.name << "': executors keep "
            << "stopping; the next starts in " << later.delay_ns / 1'000'000 << " ms" << std::endl;
  tick_at(self, later.at_ns);
}

/// The supervision policy's configuration, from the scheduler's.
supervision_config supervision_of(const scheduler_config& cfg) {
  supervision_config s;
  s.quarantine_after_failures = cfg.quarantine_after_failures;
  s.quarantine_backoff = cfg.quarantine_backoff;
  s.max_quarantine_backoff = cfg.max_quarantine_backoff;
  s.local_batch_timeout = cfg.local_batch_timeout;
  s.max_local_attempts = cfg.max_local_attempts;
  s.max_batch_attempts = cfg.max_batch_attempts;
  return s;
}

} // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config config) {
  auto stats = config.stats;
  // Published before the actor first runs, so that a model is ready as soon as
  // it is loaded; the actor keeps these current from then on.
  if (stats) {
    auto n = static_cast<uint32_t>(config.executors.size());
    stats->scheduler_running.store(true);
    stats->live_executors.store(n);
    stats->healthy_executors.store(n);
  }
  auto scheduler = sys.spawn([cfg = std::move(config)](self_ptr self) mutable
                             -> scheduler_actor::behavior_type {
    auto& st = self->state;
    auto executors = std::move(cfg.executors);
    st.cfg = std::move(cfg);
    st.supervision = supervision_policy{supervision_of(st.cfg)};
    make_policy(st);
    if (st.cfg.stats && st.cfg.latency_target)
      st.cfg.stats->slo.target_us.store(static_cast<uint64_t>(st.cfg.latency_target->count()));
    for (auto& e : executors)
      add_slot(self, local_slot(st.cfg, std::move(e)));
    if (st.cfg.respawn_postprocessor)
      self->monitor(st.cfg.postprocessor);
    self->link_to(st.cfg.postprocessor);
    // A linked stage that stops sends an exit message too: the down handler
    // deals with it, and the scheduler itself lives on.
    self->set_exit_handler([](caf::exit_msg&) {});
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& st = self->state;
      if (dm.source == st.cfg.postprocessor.address()) {
        if (st.draining || !st.cfg.respawn_postprocessor)
          return;
        std::cerr << "caf-serving: model '" << st.cfg.model.name
                  << "': the post-processor stopped (" << self->system().render(dm.reason)
                  << "); started a new one" << std::endl;
        st.cfg.postprocessor = st.cfg.respawn_postprocessor();
        self->monitor(st.cfg.postprocessor);
        self->link_to(st.cfg.postprocessor);
        if (st.cfg.stats)
          st.cfg.stats->stage_restarts.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      executor_stopped(self, dm.source);
      fail_unrunnable(self);
      poll_policy(self);
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
        if (!can_execute(st)) {
          answer_error(st, job, no_executor_error(st));
          return;
        }
        if (auto bad = check_padded_lengths(st.cfg.padding, req)) {
          answer_error(st, job, *bad);
          return;
        }
        uint64_t id = st.next_request_id++;
        request_info info{id, req.getRows(), req.getPriority(), req.getTimeoutUs()};
        info.shape_class = shape_class_of(st.cfg.model, req, st.cfg.padding);
        info.padded_length = padded_length(st.cfg.padding, req);
        for (auto t : req.getInputs())
          info.bytes += t.getData().size();
        auto now = clock_type::now();
        // The deadline counts from when the server received the request.
        int64_t received_ns = req.getTimes().getReceivedNs();
        auto received = received_ns > 0 ? time_point{std::chrono::nanoseconds{received_ns}} : now;
        executor_view view;
        if (st.policy->plans_on_executors())
          view = view_executors(st, to_ns(now));
        auto r = st.policy->enqueue(info, std::min(received, now), now, view.loads);
        if (auto* s = std::get_if<shed>(&r)) {
          answer_shed(st, job, *s);
          return;
        }
        if (auto* rej = std::get_if<rejected>(&r)) {
          answer_error(st, job, rejection_error(*rej));
          return;
        }
        st.queued.emplace(id, batched_job{std::move(job), to_ns(now), 0});
        poll_policy(self);
      },
      [self](tick_atom) {
        auto& st = self->state;
        if (st.timer_due && clock_type::now() >= *st.timer_due)
          st.timer_due.reset();
        // Also the supervision timer: a quarantine ended, a restart is due, or
        // a local executor may have hung.
        check_hung(self);
        start_executors(self, st.supervision.take_due_respawns(now_ns()));
        publish_health(st);
        poll_policy(self);
        maybe_finish_drain(self);
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
        add_slot(self, std::move(slot));
        poll_policy(self);
      },
    };
  });
  // Readiness must not outlive the scheduler, however it stops.
  if (stats)
    scheduler->attach_functor([stats](const caf::error&) {
      stats->scheduler_running.store(false);
      stats->healthy_executors.store(0);
      stats->live_executors.store(0);
    });
  return scheduler;
}

} // namespace caf_serving::scheduler
