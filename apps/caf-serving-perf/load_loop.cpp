#include "load_loop.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

namespace caf_serving::perf {

namespace {

/// The epoll tag of the timer; connections are tagged with their index.
constexpr uint64_t timer_tag = ~uint64_t{0};

/// How long a closed connection slot waits before it is opened again, so
/// that a refusing server is not hammered with connects.
constexpr int64_t reconnect_delay_ns = 100'000'000;

} // namespace

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct load_loop::connection {
  int fd = -1;
  bool busy = false;
  bool want_write = false;
  const std::string* request = nullptr;
  std::size_t request_index = 0;
  std::size_t written = 0;
  int64_t start_ns = 0;
  /// Earliest time to try connecting again after a failure.
  int64_t retry_at_ns = 0;
  /// Answers read on this connection since it was opened.
  uint64_t answered = 0;
  /// Bytes of a response that arrived in pieces.
  std::string partial;
  /// response_capture::timed_bytes: the answer so far and its arrivals.
  std::string captured;
  std::vector<read_mark> reads;
};

load_loop::load_loop(load_loop_config config)
  : config_(std::move(config)), read_buffer_(64 * 1024) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = timer_tag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev);
}

load_loop::~load_loop() {
  for (std::size_t i = 0; i < connections_.size(); ++i)
    close_connection(i);
  close(timer_fd_);
  close(epoll_fd_);
}

std::string load_loop::open_connection(std::size_t index) {
  auto& c = *connections_[index];
  auto result = connect_tcp(config_.target);
  if (result.fd < 0) {
    c.retry_at_ns = now_ns() + reconnect_delay_ns;
    return result.error;
  }
  fcntl(result.fd, F_SETFL, fcntl(result.fd, F_GETFL) | O_NONBLOCK);
  c.fd = result.fd;
  c.want_write = false;
  c.answered = 0;
  c.partial.clear();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = index;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev);
  ++open_connections_;
  return {};
}

void load_loop::close_connection(std::size_t index) {
  auto& c = *connections_[index];
  if (c.fd < 0)
    return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  c.fd = -1;
  --open_connections_;
}

std::string load_loop::start_closed(std::size_t concurrency) {
  mode_ = mode::closed;
  for (std::size_t i = 0; i < concurrency; ++i) {
    connections_.push_back(std::make_unique<connection>());
    if (auto err = open_connection(i); !err.empty())
      return err;
  }
  auto now = now_ns();
  for (std::size_t i = 0; i < concurrency; ++i)
    send_on(i, now);
  return {};
}

std::string load_loop::start_open(const arrival_config& arrivals) {
  mode_ = mode::open;
  schedule_ = std::make_unique<arrival_schedule>(arrivals);
  // One connection up front proves the server is there; more open on demand.
  connections_.push_back(std::make_unique<connection>());
  if (auto err = open_connection(0); !err.empty())
    return err;
  idle_.push_back(0);
  origin_ns_ = now_ns();
  next_due_ns_ = origin_ns_ + schedule_->next();
  return {};
}

void load_loop::send_on(std::size_t index, int64_t start_ns) {
  auto& c = *connections_[index];
  if (c.fd < 0 && !open_connection(index).empty()) {
    // The request is counted as failed at once; the slot retries later.
    completions_.push_back({start_ns, now_ns(), 0, next_request_, {}, {}});
    if (mode_ == mode::open)
      idle_.push_back(index);
    return;
  }
  c.busy = true;
  c.request = &config_.requests[next_request_];
  c.request_index = next_request_;
  if (++next_request_ == config_.requests.size())
    next_request_ = 0;
  c.written = 0;
  c.start_ns = start_ns;
  c.captured.clear();
  c.reads.clear();
  ++in_flight_;
  ++sent_;
  flush(index);
}

void load_loop::flush(std::size_t index) {
  auto& c = *connections_[index];
  while (c.written < c.request->size()) {
    auto n = send(c.fd, c.request->data() + c.written,
                  c.request->size() - c.written, MSG_NOSIGNAL);
    if (n > 0) {
      c.written += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c.want_write) {
        c.want_write = true;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
        ev.data.u64 = index;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
      }
      return;
    }
    if (!resend_if_closed_idle(index))
      fail_in_flight(index, now_ns());
    return;
  }
  if (c.want_write) {
    c.want_write = false;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = index;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }
}

bool load_loop::resend_if_closed_idle(std::size_t index) {
  auto& c = *connections_[index];
  // A kept-alive connection the server closed before answering any of the
  // request (llama.cpp's server closes after every streamed answer though
  // it says Keep-Alive): the request goes again on a new connection, as HTTP
  // clients do, with its start time unchanged. Once, so that a server that
  // closes every connection at once still fails the request.
  if (!c.busy || c.answered == 0 || !c.captured.empty() || !c.partial.empty())
    return false;
  close_connection(index);
  if (!open_connection(index).empty())
    return false;
  c.written = 0;
  flush(index);
  return true;
}

void load_loop::fail_in_flight(std::size_t index, int64_t now) {
  close_connection(index);
  auto& c = *connections_[index];
  c.retry_at_ns = now;
  if (c.busy)
    finish(index, 0, now);
}

void load_loop::on_readable(std::size_t index, int64_t now) {
  auto& c = *connections_[index];
  for (;;) {
    auto n = recv(c.fd, read_buffer_.data(), read_buffer_.size(), 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return;
      if (!resend_if_closed_idle(index))
        fail_in_flight(index, now);
      return;
    }
    if (n == 0) {
      // The server closed the connection; an idle one is reopened when
      // needed, a busy one loses its request (unless nothing of its answer
      // came yet on a reused connection: then it goes again).
      if (!resend_if_closed_idle(index))
        fail_in_flight(index, now);
      return;
    }
    if (!c.busy) {
      // Bytes nobody asked for: the connection is out of step; drop it.
      fail_in_flight(index, now);
      return;
    }
    std::string_view data(read_buffer_.data(), static_cast<std::size_t>(n));
    if (config_.capture == response_capture::timed_bytes) {
      // Each piece is timed when read; the answer ends at its last piece's
      // time, so that no chunk is timed after the answer's end.
      now = now_ns();
      c.captured.append(data);
      c.reads.push_back({now, c.captured.size()});
    }
    bool buffered = !c.partial.empty();
    if (buffered) {
      c.partial.append(data);
      data = c.partial;
    }
    auto r = parse_response(data);
    if (r.state == parse_state::incomplete) {
      if (!buffered)
        c.partial.assign(data);
      if (static_cast<std::size_t>(n) < read_buffer_.size())
        return;
      continue;
    }
    if (r.state == parse_state::malformed) {
      fail_in_flight(index, now);
      return;
    }
    bool keep = r.keep_alive;
    c.partial.clear();
    ++c.answered;
    if (!keep)
      close_connection(index);
    finish(index, r.status, now);
    return;
  }
}

void load_loop::finish(std::size_t index, int status, int64_t now) {
  auto& c = *connections_[index];
  c.busy = false;
  --in_flight_;
  completion done{c.start_ns, now, status, c.request_index, {}, {}};
  done.response.swap(c.captured);
  done.reads.swap(c.reads);
  completions_.push_back(std::move(done));
  switch (mode_) {
    case mode::closed:
      // A lost connection is reopened by run_until, not here, so that a
      // server that resets every connection cannot recurse us deep.
      if (c.fd >= 0)
        send_on(index, now);
      break;
    case mode::open:
      if (!backlog_.empty()) {
        auto due = backlog_.front();
        backlog_.pop_front();
        send_on(index, due);
      } else {
        idle_.push_back(index);
      }
      break;
    default:
      break;
  }
}

void load_loop::dispatch_due(int64_t now) {
  while (next_due_ns_ <= now) {
    auto due = next_due_ns_;
    next_due_ns_ = origin_ns_ + schedule_->next();
    if (!idle_.empty()) {
      auto index = idle_.back();
      idle_.pop_back();
      send_on(index, due);
    } else if (connections_.size() < config_.max_connections) {
      connections_.push_back(std::make_unique<connection>());
      send_on(connections_.size() - 1, due);
    } else {
      backlog_.push_back(due);
    }
  }
  arm_timer(next_due_ns_);
}

void load_loop::arm_timer(int64_t at_ns) {
  if (at_ns == armed_ns_)
    return;
  armed_ns_ = at_ns;
  itimerspec spec{};
  spec.it_value.tv_sec = at_ns / 1'000'000'000;
  spec.it_value.tv_nsec = at_ns % 1'000'000'000;
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void load_loop::run_until(int64_t deadline_ns) {
  constexpr int max_events = 256;
  epoll_event events[max_events];
  for (;;) {
    auto now = now_ns();
    if (mode_ == mode::open)
      dispatch_due(now);
    if (mode_ == mode::closed && open_connections_ < connections_.size()) {
      // Slots whose connection failed retry after their delay.
      for (std::size_t i = 0; i < connections_.size(); ++i) {
        auto& c = *connections_[i];
        if (!c.busy && c.fd < 0 && now >= c.retry_at_ns)
          send_on(i, now);
      }
    }
    if (now >= deadline_ns)
      return;
    auto wait_ms = (deadline_ns - now + 999'999) / 1'000'000;
    if (mode_ == mode::closed && open_connections_ < connections_.size())
      wait_ms = std::min<int64_t>(wait_ms, reconnect_delay_ns / 1'000'000);
    int n = epoll_wait(epoll_fd_, events, max_events,
                       static_cast<int>(wait_ms));
    if (n < 0)
      continue;
    now = now_ns();
    for (int i = 0; i < n; ++i) {
      auto tag = events[i].data.u64;
      if (tag == timer_tag) {
        uint64_t expirations;
        [[maybe_unused]] auto r = read(timer_fd_, &expirations,
                                       sizeof(expirations));
        armed_ns_ = -1;
        continue;
      }
      auto index = static_cast<std::size_t>(tag);
      auto& c = *connections_[index];
      if (c.fd < 0)
        continue;
      if ((events[i].events & EPOLLOUT) && c.busy)
        flush(index);
      if (c.fd >= 0
          && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)))
        on_readable(index, now);
    }
  }
}

std::vector<completion> load_loop::take_completions() {
  std::vector<completion> out;
  out.swap(completions_);
  return out;
}

drain_result load_loop::stop(int64_t timeout_ns) {
  drain_result result;
  result.unsent = backlog_.size();
  backlog_.clear();
  mode_ = mode::draining;
  auto deadline = now_ns() + timeout_ns;
  while (in_flight_ > 0 && now_ns() < deadline)
    run_until(std::min(deadline, now_ns() + 10'000'000));
  result.abandoned = in_flight_;
  for (std::size_t i = 0; i < connections_.size(); ++i)
    close_connection(i);
  return result;
}

} // namespace caf_serving::perf
