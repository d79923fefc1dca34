#include "cuda/staging_slots.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>

using caf_serving::cuda::staging_slot_pool;

TEST_CASE("slots are taken round-robin and a third batch waits for one to be given back") {
  staging_slot_pool pool(2);
  CHECK(pool.acquire() == 0);
  CHECK(pool.acquire() == 1);
  CHECK(pool.busy() == 2);
  std::atomic<bool> returned{false};
  auto third = std::async(std::launch::async, [&] {
    auto s = pool.acquire();
    returned = true;
    return s;
  });
  // Both slots hold a batch: the third submit waits (it would otherwise
  // overwrite a staged batch).
  CHECK(third.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  CHECK_FALSE(returned);
  pool.release(1);
  CHECK(third.get() == 1);
  CHECK(pool.busy() == 2);
  // In-order completion frees 0 first: the next batch takes 0.
  pool.release(0);
  CHECK(pool.acquire() == 0);
}

TEST_CASE("after a slot is given back, the next batch takes the slot after the last one taken") {
  staging_slot_pool pool(3);
  CHECK(pool.acquire() == 0);
  pool.release(0);
  // Round-robin, not lowest-first: consecutive batches use different slots.
  CHECK(pool.acquire() == 1);
  CHECK(pool.acquire() == 2);
  CHECK(pool.acquire() == 0);
  pool.release(2);
  CHECK(pool.acquire() == 2);
}

TEST_CASE("giving back a free slot is a bug, said as such") {
  staging_slot_pool pool(2);
  CHECK_THROWS_AS(pool.release(0), std::logic_error);
  CHECK_THROWS_AS(pool.release(5), std::logic_error);
  CHECK_THROWS_AS(staging_slot_pool(0), std::logic_error);
}
