#include "scheduler/executor_choice.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::scheduler;

TEST_CASE("choice: the faster executor gets the batch, the slower one once it is ahead") {
  batch_cost_model fast, slow;
  fast.observe(8, 1000);
  slow.observe(8, 3000);
  std::vector<executor_load> ex{{&slow, {}, 0, 2}, {&fast, {}, 0, 2}};
  CHECK(choose_executor(ex, 8) == size_t{1});
  ex[1].in_flight_rows = {8};      // fast: 1000 outstanding + 1000
  CHECK(choose_executor(ex, 8) == size_t{1});
  ex[1].in_flight_rows = {8, 8};   // full window
  CHECK(choose_executor(ex, 8) == size_t{0});
  ex[1].in_flight_rows = {8};
  ex[1].oldest_elapsed_ns = 900;   // almost done: 100 + 1000
  CHECK(outstanding_ns(ex[1]) == 100);
  CHECK(predicted_completion_ns(ex[1], 8) == 1100);
  ex[0].in_flight_rows = {8, 8};
  ex[1].in_flight_rows = {8, 8};
  CHECK_FALSE(choose_executor(ex, 8).has_value());
}

TEST_CASE("choice: an executor never measured is tried first, ties go to the less loaded") {
  batch_cost_model known, unknown;
  known.observe(1, 500);
  std::vector<executor_load> ex{{&known, {}, 0, 1}, {&unknown, {}, 0, 1}};
  CHECK(choose_executor(ex, 1) == size_t{1});
  batch_cost_model a, b;
  std::vector<executor_load> tie{{&a, {1}, 0, 2}, {&b, {}, 0, 2}};
  CHECK(choose_executor(tie, 1) == size_t{1});
}
