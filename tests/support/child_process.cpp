#include "support/child_process.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace caf_serving::support {

namespace {

int decode_status(int raw) {
  if (WIFEXITED(raw))
    return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw))
    return 128 + WTERMSIG(raw);
  return -1;
}

} // namespace

child_process::child_process(child_config cfg) {
  if (cfg.argv.empty())
    throw std::runtime_error("child_process: empty argv, nothing to start");
  std::vector<char*> argv;
  for (auto& a : cfg.argv)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    int error = errno;
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(error));
  }
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    if (cfg.capture_stderr)
      dup2(fds[1], STDERR_FILENO);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  reader_ = std::thread([this, fd = fds[0]] { read_output(fd); });
}

child_process::~child_process() {
  kill_and_wait();
  if (reader_.joinable())
    reader_.join();
}

void child_process::read_output(int fd) {
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    std::lock_guard<std::mutex> guard(mutex_);
    output_.append(buf, static_cast<size_t>(n));
    changed_.notify_all();
  }
  close(fd);
  std::lock_guard<std::mutex> guard(mutex_);
  output_closed_ = true;
  changed_.notify_all();
}

void child_process::send_signal(int signal) {
  if (!exit_status_)
    kill(pid_, signal);
}

std::optional<int> child_process::wait_exit(std::chrono::milliseconds timeout) {
  if (exit_status_)
    return exit_status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int raw = 0;
    pid_t r = waitpid(pid_, &raw, WNOHANG);
    if (r == pid_) {
      exit_status_ = decode_status(raw);
      return exit_status_;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int child_process::kill_and_wait() {
  if (!exit_status_) {
    kill(pid_, SIGKILL);
    int raw = 0;
    waitpid(pid_, &raw, 0);
    exit_status_ = decode_status(raw);
  }
  return *exit_status_;
}

std::string child_process::output() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return output_;
}

bool child_process::wait_for_output(std::string_view text,
                                    std::chrono::milliseconds timeout) const {
  return wait_until(timeout, [&](const std::string& out) {
    return out.find(text) != std::string::npos;
  });
}

bool child_process::wait_until(
    std::chrono::milliseconds timeout,
    const std::function<bool(const std::string& output)>& done) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return done(output_) || output_closed_; })
         && done(output_);
}

} // namespace caf_serving::support
