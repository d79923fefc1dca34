#include "core/thread_config.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <thread>

using namespace caf_serving;

TEST_CASE("thread defaults fit a 2-core machine and scale up") {
  auto two = default_thread_config(2);
  CHECK(two.caf_workers == 1);
  CHECK(two.ingress_threads == 1);
  CHECK(two.executor_threads == 1);
  auto sixteen = default_thread_config(16);
  CHECK(sixteen.ingress_threads == 4);
  CHECK(sixteen.caf_workers == 4);
  CHECK(sixteen.executor_threads == 8);
  auto big = default_thread_config(64);
  CHECK(big.caf_workers == 8);
  CHECK(big.ingress_threads == 8);
  CHECK(big.executor_threads == 48);
  auto zero = default_thread_config(0);
  CHECK(zero.caf_workers == 1);
  CHECK(zero.executor_threads >= 1);
}

TEST_CASE("a worker has no ingress: its event-loop cores go to the executors") {
  auto two = worker_thread_config(2);
  CHECK(two.ingress_threads == 0);
  CHECK(two.executor_threads == 2);
  auto sixteen = worker_thread_config(16);
  CHECK(sixteen.ingress_threads == 0);
  CHECK(sixteen.caf_workers == 4);
  CHECK(sixteen.executor_threads == 12);
}

TEST_CASE("usable cores: the affinity mask, capped by the cgroup quota rounded up") {
  struct row {
    unsigned affinity;   // CPUs in sched_getaffinity's mask, 0 if unknown
    const char* cpu_max; // cgroup v2 cpu.max (v1 is given the same way)
    unsigned fallback;   // hardware_concurrency
    unsigned want;
  };
  for (auto r : {row{8, "", 16, 8},                  // no cgroup file: the mask
                 row{8, "max 100000", 16, 8},        // no quota
                 row{8, "max 100000\n", 16, 8},      // as read from the file
                 row{8, "200000 100000", 16, 2},     // two cores' worth
                 row{8, "200000 100000\n", 16, 2},
                 row{8, "150000 100000", 16, 2},     // 1.5 cores: rounded up
                 row{8, "50000 100000", 16, 1},      // half a core: still one thread
                 row{2, "400000 100000", 16, 2},     // the mask is smaller
                 row{0, "", 16, 16},                 // nothing known: the fallback
                 row{0, "300000 100000", 16, 3},
                 row{0, "", 0, 1},                   // never zero
                 row{4, "garbage", 16, 4},           // unreadable quota: ignored
                 row{4, "100000 0", 16, 4},          // a zero period: ignored
                 row{4, "-1 100000", 16, 4}}) {      // cgroup v1's "no quota"
    CAPTURE(r.affinity);
    CAPTURE(r.cpu_max);
    CHECK(count_usable_cores(r.affinity, r.cpu_max, r.fallback) == r.want);
  }
}

TEST_CASE("this process's usable cores are between 1 and the machine's") {
  auto n = usable_cores();
  CHECK(n >= 1);
  CHECK(n <= std::max(1u, std::thread::hardware_concurrency()));
}
