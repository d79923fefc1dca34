#include "scheduler/executor_book.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::scheduler;

namespace {
constexpr int64_t ms = 1'000'000;
}

TEST_CASE("executor book: the cost model learns the executor's own compute time, not the "
          "turnaround the scheduler saw") {
  executor_book b;
  // A batch of 4 rows sent at 0 ms; the executor computed for 10 ms, but its
  // answer waited in mailboxes and reached the scheduler at 50 ms. Timed at
  // the scheduler (answer less the time it could start, as before), the model
  // learned 50 ms.
  b.dispatched(1, 4, 0);
  REQUIRE(b.answered(1, 50 * ms, 10 * ms));
  CHECK(b.cost().predict(4) == 10 * ms);
  // A second size: the fit goes through the executor's times only.
  b.dispatched(2, 8, 60 * ms);
  REQUIRE(b.answered(2, 95 * ms, 14 * ms));
  CHECK(b.cost().predict(8) == 14 * ms);
  CHECK(b.cost().predict(4) == 10 * ms);
  CHECK(b.cost().predict(6) == 12 * ms);
}

TEST_CASE("executor book: busy until is the dispatch time plus the predicted compute, batch "
          "after batch") {
  executor_book b;
  b.dispatched(1, 4, 0);
  REQUIRE(b.answered(1, 12 * ms, 10 * ms)); // learns 10 ms for 4 rows
  CHECK(b.empty());
  // Two batches in flight (a credit window of 2): the second starts after the first.
  b.dispatched(2, 4, 20 * ms);
  b.dispatched(3, 4, 22 * ms);
  CHECK(b.busy_until_ns() == 40 * ms);
  auto l = b.load(25 * ms, 2);
  CHECK(l.in_flight_rows == std::vector<uint32_t>{4, 4});
  CHECK_FALSE(l.has_credit());
  CHECK(outstanding_ns(l) == 15 * ms);
  // The first answered at 31 ms: the second could start then.
  REQUIRE(b.answered(2, 31 * ms, 10 * ms));
  CHECK(b.busy_until_ns() == 41 * ms);
  CHECK(outstanding_ns(b.load(33 * ms, 2)) == 8 * ms);
  // Running past its prediction, nothing is outstanding (never negative).
  CHECK(outstanding_ns(b.load(45 * ms, 2)) == 0);
}

TEST_CASE("executor book: a failed batch teaches nothing; unknown batches are refused; an "
          "executor that measured nothing is timed from the scheduler") {
  executor_book b;
  b.dispatched(1, 2, 0);
  REQUIRE(b.answered(1, 1 * ms, std::nullopt));
  CHECK(b.cost().empty());
  CHECK_FALSE(b.answered(1, 2 * ms, 5 * ms));
  CHECK(b.cost().empty());
  b.dispatched(2, 2, 10 * ms);
  REQUIRE(b.answered(2, 17 * ms, 0));
  CHECK(b.cost().predict(2) == 7 * ms);
}

TEST_CASE("executor book: lateness is how much later than predicted answers arrive, an upper "
          "quantile of the recent ones, never negative") {
  executor_book b{{}, {10, 0.9}};
  b.dispatched(1, 4, 0);
  REQUIRE(b.answered(1, 10 * ms, 10 * ms)); // unpredicted: no lateness sample
  CHECK(b.lateness_ns() == 0);
  // Predicted 10 ms from its start; the answer comes at 13 ms: 3 ms late.
  b.dispatched(2, 4, 20 * ms);
  REQUIRE(b.answered(2, 33 * ms, 10 * ms));
  CHECK(b.lateness_ns() == 3 * ms);
  CHECK(b.load(40 * ms, 1).lateness_ns == 3 * ms);
  // Each batch on it pays the lateness: one held, one new.
  b.dispatched(3, 4, 40 * ms);
  CHECK(predicted_completion_ns(b.load(40 * ms, 2), 4) == (10 + 10 + 3 + 3) * ms);
  REQUIRE(b.answered(3, 50 * ms, 10 * ms)); // on time
  // Early answers (1 ms) outnumber it: of nine samples the 90th percentile
  // is the largest (3 ms), of ten {3, 0, -1 x 8} it is 0.
  for (uint64_t id = 4; id <= 10; ++id) {
    int64_t at = static_cast<int64_t>(id) * 100 * ms;
    b.dispatched(id, 4, at);
    REQUIRE(b.answered(id, at + 9 * ms, 10 * ms));
  }
  CHECK(b.lateness_ns() == 3 * ms);
  b.dispatched(11, 4, 2000 * ms);
  REQUIRE(b.answered(11, 2009 * ms, 10 * ms));
  CHECK(b.lateness_ns() == 0);
}

TEST_CASE("executor book: a warm-up batch teaches the cost model but records no lateness") {
  executor_book b;
  b.dispatched_warm_up(1, 1, 0);
  REQUIRE(b.answered(1, 1 * ms, 1 * ms));
  // Predicted 1 ms (flat from the one size), it took 9: no lateness from it.
  b.dispatched_warm_up(2, 16, 2 * ms);
  REQUIRE(b.answered(2, 11 * ms, 9 * ms));
  CHECK(b.lateness_ns() == 0);
  CHECK(b.cost().predict(16) == 9 * ms);
}
