#include "scheduler/cost_model.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::scheduler;

TEST_CASE("cost model: nothing measured predicts 0; one size is its own estimate") {
  batch_cost_model m;
  CHECK(m.empty());
  CHECK(m.predict(4) == 0);
  m.observe(4, 4000);
  CHECK_FALSE(m.empty());
  CHECK(m.predict(4) == 4000);
  // One size only: a larger batch is priced per row (high, not low), a smaller
  // one never above the measured size.
  CHECK(m.predict(8) == 8000);
  CHECK(m.predict(1) <= 4000);
}

TEST_CASE("cost model: an upper quantile of the window, robust to one outlier") {
  batch_cost_model m{{10, 0.9, {}}};
  for (int i = 1; i <= 10; ++i)
    m.observe(2, i * 100); // 100..1000
  CHECK(m.predict(2) == 900);
  // One huge outlier replaces the oldest (100): the 9th of 10 is now 1000.
  m.observe(2, 1'000'000);
  CHECK(m.predict(2) == 1000);
}

TEST_CASE("cost model: follows drift within one window") {
  batch_cost_model m{{8, 0.9, {}}};
  for (int i = 0; i < 8; ++i)
    m.observe(4, 1000);
  CHECK(m.predict(4) == 1000);
  for (int i = 0; i < 8; ++i)
    m.observe(4, 3000); // the machine got slower
  CHECK(m.predict(4) == 3000);
  for (int i = 0; i < 8; ++i)
    m.observe(4, 500); // and faster again
  CHECK(m.predict(4) == 500);
}

TEST_CASE("cost model: unseen sizes are interpolated and extrapolated by a fixed + per-row fit") {
  batch_cost_model m;
  // fixed 1000 ns + 100 ns per row, measured at 2 and 10 rows.
  m.observe(2, 1200);
  m.observe(10, 2000);
  auto fit = m.fit();
  CHECK(fit.fixed_ns == doctest::Approx(1000));
  CHECK(fit.per_row_ns == doctest::Approx(100));
  CHECK(m.predict(6) == 1600);  // between the neighbours
  CHECK(m.predict(16) == 2600); // past the largest: + per row
  CHECK(m.predict(1) == 1100);  // below the smallest: the fit
  auto curve = m.curve();
  REQUIRE(curve.size() == 2);
  CHECK(curve[0] == std::pair<uint32_t, int64_t>{2, 1200});
  CHECK(curve[1] == std::pair<uint32_t, int64_t>{10, 2000});
}

TEST_CASE("cost model: captured sizes are cheap: a batch runs at the next captured size") {
  batch_cost_model m{{32, 0.9, {1, 4, 8}}};
  CHECK(m.run_rows(3) == 4);
  CHECK(m.run_rows(8) == 8);
  CHECK(m.run_rows(9) == 9); // past the largest captured size: as itself
  m.observe(4, 5000);
  m.observe(8, 6000);
  CHECK(m.predict(3) == 5000); // priced as the padded 4-row graph
  CHECK(m.predict(5) == 6000);
}
