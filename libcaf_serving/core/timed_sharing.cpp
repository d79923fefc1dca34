#include "core/timed_sharing.hpp"

#include "core/clock.hpp"

#include <caf/actor_clock.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/actor_system.hpp>
#include <caf/logger.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message_id.hpp>

#include <algorithm>
#include <chrono>

#include <pthread.h>

namespace caf_serving {

namespace {

bool later(const timed_sharing::timer& a, const timed_sharing::timer& b) {
  return a.due_ns != b.due_ns ? a.due_ns > b.due_ns : a.seq > b.seq;
}

/// Takes the timers due at `now` off the heap, earliest first.
std::vector<timed_sharing::timer> pop_due(timed_sharing::coordinator_data& data, int64_t now) {
  std::vector<timed_sharing::timer> due;
  while (!data.timers.empty() && data.timers.front().due_ns <= now) {
    std::pop_heap(data.timers.begin(), data.timers.end(), later);
    due.push_back(std::move(data.timers.back()));
    data.timers.pop_back();
  }
  return due;
}

void fire(std::vector<timed_sharing::timer>& due) {
  for (auto& t : due)
    if (auto dest = t.dest.lock())
      dest->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {},
                                              std::move(t.msg)),
                    nullptr);
}

} // namespace

void timed_sharing::push_job(coordinator_data& data, caf::resumable* job) {
  std::condition_variable* wake = nullptr;
  {
    std::lock_guard<std::mutex> guard(data.lock);
    data.jobs.push_back(job);
    // An idle worker without a deadline first: the keeper goes on keeping.
    if (data.idle_waiting > 0)
      wake = &data.idle_cv;
    else if (data.keeper)
      wake = &data.keeper_cv;
  }
  // After the unlock: a worker woken under the lock would only block on it
  // (one more sleep and wake-up a request, seen with strace at concurrency 1).
  // Waiters test their condition under the lock, so none misses the job.
  if (wake)
    wake->notify_one();
}

caf::resumable* timed_sharing::next_job(coordinator_data& data) {
  std::unique_lock<std::mutex> guard(data.lock);
  for (;;) {
    if (!data.timers.empty()) {
      int64_t now = now_ns();
      if (data.timers.front().due_ns <= now) {
        auto due = pop_due(data, now);
        guard.unlock();
        fire(due); // the messages' actors come back through push_job
        guard.lock();
        continue;
      }
    }
    if (!data.jobs.empty()) {
      auto* job = data.jobs.front();
      data.jobs.pop_front();
      // This worker is busy from now on: an idle one keeps the timers.
      bool wake = !data.timers.empty() && !data.keeper && data.idle_waiting > 0;
      guard.unlock();
      if (wake)
        data.idle_cv.notify_one();
      return job;
    }
    if (!data.timers.empty() && !data.keeper) {
      data.keeper = true;
      data.keeper_due_ns = data.timers.front().due_ns;
      data.keeper_cv.wait_until(
        guard, steady::time_point(std::chrono::nanoseconds(data.keeper_due_ns)));
      data.keeper = false;
    } else {
      ++data.idle_waiting;
      data.idle_cv.wait(guard);
      --data.idle_waiting;
    }
  }
}

void timed_sharing::add_timer(coordinator_data& data, int64_t due_ns, caf::weak_actor_ptr dest,
                              caf::message msg) {
  std::condition_variable* wake = nullptr;
  {
    std::lock_guard<std::mutex> guard(data.lock);
    data.timers.push_back(timer{due_ns, data.next_seq++, std::move(dest), std::move(msg)});
    std::push_heap(data.timers.begin(), data.timers.end(), later);
    if (data.keeper) {
      if (due_ns < data.keeper_due_ns)
        wake = &data.keeper_cv; // it waits for a later one
    } else if (data.idle_waiting > 0) {
      // Nobody would wake for it: the worker that sets it may run long. With
      // one worker (the default below 8 cores) this never happens on a worker.
      wake = &data.idle_cv;
    }
    // No idle worker: the first to go idle keeps it.
  }
  if (wake)
    wake->notify_one(); // after the unlock, as in push_job
}

void use_timed_sharing(caf::actor_system_config& cfg) {
  cfg.load<timed_coordinator>();
}

void send_at(caf::actor_system& sys, int64_t due_ns, const caf::strong_actor_ptr& dest,
             caf::message msg) {
  if (!dest)
    return;
  if (auto* own = dynamic_cast<timed_coordinator*>(&sys.scheduler())) {
    timed_sharing::add_timer(own->data(), due_ns, caf::weak_actor_ptr{dest.get()}, std::move(msg));
    return;
  }
  auto when = caf::actor_clock::time_point(std::chrono::nanoseconds(due_ns));
  sys.clock().schedule_message(
    when, dest, caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(msg)));
}

} // namespace caf_serving

namespace caf::scheduler {

using caf_serving::timed_sharing;

worker<timed_sharing>::worker(size_t id, coordinator_ptr parent, const policy_data& init,
                              size_t max_throughput)
    : execution_unit(&parent->system()), max_throughput_(max_throughput), id_(id),
      parent_(parent), data_(init) {}

void worker<timed_sharing>::start() {
  thread_ = std::thread{[this] {
    CAF_SET_LOGGER_SYS(&system());
    // CAF 0.17 names its workers "caf.multiplexer", the name of its I/O thread.
    pthread_setname_np(pthread_self(), "caf.worker");
    system().thread_started();
    run();
    system().thread_terminates();
  }};
}

void worker<timed_sharing>::external_enqueue(resumable* job) {
  timed_sharing::push_job(parent_->data(), job);
}

void worker<timed_sharing>::exec_later(resumable* job) {
  timed_sharing::push_job(parent_->data(), job);
}

void worker<timed_sharing>::run() {
  auto& jobs = parent_->data();
  for (;;) {
    auto* job = timed_sharing::next_job(jobs);
    switch (job->resume(this, max_throughput_)) {
      case resumable::resume_later:
        timed_sharing::push_job(jobs, job); // its reference goes with it
        break;
      case resumable::done:
      case resumable::awaiting_message:
        intrusive_ptr_release(job);
        break;
      case resumable::shutdown_execution_unit:
        return;
    }
  }
}

} // namespace caf::scheduler
