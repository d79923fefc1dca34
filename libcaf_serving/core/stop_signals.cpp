#include "core/stop_signals.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace caf_serving {

namespace {

/// The thread in wait(), where the signals are blocked; 0 before it waits.
std::atomic<pid_t> waiting_thread{0};
/// A signal that a thread not blocking it took: wait() returns it.
std::atomic<int> caught_signal{0};

/// Keeps `signal` for wait() and wakes the waiting thread, if any. Stored
/// before the waiter is looked up, and wait() looks for a kept signal after
/// it has made itself the waiter, so one of the two sees the other.
void hand_over(int signal) {
  caught_signal.store(signal);
  pid_t target = waiting_thread.load();
  if (target != 0 && static_cast<pid_t>(syscall(SYS_gettid)) != target)
    syscall(SYS_tgkill, getpid(), target, signal);
}

extern "C" void forward_stop_signal(int signal) {
  int saved = errno;
  hand_over(signal);
  errno = saved;
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

} // namespace

stop_signals stop_signals::capture() {
  auto set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  struct sigaction action {};
  action.sa_handler = forward_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return stop_signals();
}

int stop_signals::wait() {
  waiting_thread.store(static_cast<pid_t>(syscall(SYS_gettid)));
  if (int kept = caught_signal.exchange(0))
    return kept;
  auto set = stop_set();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  // A kept copy of the same stop, if the handler also kept it.
  caught_signal.store(0);
  return signal;
}

void stop_signals::request_stop() {
  hand_over(SIGTERM);
}

} // namespace caf_serving
