#pragma once
/// The listening side of the HTTP ingress, shared by its event loops.
///
/// One listening socket per port is bound once (bind_listen_socket), and one
/// event loop (loop 0) accepts from it; each connection it admits is served by
/// the loop with the fewest open connections, handed to it by descriptor
/// (kj::Executor, once per connection, never per request). Measured first:
/// every loop accepting from the one socket left 65 of 71 connections on one
/// loop when a client opened 64 at once (the loop that wakes first takes them
/// in a burst). SO_REUSEPORT (a socket per loop) balances only by a hash of
/// the client's address, and lets a second server started on the same port
/// share it silently instead of failing with EADDRINUSE.
///
/// --max-connections stays exact across loops: the count of open connections
/// of a port is one atomic, touched when a connection opens and when it
/// closes, never per request.

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/io.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace caf_serving::ingress {

/// What a bound port is called in errors: its name and its flag.
struct listen_port_names {
  const char* what = "HTTP";
  const char* flag = "--http-port";
};

/// A listening TCP socket on `address`:`port` (0: a free port), non-blocking
/// and close-on-exec. Throws std::runtime_error naming the port, its flag and
/// the reason (e.g. "Address already in use") when it cannot be bound.
kj::AutoCloseFd bind_listen_socket(const std::string& address, uint16_t port,
                                   listen_port_names names);

/// The port a listening socket is bound to.
uint16_t bound_port(int fd);

/// Connections open on one port, over all of its event loops.
struct connection_count {
  std::atomic<uint32_t> open{0};
  /// Connections being answered 503 because the port was full.
  std::atomic<uint32_t> refusing{0};
};

/// One port's connections on one event loop: with listen(), the accept loop
/// of the port, which admits connections up to --max-connections (past the
/// limit a new connection is answered 503 and closed, after at most a second
/// of reading and discarding what the client sent, so that the answer is not
/// lost to a reset) and serves each on the loop with the fewest open
/// connections, this one or a peer; a peer gets it through adopt().
class connection_gate final : private kj::TaskSet::ErrorHandler {
public:
  /// `served`, when given, counts the connections this loop serves.
  connection_gate(kj::HttpServer& server, kj::LowLevelAsyncIoProvider& io, kj::Timer& timer,
                  uint32_t max_connections, connection_count& count,
                  std::atomic<uint64_t>* served = nullptr);

  /// Another loop's gate, to which listen() may hand connections.
  struct peer {
    kj::Own<const kj::Executor> executor;
    /// Touched only on the peer's own thread (through its executor).
    connection_gate* gate = nullptr;
  };
  /// Before listen(): the loops that share this port's connections.
  void set_peers(kj::Vector<peer> peers) { peers_ = kj::mv(peers); }

  kj::Promise<void> listen(kj::ConnectionReceiver& port);

  /// Serves a connection that another loop admitted (and counted), on this
  /// loop's thread.
  void adopt(kj::AutoCloseFd fd);

  /// Connections open on this loop now.
  std::atomic<uint32_t> open_here{0};

  /// Completes when every connection this loop served is closed, after the
  /// answers it still held were sent (coalescing_stream): an HTTP server's
  /// drain() ends when the answers are handed over, not when they are sent.
  kj::Promise<void> connections_closed() { return tasks_.onEmpty(); }

private:
  void serve(kj::Own<kj::AsyncIoStream> connection);
  void hand_off(kj::Own<kj::AsyncIoStream> connection);
  kj::Promise<void> refuse(kj::Own<kj::AsyncIoStream> connection);
  void taskFailed(kj::Exception&& e) override;

  kj::HttpServer& server_;
  kj::LowLevelAsyncIoProvider& io_;
  kj::Timer& timer_;
  uint32_t max_;
  connection_count& count_;
  std::atomic<uint64_t>* served_;
  kj::Vector<peer> peers_;
  /// Where the search for the least busy loop starts next (ties go round).
  size_t next_ = 0;
  kj::TaskSet tasks_;
};

} // namespace caf_serving::ingress
