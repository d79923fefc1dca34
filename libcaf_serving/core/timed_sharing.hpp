#pragma once
/// The engine's CAF scheduler: CAF's work sharing (one job queue under one
/// mutex, idle workers wait on a condition variable) whose idle workers also
/// keep the engine's timers, so that a batching delay costs no wake-up of CAF's
/// clock thread.
///
/// Why: a `delayed_send` in CAF 0.17 wakes the clock thread to file the timer,
/// wakes it again when the timer is due, and it then wakes a worker to run the
/// message: on the 2-core VM the clock thread alone spent 40 us of CPU a
/// request at concurrency 1 (3.6 of the request's 11 context switches), and
/// the tick ran 60 us late at P50. Here the worker that goes idle first waits
/// on its condition variable until the earliest timer instead of forever, and
/// runs the tick itself when it wakes.
///
/// Who keeps the timers: at most one idle worker at a time (the keeper) waits
/// with a deadline; the others wait without one. Setting a timer that nobody
/// keeps, or taking a job as the keeper, wakes an idle worker to keep them; a
/// busy worker fires due timers each time it looks for its next job. So a timer
/// is late only while every worker is busy, when no worker could run its
/// message anyway.
///
/// Usage (main):
///
///     caf::actor_system_config cfg;
///     use_timed_sharing(cfg);          // before the actor system exists
///     caf::actor_system sys{cfg};
///     send_at(sys, now_ns() + 100'000, caf::actor_cast<caf::strong_actor_ptr>(dest),
///             caf::make_message(tick_atom::value));
///
/// send_at works in any actor system: where the scheduler is CAF's own (unit
/// tests), it falls back to CAF's clock.

#include <caf/actor_system_config.hpp>
#include <caf/message.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduler/coordinator.hpp>
#include <caf/weak_intrusive_ptr.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace caf_serving {

class timed_sharing : public caf::policy::unprofiled {
public:
  /// A message to send at `due_ns` (steady clock). The destination is held
  /// weakly: a timer does not keep an actor alive, as an unloaded model's
  /// scheduler must be able to go while its supervision timer is pending.
  struct timer {
    int64_t due_ns;
    uint64_t seq; // keeps timers due at the same time in the order they were set
    caf::weak_actor_ptr dest;
    caf::message msg;
  };

  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {}

    std::mutex lock;
    std::deque<caf::resumable*> jobs;
    /// Idle workers with no timer to keep wait here, without a deadline.
    std::condition_variable idle_cv;
    unsigned idle_waiting = 0;
    /// The keeper: the one idle worker that waits here until `keeper_due_ns`.
    std::condition_variable keeper_cv;
    bool keeper = false;
    int64_t keeper_due_ns = 0;
    /// A min-heap on (due_ns, seq).
    std::vector<timer> timers;
    uint64_t next_seq = 0;
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator*) {}
  };

  // -- what caf::scheduler::coordinator asks of its policy -------------------
  // (The worker, specialized below, calls push_job and next_job itself.)

  template <class Coordinator>
  void central_enqueue(Coordinator* self, caf::resumable* job) {
    push_job(d(self), job);
  }

  template <class Worker, class UnaryFunction>
  void foreach_resumable(Worker*, UnaryFunction) {
    // nop: workers own no jobs, all are in the central queue
  }

  /// Runs at shutdown, after the workers have stopped: hands CAF the jobs
  /// left to clean up and drops the timers that will never fire.
  template <class Coordinator, class UnaryFunction>
  void foreach_central_resumable(Coordinator* self, UnaryFunction f) {
    std::deque<caf::resumable*> jobs;
    std::vector<timer> timers;
    {
      std::lock_guard<std::mutex> guard(d(self).lock);
      jobs.swap(d(self).jobs);
      timers.swap(d(self).timers);
    }
    for (auto* job : jobs)
      f(job);
  }

  // -- the work, outside the templates ----------------------------------------

  static void push_job(coordinator_data& data, caf::resumable* job);
  static caf::resumable* next_job(coordinator_data& data);
  static void add_timer(coordinator_data& data, int64_t due_ns, caf::weak_actor_ptr dest,
                        caf::message msg);
};

} // namespace caf_serving

namespace caf::scheduler {

/// timed_sharing's worker: CAF's worker loop without what CAF's logger costs
/// per job. CAF 0.17's worker<Policy>::run casts every job to abstract_actor
/// (a cross-cast through the type information, about 1,000 instructions) and
/// sets the logger's actor id around it (two more calls into the logger), with
/// logging compiled out or not: about 5% of a request's instructions at
/// concurrency 1 (callgrind). scheduled_actor::resume sets the id again for
/// its own run, so log lines from actors keep their ids. The policy's hooks
/// (caf::policy::unprofiled's) are all empty, and the jobs go straight to and
/// from the policy's one queue.
template <>
class worker<caf_serving::timed_sharing> : public execution_unit {
public:
  using coordinator_ptr = coordinator<caf_serving::timed_sharing>*;
  using policy_data = caf_serving::timed_sharing::worker_data;

  worker(size_t id, coordinator_ptr parent, const policy_data& init, size_t max_throughput);
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  void start();
  /// From any thread (the coordinator's stop).
  void external_enqueue(resumable* job);
  /// From a job this worker runs.
  void exec_later(resumable* job) override;

  coordinator_ptr parent() { return parent_; }
  size_t id() const { return id_; }
  std::thread& get_thread() { return thread_; }
  policy_data& data() { return data_; }
  size_t max_throughput() { return max_throughput_; }

private:
  void run();

  size_t max_throughput_;
  std::thread thread_;
  size_t id_;
  coordinator_ptr parent_;
  policy_data data_;
};

} // namespace caf::scheduler

namespace caf_serving {

using timed_coordinator = caf::scheduler::coordinator<timed_sharing>;

/// Makes the actor system built from `cfg` run on timed_sharing workers
/// (`scheduler.max-threads` still sets how many).
void use_timed_sharing(caf::actor_system_config& cfg);

/// Sends `msg` to `dest` at `due_ns` (steady clock, nanoseconds; a time past
/// sends at once), with no sender. Through timed_sharing's workers where the
/// system runs them, through CAF's clock otherwise. A destination that is gone
/// by then gets nothing.
void send_at(caf::actor_system& sys, int64_t due_ns, const caf::strong_actor_ptr& dest,
             caf::message msg);

} // namespace caf_serving
