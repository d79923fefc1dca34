#include "ingress/http_listen.hpp"

#include "ingress/coalescing_stream.hpp"
#include "ingress/kserve_codec.hpp"

#include <kj/async.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace caf_serving::ingress {

kj::AutoCloseFd bind_listen_socket(const std::string& address, uint16_t port,
                                   listen_port_names names) {
  auto fail = [&](const std::string& reason) {
    return std::runtime_error("cannot listen on the " + std::string(names.what) + " port "
                              + std::to_string(port) + " of " + address + " (" + names.flag
                              + "): " + reason);
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  // "*" is kj's word for every address; getaddrinfo takes none for that.
  const char* host = address.empty() || address == "*" ? nullptr : address.c_str();
  auto service = std::to_string(port);
  if (int rc = getaddrinfo(host, service.c_str(), &hints, &found); rc != 0)
    throw fail(std::string("the address cannot be resolved: ") + gai_strerror(rc));
  int error = EADDRNOTAVAIL;
  kj::AutoCloseFd bound;
  for (auto* a = found; a != nullptr && bound.get() < 0; a = a->ai_next) {
    kj::AutoCloseFd fd(
      socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      error = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(fd.get(), SOMAXCONN) != 0) {
      error = errno;
      continue;
    }
    bound = kj::mv(fd);
  }
  freeaddrinfo(found);
  if (bound.get() < 0)
    throw fail(std::strerror(error));
  return bound;
}

uint16_t bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return 0;
  if (addr.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

namespace {

/// Reads and drops up to `budget` bytes, until the client closes.
kj::Promise<void> discard(kj::AsyncIoStream& stream, size_t budget) {
  auto buffer = kj::heapArray<kj::byte>(4096);
  auto read = stream.tryRead(buffer.begin(), 1, buffer.size());
  return read.then([&stream, budget](size_t n) -> kj::Promise<void> {
    if (n == 0 || n >= budget)
      return kj::READY_NOW;
    return discard(stream, budget - n);
  }).attach(kj::mv(buffer));
}

} // namespace

connection_gate::connection_gate(kj::HttpServer& server, kj::LowLevelAsyncIoProvider& io,
                                 kj::Timer& timer, uint32_t max_connections,
                                 connection_count& count, std::atomic<uint64_t>* served)
    : server_(server),
      io_(io),
      timer_(timer),
      max_(max_connections),
      count_(count),
      served_(served),
      tasks_(*this) {}

kj::Promise<void> connection_gate::listen(kj::ConnectionReceiver& port) {
  return port.accept().then([this, &port](kj::Own<kj::AsyncIoStream> connection) {
    if (count_.open.fetch_add(1, std::memory_order_relaxed) < max_) {
      hand_off(kj::mv(connection));
    } else {
      count_.open.fetch_sub(1, std::memory_order_relaxed);
      if (count_.refusing.fetch_add(1, std::memory_order_relaxed) < max_)
        tasks_.add(refuse(kj::mv(connection)).attach(kj::defer([this]() {
          count_.refusing.fetch_sub(1, std::memory_order_relaxed);
        })));
      else // dropped at once; a flood of refusals must not cost more fds.
        count_.refusing.fetch_sub(1, std::memory_order_relaxed);
    }
    return listen(port);
  }, [this, &port](kj::Exception&& e) -> kj::Promise<void> {
    // Out of file descriptors, most likely: keep serving the connections
    // already open and try again shortly.
    std::cerr << "caf-serving: cannot accept a connection: " << e.getDescription().cStr()
              << std::endl;
    return timer_.afterDelay(100 * kj::MILLISECONDS).then([this, &port]() {
      return listen(port);
    });
  });
}

void connection_gate::hand_off(kj::Own<kj::AsyncIoStream> connection) {
  // The loop with the fewest open connections; this one when none has fewer.
  size_t loops = peers_.size() + 1;
  size_t best = 0;
  uint32_t best_open = open_here.load(std::memory_order_relaxed);
  for (size_t k = 0; k < loops; ++k) {
    size_t i = (next_ + k) % loops;
    uint32_t open = i == 0 ? open_here.load(std::memory_order_relaxed)
                           : peers_[i - 1].gate->open_here.load(std::memory_order_relaxed);
    if (open < best_open) {
      best = i;
      best_open = open;
    }
  }
  next_ = (next_ + 1) % loops;
  int fd = -1;
  KJ_IF_MAYBE (f, connection->getFd())
    fd = fcntl(*f, F_DUPFD_CLOEXEC, 0);
  if (best == 0 || fd < 0) {
    if (fd >= 0)
      close(fd);
    serve(kj::mv(connection));
    return;
  }
  // The peer serves its own descriptor of the socket; this one closes.
  connection = nullptr;
  auto& target = peers_[best - 1];
  target.gate->open_here.fetch_add(1, std::memory_order_relaxed);
  auto delivered = target.executor->executeAsync(
    [gate = target.gate, owned = kj::AutoCloseFd(fd)]() mutable { gate->adopt(kj::mv(owned)); });
  // A loop that has already stopped never ran adopt(): the descriptor closed
  // with the function, and the connection is counted out here.
  tasks_.add(delivered.catch_([this, gate = target.gate](kj::Exception&&) {
    gate->open_here.fetch_sub(1, std::memory_order_relaxed);
    count_.open.fetch_sub(1, std::memory_order_relaxed);
  }));
}

void connection_gate::adopt(kj::AutoCloseFd fd) {
  using flags = kj::LowLevelAsyncIoProvider;
  // Accepted by kj: non-blocking and close-on-exec already (flags shared by
  // the duplicate).
  auto connection = io_.wrapSocketFd(fd.release(), flags::TAKE_OWNERSHIP
                                                     | flags::ALREADY_CLOEXEC
                                                     | flags::ALREADY_NONBLOCK);
  // open_here was counted by the loop that handed it over.
  open_here.fetch_sub(1, std::memory_order_relaxed);
  serve(kj::mv(connection));
}

void connection_gate::serve(kj::Own<kj::AsyncIoStream> connection) {
  if (served_)
    served_->fetch_add(1, std::memory_order_relaxed);
  open_here.fetch_add(1, std::memory_order_relaxed);
  // One write per response instead of kj-http's two (coalescing_stream.hpp).
  // What it still holds when kj-http is done with the connection (a last
  // answer, a 400 for a malformed request) is sent before it closes, for at
  // most as long as a client that does not read may hold it up.
  auto stream = kj::heap<coalescing_stream>(kj::mv(connection));
  auto& s = *stream;
  auto flushed = [this, &s]() {
    return s.flush().exclusiveJoin(timer_.afterDelay(5 * kj::SECONDS));
  };
  auto served = server_.listenHttpCleanDrain(s).then(
    [flushed](bool) { return flushed(); },
    [flushed](kj::Exception&& e) {
      return flushed().then([e = kj::mv(e)]() mutable -> kj::Promise<void> { return kj::mv(e); });
    });
  tasks_.add(served.attach(kj::mv(stream), kj::defer([this]() {
    open_here.fetch_sub(1, std::memory_order_relaxed);
    count_.open.fetch_sub(1, std::memory_order_relaxed);
  })));
}

kj::Promise<void> connection_gate::refuse(kj::Own<kj::AsyncIoStream> connection) {
  auto body = serialize_error("the server has " + std::to_string(max_)
                              + " connections open, its limit (--max-connections); "
                                "retry later");
  auto text = kj::heap<std::string>("HTTP/1.1 503 Service Unavailable\r\n"
                                    "Content-Type: application/json\r\n"
                                    "Connection: close\r\n"
                                    "Content-Length: "
                                    + std::to_string(body.size()) + "\r\n\r\n" + body);
  auto& stream = *connection;
  auto sent = stream.write(text->data(), text->size()).then([&stream]() {
    stream.shutdownWrite();
    return discard(stream, 64 << 10);
  });
  auto waited = sent.exclusiveJoin(timer_.afterDelay(1 * kj::SECONDS));
  return waited.attach(kj::mv(connection), kj::mv(text));
}

void connection_gate::taskFailed(kj::Exception&& e) {
  // A connection that failed was closed; kj has answered what could be.
  if (e.getType() != kj::Exception::Type::DISCONNECTED)
    std::cerr << "caf-serving: a connection failed: " << e.getDescription().cStr() << std::endl;
}

} // namespace caf_serving::ingress
