#pragma once
/// A connection's stream that sends the small writes of one event-loop turn in
/// one system call.
///
/// kj-http 0.9 writes a response's status line and headers, then its body, as
/// two writes, the second only once the first has completed. On a socket with
/// TCP_NODELAY that is two system calls and two TCP segments for every answer,
/// and the client wakes for each (strace at 64 concurrent requests: three
/// writes per request, two of them to the socket). Libevhtp, under Triton,
/// sends one. This stream holds writes that fit in `hold_limit` bytes, reports
/// them written at once, and sends what it holds with one write when the event
/// loop is about to wait for I/O (kj::evalLast), or together with the next
/// write too large to hold (one vectored write, no copy of it).
///
/// Held bytes are not lost when the HTTP server is done with the connection:
/// the owner calls flush() before destroying the stream, and shutdownWrite()
/// sends them before the end of the stream.

#include <kj/async-io.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace caf_serving::ingress {

class coalescing_stream final : public kj::AsyncIoStream {
public:
  explicit coalescing_stream(kj::Own<kj::AsyncIoStream> inner, size_t hold_limit = 4096);

  /// Completes when every byte written so far has been handed to the socket;
  /// rejects with the error that stopped them.
  kj::Promise<void> flush();

  /// Writes to the socket so far: a test's view of the coalescing.
  uint64_t socket_writes() const { return socket_writes_; }

  // Reading goes straight through.
  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;
  kj::Maybe<uint64_t> tryGetLength() override;
  kj::Promise<uint64_t> pumpTo(kj::AsyncOutputStream& output, uint64_t amount) override;
  void abortRead() override;

  kj::Promise<void> write(const void* buffer, size_t size) override;
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override;
  kj::Promise<void> whenWriteDisconnected() override;
  void shutdownWrite() override;

  void getsockopt(int level, int option, void* value, kj::uint* length) override;
  void setsockopt(int level, int option, const void* value, kj::uint length) override;
  void getsockname(struct sockaddr* addr, kj::uint* length) override;
  void getpeername(struct sockaddr* addr, kj::uint* length) override;
  kj::Maybe<int> getFd() const override;

private:
  /// What the held bytes are waiting for.
  enum class state {
    idle,      ///< nothing held, nothing being sent
    scheduled, ///< a flush at the end of this turn will send them
    sending,   ///< a send is in flight; it sends what is held when it ends
  };

  /// Sends what is held, then what was held meanwhile, until nothing is.
  kj::Promise<void> send_held();
  /// The send in flight, or a promise already fulfilled when there is none.
  kj::Promise<void> after_send();

  kj::Own<kj::AsyncIoStream> inner_;
  size_t hold_limit_;
  /// Bytes reported written and not yet handed to the socket; and those being
  /// handed over (the two swap, so their space is reused from turn to turn).
  std::vector<kj::byte> held_;
  std::vector<kj::byte> sending_bytes_;
  state state_ = state::idle;
  /// The scheduled or running send of held bytes (state scheduled or sending).
  kj::Maybe<kj::ForkedPromise<void>> sending_;
  /// The error a send ran into: every later write fails with it.
  kj::Maybe<kj::Exception> failed_;
  bool shutdown_after_send_ = false;
  uint64_t socket_writes_ = 0;
};

} // namespace caf_serving::ingress
