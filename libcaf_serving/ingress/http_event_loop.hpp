#pragma once
/// The HTTP ingress's event loops (part of http_server; internal to the
/// ingress; docs/http-event-loops.md): each a kj event loop with its
/// kj::HttpServer and kserve_service over the HTTP port (and, on loop 0, the
/// metrics port). Loop 0 accepts every connection and hands each to the loop
/// with the fewest open ones (connection_gate); it runs on the thread that
/// calls http_server::serve(), the others on threads of their own.
///
/// Usage (http_server.cpp):
///
///   loop_thread other(shared, {1});                  // serving what loop 0 hands it
///   loop_setup first{0, kj::mv(http_fd), kj::mv(metrics_fd)};
///   first.peers.add(other.peer());
///   loop_control zero;
///   auto report = run_loop(shared, kj::mv(first), zero, nullptr);  // until zero.stop()
///   other.stop();                                    // any thread
///   report.abandoned += other.join().abandoned;      // drained (or past the timeout)

#include "ingress/http_listen.hpp"
#include "ingress/http_server.hpp"
#include "ingress/http_shared.hpp"

#include <kj/io.h>
#include <kj/mutex.h>
#include <kj/vector.h>

#include <functional>
#include <string>
#include <thread>

namespace caf_serving::ingress {

/// What a loop serves.
struct loop_setup {
  /// Its number: the index of its count of accepted connections.
  unsigned index = 0;
  /// The listening sockets it accepts from, which it takes; none for loops
  /// other than loop 0, which serve only what loop 0 hands them.
  kj::AutoCloseFd http_fd;
  kj::AutoCloseFd metrics_fd;
  /// The loops it hands connections to, beside itself.
  kj::Vector<connection_gate::peer> peers;
};

/// Tells a loop to stop, from any thread, before or while it runs.
class loop_control {
public:
  /// Safe from any thread, and more than once: the loop stops accepting and
  /// drains (at once when it starts, if it has not started yet).
  void stop();

  /// On the loop's thread: resolves once stop() has been called.
  kj::Promise<void> when_stopped();

  /// On the loop's thread, once it no longer waits for when_stopped().
  void forget();

private:
  struct slot {
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> fulfiller;
    bool stopped = false;
  };
  kj::MutexGuarded<slot> slot_;
};

/// Where a loop is reached from loop 0, once it serves.
using loop_ready = std::function<void(connection_gate::peer)>;

/// Runs one event loop on the calling thread until `control` is stopped
/// (`ready`, when given, is called once it serves), then stops accepting and
/// drains its own connections as http_server::serve's contract says, and
/// tells how that ended. kj's exceptions propagate.
stop_report run_loop(const http_shared& shared, loop_setup setup, loop_control& control,
                     const loop_ready& ready);

/// A loop on a thread of its own: started (it serves once the constructor
/// returns), told to stop from any thread, joined for its stop_report.
class loop_thread {
public:
  /// Throws std::runtime_error when the loop cannot start.
  loop_thread(const http_shared& shared, loop_setup setup);
  ~loop_thread();
  loop_thread(const loop_thread&) = delete;
  loop_thread& operator=(const loop_thread&) = delete;

  /// Where loop 0 hands this loop its connections.
  connection_gate::peer peer() const;

  /// Safe from any thread, and more than once.
  void stop() { control_.stop(); }

  /// Waits for the loop to end; a failure of the loop is thrown.
  stop_report join();

private:
  struct slot {
    bool ready = false;
    connection_gate::peer peer;
    stop_report report;
    std::string failure;
  };

  void run(const http_shared& shared, loop_setup setup);

  loop_control control_;
  kj::MutexGuarded<slot> state_;
  connection_gate::peer peer_;
  std::thread thread_;
};

} // namespace caf_serving::ingress
