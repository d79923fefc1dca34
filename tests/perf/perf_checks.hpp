/// Checks that more than one perf test makes, as doctest assertions: the
/// tool's answers to a model the server does not have and to a request only
/// the server can refuse. Header-only because each test file is its own
/// executable.
#pragma once

#include <doctest/doctest.h>

#include "perf_harness.hpp"

#include <fstream>
#include <string>

#include <unistd.h>

namespace perf_test {

/// Asking the server at `url` for model "nope" ends with exit code 2 and
/// names the model.
inline void check_unknown_model_fails(const std::string& tool,
                                      const std::string& url) {
  auto unknown = run_tool(tool, {"-m", "nope", "-u", url}, 20);
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.err.find("model 'nope' is not available") != std::string::npos);
}

/// Sends identity_fp32 (which expects [-1,16]) a 7-element INPUT0 from a
/// data file, a shape only the server can refuse: the tool's test request
/// fails, it exits with code 2 and says so. Returns the run so a caller can
/// check more of the server's message.
inline tool_run check_server_rejects_short_input(const std::string& tool,
                                                 const std::string& url) {
  auto data = temp_path(".json");
  {
    std::ofstream f(data);
    f << R"({"data":[{"INPUT0":{"content":[1,2,3,4,5,6,7],"shape":[1,7]}}]})";
  }
  auto remote = run_tool(tool, {"-m", "identity_fp32", "-u", url,
                                "--input-data", data},
                         20);
  unlink(data.c_str());
  CHECK(remote.exit_code == 2);
  CHECK(remote.err.find("rejected a test request") != std::string::npos);
  return remote;
}

} // namespace perf_test
