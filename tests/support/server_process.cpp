#include "support/server_process.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

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

/// The command line: the fixed flags first, then the test's own.
std::vector<std::string> server_argv(const server_config& cfg) {
  std::vector<std::string> args{cfg.binary, "--model-repository", cfg.model_repository,
                                "--http-address", "127.0.0.1", "--http-port", "0",
                                "--metrics-port", "0", "--grpc-port", "0"};
  args.insert(args.end(), cfg.extra_args.begin(), cfg.extra_args.end());
  return args;
}

} // namespace

server_process::server_process(server_config cfg)
  : cfg_(std::move(cfg)), child_({server_argv(cfg_), false}) {
  bool ready = child_.wait_until(cfg_.start_timeout, [&](const std::string& out) {
    http_port_ = port_after(out, "HTTP listening on ");
    metrics_port_ = port_after(out, "metrics listening on ");
    // Printed before the HTTP line, when gRPC is on.
    grpc_port_ = port_after(out, "GRPC listening on ");
    return http_port_ != 0 && metrics_port_ != 0;
  });
  if (!ready) {
    std::string out = child_.output();
    int status = child_.kill_and_wait();
    throw std::runtime_error("caf-serving did not start listening (" + cfg_.binary
                             + ", exit status " + std::to_string(status)
                             + "); its stdout:\n" + out);
  }
}

server_process::~server_process() = default;

void server_process::send_signal(int signal) {
  child_.send_signal(signal);
}

std::optional<int> server_process::wait_exit(std::chrono::milliseconds timeout) {
  return child_.wait_exit(timeout);
}

std::string server_process::output() const {
  return child_.output();
}

bool server_process::wait_for_output(std::string_view text,
                                     std::chrono::milliseconds timeout) const {
  return child_.wait_for_output(text, timeout);
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
