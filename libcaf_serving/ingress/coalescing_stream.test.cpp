#include "ingress/coalescing_stream.hpp"

#include <kj/async.h>
#include <doctest/doctest.h>

#include <string>

using caf_serving::ingress::coalescing_stream;

namespace {

/// An event loop and an in-memory connection: `out` writes through a
/// coalescing_stream, `peer` reads what arrived. A write on the pipe completes
/// only when the peer has read it, so a test decides when a send is in flight.
struct fixture {
  kj::EventLoop loop;
  kj::WaitScope ws{loop};
  kj::Own<kj::AsyncIoStream> peer;
  kj::Own<coalescing_stream> out;

  explicit fixture(size_t hold_limit = 64) {
    auto pipe = kj::newTwoWayPipe();
    peer = kj::mv(pipe.ends[1]);
    out = kj::heap<coalescing_stream>(kj::mv(pipe.ends[0]), hold_limit);
  }

  /// Reads exactly `n` bytes from the peer.
  std::string read(size_t n) {
    std::string s(n, '\0');
    peer->read(s.data(), n).wait(ws);
    return s;
  }

  /// Reads until the end of the stream.
  std::string read_to_end() {
    std::string all;
    char buf[256];
    for (;;) {
      size_t got = peer->tryRead(buf, 1, sizeof(buf)).wait(ws);
      if (got == 0)
        return all;
      all.append(buf, got);
    }
  }
};

kj::Promise<void> write(coalescing_stream& s, const std::string& text) {
  return s.write(text.data(), text.size());
}

} // namespace

TEST_CASE("small writes of one turn are reported at once and sent in one write") {
  fixture f;
  // kj-http's two writes for one response: status line and headers, then body.
  CHECK(write(*f.out, "HTTP/1.1 200 OK\r\n\r\n").poll(f.ws));
  CHECK(write(*f.out, "{\"a\":1}").poll(f.ws));
  CHECK(f.out->socket_writes() == 0); // nothing sent before the loop runs out of work
  CHECK(f.read(26) == "HTTP/1.1 200 OK\r\n\r\n{\"a\":1}");
  CHECK(f.out->socket_writes() == 1);
  // The next turn's writes go in a write of their own.
  write(*f.out, "second").wait(f.ws);
  CHECK(f.read(6) == "second");
  CHECK(f.out->socket_writes() == 2);
}

TEST_CASE("a write too large to hold goes out at once, behind what is held, in one write") {
  fixture f(16);
  write(*f.out, "head:").wait(f.ws);
  std::string big(100, 'x');
  auto sent = write(*f.out, big);
  CHECK(f.read(105) == "head:" + big);
  sent.wait(f.ws);
  CHECK(f.out->socket_writes() == 1);
}

TEST_CASE("bytes held while a send is in flight follow it, before a later large write") {
  fixture f(16);
  write(*f.out, "one,").wait(f.ws);
  // The scheduled send starts when the loop runs out of work, and stays in
  // flight until the peer reads.
  f.loop.run();
  CHECK(f.out->socket_writes() == 1);
  CHECK(write(*f.out, "two,").poll(f.ws)); // held meanwhile
  std::string big(40, 'y');
  auto sent = write(*f.out, big);
  CHECK_FALSE(sent.poll(f.ws)); // behind the send in flight
  CHECK(f.read(48) == "one,two," + big);
  sent.wait(f.ws);
  CHECK(f.out->socket_writes() == 3);
}

TEST_CASE("flush() waits for held bytes; shutdownWrite() sends them before the end") {
  fixture f;
  write(*f.out, "last answer").wait(f.ws);
  auto flushed = f.out->flush();
  CHECK(f.read(11) == "last answer");
  flushed.wait(f.ws);

  write(*f.out, "then closed").wait(f.ws);
  f.out->shutdownWrite();
  CHECK(f.read_to_end() == "then closed");
}

TEST_CASE("a failed send fails every later write") {
  fixture f;
  write(*f.out, "lost").wait(f.ws);
  f.peer = nullptr; // the client is gone
  f.loop.run();
  CHECK_THROWS(f.out->flush().wait(f.ws));
  CHECK_THROWS(write(*f.out, "more").wait(f.ws));
}
