#pragma once
/// Runs the caf-serving binary as a child process for whole-server tests.
///
/// Usage:
///
///   support::temp_repository repo;                 // a fresh directory, removed at the end
///   repo.add_model(examples_dir / "simple");      // copied, so a test may edit it
///   support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
///                                   {"--max-queue-size", "4"}});
///   support::http_client http(server.http_port());
///   ...
///   server.send_signal(SIGTERM);
///   auto status = server.wait_exit(std::chrono::seconds(10));   // 0 on a clean stop
///
/// The server is started with --http-port 0 --metrics-port 0 --grpc-port 0 and the ports are
/// read from the lines it prints ("HTTP listening on 127.0.0.1:PORT"). Its
/// stdout is collected (output(), wait_for_output()); its stderr goes to the
/// test's stderr. A server still running when the object is destroyed is
/// killed with SIGKILL, and so is one whose test process dies (PDEATHSIG).

#include "support/child_process.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

namespace caf_serving::support {

/// How to start the server.
struct server_config {
  /// Path of the caf-serving executable.
  std::string binary;
  std::string model_repository;
  /// Flags after --model-repository, --http-port 0, --metrics-port 0 and
  /// --grpc-port 0.
  std::vector<std::string> extra_args;
  /// How long to wait for both "listening on" lines.
  std::chrono::milliseconds start_timeout{30000};
};

class server_process {
public:
  /// Starts the server and waits until it listens. Throws std::runtime_error
  /// with the server's output when it exits or stays silent instead.
  explicit server_process(server_config cfg);
  ~server_process();
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  uint16_t http_port() const { return http_port_; }
  /// 0 when the server runs without a metrics port.
  uint16_t metrics_port() const { return metrics_port_; }
  /// 0 when the server runs without gRPC (--allow-grpc false).
  uint16_t grpc_port() const { return grpc_port_; }
  pid_t pid() const { return child_.pid(); }

  void send_signal(int signal);
  /// The exit status once the process has exited (128 + signal number when a
  /// signal killed it), or nothing when it still runs after `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  /// Everything the server wrote to stdout so far.
  std::string output() const;
  /// Whether `text` appears in stdout within `timeout`.
  bool wait_for_output(std::string_view text, std::chrono::milliseconds timeout) const;

private:
  server_config cfg_;
  child_process child_;
  uint16_t http_port_ = 0;
  uint16_t metrics_port_ = 0;
  uint16_t grpc_port_ = 0;
};

/// A model repository in a fresh temporary directory, removed with the object.
class temp_repository {
public:
  temp_repository();
  ~temp_repository();
  temp_repository(const temp_repository&) = delete;
  temp_repository& operator=(const temp_repository&) = delete;

  /// Copies the model directory `model_dir` (config.pbtxt, version
  /// directories, label files) into the repository under its own name.
  void add_model(const std::filesystem::path& model_dir);
  /// Writes `text` to `relative` inside the repository, creating directories.
  void write_file(const std::filesystem::path& relative, std::string_view text);
  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

} // namespace caf_serving::support
