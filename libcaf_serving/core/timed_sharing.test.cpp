#include "core/timed_sharing.hpp"

#include "core/clock.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <pthread.h>

using namespace caf_serving;

namespace {

using fire_atom = caf::atom_constant<caf::atom("fire")>;
using arm_atom = caf::atom_constant<caf::atom("arm")>;

/// What the recipients saw: each timer's index, when it was due, and when it
/// arrived.
struct arrivals {
  struct arrival {
    int index;
    int64_t due_ns;
    int64_t at_ns;
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<arrival> seen;

  void add(int index, int64_t due_ns) {
    int64_t at = now_ns();
    std::lock_guard<std::mutex> guard(mutex);
    seen.push_back({index, due_ns, at});
    cv.notify_all();
  }

  bool wait_for(size_t n, std::chrono::seconds limit = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, limit, [&] { return seen.size() >= n; });
  }
};

caf::behavior recipient(caf::event_based_actor*, arrivals* log) {
  return {[log](fire_atom, int index, int64_t due_ns) { log->add(index, due_ns); }};
}

caf::actor_system_config timed_config(size_t workers) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", workers);
  use_timed_sharing(cfg);
  return cfg;
}

caf::strong_actor_ptr strong(const caf::actor& a) {
  return caf::actor_cast<caf::strong_actor_ptr>(a);
}

} // namespace

TEST_CASE("timers set from actors and from outside all fire, none early") {
  for (size_t workers : {1u, 2u, 4u}) {
    CAPTURE(workers);
    auto cfg = timed_config(workers);
    caf::actor_system sys{cfg};
    REQUIRE(dynamic_cast<timed_coordinator*>(&sys.scheduler()) != nullptr);
    arrivals log;
    auto sink = sys.spawn(recipient, &log);
    constexpr int per_side = 300;
    std::mt19937 rng(7);
    std::vector<int64_t> offsets(per_side);
    for (auto& o : offsets)
      o = std::uniform_int_distribution<int64_t>(0, 30'000'000)(rng);
    // From a worker: an actor sets timers as the scheduler actor does.
    auto setter = sys.spawn([&](caf::event_based_actor* self) -> caf::behavior {
      return {[&, self](arm_atom) {
        int64_t start = now_ns();
        for (int i = 0; i < per_side; ++i)
          send_at(self->system(), start + offsets[i], strong(sink),
                  caf::make_message(fire_atom::value, i, start + offsets[i]));
      }};
    });
    caf::anon_send(setter, arm_atom::value);
    // From outside, as an ingress thread would.
    int64_t start = now_ns();
    for (int i = 0; i < per_side; ++i)
      send_at(sys, start + offsets[i], strong(sink),
              caf::make_message(fire_atom::value, per_side + i, start + offsets[i]));
    REQUIRE(log.wait_for(2 * per_side));
    std::lock_guard<std::mutex> guard(log.mutex);
    CHECK(log.seen.size() == 2 * per_side);
    std::vector<int> indices;
    for (const auto& a : log.seen) {
      CHECK_MESSAGE(a.at_ns >= a.due_ns, "timer ", a.index, " arrived ", a.due_ns - a.at_ns,
                    " ns early");
      indices.push_back(a.index);
    }
    std::sort(indices.begin(), indices.end());
    CHECK(std::adjacent_find(indices.begin(), indices.end()) == indices.end());
    if (workers == 1) {
      // The setter's timers were all filed before the one worker could fire
      // any of them: it fires them in the order they were due. (One set from
      // outside may be filed after a later one has fired.)
      int64_t last_due = 0;
      for (const auto& a : log.seen) {
        if (a.index >= per_side)
          continue;
        CHECK(last_due <= a.due_ns);
        last_due = a.due_ns;
      }
    }
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(setter, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("a timer set on a worker that then stays busy fires on another worker") {
  // The worker that sets the timer blocks until the timer's message has
  // arrived (at most 10 s): only the idle worker can have run it.
  auto cfg = timed_config(2);
  caf::actor_system sys{cfg};
  arrivals log;
  auto sink = sys.spawn(recipient, &log);
  std::promise<bool> arrived_while_busy;
  auto busy = sys.spawn([&](caf::event_based_actor* self) -> caf::behavior {
    return {[&, self](arm_atom) {
      int64_t due = now_ns() + 20'000'000;
      send_at(self->system(), due, strong(sink), caf::make_message(fire_atom::value, 1, due));
      arrived_while_busy.set_value(log.wait_for(1, std::chrono::seconds(10)));
    }};
  });
  caf::anon_send(busy, arm_atom::value);
  CHECK(arrived_while_busy.get_future().get());
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(busy, caf::exit_reason::user_shutdown);
}

TEST_CASE("an earlier timer wakes the keeper that waits for a later one") {
  auto cfg = timed_config(1);
  caf::actor_system sys{cfg};
  arrivals log;
  auto sink = sys.spawn(recipient, &log);
  int64_t start = now_ns();
  // The worker keeps this one, an hour out...
  send_at(sys, start + 3600'000'000'000, strong(sink),
          caf::make_message(fire_atom::value, 0, start + 3600'000'000'000));
  // ... and must come back for this one.
  send_at(sys, start + 1'000'000, strong(sink),
          caf::make_message(fire_atom::value, 1, start + 1'000'000));
  REQUIRE(log.wait_for(1, std::chrono::seconds(10)));
  std::lock_guard<std::mutex> guard(log.mutex);
  CHECK(log.seen.size() == 1);
  CHECK(log.seen[0].index == 1);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

namespace {

struct counted_state {
  static std::atomic<int> destroyed;
  ~counted_state() { ++destroyed; }
};
std::atomic<int> counted_state::destroyed{0};

} // namespace

TEST_CASE("a pending timer keeps no actor alive, and one for a gone actor is dropped") {
  counted_state::destroyed = 0;
  arrivals log;
  {
    auto cfg = timed_config(2);
    caf::actor_system sys{cfg};
    auto sink = sys.spawn(recipient, &log);
    auto doomed = sys.spawn([](caf::stateful_actor<counted_state>*) -> caf::behavior {
      return {[](fire_atom, int, int64_t) {}};
    });
    int64_t start = now_ns();
    send_at(sys, start + 3600'000'000'000, strong(doomed),
            caf::make_message(fire_atom::value, 0, int64_t{0}));
    send_at(sys, start + 5'000'000, strong(doomed),
            caf::make_message(fire_atom::value, 1, int64_t{0}));
    caf::anon_send_exit(doomed, caf::exit_reason::user_shutdown);
    doomed = nullptr;
    // After the gone actor's timer: its message is dropped, this one arrives.
    send_at(sys, start + 10'000'000, strong(sink),
            caf::make_message(fire_atom::value, 2, start + 10'000'000));
    REQUIRE(log.wait_for(1, std::chrono::seconds(10)));
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    // The system stops with the hour-long timer still pending.
  }
  CHECK(counted_state::destroyed == 1);
  CHECK(log.seen.size() == 1);
}

TEST_CASE("send_at falls back to CAF's clock under CAF's own scheduler") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  REQUIRE(dynamic_cast<timed_coordinator*>(&sys.scheduler()) == nullptr);
  arrivals log;
  auto sink = sys.spawn(recipient, &log);
  int64_t due = now_ns() + 2'000'000;
  send_at(sys, due, strong(sink), caf::make_message(fire_atom::value, 1, due));
  REQUIRE(log.wait_for(1, std::chrono::seconds(10)));
  CHECK(log.seen[0].at_ns >= due);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

TEST_CASE("the workers run every message of actors that yield after each one, in order, and "
          "name themselves caf.worker") {
  // scheduler.max-throughput 1: an actor with more mail yields after each
  // message (resume_later) and goes back to the queue behind the others.
  for (size_t workers : {size_t{1}, size_t{2}}) {
    CAPTURE(workers);
    auto cfg = timed_config(workers);
    cfg.set("scheduler.max-throughput", size_t{1});
    caf::actor_system sys{cfg};
    constexpr int actors = 8;
    constexpr int messages = 500;
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<std::vector<int>> seen(actors);
    std::vector<std::string> thread_names;
    int total = 0;
    std::vector<caf::actor> sinks;
    for (int a = 0; a < actors; ++a)
      sinks.push_back(sys.spawn([&, a](caf::event_based_actor*) -> caf::behavior {
        return {[&, a](int i) {
          char name[16] = {};
          pthread_getname_np(pthread_self(), name, sizeof name);
          std::lock_guard<std::mutex> guard(mutex);
          seen[a].push_back(i);
          thread_names.emplace_back(name);
          if (++total == actors * messages)
            cv.notify_all();
        }};
      }));
    for (int i = 0; i < messages; ++i)
      for (auto& s : sinks)
        caf::anon_send(s, i);
    {
      std::unique_lock<std::mutex> lock(mutex);
      REQUIRE(cv.wait_for(lock, std::chrono::seconds(20),
                          [&] { return total == actors * messages; }));
    }
    for (int a = 0; a < actors; ++a) {
      REQUIRE(seen[a].size() == messages);
      CHECK(std::is_sorted(seen[a].begin(), seen[a].end()));
      CHECK(seen[a].back() == messages - 1);
    }
    CHECK(std::all_of(thread_names.begin(), thread_names.end(),
                      [](const std::string& n) { return n == "caf.worker"; }));
    for (auto& s : sinks)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  }
}
