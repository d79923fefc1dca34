#include "onnx_cpu/work_pool.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
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

TEST_CASE("a thread runs its own range in order, then the back of a slower thread's range") {
  work_pool pool(2);
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    std::vector<int64_t> mine; // only the caller (thread 0) appends
    pool.run(16, [&](int64_t i, unsigned t) {
      if (t == 0)
        mine.push_back(i);
      else // a slow worker: the caller takes most of its range
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    REQUIRE(mine.size() > 8);
    // Its own range [0, 8) front to back ...
    for (int64_t i = 0; i < 8; ++i)
      CHECK(mine[static_cast<size_t>(i)] == i);
    // ... then the worker's from the back.
    CHECK(mine[8] == 15);
    for (size_t k = 9; k < mine.size(); ++k)
      CHECK(mine[k] == mine[k - 1] - 1);
  }
}

TEST_CASE("callers that share one pool take turns, and every item of each runs once") {
  work_pool pool(2);
  constexpr int callers = 4, rounds = 50, items = 64;
  std::vector<std::atomic<int>> hits(callers * items);
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c)
    threads.emplace_back([&, c] {
      for (int r = 0; r < rounds; ++r) {
        auto turn = pool.hold();
        pool.run(items, [&](int64_t i, unsigned) { hits[c * items + i].fetch_add(1); });
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& h : hits)
    CHECK(h.load() == rounds);
}
