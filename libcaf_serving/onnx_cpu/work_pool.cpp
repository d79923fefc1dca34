#include "onnx_cpu/work_pool.hpp"

#include <omp.h>

#include <chrono>

namespace caf_serving::onnx {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// How long an idle worker spins for the next job before it sleeps: long
/// enough to cover the gap between two plan steps, short enough not to burn
/// a shared core between batches.
constexpr auto spin_before_sleep = std::chrono::microseconds(200);

} // namespace

work_pool::work_pool(unsigned threads) {
  for (unsigned t = 1; t < threads; ++t)
    workers_.emplace_back([this, t] { worker_loop(t); });
}

work_pool::~work_pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_)
    w.join();
}

work_pool::job::job(int64_t n, unsigned t)
  : items(n), threads(t), ranges(new std::atomic<uint64_t>[t]) {
  for (unsigned i = 0; i < t; ++i) {
    uint64_t front = static_cast<uint64_t>(n * i / t), back = static_cast<uint64_t>(n * (i + 1) / t);
    ranges[i].store(front << 32 | back, std::memory_order_relaxed);
  }
}

int64_t work_pool::job::claim(unsigned thread) {
  auto& own = ranges[thread];
  for (uint64_t v = own.load(std::memory_order_relaxed); (v >> 32) < (v & 0xffffffffu);)
    if (own.compare_exchange_weak(v, v + (uint64_t{1} << 32), std::memory_order_relaxed))
      return static_cast<int64_t>(v >> 32);
  for (;;) {
    unsigned victim = threads;
    uint64_t most = 0, seen = 0;
    for (unsigned i = 0; i < threads; ++i) {
      uint64_t v = ranges[i].load(std::memory_order_relaxed);
      uint64_t left = (v & 0xffffffffu) > (v >> 32) ? (v & 0xffffffffu) - (v >> 32) : 0;
      if (left > most) {
        most = left;
        victim = i;
        seen = v;
      }
    }
    if (victim == threads)
      return -1;
    if (ranges[victim].compare_exchange_weak(seen, seen - 1, std::memory_order_relaxed))
      return static_cast<int64_t>((seen & 0xffffffffu) - 1);
  }
}

void work_pool::work_on(job& j, unsigned thread) {
  for (int64_t i; (i = j.claim(thread)) >= 0;) {
    (*j.fn)(i, thread);
    j.done.fetch_add(1, std::memory_order_release);
  }
}

void work_pool::run(int64_t items, const std::function<void(int64_t, unsigned)>& fn) {
  if (items <= 0)
    return;
  if (items == 1 || workers_.empty()) {
    for (int64_t i = 0; i < items; ++i)
      fn(i, 0);
    return;
  }
  auto j = std::make_shared<job>(items, size());
  j->fn = &fn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = j;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  work_on(*j, 0);
  // Items claimed by workers still running; workers that never started find
  // nothing left and are not waited for.
  while (j->done.load(std::memory_order_acquire) < items) {
    for (int k = 0; k < 64; ++k)
      cpu_relax();
    if (j->done.load(std::memory_order_acquire) < items)
      std::this_thread::yield();
  }
}

void work_pool::worker_loop(unsigned thread) {
  omp_set_num_threads(1);
  uint64_t seen = 0;
  for (;;) {
    auto until = std::chrono::steady_clock::now() + spin_before_sleep;
    while (generation_.load(std::memory_order_acquire) == seen
           && std::chrono::steady_clock::now() < until)
      cpu_relax();
    std::shared_ptr<job> j;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_.load() != seen; });
      if (stopping_)
        return;
      seen = generation_.load();
      j = current_;
    }
    if (j)
      work_on(*j, thread);
  }
}

} // namespace caf_serving::onnx
