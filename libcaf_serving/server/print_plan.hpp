#pragma once
/// The optimized execution plan of an ONNX model in a repository, as text
/// (`caf-serving --print-plan MODEL` and `caf-onnx-plan`).

#include "core/error.hpp"

#include <cstdint>
#include <filesystem>
#include <string>

namespace caf_serving::server {

struct print_plan_request {
  std::filesystem::path repository;
  std::string model;  ///< directory name in the repository
  int64_t batch = 1;  ///< rows of the plan
  unsigned threads = 1; ///< compute threads the steps are split for
};

/// Reads `repository/model/config.pbtxt` and the newest version's model.onnx
/// and returns onnx::describe_plan(): one line per step with its kernel,
/// layouts, thread split, shapes and arena offset, then the arena size. Errors
/// name the model and what is wrong (no such model, not an ONNX model, ...).
result<std::string> describe_model_plan(const print_plan_request& req);

} // namespace caf_serving::server
