#pragma once
/// Reading a request body on the HTTP ingress's event loop (part of
/// http_server; internal to the ingress): into a buffer that is not zeroed
/// first, with room after it for the JSON parser's padding, within a limit,
/// and with each way of failing told apart. Inline: every inference request
/// goes through it.
///
/// Usage:
///
///   body_reader reader(body, timer, stall, limit, declared_length);
///   return reader.read().then([](body_read read) { ... read.bytes.view() ... });

#include <kj/async-io.h>
#include <kj/timer.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace caf_serving::ingress {

/// A request body's bytes. Unlike a std::string, whose resize zero-fills what
/// the socket then overwrites (a memset of the whole body per request), growing
/// leaves the new bytes uninitialised. A NUL follows the bytes, as in a
/// std::string, and the room past it is readable (padding()).
class body_bytes {
public:
  const char* data() const { return data_.get(); }
  char* data() { return data_.get(); }
  size_t size() const { return size_; }
  /// Allocated bytes readable after the end, which the JSON parser may use
  /// as its padding.
  size_t padding() const { return capacity_ - size_; }

  /// Makes room for `n` bytes and `spare` more after them, keeping the bytes
  /// there are; the new ones are uninitialised until written.
  void grow(size_t n, size_t spare) {
    if (n + spare + 1 > capacity_) {
      std::unique_ptr<char[]> bigger(new char[n + spare + 1]); // not zeroed
      if (size_ != 0)
        std::memcpy(bigger.get(), data_.get(), std::min(size_, n));
      data_ = std::move(bigger);
      capacity_ = n + spare + 1;
    }
    size_ = n;
  }

  /// Ends the bytes at `n` (at most size()), with a NUL after them.
  void truncate(size_t n) {
    size_ = std::min(n, size_);
    if (data_)
      data_[size_] = '\0';
  }

  std::string_view view() const { return {data_.get(), size_}; }

private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

/// A request body as read from the connection, or why there is none.
struct body_read {
  enum class outcome { complete, too_large, disconnected, malformed, stalled };
  outcome result = outcome::complete;
  body_bytes bytes;
  size_t used = 0;
};

/// Bytes simdjson may read past the end of a JSON text (SIMDJSON_PADDING);
/// parse_infer_request copies a JSON that has less readable room after it.
constexpr size_t json_parser_padding = 64;

/// Allocated bytes readable after the end of `s` (its capacity), which the
/// JSON parser may use as its padding.
inline size_t read_padding(const std::string& s) {
  return s.capacity() - s.size();
}

inline size_t read_padding(const body_bytes& b) {
  return b.padding();
}

/// Reads a request body into memory, at most `limit` bytes: one more means
/// too_large. Each read waits at most `stall` for the client's next bytes.
/// Unlike readAllBytes, every way of failing is told apart: kj reports a body
/// that ends early (the client closed or shut down its side) as DISCONNECTED,
/// and broken chunked framing as FAILED.
class body_reader {
public:
  body_reader(kj::AsyncInputStream& in, kj::Timer& timer, kj::Duration stall, size_t limit,
              std::optional<uint64_t> expected)
      : in_(in), timer_(timer), stall_(stall), limit_(limit), expected_(expected) {
    // A declared length (plus one byte, to see the end) is allocated at once;
    // a chunked body grows from 64 KiB.
    size_t first = expected ? static_cast<size_t>(std::min<uint64_t>(*expected, limit_)) + 1
                            : std::min<size_t>(size_t{64} << 10, limit_ + 1);
    // Room past the body for the JSON parser's padding, so that it parses
    // the body where it lies instead of a padded copy (read_padding()).
    body_.bytes.grow(first, json_parser_padding);
  }

  /// The whole body, or why there is none.
  kj::Promise<body_read> read() {
    return loop().then([this]() { return kj::mv(body_); },
                       [this](kj::Exception&& e) {
                         failed(e);
                         return kj::mv(body_);
                       });
  }

  /// One read: resolves to whether the body is done (read whole, or failed:
  /// see body()). A failure of the stream is an exception, for failed().
  /// A caller that goes on anyway chains this instead of read(), and loop()
  /// only when it is not done: a body that came with its headers (the usual
  /// case) costs one read and no promise nodes for the loop.
  kj::Promise<bool> step() {
    if (body_.used > limit_) {
      body_.result = body_read::outcome::too_large;
      return true;
    }
    if (body_.used == body_.bytes.size())
      body_.bytes.grow(std::min(body_.bytes.size() * 2, limit_ + 1), json_parser_padding);
    auto got = in_.tryRead(body_.bytes.data() + body_.used, 1, body_.bytes.size() - body_.used)
                 .exclusiveJoin(timer_.afterDelay(stall_).then([]() { return stalled; }));
    return got.then([this](size_t n) { return consume(n); });
  }

  /// The rest of the body, after a step() that was not done.
  kj::Promise<void> loop() {
    return step().then([this](bool done) -> kj::Promise<void> {
      if (done)
        return kj::READY_NOW;
      return loop();
    });
  }

  /// Records the failure of the stream that step() or loop() threw.
  void failed(const kj::Exception& e) {
    body_.result = e.getType() == kj::Exception::Type::DISCONNECTED
                     ? body_read::outcome::disconnected
                     : body_read::outcome::malformed;
  }

  body_read& body() { return body_; }

private:
  static constexpr size_t stalled = ~size_t{0};

  /// Takes the `n` bytes one read gave; returns whether the body is done.
  bool consume(size_t n) {
    if (n == stalled) {
      body_.result = body_read::outcome::stalled;
      return true;
    }
    if (n == 0) {
      body_.bytes.truncate(body_.used);
      return true;
    }
    body_.used += n;
    // A declared length read whole is the end: kj's stream would only
    // answer the next read with 0 (a timer and three promise nodes more).
    if (expected_ && body_.used == *expected_) {
      body_.bytes.truncate(body_.used);
      return true;
    }
    return false;
  }

  kj::AsyncInputStream& in_;
  kj::Timer& timer_;
  kj::Duration stall_;
  size_t limit_;
  std::optional<uint64_t> expected_;
  body_read body_;
};

} // namespace caf_serving::ingress
