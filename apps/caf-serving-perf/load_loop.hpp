/// The measured path: one thread, one epoll set, keep-alive connections, and
/// requests that are complete HTTP byte strings prepared before the run.
///
///   load_loop loop{{target, requests, max_connections}};
///   loop.start_closed(8);            // or loop.start_open(arrival_config)
///   loop.run_until(now_ns() + 1e9);  // handle events for a second
///   auto done = loop.take_completions();
///   loop.stop(drain_timeout);
///
/// Closed loop: `concurrency` connections, each sends its next request as
/// soon as the previous one is answered. Open loop: a request is due at each
/// time of the arrival schedule; it goes out on an idle connection, on a new
/// one while fewer than `max_connections` exist, or else waits in a backlog.
/// Its latency counts from the time it was due, so waiting in the backlog or
/// behind a late timer is part of what is measured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "arrivals.hpp"
#include "http.hpp"

namespace caf_serving::perf {

/// CLOCK_MONOTONIC in nanoseconds.
int64_t now_ns();

/// When bytes of an answer arrived: those up to `end` of the captured
/// response had arrived at `at_ns`.
struct read_mark {
  int64_t at_ns = 0;
  std::size_t end = 0;
};

/// What the loop keeps of each answer.
enum class response_capture {
  /// The status and the times only.
  status,
  /// Also the raw response bytes and when each piece arrived, for streamed
  /// answers whose chunks are timed (generative mode).
  timed_bytes,
};

/// One answered (or failed) request.
struct completion {
  /// When it was due (open loop) or written (closed loop).
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  /// The HTTP status, or 0 when the connection failed or the answer was not
  /// HTTP.
  int status = 0;
  /// Index of the request in load_loop_config::requests.
  std::size_t request = 0;
  /// With response_capture::timed_bytes: the response as read (header,
  /// framing and body) and the arrival time of each piece.
  std::string response;
  std::vector<read_mark> reads;
};

struct load_loop_config {
  endpoint target;
  /// Complete HTTP requests, sent in turn.
  std::vector<std::string> requests;
  std::size_t max_connections = 512;
  response_capture capture = response_capture::status;
};

/// What `stop` left behind.
struct drain_result {
  /// Due requests of the open loop's backlog that were never sent.
  uint64_t unsent = 0;
  /// Requests still unanswered when the drain timeout passed.
  uint64_t abandoned = 0;
};

class load_loop {
public:
  explicit load_loop(load_loop_config config);
  ~load_loop();
  load_loop(const load_loop&) = delete;
  load_loop& operator=(const load_loop&) = delete;

  /// Opens `concurrency` connections and sends a request on each. Returns
  /// an error message, empty on success.
  std::string start_closed(std::size_t concurrency);

  /// Starts the arrival schedule now.
  std::string start_open(const arrival_config& arrivals);

  /// Handles events until the monotonic clock passes `deadline_ns`.
  void run_until(int64_t deadline_ns);

  /// The completions since the last call.
  std::vector<completion> take_completions();

  /// Sends nothing new and waits up to `timeout_ns` for answers in flight.
  drain_result stop(int64_t timeout_ns);

  uint64_t sent() const {
    return sent_;
  }
  std::size_t connection_count() const {
    return open_connections_;
  }
  std::size_t in_flight() const {
    return in_flight_;
  }
  std::size_t backlog() const {
    return backlog_.size();
  }

private:
  struct connection;

  std::string open_connection(std::size_t index);
  void close_connection(std::size_t index);
  void send_on(std::size_t index, int64_t start_ns);
  void flush(std::size_t index);
  void on_readable(std::size_t index, int64_t now);
  void finish(std::size_t index, int status, int64_t now);
  void dispatch_due(int64_t now);
  void arm_timer(int64_t at_ns);
  void fail_in_flight(std::size_t index, int64_t now);
  /// Sends a busy connection's request again on a new connection when the
  /// server closed a reused connection before answering; false otherwise.
  bool resend_if_closed_idle(std::size_t index);

  load_loop_config config_;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  std::vector<std::unique_ptr<connection>> connections_;
  std::vector<std::size_t> idle_;
  std::deque<int64_t> backlog_;
  std::size_t next_request_ = 0;
  std::size_t open_connections_ = 0;
  std::size_t in_flight_ = 0;
  uint64_t sent_ = 0;
  std::vector<completion> completions_;
  std::vector<char> read_buffer_;

  enum class mode { idle, closed, open, draining };
  mode mode_ = mode::idle;
  std::unique_ptr<arrival_schedule> schedule_;
  int64_t origin_ns_ = 0;
  int64_t next_due_ns_ = 0;
  int64_t armed_ns_ = -1;
};

} // namespace caf_serving::perf
