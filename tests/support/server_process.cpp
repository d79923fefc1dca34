#include "support/server_process.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace caf_serving::support {

namespace {

/// The port after "<prefix>HOST:" on one line of `text`, or 0.
uint16_t port_after(const std::string& text, std::string_view prefix) {
  auto at = text.find(prefix);
  if (at == std::string::npos)
    return 0;
  auto eol = text.find('\n', at);
  if (eol == std::string::npos)
    return 0; // the line is not complete yet
  auto colon = text.rfind(':', eol);
  if (colon == std::string::npos || colon < at)
    return 0;
  return static_cast<uint16_t>(std::strtoul(text.c_str() + colon + 1, nullptr, 10));
}

int decode_status(int raw) {
  if (WIFEXITED(raw))
    return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw))
    return 128 + WTERMSIG(raw);
  return -1;
}

} // namespace

server_process::server_process(server_config cfg) : cfg_(std::move(cfg)) {
  std::vector<std::string> args{cfg_.binary, "--model-repository", cfg_.model_repository,
                                "--http-address", "127.0.0.1", "--http-port", "0",
                                "--metrics-port", "0"};
  args.insert(args.end(), cfg_.extra_args.begin(), cfg_.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0)
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  reader_ = std::thread([this, fd = fds[0]] { read_stdout(fd); });

  std::unique_lock<std::mutex> lock(mutex_);
  bool ready = changed_.wait_for(lock, cfg_.start_timeout, [&] {
    http_port_ = port_after(output_, "HTTP listening on ");
    metrics_port_ = port_after(output_, "metrics listening on ");
    return stdout_closed_ || (http_port_ != 0 && metrics_port_ != 0);
  });
  if (!ready || http_port_ == 0 || metrics_port_ == 0) {
    std::string out = output_;
    lock.unlock();
    kill(pid_, SIGKILL);
    int raw = 0;
    waitpid(pid_, &raw, 0);
    exit_status_ = decode_status(raw);
    reader_.join();
    throw std::runtime_error("caf-serving did not start listening (" + cfg_.binary
                             + ", exit status " + std::to_string(*exit_status_)
                             + "); its stdout:\n" + out);
  }
}

server_process::~server_process() {
  if (!exit_status_) {
    kill(pid_, SIGKILL);
    int raw = 0;
    waitpid(pid_, &raw, 0);
  }
  if (reader_.joinable())
    reader_.join();
}

void server_process::read_stdout(int fd) {
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
  stdout_closed_ = true;
  changed_.notify_all();
}

void server_process::send_signal(int signal) {
  if (!exit_status_)
    kill(pid_, signal);
}

std::optional<int> server_process::wait_exit(std::chrono::milliseconds timeout) {
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

std::string server_process::output() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return output_;
}

bool server_process::wait_for_output(std::string_view text,
                                     std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    return output_.find(text) != std::string::npos || stdout_closed_;
  }) && output_.find(text) != std::string::npos;
}

// -- temp_repository ----------------------------------------------------------

temp_repository::temp_repository() {
  auto pattern = (std::filesystem::temp_directory_path() / "caf-serving-itest-XXXXXX").string();
  if (!mkdtemp(pattern.data()))
    throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  path_ = pattern;
}

temp_repository::~temp_repository() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void temp_repository::add_model(const std::filesystem::path& model_dir) {
  auto source = model_dir;
  if (!source.has_filename())
    source = source.parent_path();
  if (!std::filesystem::is_directory(source))
    throw std::runtime_error("no model directory " + source.string());
  std::filesystem::copy(source, path_ / source.filename(),
                        std::filesystem::copy_options::recursive);
}

void temp_repository::write_file(const std::filesystem::path& relative, std::string_view text) {
  auto target = path_ / relative;
  std::filesystem::create_directories(target.parent_path());
  std::ofstream out(target, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out)
    throw std::runtime_error("cannot write " + target.string());
}

} // namespace caf_serving::support
