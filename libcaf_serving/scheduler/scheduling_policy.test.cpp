#include "scheduler/scheduling_policy.hpp"

#include <algorithm>
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::scheduler;

namespace {

/// Synthetic time: microseconds after an arbitrary origin.
const time_point origin = time_point{} + std::chrono::hours{1};
time_point at(int64_t us) { return origin + std::chrono::microseconds{us}; }

policy_config dynamic_config(uint64_t delay_us) {
  policy_config cfg;
  cfg.max_batch_size = 8;
  cfg.dynamic_batching_enabled = true;
  cfg.dynamic_batching.max_queue_delay_us = delay_us;
  cfg.max_queue_size_default = 100;
  return cfg;
}

slo_policy_config target_config() {
  slo_policy_config c;
  c.base = dynamic_config(0);
  c.base.max_batch_bytes = 0;
  c.target = std::chrono::milliseconds{50};
  c.margin = std::chrono::microseconds{1000};
  return c;
}

request_info req(uint64_t id, uint32_t rows = 1) {
  request_info r;
  r.id = id;
  r.rows = rows;
  return r;
}

/// An executor with no batch in flight and one credit.
executor_load free_executor(const batch_cost_model& cost) {
  executor_load x;
  x.cost = &cost;
  return x;
}

/// An executor whose one credit is taken.
executor_load full_executor(const batch_cost_model& cost) {
  executor_load x;
  x.cost = &cost;
  x.in_flight_rows = {1};
  return x;
}

poll_input input(time_point now, std::vector<executor_load> executors,
                 bool resends_waiting = false) {
  poll_input in;
  in.now = now;
  // As the scheduler fills it: executor_free always, the loads for every policy
  // (here, so that each test reads the same input for both).
  in.executor_free = std::any_of(executors.begin(), executors.end(),
                                 [](const executor_load& x) { return x.has_credit(); });
  in.executors = std::move(executors);
  in.resends_waiting = resends_waiting;
  return in;
}

} // namespace

TEST_CASE("dynamic batching: dispatches leave the executor to the scheduler") {
  auto p = make_dynamic_batching_policy(dynamic_config(0));
  CHECK_FALSE(p->plans_on_executors()); // the scheduler builds no loads for it
  batch_cost_model cost;
  std::vector<executor_load> ex{free_executor(cost), free_executor(cost)};
  CHECK(std::holds_alternative<admitted>(p->enqueue(req(1), at(0), at(0), ex)));
  CHECK(std::holds_alternative<admitted>(p->enqueue(req(2), at(0), at(0), ex)));
  auto r = p->poll(input(at(0), ex));
  REQUIRE(std::holds_alternative<batch_dispatch>(r.next));
  auto d = std::get<batch_dispatch>(r.next);
  CHECK(d.ids == std::vector<uint64_t>{1, 2});
  CHECK(d.rows == 2);
  CHECK_FALSE(d.executor);
  CHECK(std::holds_alternative<idle>(p->poll(input(at(0), ex)).next));
}

TEST_CASE("dynamic batching: no executor with a credit, or batches waiting to be sent again, "
          "hold the batch, and queue timeouts still apply") {
  auto cfg = dynamic_config(0);
  cfg.dynamic_batching.default_queue_policy.default_timeout_us = 100;
  cfg.dynamic_batching.default_queue_policy.action = timeout_action::reject;
  auto p = make_dynamic_batching_policy(cfg);
  batch_cost_model cost;
  std::vector<executor_load> full{full_executor(cost)};
  std::vector<executor_load> free{free_executor(cost)};
  CHECK(std::holds_alternative<admitted>(p->enqueue(req(1), at(0), at(0), full)));
  CHECK(std::holds_alternative<wait_until>(p->poll(input(at(0), full)).next));
  CHECK(std::holds_alternative<wait_until>(p->poll(input(at(0), free, true)).next));
  // Past its timeout the request leaves the queue as timed out, answered 503.
  auto r = p->poll(input(at(200), free, true));
  REQUIRE(r.timed_out.size() == 1);
  CHECK(r.timed_out[0].id == 1);
  CHECK(rejection_error(r.timed_out[0]).reason == failure_reason::timeout);
  CHECK(r.late.empty());
  CHECK(std::holds_alternative<idle>(r.next));
}

TEST_CASE("dynamic batching: rejections come back as rejected; no warm-up runs") {
  auto p = make_dynamic_batching_policy(dynamic_config(0));
  batch_cost_model cost;
  std::vector<executor_load> ex{free_executor(cost)};
  auto r = p->enqueue(req(1, 9), at(0), at(0), ex);
  REQUIRE(std::holds_alternative<rejected>(r));
  CHECK(std::get<rejected>(r).reason == reject_reason::too_many_rows);
  CHECK(p->warm_up_runs(8).empty());
}

TEST_CASE("latency target: dispatches name the executor the policy planned on") {
  auto p = make_latency_target_policy(target_config());
  CHECK(p->plans_on_executors());
  batch_cost_model cost;
  for (uint32_t rows = 1; rows <= 8; ++rows)
    cost.observe(rows, 10'000'000); // 10 ms a batch
  // Executor 0 is busy and full: the batch is planned on executor 1.
  std::vector<executor_load> ex{full_executor(cost), free_executor(cost)};
  CHECK(std::holds_alternative<admitted>(p->enqueue(req(1), at(0), at(0), ex)));
  auto r = p->poll(input(at(0), ex));
  REQUIRE(std::holds_alternative<batch_dispatch>(r.next));
  auto d = std::get<batch_dispatch>(r.next);
  CHECK(d.ids == std::vector<uint64_t>{1});
  CHECK(d.rows == 1);
  REQUIRE(d.executor);
  CHECK(*d.executor == 1);
}

TEST_CASE("latency target: while batches wait to be sent again it waits for an executor") {
  auto p = make_latency_target_policy(target_config());
  batch_cost_model cost;
  std::vector<executor_load> ex{free_executor(cost)};
  CHECK(std::holds_alternative<admitted>(p->enqueue(req(1), at(0), at(0), ex)));
  auto r = p->poll(input(at(0), ex, true));
  CHECK(std::holds_alternative<wait_for_executor>(r.next));
  CHECK(r.timed_out.empty());
  CHECK(r.late.empty());
  // Once they are sent, the queued request goes out.
  CHECK(std::holds_alternative<batch_dispatch>(p->poll(input(at(0), ex)).next));
}

TEST_CASE("latency target: requests that can no longer finish in time come back as late") {
  auto p = make_latency_target_policy(target_config());
  batch_cost_model cost;
  for (uint32_t rows = 1; rows <= 8; ++rows)
    cost.observe(rows, 10'000'000); // 10 ms a batch
  std::vector<executor_load> busy{full_executor(cost)};
  CHECK(std::holds_alternative<admitted>(p->enqueue(req(1), at(0), at(0), busy)));
  // 45 ms later a batch of 10 ms cannot finish within the 50 ms target.
  auto r = p->poll(input(at(45'000), busy));
  REQUIRE(r.late.size() == 1);
  CHECK(r.late[0].id == 1);
  CHECK(r.timed_out.empty());
}

TEST_CASE("latency target: a new executor runs the largest batch, then one row, each twice, "
          "learning from the second run") {
  auto p = make_latency_target_policy(target_config());
  // The next run is the last: one row unlearnt, one row learnt, then the largest.
  auto runs = p->warm_up_runs(8);
  REQUIRE(runs.size() == 4);
  CHECK((runs[3].rows == 1 && !runs[3].learn));
  CHECK((runs[2].rows == 1 && runs[2].learn));
  CHECK((runs[1].rows == 8 && !runs[1].learn));
  CHECK((runs[0].rows == 8 && runs[0].learn));
  // A model without a batch dimension runs its one size twice.
  auto single = p->warm_up_runs(1);
  REQUIRE(single.size() == 2);
  CHECK((single[1].rows == 1 && !single[1].learn));
  CHECK((single[0].rows == 1 && single[0].learn));
}
