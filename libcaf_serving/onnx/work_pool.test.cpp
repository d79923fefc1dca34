#include "onnx/work_pool.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <vector>

using caf_serving::onnx::work_pool;

TEST_CASE("every item runs exactly once, on a thread index below size()") {
  for (unsigned threads : {1u, 2u, 4u}) {
    work_pool pool(threads);
    CHECK(pool.size() == threads);
    for (int64_t items : {0, 1, 3, 100}) {
      CAPTURE(threads);
      CAPTURE(items);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(items));
      std::atomic<bool> bad_thread{false};
      pool.run(items, [&](int64_t i, unsigned t) {
        hits[static_cast<size_t>(i)].fetch_add(1);
        if (t >= threads) bad_thread = true;
      });
      for (auto& h : hits)
        CHECK(h.load() == 1);
      CHECK(!bad_thread);
    }
  }
}

TEST_CASE("run returns only after items claimed by workers are done") {
  work_pool pool(2);
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> done{0};
    pool.run(8, [&](int64_t, unsigned t) {
      if (t != 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      done.fetch_add(1);
    });
    CHECK(done.load() == 8);
  }
}
