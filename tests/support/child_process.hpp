#pragma once
/// A child process whose output a test reads: the shared fork/exec part of
/// support::server_process and the cluster tests' worker_process.
///
/// Usage:
///
///   support::child_process child({{"/path/to/binary", "--flag", "value"}, true});
///   if (!child.wait_for_output("listening on ", std::chrono::seconds(20)))
///     throw std::runtime_error("no start; its output:\n" + child.output());
///   child.send_signal(SIGTERM);
///   auto status = child.wait_exit(std::chrono::seconds(10));   // 0 on a clean stop
///
/// stdout (and stderr when `capture_stderr` is set) is collected through a
/// pipe by a reader thread. A child still running when the object is
/// destroyed is killed with SIGKILL, and so is one whose test process dies
/// (PR_SET_PDEATHSIG).

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/types.h>

namespace caf_serving::support {

/// What to start and which output to collect.
struct child_config {
  /// The program and its arguments; a program name without '/' is looked up
  /// in PATH.
  std::vector<std::string> argv;
  /// Collect stderr with stdout; otherwise stderr goes to the test's stderr.
  bool capture_stderr = false;
};

class child_process {
public:
  /// Starts the child. Throws std::runtime_error when pipe2 or fork fails; a
  /// program that cannot be executed exits with status 127.
  explicit child_process(child_config cfg);
  /// Kills (SIGKILL) and reaps a child not reaped yet, and joins the reader.
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }

  /// Sends `signal` unless the child has been reaped already.
  void send_signal(int signal);
  /// The exit status once the process has exited (128 + signal number when a
  /// signal killed it), or nothing when it still runs after `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  /// Sends SIGKILL and reaps the child; returns its exit status. Does nothing
  /// but return the status when the child was reaped already.
  int kill_and_wait();

  /// Everything collected so far.
  std::string output() const;
  /// Whether `text` appears in the output within `timeout`.
  bool wait_for_output(std::string_view text, std::chrono::milliseconds timeout) const;
  /// Waits until `done(output)` is true, the child closes its output (no
  /// more will come) or `timeout` passes, and returns the last value of
  /// `done`. `done` runs under the output lock, so it must not call back into
  /// this object.
  bool wait_until(std::chrono::milliseconds timeout,
                  const std::function<bool(const std::string& output)>& done) const;

private:
  void read_output(int fd);

  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::string output_;
  bool output_closed_ = false;
  std::thread reader_;
};

} // namespace caf_serving::support
