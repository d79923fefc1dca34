#include "scheduler/batching_policy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <tuple>

using namespace caf_serving;
using namespace caf_serving::scheduler;

namespace {

/// Synthetic time: microseconds after an arbitrary origin.
const time_point origin = time_point{} + std::chrono::hours{1};
time_point at(int64_t us) { return origin + std::chrono::microseconds{us}; }

policy_config dynamic_config(int max_batch_size, std::vector<int> preferred,
                             uint64_t delay_us) {
  policy_config cfg;
  cfg.max_batch_size = max_batch_size;
  cfg.dynamic_batching_enabled = true;
  cfg.dynamic_batching.preferred_batch_sizes = std::move(preferred);
  cfg.dynamic_batching.max_queue_delay_us = delay_us;
  cfg.max_queue_size_default = 100;
  return cfg;
}

request_info req(uint64_t id, uint32_t rows = 1, uint32_t priority = 0,
                 uint64_t timeout_us = 0) {
  return request_info{id, rows, priority, timeout_us};
}

void admit(batching_policy& p, const request_info& r, time_point now) {
  auto res = p.enqueue(r, now);
  REQUIRE_MESSAGE(std::holds_alternative<admitted>(res), "request " << r.id);
}

rejected refuse(batching_policy& p, const request_info& r, time_point now) {
  auto res = p.enqueue(r, now);
  REQUIRE(std::holds_alternative<rejected>(res));
  return std::get<rejected>(res);
}

dispatch expect_dispatch(const poll_result& r) {
  REQUIRE(std::holds_alternative<dispatch>(r.next));
  return std::get<dispatch>(r.next);
}

time_point expect_wait(const poll_result& r) {
  REQUIRE(std::holds_alternative<wait_until>(r.next));
  return std::get<wait_until>(r.next).when;
}

using ids = std::vector<uint64_t>;

} // namespace

TEST_CASE("a batch goes out as soon as it reaches a preferred size") {
  batching_policy p{dynamic_config(8, {4}, 1000)};
  for (uint64_t i = 1; i <= 3; ++i) {
    admit(p, req(i), at(i));
    auto r = p.poll(at(i), true);
    CHECK(r.expired.empty());
    CHECK(expect_wait(r) == at(1 + 1000)); // the oldest's delay expiry
  }
  admit(p, req(4), at(4));
  auto d = expect_dispatch(p.poll(at(4), true));
  CHECK(d.ids == ids{1, 2, 3, 4});
  CHECK(d.rows == 4);
  CHECK(p.queued() == 0);
  CHECK(std::holds_alternative<idle>(p.poll(at(5), true).next));
}

TEST_CASE("the largest preferred size a prefix reaches is chosen") {
  batching_policy p{dynamic_config(8, {2, 4}, 1000)};
  for (uint64_t i = 1; i <= 5; ++i)
    admit(p, req(i), at(0));
  auto d = expect_dispatch(p.poll(at(0), true));
  CHECK(d.ids == ids{1, 2, 3, 4});
  // One request left: no preferred size, so it waits for its delay.
  CHECK(expect_wait(p.poll(at(1), true)) == at(1000));
}

TEST_CASE("past the largest preferred size, the prefix below it goes out") {
  // Triton: with rows 3,3,3 no prefix hits 4; the prefix before passing 4 goes.
  batching_policy p{dynamic_config(8, {4}, 1000)};
  admit(p, req(1, 3), at(0));
  admit(p, req(2, 3), at(0));
  admit(p, req(3, 3), at(0));
  auto d = expect_dispatch(p.poll(at(0), true));
  CHECK(d.ids == ids{1});
  CHECK(d.rows == 3);
  CHECK(p.queued_rows() == 6);
}

TEST_CASE("a batch goes out when the oldest request has waited the delay") {
  batching_policy p{dynamic_config(8, {4}, 500)};
  admit(p, req(1, 1), at(0));
  admit(p, req(2, 2), at(100));
  CHECK(expect_wait(p.poll(at(100), true)) == at(500));
  CHECK(expect_wait(p.poll(at(499), true)) == at(500));
  auto d = expect_dispatch(p.poll(at(500), true));
  CHECK(d.ids == ids{1, 2});
  CHECK(d.rows == 3);
}

TEST_CASE("at the delay the whole pending batch goes out, up to max_batch_size") {
  // Triton sends "whatever is pending" once the delay is exceeded, even past
  // the largest preferred size.
  batching_policy p{dynamic_config(6, {4}, 500)};
  for (uint64_t i = 1; i <= 7; ++i)
    admit(p, req(i), at(0));
  CHECK(std::holds_alternative<wait_for_executor>(p.poll(at(10), false).next));
  auto d = expect_dispatch(p.poll(at(600), true));
  CHECK(d.ids == ids{1, 2, 3, 4, 5, 6});
  CHECK(d.rows == 6);
  d = expect_dispatch(p.poll(at(600), true));
  CHECK(d.ids == ids{7});
}

TEST_CASE("a batch goes out at max_batch_size without preferred sizes") {
  // No preferred sizes means {max_batch_size}, as Triton normalises.
  batching_policy p{dynamic_config(4, {}, 10'000)};
  admit(p, req(1, 2), at(0));
  admit(p, req(2, 1), at(1));
  CHECK(expect_wait(p.poll(at(1), true)) == at(10'000));
  admit(p, req(3, 1), at(2));
  auto d = expect_dispatch(p.poll(at(2), true));
  CHECK(d.ids == ids{1, 2, 3});
  CHECK(d.rows == 4);
  // A batch never passes max_batch_size: 3 + 3 > 4, so 3 goes alone.
  admit(p, req(4, 3), at(3));
  admit(p, req(5, 3), at(4));
  d = expect_dispatch(p.poll(at(4), true));
  CHECK(d.ids == ids{4});
  CHECK(expect_wait(p.poll(at(4), true)) == at(4 + 10'000));
}

TEST_CASE("max_queue_delay 0 dispatches at once what is queued") {
  batching_policy p{dynamic_config(8, {}, 0)};
  admit(p, req(1, 2), at(0));
  admit(p, req(2, 1), at(0));
  auto d = expect_dispatch(p.poll(at(0), true));
  CHECK(d.ids == ids{1, 2});
  CHECK(d.rows == 3);
}

TEST_CASE("without dynamic batching each request is its own batch") {
  policy_config cfg;
  cfg.max_batch_size = 8;
  cfg.max_queue_size_default = 3;
  batching_policy p{cfg};
  admit(p, req(1, 3, 2, 100), at(0)); // priority and timeout do not apply
  admit(p, req(2, 5, 1), at(1));
  CHECK(refuse(p, req(9, 9), at(1)).reason == reject_reason::too_many_rows);
  CHECK(std::holds_alternative<wait_for_executor>(p.poll(at(2), false).next));
  auto r = p.poll(at(10'000), true);
  CHECK(r.expired.empty());
  auto d = expect_dispatch(r);
  CHECK(d.ids == ids{1});
  CHECK(d.rows == 3);
  d = expect_dispatch(p.poll(at(10'000), true));
  CHECK(d.ids == ids{2});
  CHECK(d.rows == 5);
  // Still bounded, by the engine's default.
  for (uint64_t i = 3; i <= 5; ++i)
    admit(p, req(i), at(20'000));
  CHECK(refuse(p, req(6), at(20'000)).reason == reject_reason::queue_full);
}

TEST_CASE("a model without a batch dimension takes one request per batch") {
  batching_policy p{dynamic_config(0, {}, 1000)};
  CHECK(p.max_batch_rows() == 1);
  admit(p, req(1, 7), at(0)); // rows mean nothing without a batch dimension
  admit(p, req(2, 1), at(0));
  CHECK(p.queued_rows() == 2);
  auto d = expect_dispatch(p.poll(at(0), true));
  CHECK(d.ids == ids{1});
  CHECK(d.rows == 1);
}

TEST_CASE("rows count towards the batch size") {
  batching_policy p{dynamic_config(8, {}, 1000)};
  admit(p, req(1, 5), at(0));
  admit(p, req(2, 0), at(0)); // 0 rows counts as 1
  CHECK(p.queued() == 2);
  CHECK(p.queued_rows() == 6);
  auto too_big = refuse(p, req(3, 9), at(0));
  CHECK(too_big.id == 3);
  CHECK(too_big.reason == reject_reason::too_many_rows);
  CHECK(too_big.message.find("max_batch_size is 8") != std::string::npos);
  CHECK(p.queued() == 2);
  admit(p, req(4, 2), at(1));
  auto d = expect_dispatch(p.poll(at(1), true));
  CHECK(d.ids == ids{1, 2, 4});
  CHECK(d.rows == 8);
  CHECK(p.queued_rows() == 0);
}

request_info shaped(uint64_t id, uint64_t shape_class, uint64_t bytes = 0) {
  request_info r = req(id);
  r.shape_class = shape_class;
  r.bytes = bytes;
  return r;
}

TEST_CASE("requests of another shape never share a batch; the batch before them goes out") {
  batching_policy p{dynamic_config(8, {}, 1000)};
  admit(p, shaped(1, 2), at(0));
  admit(p, shaped(2, 2), at(1));
  // A request of another shape ends the batch: it cannot grow past it.
  admit(p, shaped(3, 4), at(2));
  admit(p, shaped(4, 2), at(3));
  auto d = expect_dispatch(p.poll(at(3), true));
  CHECK(d.ids == ids{1, 2});
  // The request of the other shape leads the next batch, which ends at the
  // next change of shape.
  d = expect_dispatch(p.poll(at(3), true));
  CHECK(d.ids == ids{3});
  // The last one waits for its delay (or more of its own shape).
  CHECK(expect_wait(p.poll(at(3), true)) == at(3 + 1000));
  admit(p, shaped(5, 2), at(4));
  CHECK(expect_wait(p.poll(at(4), true)) == at(3 + 1000));
  d = expect_dispatch(p.poll(at(1003), true));
  CHECK(d.ids == ids{4, 5});
}

TEST_CASE("a batch closes before it would pass max_batch_bytes") {
  auto cfg = dynamic_config(8, {}, 1000);
  cfg.max_batch_bytes = 1000;
  batching_policy p{cfg};
  admit(p, shaped(1, 0, 400), at(0));
  admit(p, shaped(2, 0, 400), at(0));
  CHECK(expect_wait(p.poll(at(0), true)) == at(1000));
  admit(p, shaped(3, 0, 400), at(1)); // 1200 bytes with it: the batch is full
  auto d = expect_dispatch(p.poll(at(1), true));
  CHECK(d.ids == ids{1, 2});
  // Exactly at the cap is allowed.
  admit(p, shaped(4, 0, 600), at(2));
  admit(p, shaped(5, 0, 1), at(2));
  d = expect_dispatch(p.poll(at(2), true));
  CHECK(d.ids == ids{3, 4});
  // A request over the cap alone is refused with what to do.
  auto big = refuse(p, shaped(6, 0, 1001), at(3));
  CHECK(big.reason == reject_reason::too_large);
  CHECK(big.message.find("1001 bytes") != std::string::npos);
  CHECK(big.message.find("--max-batch-bytes") != std::string::npos);
  CHECK(p.queued() == 1);
}

TEST_CASE("max_batch_bytes past a Cap'n Proto Data field is refused") {
  auto cfg = dynamic_config(8, {}, 1000);
  cfg.max_batch_bytes = max_data_field_bytes + 1;
  auto err = batching_policy::validate(cfg);
  REQUIRE(err.has_value());
  CHECK(err->message.find("--max-batch-bytes") != std::string::npos);
  cfg.max_batch_bytes = max_data_field_bytes;
  CHECK_FALSE(batching_policy::validate(cfg).has_value());
}

TEST_CASE("priority levels order the queue, FIFO within a level") {
  auto cfg = dynamic_config(8, {}, 0);
  cfg.dynamic_batching.priority_levels = 3;
  cfg.dynamic_batching.default_priority_level = 2;
  batching_policy p{cfg};
  admit(p, req(1, 1, 3), at(0));
  admit(p, req(2, 1, 0), at(1)); // none given: default level 2
  admit(p, req(3, 1, 1), at(2));
  admit(p, req(4, 1, 9), at(3)); // out of range: default level 2
  admit(p, req(5, 1, 1), at(4));
  auto d = expect_dispatch(p.poll(at(5), true));
  CHECK(d.ids == ids{3, 5, 2, 4, 1});
}

TEST_CASE("a batch takes the highest levels first") {
  auto cfg = dynamic_config(2, {}, 0);
  cfg.dynamic_batching.priority_levels = 2;
  cfg.dynamic_batching.default_priority_level = 2;
  batching_policy p{cfg};
  admit(p, req(1), at(0));
  admit(p, req(2), at(1));
  admit(p, req(3, 1, 1), at(2));
  CHECK(expect_dispatch(p.poll(at(3), true)).ids == ids{3, 1});
  CHECK(expect_dispatch(p.poll(at(3), true)).ids == ids{2});
}

TEST_CASE("REJECT: an expired request comes back in expired and leaves the queue") {
  auto cfg = dynamic_config(8, {4}, 1000);
  cfg.dynamic_batching.default_queue_policy.default_timeout_us = 100;
  batching_policy p{cfg};
  admit(p, req(1), at(0));
  admit(p, req(2), at(50));
  // The next timeout comes before the delay expiry.
  CHECK(expect_wait(p.poll(at(50), true)) == at(100));
  CHECK(expect_wait(p.poll(at(99), true)) == at(100));
  auto r = p.poll(at(100), true);
  REQUIRE(r.expired.size() == 1);
  CHECK(r.expired[0].id == 1);
  CHECK(r.expired[0].reason == reject_reason::timed_out);
  CHECK(r.expired[0].message.find("timeout of 100 us") != std::string::npos);
  CHECK(p.queued() == 1);
  CHECK(expect_wait(r) == at(150));
  r = p.poll(at(400), false); // expiry happens without an executor too
  REQUIRE(r.expired.size() == 1);
  CHECK(r.expired[0].id == 2);
  CHECK(std::holds_alternative<idle>(r.next));
}

TEST_CASE("DELAY: an expired request moves behind its level's undelayed ones") {
  auto cfg = dynamic_config(8, {}, 0);
  cfg.dynamic_batching.priority_levels = 2;
  cfg.dynamic_batching.default_priority_level = 2;
  queue_policy delaying;
  delaying.action = timeout_action::delay;
  delaying.default_timeout_us = 100;
  cfg.dynamic_batching.priority_queue_policy[1] = delaying;
  batching_policy p{cfg};
  admit(p, req(1, 1, 1), at(0)); // times out at 100
  admit(p, req(2, 1, 2), at(0)); // level 2, no timeout
  admit(p, req(3, 1, 1), at(10)); // times out at 110
  CHECK(expect_wait(p.poll(at(20), false)) == at(100));
  auto r = p.poll(at(100), false);
  CHECK(r.expired.empty()); // delayed, not rejected
  CHECK(expect_wait(r) == at(110));
  admit(p, req(4, 1, 1), at(105));
  r = p.poll(at(110), false);
  CHECK(r.expired.empty());
  CHECK(expect_wait(r) == at(205)); // request 4's timeout
  CHECK(p.queued() == 4);
  // Undelayed level 1, then delayed level 1 (in timeout order), then level 2.
  auto d = expect_dispatch(p.poll(at(120), true));
  CHECK(d.ids == ids{4, 1, 3, 2});
}

TEST_CASE("a request may shorten the timeout only when override is allowed") {
  auto queue_with = [](uint64_t default_us, bool allow) {
    auto cfg = dynamic_config(8, {}, 0);
    cfg.dynamic_batching.default_queue_policy.default_timeout_us = default_us;
    cfg.dynamic_batching.default_queue_policy.allow_timeout_override = allow;
    return batching_policy{cfg};
  };
  // The deadline shows as the wait_until of a poll without an executor.
  auto deadline_for = [](batching_policy& p, uint64_t request_timeout) -> next_step {
    admit(p, req(1, 1, 0, request_timeout), at(0));
    return p.poll(at(0), false).next;
  };
  auto when = [](const next_step& n) {
    REQUIRE(std::holds_alternative<wait_until>(n));
    return std::get<wait_until>(n).when;
  };
  SUBCASE("allowed, shorter: the request's") {
    auto p = queue_with(1000, true);
    CHECK(when(deadline_for(p, 100)) == at(100));
  }
  SUBCASE("allowed, longer: the default (may not increase)") {
    auto p = queue_with(1000, true);
    CHECK(when(deadline_for(p, 5000)) == at(1000));
  }
  SUBCASE("allowed, request gives none: the default") {
    auto p = queue_with(1000, true);
    CHECK(when(deadline_for(p, 0)) == at(1000));
  }
  SUBCASE("not allowed: the default") {
    auto p = queue_with(1000, false);
    CHECK(when(deadline_for(p, 100)) == at(1000));
  }
  SUBCASE("allowed, no default: the request's") {
    auto p = queue_with(0, true);
    CHECK(when(deadline_for(p, 300)) == at(300));
  }
  SUBCASE("not allowed, no default: no timeout") {
    auto p = queue_with(0, false);
    CHECK(std::holds_alternative<wait_for_executor>(deadline_for(p, 300)));
  }
}

TEST_CASE("a full queue rejects at once and never exceeds its limit") {
  auto cfg = dynamic_config(8, {}, 1000);
  cfg.dynamic_batching.priority_levels = 2;
  cfg.dynamic_batching.default_priority_level = 1;
  cfg.dynamic_batching.default_queue_policy.max_queue_size = 0; // engine default
  cfg.max_queue_size_default = 3;
  queue_policy small;
  small.max_queue_size = 2;
  cfg.dynamic_batching.priority_queue_policy[2] = small;
  batching_policy p{cfg};
  admit(p, req(1, 1, 2), at(0));
  admit(p, req(2, 1, 2), at(0));
  auto full = refuse(p, req(3, 1, 2), at(0));
  CHECK(full.id == 3);
  CHECK(full.reason == reject_reason::queue_full);
  CHECK(full.message.find("priority level 2 is full (2 requests)") != std::string::npos);
  CHECK(p.queued() == 2);
  // Level 1 has its own limit: the engine default of 3.
  for (uint64_t i = 4; i <= 6; ++i)
    admit(p, req(i, 1, 1), at(0));
  CHECK(refuse(p, req(7, 1, 1), at(0)).reason == reject_reason::queue_full);
  CHECK(p.queued() == 5);
  // Delayed requests still count towards the limit (as in Triton).
  auto d_cfg = dynamic_config(8, {}, 1000);
  d_cfg.dynamic_batching.default_queue_policy = {timeout_action::delay, 10, false, 1};
  batching_policy d{d_cfg};
  admit(d, req(1), at(0));
  CHECK(d.poll(at(20), false).expired.empty());
  CHECK(refuse(d, req(2), at(20)).reason == reject_reason::queue_full);
}

TEST_CASE("a rejection is answered with the status and failure reason of its kind") {
  auto answer = [](reject_reason reason) { return rejection_error({7, reason, "why"}); };
  auto full = answer(reject_reason::queue_full);
  CHECK(full.status == status_code::unavailable);
  CHECK(full.reason == failure_reason::queue_full);
  CHECK(full.message == "why");
  auto late = answer(reject_reason::timed_out);
  CHECK(late.status == status_code::unavailable);
  CHECK(late.reason == failure_reason::timeout);
  auto rows = answer(reject_reason::too_many_rows);
  CHECK(rows.status == status_code::bad_request);
  CHECK(rows.reason == failure_reason::bad_request);
  auto bytes = answer(reject_reason::too_large);
  CHECK(bytes.status == status_code::payload_too_large);
  CHECK(bytes.reason == failure_reason::bad_request);
  CHECK(bytes.retry_after_s == 0);
}

TEST_CASE("without a free executor batches are held") {
  batching_policy p{dynamic_config(4, {}, 100)};
  for (uint64_t i = 1; i <= 6; ++i)
    admit(p, req(i), at(0));
  CHECK(std::holds_alternative<wait_for_executor>(p.poll(at(0), false).next));
  CHECK(std::holds_alternative<wait_for_executor>(p.poll(at(5000), false).next));
  CHECK(p.queued() == 6);
  CHECK(expect_dispatch(p.poll(at(5000), true)).ids == ids{1, 2, 3, 4});
  CHECK(expect_dispatch(p.poll(at(5000), true)).ids == ids{5, 6});
  CHECK(std::holds_alternative<idle>(p.poll(at(5000), false).next));
}

TEST_CASE("invalid configurations are refused with a clear message") {
  auto message_of = [](const policy_config& cfg) {
    auto err = batching_policy::validate(cfg);
    return err ? err->message : std::string{};
  };
  auto cfg = dynamic_config(4, {8}, 0);
  CHECK(message_of(cfg).find("preferred_batch_size 8 is out of range") != std::string::npos);
  CHECK_THROWS_AS(batching_policy{cfg}, std::invalid_argument);
  cfg = dynamic_config(4, {}, 0);
  cfg.max_queue_size_default = 0;
  CHECK(message_of(cfg).find("must be at least 1") != std::string::npos);
  cfg = dynamic_config(4, {}, 0);
  cfg.dynamic_batching.priority_levels = 2;
  cfg.dynamic_batching.default_priority_level = 3;
  CHECK(message_of(cfg).find("default_priority_level is 3") != std::string::npos);
  cfg.dynamic_batching.default_priority_level = 1;
  cfg.dynamic_batching.priority_queue_policy[5] = queue_policy{};
  CHECK(message_of(cfg).find("has key 5") != std::string::npos);
  cfg = dynamic_config(4, {2, 4}, 0);
  CHECK(message_of(cfg).empty());
  cfg.dynamic_batching.preserve_ordering = true;
  cfg.dynamic_batching.default_queue_policy = {timeout_action::delay, 10, false, 0};
  CHECK(message_of(cfg).find("DELAY") != std::string::npos);
}

// -- randomized property test -----------------------------------------------------

namespace {

/// An independent model of the spec, used to check the policy's every answer.
struct model_request {
  uint64_t id;
  uint32_t level;
  uint32_t rows;
  uint64_t seq;
  time_point enqueued;
  std::optional<time_point> deadline;
  timeout_action action;
};

struct random_world {
  std::mt19937_64 rng;
  policy_config cfg;

  uint64_t pick(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>{lo, hi}(rng);
  }
  bool chance(double p) { return std::bernoulli_distribution{p}(rng); }

  queue_policy random_queue_policy() {
    queue_policy q;
    q.action = chance(0.5) ? timeout_action::reject : timeout_action::delay;
    const uint64_t timeouts[] = {0, 0, 100, 300, 1000};
    q.default_timeout_us = timeouts[pick(0, 4)];
    q.allow_timeout_override = chance(0.5);
    q.max_queue_size = chance(0.4) ? 0 : static_cast<uint32_t>(pick(1, 20));
    return q;
  }

  void make_config() {
    const int sizes[] = {0, 1, 2, 4, 8, 16};
    cfg = policy_config{};
    cfg.max_batch_size = sizes[pick(0, 5)];
    cfg.dynamic_batching_enabled = chance(0.85);
    cfg.max_queue_size_default = static_cast<uint32_t>(pick(3, 40));
    auto& db = cfg.dynamic_batching;
    for (int s = 1; s <= cfg.max_batch_size; ++s)
      if (chance(0.3))
        db.preferred_batch_sizes.push_back(s);
    const uint64_t delays[] = {0, 50, 200, 1000};
    db.max_queue_delay_us = delays[pick(0, 3)];
    db.priority_levels = static_cast<uint32_t>(pick(0, 3));
    db.default_priority_level =
      db.priority_levels == 0 ? 0 : static_cast<uint32_t>(pick(1, db.priority_levels));
    db.default_queue_policy = random_queue_policy();
    for (uint32_t l = 1; l <= db.priority_levels; ++l)
      if (chance(0.6))
        db.priority_queue_policy[l] = random_queue_policy();
  }
};

/// The queue order at `now`: level, then undelayed in arrival order, then
/// delayed in the order they timed out.
auto order_key(const model_request& r, time_point now) {
  bool delayed = r.action == timeout_action::delay && r.deadline && now >= *r.deadline;
  return std::make_tuple(r.level, delayed ? 1 : 0,
                         delayed ? r.deadline->time_since_epoch().count() : 0, r.seq);
}

/// What a run exercised, so that the test fails if it stops reaching a path.
struct coverage {
  size_t dispatches = 0, multi_request_batches = 0, waits = 0, timed_out = 0,
         delayed_dispatched = 0, queue_full = 0, too_many_rows = 0, held = 0;
};

void run_random_sequence(uint64_t seed, int events, coverage& seen) {
  random_world w{std::mt19937_64{seed}, {}};
  w.make_config();
  INFO("seed " << seed << " max_batch_size " << w.cfg.max_batch_size << " dynamic "
               << w.cfg.dynamic_batching_enabled << " levels "
               << w.cfg.dynamic_batching.priority_levels << " delay "
               << w.cfg.dynamic_batching.max_queue_delay_us);
  const auto& cfg = w.cfg;
  const auto& db = cfg.dynamic_batching;
  const bool dynamic = cfg.dynamic_batching_enabled;
  const uint32_t max_rows = static_cast<uint32_t>(std::max(1, cfg.max_batch_size));
  std::set<uint32_t> preferred(db.preferred_batch_sizes.begin(),
                               db.preferred_batch_sizes.end());
  if (preferred.empty() && cfg.max_batch_size > 0)
    preferred.insert(static_cast<uint32_t>(cfg.max_batch_size));
  const uint32_t max_preferred = preferred.empty() ? 0 : *preferred.rbegin();
  const uint64_t delay_us = dynamic ? db.max_queue_delay_us : 0;

  auto policy_of = [&](uint32_t level) {
    if (!dynamic)
      return queue_policy{};
    if (db.priority_levels != 0) {
      auto i = db.priority_queue_policy.find(level);
      if (i != db.priority_queue_policy.end())
        return i->second;
    }
    return db.default_queue_policy;
  };

  batching_policy policy{cfg};
  std::map<uint64_t, model_request> live;
  std::set<uint64_t> finished; // dispatched or rejected, each exactly once
  uint64_t next_id = 1, seq = 0, admitted_count = 0;
  int64_t clock_us = 0;

  auto check_poll = [&](time_point now, bool available) {
    auto r = policy.poll(now, available);
    // Expired: exactly the REJECT requests whose deadline has come.
    std::set<uint64_t> due;
    for (const auto& [id, m] : live)
      if (m.action == timeout_action::reject && m.deadline && now >= *m.deadline)
        due.insert(id);
    std::set<uint64_t> got;
    seen.timed_out += r.expired.size();
    for (const auto& e : r.expired) {
      CHECK(e.reason == reject_reason::timed_out);
      CHECK_MESSAGE(got.insert(e.id).second, "expired twice in one poll: " << e.id);
    }
    CHECK(got == due);
    for (uint64_t id : due) {
      CHECK(finished.insert(id).second);
      live.erase(id);
    }
    std::vector<const model_request*> order;
    for (const auto& [id, m] : live)
      order.push_back(&m);
    std::sort(order.begin(), order.end(), [&](auto* a, auto* b) {
      return order_key(*a, now) < order_key(*b, now);
    });
    std::optional<time_point> next_deadline; // of undelayed requests
    for (auto* m : order)
      if (m->deadline && now < *m->deadline)
        next_deadline = next_deadline ? std::min(*next_deadline, *m->deadline)
                                      : *m->deadline;
    if (live.empty()) {
      CHECK(std::holds_alternative<idle>(r.next));
      return r;
    }
    if (!available) {
      ++seen.held;
      if (next_deadline) {
        REQUIRE(std::holds_alternative<wait_until>(r.next));
        CHECK(std::get<wait_until>(r.next).when == *next_deadline);
      } else {
        CHECK(std::holds_alternative<wait_for_executor>(r.next));
      }
      return r;
    }
    // The candidate: the longest prefix that fits max_rows.
    uint32_t cand_rows = 0;
    size_t cand = 0;
    time_point oldest = time_point::max();
    bool hits_preferred = false;
    for (auto* m : order) {
      if (cand > 0 && cand_rows + m->rows > max_rows)
        break;
      cand_rows += m->rows;
      ++cand;
      oldest = std::min(oldest, m->enqueued);
      hits_preferred = hits_preferred || preferred.count(cand_rows) > 0;
    }
    const bool delay_due =
      delay_us == 0 || now >= oldest + std::chrono::microseconds{delay_us};
    if (auto* d = std::get_if<dispatch>(&r.next)) {
      REQUIRE(!d->ids.empty());
      ++seen.dispatches;
      seen.multi_request_batches += d->ids.size() > 1 ? 1 : 0;
      REQUIRE(d->ids.size() <= order.size());
      uint32_t rows = 0;
      for (size_t i = 0; i < d->ids.size(); ++i) {
        // The batch is a prefix of the queue order: priority, FIFO, delayed last.
        CHECK_MESSAGE(d->ids[i] == order[i]->id, "position " << i);
        rows += order[i]->rows;
        seen.delayed_dispatched += std::get<1>(order_key(*order[i], now));
        // No dispatched request had expired under REJECT (those left above).
        CHECK(!(order[i]->action == timeout_action::reject && order[i]->deadline
                && now >= *order[i]->deadline));
      }
      CHECK(d->rows == rows);
      CHECK(rows <= max_rows);
      if (!dynamic)
        CHECK(d->ids.size() == 1);
      else
        // Justified: a preferred size, the delay, or a batch that cannot grow.
        CHECK((preferred.count(rows) > 0 || delay_due || cand < order.size()
               || cand_rows >= max_preferred));
      for (uint64_t id : d->ids) {
        CHECK(finished.insert(id).second);
        live.erase(id);
      }
    } else {
      REQUIRE(std::holds_alternative<wait_until>(r.next));
      ++seen.waits;
      CHECK(dynamic);
      // Waiting is only allowed when no rule says "send now".
      CHECK(!delay_due);
      CHECK(!hits_preferred);
      CHECK(cand == order.size());
      CHECK(cand_rows < max_preferred);
      auto expect = oldest + std::chrono::microseconds{delay_us};
      if (next_deadline)
        expect = std::min(expect, *next_deadline);
      CHECK(std::get<wait_until>(r.next).when == expect);
      CHECK(std::get<wait_until>(r.next).when > now);
    }
    return r;
  };

  for (int step = 0; step < events; ++step) {
    clock_us += static_cast<int64_t>(w.pick(0, 60));
    const time_point now = at(clock_us);
    if (w.chance(0.55)) {
      request_info info;
      info.id = next_id++;
      info.rows = static_cast<uint32_t>(w.chance(0.05) ? max_rows + 1
                                                       : w.pick(0, max_rows));
      info.priority = static_cast<uint32_t>(w.pick(0, db.priority_levels + 1));
      const uint64_t timeouts[] = {0, 0, 50, 150, 700, 2000};
      info.timeout_us = timeouts[w.pick(0, 5)];
      // The model's expectation.
      uint32_t rows = cfg.max_batch_size == 0 ? 1 : std::max<uint32_t>(1, info.rows);
      uint32_t level = 0;
      if (dynamic && db.priority_levels != 0)
        level = (info.priority == 0 || info.priority > db.priority_levels)
                  ? db.default_priority_level
                  : info.priority;
      auto qp = policy_of(level);
      uint32_t limit = qp.max_queue_size != 0 ? qp.max_queue_size : cfg.max_queue_size_default;
      size_t in_level = 0;
      for (const auto& [id, m] : live)
        in_level += m.level == level ? 1 : 0;
      auto res = policy.enqueue(info, now);
      if (rows > max_rows) {
        REQUIRE(std::holds_alternative<rejected>(res));
        CHECK(std::get<rejected>(res).reason == reject_reason::too_many_rows);
        ++seen.too_many_rows;
      } else if (in_level >= limit) {
        REQUIRE(std::holds_alternative<rejected>(res));
        CHECK(std::get<rejected>(res).reason == reject_reason::queue_full);
        ++seen.queue_full;
      } else {
        REQUIRE(std::holds_alternative<admitted>(res));
        ++admitted_count;
        uint64_t t = qp.default_timeout_us;
        if (qp.allow_timeout_override && info.timeout_us != 0
            && (t == 0 || info.timeout_us < t))
          t = info.timeout_us;
        std::optional<time_point> deadline;
        if (t != 0)
          deadline = now + std::chrono::microseconds{t};
        live.emplace(info.id, model_request{info.id, level, rows, seq++, now,
                                            deadline, qp.action});
        CHECK(in_level + 1 <= limit);
      }
    } else {
      check_poll(now, w.chance(0.6));
    }
    size_t rows = 0;
    for (const auto& [id, m] : live)
      rows += m.rows;
    REQUIRE(policy.queued() == live.size());
    REQUIRE(policy.queued_rows() == rows);
  }
  // Drain: far in the future every delay and timeout has passed.
  const time_point end = at(clock_us + 10'000'000);
  for (int guard = 0; guard < 100'000 && !live.empty(); ++guard)
    check_poll(end, true);
  CHECK(live.empty());
  CHECK(policy.queued() == 0);
  CHECK(finished.size() == admitted_count);
}

} // namespace

TEST_CASE("random event sequences keep every invariant") {
  coverage seen;
  for (uint64_t seed = 1; seed <= 40; ++seed)
    run_random_sequence(seed, 5000, seen);
  MESSAGE("dispatches " << seen.dispatches << ", multi-request " << seen.multi_request_batches
          << ", waits " << seen.waits << ", held " << seen.held << ", timed out "
          << seen.timed_out << ", delayed dispatched " << seen.delayed_dispatched
          << ", queue full " << seen.queue_full << ", too many rows " << seen.too_many_rows);
  CHECK(seen.dispatches > 1000);
  CHECK(seen.multi_request_batches > 100);
  CHECK(seen.waits > 100);
  CHECK(seen.held > 100);
  CHECK(seen.timed_out > 100);
  CHECK(seen.delayed_dispatched > 100);
  CHECK(seen.queue_full > 100);
  CHECK(seen.too_many_rows > 100);
}

// -- padding up to captured CUDA graph sizes -------------------------------------

TEST_CASE("captured sizes: a slow trickle is padded to the next bucket instead of waiting") {
  // max 8, no preferred sizes, 1000 us delay; graphs at 1, 2, 4, 8. One request
  // every 400 us: after 3 requests the 4th row is ~400 us away but the oldest
  // request has only 200 us left, so waiting cannot fill the bucket of 4.
  auto cfg = dynamic_config(8, {}, 1000);
  cfg.captured_batch_sizes = {1, 2, 4, 8};
  batching_policy p{cfg};
  admit(p, req(1), at(0));
  CHECK(expect_dispatch(p.poll(at(0), true)).padded_rows == 1); // fills bucket 1 exactly
  admit(p, req(2), at(400));
  admit(p, req(3), at(800));
  admit(p, req(4), at(1200));
  // 3 rows queued, oldest at 400 us: 200 us left, 400 us per missing row.
  auto d = expect_dispatch(p.poll(at(1200), true));
  CHECK(d.ids == ids{2, 3, 4});
  CHECK(d.rows == 3);
  CHECK(d.padded_rows == 4);
}

TEST_CASE("captured sizes: a fast stream keeps waiting for the bucket to fill") {
  auto cfg = dynamic_config(8, {}, 1000);
  cfg.captured_batch_sizes = {1, 2, 4, 8};
  batching_policy p{cfg};
  // One row every 10 us: 5 rows queued, 3 missing for bucket 8 expected in
  // ~30 us, well inside the 950 us left.
  for (uint64_t i = 0; i < 5; ++i)
    admit(p, req(i + 1), at(static_cast<int64_t>(i) * 10));
  CHECK(expect_wait(p.poll(at(50), true)) == at(1000));
}

TEST_CASE("without captured sizes the policy never pads (Triton behaviour)") {
  batching_policy p{dynamic_config(8, {}, 1000)};
  admit(p, req(1), at(0));
  admit(p, req(2), at(400));
  admit(p, req(3), at(800));
  CHECK(expect_wait(p.poll(at(800), true)) == at(1000));
  CHECK(expect_dispatch(p.poll(at(1000), true)).padded_rows == 0);
}
