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
  // One size only: every size is priced like it, so that a larger batch can
  // form and be measured (priced per row, it never would).
  CHECK(m.predict(8) == 4000);
  CHECK(m.predict(1) == 4000);
  m.observe(8, 6000); // now the fit: 2000 + 500 a row
  CHECK(m.predict(8) == 6000);
  CHECK(m.predict(6) == 5000);
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

TEST_CASE("cost model: sizes are priced by a fixed + per-row fit, seen or not") {
  batch_cost_model m;
  // fixed 1000 ns + 100 ns per row, measured at 2 and 10 rows.
  m.observe(2, 1200);
  m.observe(10, 2000);
  auto fit = m.fit();
  CHECK(fit.fixed_ns == doctest::Approx(1000));
  CHECK(fit.per_row_ns == doctest::Approx(100));
  CHECK(m.predict(2) == 1200);
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

TEST_CASE("cost model: a noisy size never makes a larger batch look cheaper") {
  // A flat 20 ms curve where one size's window caught a slow spell: joining a
  // batch of 2 must not look dearer than being in a batch of 4.
  batch_cost_model m;
  m.observe(2, 20'000'000);
  m.observe(3, 23'000'000);
  m.observe(4, 20'000'000);
  m.observe(8, 20'500'000);
  for (uint32_t r = 2; r <= 16; ++r)
    CHECK(m.predict(r) >= m.predict(r - 1));
  CHECK(m.predict(3) >= 23'000'000);  // never below a measured estimate
  CHECK(m.predict(8) <= 24'000'000);  // and not priced per row
}

TEST_CASE("cost model: a size not measured for a while is forgotten, so a slow spell does not "
          "price it out for good") {
  batch_cost_model m{{32, 0.9, {}, 8}};
  m.observe(16, 188'000'000); // a cold first batch of 16
  m.observe(1, 600'000);
  CHECK(m.predict(16) > 100'000'000);
  // Only batches of 1 run (16 is priced too high to form): after 8 of them
  // the size-16 window is forgotten and 16 is priced like 1 until measured.
  for (int i = 0; i < 8; ++i)
    m.observe(1, 600'000);
  CHECK(m.predict(16) == 600'000);
  CHECK(m.curve().size() == 1);
}
