#pragma once
/// SIGINT and SIGTERM as one stop request that one thread waits for: a
/// server's stop coordinator, which then tells each part to drain
/// (apps/caf-serving/main.cpp).
///
/// Usage:
///
///   auto stop = stop_signals::capture();   // first in main, before any thread starts:
///                                          // blocked here and in every later thread
///   ... start the actor system, the ingresses ...
///   std::thread coordinator([&] {
///     stop.wait();                         // SIGINT, SIGTERM or request_stop()
///     ... tell each part to drain ...
///   });
///
/// A thread started before capture() (OpenBLAS starts its thread pool when the
/// library loads, before main) still takes a process-wide signal with the
/// default action, which would kill the server without a drain. capture()
/// therefore also installs a handler that hands the signal from such a thread
/// to the waiting one, and keeps it for wait() when nobody waits yet.

namespace caf_serving {

class stop_signals {
public:
  /// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread
  /// it starts later) and installs the handler for the threads that do not
  /// block them. Once per process.
  static stop_signals capture();

  /// Waits until SIGINT or SIGTERM arrives, or request_stop() is called, and
  /// returns the signal (SIGTERM for request_stop()); at once when one came
  /// before. One thread waits.
  int wait();

  /// From any thread: wait() returns as if SIGTERM had arrived (a part of the
  /// server ended on its own and the others must drain).
  void request_stop();

private:
  stop_signals() = default;
};

} // namespace caf_serving
