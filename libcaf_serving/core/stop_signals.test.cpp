#include "core/stop_signals.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include <pthread.h>
#include <unistd.h>

using caf_serving::stop_signals;

namespace {

/// Does `f` a little later on a thread of its own (which blocks the signals,
/// as every thread started after capture() does), while the caller waits.
template <class F>
std::thread later(F f) {
  return std::thread([f] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    f();
  });
}

} // namespace

// One test case: capture() is once per process.
TEST_CASE("SIGTERM, SIGINT and request_stop() end wait(), also when they come from a thread "
          "started before capture() or before anyone waits") {
  // Started first, as OpenBLAS's threads are: the signals are not blocked
  // here, so a signal sent to it runs the handler.
  std::atomic<bool> done{false};
  std::thread early([&] {
    while (!done.load())
      std::this_thread::yield();
  });
  auto stop = stop_signals::capture();

  // Taken by the early thread before anyone waits: kept for wait().
  pthread_kill(early.native_handle(), SIGTERM);
  CHECK(stop.wait() == SIGTERM);

  // Taken by the early thread while the caller waits: handed over.
  auto sender = later([&] { pthread_kill(early.native_handle(), SIGINT); });
  CHECK(stop.wait() == SIGINT);
  sender.join();

  // Process-wide: taken by whichever thread does not block it, or left
  // pending for the waiting one.
  sender = later([] { kill(getpid(), SIGTERM); });
  CHECK(stop.wait() == SIGTERM);
  sender.join();

  // A part of the server that ended on its own asks the others to drain.
  sender = later([&] { stop.request_stop(); });
  CHECK(stop.wait() == SIGTERM);
  sender.join();
  stop.request_stop();
  CHECK(stop.wait() == SIGTERM);

  done = true;
  early.join();
}
