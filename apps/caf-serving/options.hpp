#pragma once
/// Command-line options of `caf-serving`, with Triton's flag names where Triton
/// has the flag.

#include "core/thread_config.hpp"
#include "ingress/http_server.hpp"

#include <optional>
#include <string>
#include <variant>

namespace caf_serving::app {

struct server_options {
  std::string model_repository;
  ingress::http_server_config http;
  thread_config threads;
  uint32_t max_queue_size = 1024;
  uint32_t executor_depth = 1;
};

struct show_help {};

/// Parses argv; a string is a usage error that says which flag is wrong and why.
std::variant<server_options, show_help, std::string> parse_options(int argc, char** argv);

/// The text --help prints.
std::string usage();

} // namespace caf_serving::app
