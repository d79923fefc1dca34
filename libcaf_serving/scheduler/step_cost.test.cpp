#include "scheduler/step_cost.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <random>

using namespace caf_serving::scheduler;
using std::chrono::duration_cast;
using std::chrono::microseconds;

namespace {

/// A step of `tokens` on a machine whose steps cost 20 ms + 0.5 ms per token.
clock_type::duration machine(uint32_t tokens) {
  return duration_cast<clock_type::duration>(microseconds(20000 + 500 * tokens));
}

} // namespace

TEST_CASE("the step cost is learned as a line in the tokens, from steps of several sizes") {
  step_cost cost;
  CHECK_FALSE(cost.known());
  CHECK(cost.predict(10).count() == 0);
  std::mt19937 rng(35);
  std::uniform_int_distribution<uint32_t> sizes(1, 200);
  for (uint32_t i = 1; i <= 7; ++i)
    cost.observe(i, machine(i));
  CHECK_FALSE(cost.known()); // seven steps
  for (int i = 0; i < 40; ++i) {
    uint32_t t = sizes(rng);
    cost.observe(t, machine(t));
  }
  REQUIRE(cost.known());
  CHECK(cost.fixed_seconds() == doctest::Approx(0.020).epsilon(0.05));
  CHECK(cost.per_token_seconds() == doctest::Approx(0.0005).epsilon(0.05));
  CHECK(duration_cast<microseconds>(cost.predict(100)).count()
        == doctest::Approx(70000).epsilon(0.05));
  // 100 ms holds 20 ms + 160 tokens; the cap wins when smaller; 10 ms holds one at least.
  CHECK(cost.tokens_within(std::chrono::milliseconds(100), 512) == doctest::Approx(160).epsilon(0.05));
  CHECK(cost.tokens_within(std::chrono::milliseconds(100), 64) == 64);
  CHECK(cost.tokens_within(std::chrono::milliseconds(10), 512) == 1);
}

TEST_CASE("the cost model follows a machine that slows down") {
  step_cost cost;
  for (uint32_t i = 0; i < 100; ++i)
    cost.observe(1 + i % 50, machine(1 + i % 50));
  for (uint32_t i = 0; i < 300; ++i)
    cost.observe(1 + i % 50, machine(1 + i % 50) * 2);
  CHECK(cost.per_token_seconds() == doctest::Approx(0.001).epsilon(0.05));
  CHECK(cost.fixed_seconds() == doctest::Approx(0.040).epsilon(0.05));
}

TEST_CASE("steps of one size only: the whole time is priced per token, never below zero") {
  step_cost cost;
  for (int i = 0; i < 40; ++i)
    cost.observe(10, machine(10));
  REQUIRE(cost.known());
  CHECK(cost.fixed_seconds() == doctest::Approx(0.0).epsilon(1e-9));
  CHECK(cost.per_token_seconds() == doctest::Approx(0.0025).epsilon(1e-6));
  // Larger steps are overpriced, not underpriced.
  CHECK(cost.predict(20) >= machine(20));
}
