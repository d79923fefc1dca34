#include "core/thread_config.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;

TEST_CASE("thread defaults fit a 2-core machine and scale up") {
  auto two = default_thread_config(2);
  CHECK(two.caf_workers == 1);
  CHECK(two.ingress_threads == 1);
  CHECK(two.executor_threads == 1);
  auto big = default_thread_config(64);
  CHECK(big.caf_workers == 8);
  CHECK(big.executor_threads == 55);
  auto zero = default_thread_config(0);
  CHECK(zero.caf_workers == 1);
  CHECK(zero.executor_threads >= 1);
}
