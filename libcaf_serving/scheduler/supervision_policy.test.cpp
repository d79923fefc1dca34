#include "scheduler/supervision_policy.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <vector>

using namespace caf_serving::scheduler;
using std::chrono::milliseconds;

namespace {

/// A fake steady clock: nanoseconds from an arbitrary origin, set by hand.
constexpr int64_t t0 = 1'000'000'000'000;
constexpr int64_t ms = 1'000'000;

supervision_config config() {
  supervision_config c;
  c.quarantine_after_failures = 3;
  c.quarantine_backoff = milliseconds{1000};
  c.max_quarantine_backoff = milliseconds{30000};
  c.local_batch_timeout = milliseconds{100};
  c.max_local_attempts = 2;
  c.max_batch_attempts = 4;
  return c;
}

/// Fails `executor` until it is quarantined; returns that quarantine.
quarantine fail_until_quarantined(supervision_policy& sv, uint64_t executor, int64_t now) {
  for (uint32_t i = 1; i < sv.config().quarantine_after_failures; ++i) {
    auto d = sv.internal_failure(executor, now);
    REQUIRE(std::holds_alternative<keep_serving>(d));
    CHECK(std::get<keep_serving>(d).failures_in_row == i);
  }
  auto d = sv.internal_failure(executor, now);
  REQUIRE(std::holds_alternative<quarantine>(d));
  return std::get<quarantine>(d);
}

} // namespace

// -- executor health --------------------------------------------------------------

TEST_CASE("health: failures in a row quarantine an executor until its backoff ends") {
  supervision_policy sv{config()};
  sv.add_executor(1);
  sv.add_executor(2);
  auto q = fail_until_quarantined(sv, 1, t0);
  CHECK(q.backoff == milliseconds{1000});
  CHECK(q.until_ns == t0 + 1000 * ms);
  CHECK(sv.quarantined(1, t0));
  CHECK(sv.quarantined(1, t0 + 1000 * ms - 1));
  CHECK_FALSE(sv.quarantined(1, t0 + 1000 * ms));
  // The other executor is not touched.
  CHECK_FALSE(sv.quarantined(2, t0));
}

TEST_CASE("health: the backoff doubles with each quarantine, up to the cap") {
  supervision_policy sv{config()};
  sv.add_executor(1);
  int64_t now = t0;
  std::vector<int64_t> backoffs;
  for (int i = 0; i < 8; ++i) {
    auto q = fail_until_quarantined(sv, 1, now);
    CHECK(q.until_ns == now + q.backoff.count() * ms);
    backoffs.push_back(q.backoff.count());
    now = q.until_ns; // it keeps failing after each return
  }
  CHECK(backoffs == std::vector<int64_t>{1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000});
}

TEST_CASE("health: the doubling stops at 2^16 even when the cap is higher") {
  auto c = config();
  c.quarantine_after_failures = 1;
  c.quarantine_backoff = milliseconds{1};
  c.max_quarantine_backoff = milliseconds{1'000'000'000};
  supervision_policy sv{c};
  sv.add_executor(1);
  milliseconds last{0};
  for (int i = 0; i < 20; ++i)
    last = std::get<quarantine>(sv.internal_failure(1, t0)).backoff;
  CHECK(last == milliseconds{65536});
}

TEST_CASE("health: an attempt without an internal failure clears the count and the backoff") {
  supervision_policy sv{config()};
  sv.add_executor(1);
  // Two failures, then a success: the count starts over.
  sv.internal_failure(1, t0);
  sv.internal_failure(1, t0);
  sv.clear_failures(1);
  auto d = sv.internal_failure(1, t0);
  REQUIRE(std::holds_alternative<keep_serving>(d));
  CHECK(std::get<keep_serving>(d).failures_in_row == 1);
  // Two quarantines, then a success: the next quarantine is the first again.
  sv.clear_failures(1);
  fail_until_quarantined(sv, 1, t0);
  CHECK(fail_until_quarantined(sv, 1, t0).backoff == milliseconds{2000});
  sv.clear_failures(1);
  CHECK(fail_until_quarantined(sv, 1, t0).backoff == milliseconds{1000});
}

TEST_CASE("health: a removed or unknown executor is not quarantined") {
  supervision_policy sv{config()};
  sv.add_executor(1);
  fail_until_quarantined(sv, 1, t0);
  sv.remove_executor(1);
  CHECK_FALSE(sv.quarantined(1, t0));
  CHECK_FALSE(sv.quarantined(7, t0));
}

// -- respawns ---------------------------------------------------------------------

TEST_CASE("respawn: the first restarts start at once, then the delay doubles up to 10 s") {
  supervision_policy sv{config()};
  int64_t now = t0;
  // Stops 100 ms apart with no success in between: the first and the next two
  // quick ones restart at once.
  for (int i = 0; i < 3; ++i) {
    auto d = sv.local_executor_stopped(now);
    REQUIRE(std::holds_alternative<respawn_now>(d));
    CHECK(std::get<respawn_now>(d).executors == 1);
    CHECK_FALSE(sv.respawns_waiting());
    now += 100 * ms;
  }
  std::vector<int64_t> delays;
  for (int i = 0; i < 11; ++i) {
    auto d = sv.local_executor_stopped(now);
    REQUIRE(std::holds_alternative<respawn_later>(d));
    auto later = std::get<respawn_later>(d);
    CHECK(later.at_ns == now + later.delay_ns);
    delays.push_back(later.delay_ns / ms);
    now += 100 * ms;
  }
  CHECK(delays
        == std::vector<int64_t>{50, 100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000});
  // Every executor that stopped meanwhile starts when the last delay is over.
  CHECK(sv.take_due_respawns(now - 100 * ms + 10'000 * ms) == 11);
}

TEST_CASE("respawn: a stop a second or more after the previous one is not quick") {
  supervision_policy sv{config()};
  int64_t now = t0;
  for (int i = 0; i < 3; ++i)
    sv.local_executor_stopped(now += 10 * ms);
  auto later = std::get<respawn_later>(sv.local_executor_stopped(now += 10 * ms));
  CHECK(sv.take_due_respawns(later.at_ns) == 1);
  // The replacement stops a second after the stop before it: at once.
  CHECK(std::holds_alternative<respawn_now>(sv.local_executor_stopped(now + 1000 * ms)));
}

TEST_CASE("respawn: a delayed restart waits until it is due; a slow stop starts all at once") {
  supervision_policy sv{config()};
  int64_t now = t0;
  for (int i = 0; i < 3; ++i)
    sv.local_executor_stopped(now += 10 * ms);
  auto later = std::get<respawn_later>(sv.local_executor_stopped(now += 10 * ms));
  CHECK(later.delay_ns == 50 * ms);
  CHECK(sv.respawns_waiting());
  CHECK(sv.take_due_respawns(later.at_ns - 1) == 0);
  CHECK(sv.respawns_waiting());
  // Another executor stops more than a second later: not a crash loop, so
  // it and the one still waiting start now.
  auto d = sv.local_executor_stopped(now + 2000 * ms);
  REQUIRE(std::holds_alternative<respawn_now>(d));
  CHECK(std::get<respawn_now>(d).executors == 2);
  CHECK_FALSE(sv.respawns_waiting());
  CHECK(sv.take_due_respawns(later.at_ns) == 0);
}

TEST_CASE("respawn: a succeeding batch ends the crash loop; cancel forgets the waiting ones") {
  supervision_policy sv{config()};
  int64_t now = t0;
  for (int i = 0; i < 3; ++i)
    sv.local_executor_stopped(now += 10 * ms);
  sv.batch_succeeded();
  // Quick, but the count starts over: at once.
  CHECK(std::holds_alternative<respawn_now>(sv.local_executor_stopped(now += 10 * ms)));
  sv.local_executor_stopped(now += 10 * ms);
  auto later = sv.local_executor_stopped(now += 10 * ms);
  REQUIRE(std::holds_alternative<respawn_later>(later));
  CHECK(sv.respawns_waiting());
  sv.cancel_respawns();
  CHECK_FALSE(sv.respawns_waiting());
  CHECK(sv.take_due_respawns(std::get<respawn_later>(later).at_ns) == 0);
}

// -- hang check -------------------------------------------------------------------

TEST_CASE("hang check: armed for the first attempt, not again while one is armed sooner") {
  supervision_policy sv{config()};
  auto first = sv.local_attempt_sent(1, t0);
  REQUIRE(first);
  CHECK(first->when_ns == t0 + 100 * ms);
  CHECK_FALSE(sv.local_attempt_sent(2, t0 + 10 * ms));
  // Not due yet: nothing is given up, nothing is armed.
  auto early = sv.check_hung(t0 + 100 * ms - 1);
  CHECK(early.hung.empty());
  CHECK_FALSE(early.next);
}

TEST_CASE("hang check: gives up what ran past the timeout and arms the next for the oldest left") {
  supervision_policy sv{config()};
  sv.local_attempt_sent(5, t0);
  sv.local_attempt_sent(3, t0 + 1 * ms);
  sv.local_attempt_sent(9, t0 + 30 * ms);
  sv.local_attempt_sent(7, t0 + 20 * ms);
  auto check = sv.check_hung(t0 + 101 * ms);
  CHECK(check.hung == std::vector<uint64_t>{3, 5});
  REQUIRE(check.next);
  CHECK(check.next->when_ns == t0 + 120 * ms); // batch 7, the oldest left
  // Given up attempts are no longer tracked; an answered one is forgotten.
  sv.attempt_ended(7);
  auto later = sv.check_hung(t0 + 120 * ms);
  CHECK(later.hung.empty());
  REQUIRE(later.next);
  CHECK(later.next->when_ns == t0 + 130 * ms);
  CHECK(sv.check_hung(t0 + 130 * ms).hung == std::vector<uint64_t>{9});
  // Nothing left: nothing armed, and a new attempt arms a check again.
  CHECK_FALSE(sv.check_hung(t0 + 500 * ms).next);
  auto again = sv.local_attempt_sent(11, t0 + 500 * ms);
  REQUIRE(again);
  CHECK(again->when_ns == t0 + 600 * ms);
}

TEST_CASE("hang check: a resend after a check does not arm one later than the one armed") {
  supervision_policy sv{config()};
  sv.local_attempt_sent(1, t0);
  sv.local_attempt_sent(2, t0 + 50 * ms);
  auto check = sv.check_hung(t0 + 100 * ms);
  CHECK(check.hung == std::vector<uint64_t>{1});
  REQUIRE(check.next);
  CHECK(check.next->when_ns == t0 + 150 * ms);
  // Batch 1 goes out again: its check would come after the one armed.
  CHECK_FALSE(sv.local_attempt_sent(1, t0 + 100 * ms));
  CHECK(sv.check_hung(t0 + 150 * ms).hung == std::vector<uint64_t>{2});
}

TEST_CASE("hang check: a timeout of 0 never arms a check") {
  auto c = config();
  c.local_batch_timeout = milliseconds{0};
  supervision_policy sv{c};
  CHECK_FALSE(sv.local_attempt_sent(1, t0));
  CHECK(sv.check_hung(t0 + 1'000'000 * ms).hung.empty());
}

// -- failed attempts ----------------------------------------------------------------

TEST_CASE("failed attempts: a lost batch is sent again while it has attempts left") {
  supervision_policy sv{config()};
  for (auto how : {attempt_end::stopped, attempt_end::timed_out}) {
    CHECK(std::holds_alternative<send_again>(sv.attempt_failed({1, true, how})));
    for (uint32_t attempts = 1; attempts < 4; ++attempts)
      CHECK(std::holds_alternative<send_again>(sv.attempt_failed({attempts, false, how})));
  }
}

TEST_CASE("failed attempts: out of attempts, remote is 503 and local is 500") {
  supervision_policy sv{config()};
  auto remote = sv.attempt_failed({4, false, attempt_end::stopped});
  REQUIRE(std::holds_alternative<fail_unavailable>(remote));
  CHECK(std::get<fail_unavailable>(remote).attempts == 4);
  CHECK(std::holds_alternative<fail_unavailable>(
    sv.attempt_failed({4, false, attempt_end::timed_out})));
  for (auto how : {attempt_end::stopped, attempt_end::timed_out}) {
    auto local = sv.attempt_failed({2, true, how});
    REQUIRE(std::holds_alternative<fail_internal>(local));
    CHECK(std::get<fail_internal>(local).how == how);
    CHECK(std::get<fail_internal>(local).attempts == 2);
  }
}

TEST_CASE("failed attempts: an executor that failed while running the batch is 500 at once") {
  supervision_policy sv{config()};
  for (bool local : {true, false}) {
    auto d = sv.attempt_failed({1, local, attempt_end::failed});
    REQUIRE(std::holds_alternative<fail_internal>(d));
    CHECK(std::get<fail_internal>(d).how == attempt_end::failed);
    CHECK(std::get<fail_internal>(d).attempts == 1);
  }
}
