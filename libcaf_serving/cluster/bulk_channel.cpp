#include "cluster/bulk_channel.hpp"

#include "core/wire_check.hpp"

#include <caf/actor_cast.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <openssl/rand.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace caf_serving::cluster {

// -- frames -----------------------------------------------------------------------

namespace bulk {

namespace {

template <class T>
void put(uint8_t*& out, T v) {
  std::memcpy(out, &v, sizeof(T));
  out += sizeof(T);
}

template <class T>
T get(const uint8_t*& in) {
  T v;
  std::memcpy(&v, in, sizeof(T));
  in += sizeof(T);
  return v;
}

} // namespace

void encode_header(const frame_header& h, uint8_t* out) {
  put<uint32_t>(out, frame_magic);
  put<uint8_t>(out, static_cast<uint8_t>(h.kind));
  put<uint8_t>(out, 0);
  put<uint16_t>(out, 0);
  put<uint32_t>(out, h.segments);
  put<uint32_t>(out, 0);
  put<uint64_t>(out, h.request);
  put<uint64_t>(out, h.target);
  put<uint64_t>(out, h.payload_bytes);
}

namespace {

/// Reads the header's fields into `out`; what is wrong with them, or empty.
std::string read_header(const uint8_t* in, uint64_t max_frame_bytes, frame_header& out) {
  if (get<uint32_t>(in) != frame_magic)
    return "a frame does not start with the bulk channel's magic (not a caf-serving peer, or "
           "the stream lost its place)";
  auto kind = get<uint8_t>(in);
  in += 3;
  if (kind < 1 || kind > 3)
    return "a frame of unknown kind " + std::to_string(kind);
  out.kind = static_cast<frame_kind>(kind);
  out.segments = get<uint32_t>(in);
  in += 4;
  out.request = get<uint64_t>(in);
  out.target = get<uint64_t>(in);
  out.payload_bytes = get<uint64_t>(in);
  if (out.kind == frame_kind::error) {
    if (out.segments != 0)
      return "an error frame with segments";
    if (out.payload_bytes > max_error_bytes)
      return "an error frame of " + std::to_string(out.payload_bytes) + " bytes (at most "
             + std::to_string(max_error_bytes) + ")";
    return {};
  }
  if (out.segments == 0 || out.segments > wire_format::max_segments)
    return "a frame with " + std::to_string(out.segments) + " segments (1 to "
           + std::to_string(wire_format::max_segments) + " are accepted)";
  if (out.payload_bytes > max_frame_bytes)
    return "a frame of " + std::to_string(out.payload_bytes)
           + " bytes, more than the largest accepted (" + std::to_string(max_frame_bytes)
           + ")";
  if (out.payload_bytes % sizeof(capnp::word) != 0
      || out.payload_bytes < uint64_t{out.segments} * sizeof(uint64_t))
    return "a frame of " + std::to_string(out.payload_bytes) + " bytes cannot hold "
           + std::to_string(out.segments) + " whole segments";
  return {};
}

} // namespace

parsed_header parse_header(const uint8_t* in, uint64_t max_frame_bytes) {
  parsed_header out;
  out.error = read_header(in, max_frame_bytes, out.header);
  return out;
}

segment_table check_segment_table(const frame_header& h, const std::vector<uint64_t>& sizes) {
  segment_table out;
  // The header's payload, less the table, is what the segments must fill exactly.
  uint64_t room = (h.payload_bytes - sizes.size() * sizeof(uint64_t)) / sizeof(capnp::word);
  for (auto s : sizes) {
    if (s > room - out.total_words) {
      out.error = "a frame's segment table claims more words than the frame holds";
      return out;
    }
    out.total_words += s;
  }
  if (out.total_words != room)
    out.error = "a frame's segment table claims " + std::to_string(out.total_words)
                + " words but the frame holds " + std::to_string(room);
  return out;
}

kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments_of(const run_batch& b) {
  if (b.received)
    return b.received->segments;
  auto storage = std::static_pointer_cast<const message_storage>(b.batch.owner());
  if (!storage)
    return {};
  // getSegmentsForOutput is not const but does not modify the message.
  return const_cast<capnp::MallocMessageBuilder&>(storage->builder).getSegmentsForOutput();
}

kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments_of(const batch_result_message& m) {
  if (m.is_received())
    return std::static_pointer_cast<const received_message>(m.owner())->segments;
  auto storage = std::static_pointer_cast<const message_storage>(m.owner());
  if (!storage)
    return {};
  return const_cast<capnp::MallocMessageBuilder&>(storage->builder).getSegmentsForOutput();
}

uint64_t wire_bytes(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  uint64_t n = sizeof(uint32_t) + segments.size() * sizeof(uint64_t);
  for (auto s : segments)
    n += s.size() * sizeof(capnp::word);
  return n;
}

} // namespace bulk

// -- one connection, either end ---------------------------------------------------

namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

/// Reads exactly `n` bytes; empty on success, else why not.
std::string read_full(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    auto r = ::recv(fd, p, n, 0);
    if (r == 0)
      return "the peer closed the connection";
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return errno_text(errno);
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return {};
}

/// Writes every byte of `iov` (advancing through partial writes).
std::string write_all(int fd, std::vector<iovec>& iov) {
  size_t first = 0;
  while (first < iov.size()) {
    auto count = std::min<size_t>(iov.size() - first, IOV_MAX);
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = count;
    auto w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return errno_text(errno);
    }
    auto left = static_cast<size_t>(w);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return {};
}

struct outgoing {
  /// Header, then the segment table or the error's bytes.
  std::vector<uint8_t> head;
  std::vector<kj::ArrayPtr<const capnp::word>> segments;
  /// Keeps the segments' memory alive until they are written.
  std::shared_ptr<const void> keep;
  uint64_t bytes = 0;
};

outgoing make_message_frame(bulk::frame_kind kind, uint64_t request, uint64_t target,
                            kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segs,
                            std::shared_ptr<const void> keep) {
  outgoing o;
  bulk::frame_header h;
  h.kind = kind;
  h.segments = static_cast<uint32_t>(segs.size());
  h.request = request;
  h.target = target;
  h.payload_bytes = segs.size() * sizeof(uint64_t);
  for (auto s : segs)
    h.payload_bytes += s.size() * sizeof(capnp::word);
  o.head.resize(bulk::header_bytes + segs.size() * sizeof(uint64_t));
  bulk::encode_header(h, o.head.data());
  auto* table = o.head.data() + bulk::header_bytes;
  for (auto s : segs) {
    uint64_t words = s.size();
    std::memcpy(table, &words, sizeof(words));
    table += sizeof(words);
  }
  o.segments.assign(segs.begin(), segs.end());
  o.keep = std::move(keep);
  o.bytes = bulk::header_bytes + h.payload_bytes;
  return o;
}

/// A frame that arrived: its header and, for batches and results, the message
/// read in place; for errors, the error's bytes. Or, with `error` set, why the
/// connection must close.
struct incoming {
  bulk::frame_header header;
  std::shared_ptr<const received_message> message;
  std::vector<char> error_bytes;
  std::string error;
};

/// Reads one frame.
incoming read_frame(int fd, uint64_t max_frame_bytes) {
  incoming out;
  uint8_t head[bulk::header_bytes];
  if (out.error = read_full(fd, head, sizeof(head)); !out.error.empty())
    return out;
  auto parsed = bulk::parse_header(head, max_frame_bytes);
  out.header = parsed.header;
  if (out.error = parsed.error; !out.error.empty())
    return out;
  const auto& h = out.header;
  if (h.kind == bulk::frame_kind::error) {
    out.error_bytes.resize(h.payload_bytes);
    out.error = read_full(fd, out.error_bytes.data(), out.error_bytes.size());
    return out;
  }
  std::vector<uint64_t> sizes(h.segments);
  if (out.error = read_full(fd, sizes.data(), sizes.size() * sizeof(uint64_t));
      !out.error.empty())
    return out;
  auto table = bulk::check_segment_table(h, sizes);
  if (out.error = table.error; !out.error.empty())
    return out;
  auto total = table.total_words;
  auto msg = std::make_shared<received_message>();
  msg->words = kj::heapArray<capnp::word>(total);
  if (total > 0)
    if (out.error = read_full(fd, msg->words.begin(), total * sizeof(capnp::word));
        !out.error.empty())
      return out;
  auto segs = kj::heapArrayBuilder<kj::ArrayPtr<const capnp::word>>(sizes.size());
  size_t at = 0;
  for (auto s : sizes) {
    segs.add(msg->words.begin() + at, s);
    at += s;
  }
  msg->segments = segs.finish();
  auto schema = h.kind == bulk::frame_kind::batch ? capnp::Schema::from<wire::Batch>()
                                                  : capnp::Schema::from<wire::BatchResult>();
  // As wire_format::load: checked before anything reads it, read more than once.
  auto problem = wire_format::unreadable_reason(msg->segments, schema);
  if (!problem.empty()) {
    out.error = "a Cap'n Proto message that is not a valid "
                + std::string{schema.getShortDisplayName().cStr()} + " arrived: " + problem;
    return out;
  }
  capnp::ReaderOptions options;
  options.traversalLimitInWords = total * 8 + (uint64_t{1} << 20);
  msg->reader = std::make_unique<capnp::SegmentArrayMessageReader>(msg->segments, options);
  out.message = std::move(msg);
  return out;
}

/// Whether a frame waits for room in the queue (the server's batches) or not
/// (the worker's answers, and errors).
enum class queue_room { bounded, unbounded };

/// Who closes a connection: it broke (a read or write failed, a frame was
/// malformed), or its owner closed it.
enum class closing { broke, by_owner };

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

} // namespace

/// What both threads of one connection share. The threads hold it, so the
/// socket is closed only after both have finished with it.
struct bulk_core {
  caf::actor_system* sys = nullptr;
  bulk_config cfg;
  /// For log lines: the worker's name (server side) or the peer (worker side).
  std::string peer;
  int fd = -1;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<outgoing> queue;
  uint64_t queued_bytes = 0;
  bool ready = false;
  bool closed = false;

  /// Server side: batches sent and not answered, by request id.
  struct waiting {
    caf::actor proxy;
    uint64_t id = 0;
  };
  std::map<uint64_t, waiting> pending;
  uint64_t next_request = 1;
  std::function<void(const std::string&)> on_lost;

  ~bulk_core() {
    if (fd >= 0)
      ::close(fd);
  }

  /// Queues a frame; a bounded one only when it fits max_queued_bytes (or the
  /// queue is empty).
  bool enqueue(outgoing o, queue_room room) {
    {
      std::lock_guard<std::mutex> guard(mutex);
      if (closed || !ready)
        return false;
      if (room == queue_room::bounded && queued_bytes > 0
          && queued_bytes + o.bytes > cfg.max_queued_bytes)
        return false;
      queued_bytes += o.bytes;
      queue.push_back(std::move(o));
    }
    cv.notify_one();
    return true;
  }

  /// Closes the connection (once): the threads stop, every batch waiting for an
  /// answer goes back to its proxy as lost, and when the channel broke rather
  /// than being closed by its owner, on_lost is told.
  void close(const std::string& why, closing how) {
    std::map<uint64_t, waiting> orphans;
    std::function<void(const std::string&)> tell;
    {
      std::lock_guard<std::mutex> guard(mutex);
      if (closed)
        return;
      closed = true;
      if (fd >= 0)
        ::shutdown(fd, SHUT_RDWR);
      queue.clear();
      queued_bytes = 0;
      orphans.swap(pending);
      if (how == closing::broke && ready)
        tell = std::move(on_lost);
      on_lost = nullptr;
    }
    cv.notify_all();
    for (auto& [request, w] : orphans)
      caf::anon_send(w.proxy, bulk_lost_atom::value, why);
    if (tell)
      tell(why);
  }

  /// The writer thread's loop: writes each queued frame with one writev (header
  /// and table, then the segments from where they are).
  void write_loop() {
    std::vector<iovec> iov;
    for (;;) {
      outgoing o;
      {
        std::unique_lock<std::mutex> guard(mutex);
        cv.wait(guard, [this] { return closed || !queue.empty(); });
        if (closed)
          return;
        o = std::move(queue.front());
        queue.pop_front();
      }
      iov.clear();
      iov.push_back({o.head.data(), o.head.size()});
      for (auto s : o.segments)
        if (s.size() > 0)
          iov.push_back({const_cast<capnp::word*>(s.begin()), s.size() * sizeof(capnp::word)});
      auto why = write_all(fd, iov);
      {
        std::lock_guard<std::mutex> guard(mutex);
        queued_bytes -= std::min(queued_bytes, o.bytes);
      }
      if (!why.empty()) {
        close("writing to the bulk channel failed: " + why, closing::broke);
        return;
      }
    }
  }
};

// -- server side ------------------------------------------------------------------

namespace {

/// Connects within `timeout`; the socket, or -1 with `why`.
int connect_to(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
               std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      e != 0) {
    why = std::string("cannot resolve ") + host + ": " + gai_strerror(e);
    return -1;
  }
  int fd = -1;
  for (auto* a = found; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r < 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      r = ::poll(&p, 1, static_cast<int>(timeout.count()));
      int err = 0;
      socklen_t len = sizeof(err);
      if (r == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        r = 0;
      } else {
        why = r == 0 ? "timed out" : errno_text(err ? err : errno);
        r = -1;
      }
    } else if (r < 0) {
      why = errno_text(errno);
    }
    if (r == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      break;
    }
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  return fd;
}

/// Server side: reads results and errors and hands each to its batch's proxy.
void client_read_loop(std::shared_ptr<bulk_core> core) {
  for (;;) {
    auto in = read_frame(core->fd, core->cfg.max_frame_bytes);
    auto why = std::move(in.error);
    if (why.empty() && in.header.kind == bulk::frame_kind::batch)
      why = "the worker sent a batch frame; only results and errors come this way";
    if (!why.empty()) {
      core->close(why, closing::broke);
      return;
    }
    bulk_core::waiting w;
    {
      std::lock_guard<std::mutex> guard(core->mutex);
      auto it = core->pending.find(in.header.request);
      if (it == core->pending.end()) {
        why = "an answer to batch " + std::to_string(in.header.request)
              + ", which this server did not send";
      } else {
        w = std::move(it->second);
        core->pending.erase(it);
      }
    }
    if (!why.empty()) {
      core->close(why, closing::broke);
      return;
    }
    if (in.header.kind == bulk::frame_kind::result) {
      auto root = in.message->reader->getRoot<wire::BatchResult>();
      caf::anon_send(w.proxy, bulk_answer_atom::value, w.id,
                     batch_result_message::received(root, std::move(in.message)));
    } else {
      caf::error err;
      caf::binary_deserializer source(*core->sys, in.error_bytes);
      if (auto e = source(err); e || !err) {
        core->close("an error frame that does not hold a caf::error", closing::broke);
        return;
      }
      caf::anon_send(w.proxy, bulk_error_atom::value, w.id, std::move(err));
    }
  }
}

} // namespace

std::shared_ptr<bulk_client> bulk_client::connect(caf::actor_system& sys,
                                                  bulk_client_config cfg) {
  auto core = std::make_shared<bulk_core>();
  core->sys = &sys;
  core->cfg = cfg.limits;
  core->peer = cfg.worker;
  core->on_lost = std::move(cfg.on_lost);
  // The connect runs on the writer thread: no actor waits for it.
  std::thread([core, host = cfg.host, port = cfg.port, token = cfg.token] {
    std::string why;
    int fd = connect_to(host, port, core->cfg.connect_timeout, why);
    if (fd >= 0) {
      set_nodelay(fd);
      std::vector<iovec> iov{{const_cast<char*>(token.data()), token.size()}};
      if (auto w = write_all(fd, iov); !w.empty()) {
        why = "sending the token failed: " + w;
        ::close(fd);
        fd = -1;
      }
    }
    {
      std::lock_guard<std::mutex> guard(core->mutex);
      if (fd >= 0 && core->closed) {
        ::close(fd);
        return;
      }
      if (fd < 0) {
        core->closed = true;
        core->on_lost = nullptr;
      } else {
        core->fd = fd;
        core->ready = true;
      }
    }
    if (fd < 0) {
      std::cerr << ("caf-serving: cannot connect to the bulk channel of worker '" + core->peer
                    + "' at " + host + ":" + std::to_string(port) + " (" + why
                    + "); its batches stay on the CAF link\n")
                << std::flush;
      return;
    }
    // Each log line in one write: other threads print beside this one.
    std::cout << ("worker " + core->peer + ": bulk channel connected to " + host + ":"
                  + std::to_string(port) + "\n")
              << std::flush;
    std::thread(client_read_loop, core).detach();
    core->write_loop();
  }).detach();
  return std::shared_ptr<bulk_client>(new bulk_client(std::move(core)));
}

bulk_client::~bulk_client() {
  core_->close("the server closed the bulk channel", closing::by_owner);
}

bool bulk_client::connected() const {
  std::lock_guard<std::mutex> guard(core_->mutex);
  return core_->ready && !core_->closed;
}

bool bulk_client::closed() const {
  std::lock_guard<std::mutex> guard(core_->mutex);
  return core_->closed;
}

bool bulk_client::send_batch(const run_batch& batch, uint64_t target, caf::actor proxy,
                             uint64_t id) {
  auto segs = bulk::segments_of(batch);
  if (segs.size() == 0)
    return false;
  std::shared_ptr<const void> keep = batch.received ? std::shared_ptr<const void>(batch.received)
                                                    : batch.batch.owner();
  uint64_t request = 0;
  {
    std::lock_guard<std::mutex> guard(core_->mutex);
    if (core_->closed || !core_->ready)
      return false;
    request = core_->next_request++;
    core_->pending.emplace(request, bulk_core::waiting{std::move(proxy), id});
  }
  auto frame = make_message_frame(bulk::frame_kind::batch, request, target, segs,
                                  std::move(keep));
  if (core_->enqueue(std::move(frame), queue_room::bounded))
    return true;
  std::lock_guard<std::mutex> guard(core_->mutex);
  core_->pending.erase(request);
  return false;
}

// -- worker side ------------------------------------------------------------------

struct bulk_listener_state {
  caf::actor_system* sys = nullptr;
  bulk_config cfg;
  int fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::thread acceptor;

  std::mutex mutex;
  /// Tokens handed out and not used yet, with whom they were handed to.
  std::map<std::string, std::string> tokens;
  /// The executor gates, by actor id (weak: a retired gate is gone).
  std::map<caf::actor_id, caf::actor_addr> targets;

  /// Consumes `token`; the server it was handed to, or nothing.
  std::optional<std::string> take_token(const std::string& token) {
    std::lock_guard<std::mutex> guard(mutex);
    auto it = tokens.find(token);
    if (it == tokens.end())
      return std::nullopt;
    auto who = it->second;
    tokens.erase(it);
    return who;
  }

  caf::actor target(caf::actor_id id) {
    std::lock_guard<std::mutex> guard(mutex);
    auto it = targets.find(id);
    if (it == targets.end())
      return nullptr;
    auto gate = caf::actor_cast<caf::actor>(it->second);
    if (!gate)
      targets.erase(it);
    return gate;
  }
};

namespace {

std::string peer_name(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

/// Worker side, one per connection: runs each batch through its gate and
/// queues the answer on the same connection.
caf::behavior session(caf::event_based_actor* self, std::shared_ptr<bulk_core> core,
                      std::shared_ptr<bulk_listener_state> st) {
  return {
    [self, core, st](bulk_in_atom, uint64_t request, uint64_t target, run_batch& batch) {
      auto send_error = [core, request](const caf::error& err, bool lost) {
        std::vector<char> bytes;
        caf::binary_serializer sink(*core->sys, bytes);
        if (sink(const_cast<caf::error&>(err)))
          return;
        outgoing o;
        bulk::frame_header h;
        h.kind = bulk::frame_kind::error;
        h.request = request;
        h.target = lost ? 1 : 0;
        h.payload_bytes = bytes.size();
        o.head.resize(bulk::header_bytes + bytes.size());
        bulk::encode_header(h, o.head.data());
        std::memcpy(o.head.data() + bulk::header_bytes, bytes.data(), bytes.size());
        o.bytes = o.head.size();
        core->enqueue(std::move(o), queue_room::unbounded);
      };
      auto gate = st->target(static_cast<caf::actor_id>(target));
      if (!gate) {
        // As on the CAF link when the executor is gone: the batch runs elsewhere.
        send_error(make_cluster_error(cluster_errc::executor_lost,
                                      "the executor is no longer served on this worker"),
                   true);
        return;
      }
      // Each answer goes back as its own frame; no bound on this queue: every
      // answer is for a batch the server admitted under its own bound.
      self->request(gate, caf::infinite, std::move(batch))
        .then(
          [core, request](batch_result_message& result) {
            auto segs = bulk::segments_of(result);
            core->enqueue(make_message_frame(bulk::frame_kind::result, request, 0, segs,
                                             result.owner()),
                          queue_room::unbounded);
          },
          [send_error](caf::error& err) { send_error(err, executor_was_lost(err)); });
    },
  };
}

/// Worker side: checks the token, then reads batches until the connection ends.
void worker_read_loop(std::shared_ptr<bulk_core> core, std::shared_ptr<bulk_listener_state> st) {
  // A peer that connects and sends nothing is dropped after 5 s.
  timeval tv{5, 0};
  ::setsockopt(core->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string token(bulk::token_bytes, '\0');
  auto why = read_full(core->fd, token.data(), token.size());
  std::optional<std::string> server;
  if (why.empty()) {
    server = st->take_token(token);
    if (!server)
      why = "its first 16 bytes are not a token this worker handed out";
  }
  if (!why.empty()) {
    std::cerr << ("caf-serving-worker: refused a bulk channel connection from " + core->peer
                  + ": " + why + "\n")
              << std::flush;
    core->close(why, closing::by_owner);
    return;
  }
  tv = {0, 0};
  ::setsockopt(core->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  {
    std::lock_guard<std::mutex> guard(core->mutex);
    core->ready = true;
  }
  std::cout << ("bulk channel from " + core->peer + " accepted (server node " + *server + ")\n")
            << std::flush;
  auto actor = st->sys->spawn(session, core, st);
  std::thread([core] { core->write_loop(); }).detach();
  for (;;) {
    auto in = read_frame(core->fd, core->cfg.max_frame_bytes);
    why = std::move(in.error);
    if (why.empty() && in.header.kind != bulk::frame_kind::batch)
      why = "the server sent a result or error frame; only batches come this way";
    if (!why.empty())
      break;
    run_batch batch;
    batch.received = std::move(in.message);
    caf::anon_send(actor, bulk_in_atom::value, in.header.request, in.header.target,
                   std::move(batch));
  }
  if (why != "the peer closed the connection")
    std::cerr << ("caf-serving-worker: bulk channel from " + core->peer + " closed: " + why
                  + "\n")
              << std::flush;
  core->close(why, closing::broke);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

} // namespace

result<std::shared_ptr<bulk_listener>> bulk_listener::listen(caf::actor_system& sys,
                                                             const std::string& address,
                                                             uint16_t port, bulk_config cfg) {
  auto st = std::make_shared<bulk_listener_state>();
  st->sys = &sys;
  st->cfg = cfg;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  bool any = address.empty() || address == "0.0.0.0";
  if (int e = ::getaddrinfo(any ? nullptr : address.c_str(), std::to_string(port).c_str(),
                            &hints, &found);
      e != 0)
    return bad_request("--bulk-port: cannot resolve " + address + ": " + gai_strerror(e));
  std::string why = "no address";
  for (auto* a = found; a && st->fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      st->fd = fd;
    } else {
      why = errno_text(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (st->fd < 0)
    return bad_request("cannot listen on " + (any ? std::string("0.0.0.0") : address) + ":"
                       + std::to_string(port) + " for the bulk channel (--bulk-port): " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(st->fd, reinterpret_cast<sockaddr*>(&bound), &len);
  st->port = bound.ss_family == AF_INET6
               ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  st->acceptor = std::thread([st = st.get(), self = std::weak_ptr<bulk_listener_state>(st)] {
    while (!st->stop.load()) {
      pollfd p{st->fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0)
        continue;
      sockaddr_storage peer{};
      socklen_t plen = sizeof(peer);
      int fd = ::accept4(st->fd, reinterpret_cast<sockaddr*>(&peer), &plen, SOCK_CLOEXEC);
      if (fd < 0)
        continue;
      auto shared = self.lock();
      if (!shared) {
        ::close(fd);
        return;
      }
      set_nodelay(fd);
      auto core = std::make_shared<bulk_core>();
      core->sys = st->sys;
      core->cfg = st->cfg;
      core->peer = peer_name(peer);
      core->fd = fd;
      std::thread(worker_read_loop, core, shared).detach();
    }
  });
  return std::shared_ptr<bulk_listener>(new bulk_listener(std::move(st)));
}

bulk_listener::~bulk_listener() {
  st_->stop = true;
  if (st_->acceptor.joinable())
    st_->acceptor.join();
  ::close(st_->fd);
}

uint16_t bulk_listener::port() const {
  return st_->port;
}

std::string bulk_listener::issue_token(const std::string& who) {
  std::string token(bulk::token_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(token.data()),
                 static_cast<int>(token.size()))
      != 1)
    throw std::runtime_error("the OS random generator failed (RAND_bytes)");
  std::lock_guard<std::mutex> guard(st_->mutex);
  // A server that greets again and again without connecting leaves unused
  // tokens behind: at most 256 are kept (beyond, an arbitrary one is dropped).
  if (st_->tokens.size() >= 256)
    st_->tokens.erase(st_->tokens.begin());
  st_->tokens.emplace(token, who);
  return token;
}

void bulk_listener::add_target(const caf::actor& gate) {
  std::lock_guard<std::mutex> guard(st_->mutex);
  st_->targets[gate.id()] = gate.address();
}

} // namespace caf_serving::cluster
