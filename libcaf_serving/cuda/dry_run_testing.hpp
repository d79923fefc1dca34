#pragma once
/// Helpers of the device-free tests of the step families (steps_*.test.cpp):
/// what the dry run of the step selection (steps.hpp) chooses for a fixture of
/// tests/onnx/fixtures or for a graph built by hand. Tests only.

#include "cuda/cuda_backend.hpp"
#include "cuda/steps.hpp"
#include "repository/model_repository.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace caf_serving::cuda::testing {

/// Steps of `kernel` at every planned size of fixture `name` in
/// `fixtures`/models, or -1 when the sizes disagree.
inline long steps_of(const std::filesystem::path& fixtures, const std::string& name,
                     const std::string& kernel) {
  auto entry = repository::load_model_config(fixtures / "models", name, {true});
  REQUIRE(entry.config);
  auto r = plan_model({entry.version_dirs.back() / "model.onnx", entry.config->config, {}});
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
  REQUIRE(!r->buckets.empty());
  long first = -1;
  for (const auto& b : r->buckets) {
    auto it = b.kernels.find(kernel);
    long n = it == b.kernels.end() ? 0 : static_cast<long>(it->second);
    if (first < 0) first = n;
    if (n != first) return -1;
  }
  return first;
}

/// The kernel the dry run chooses for the one node `make` adds to a graph of
/// opset `opset`.
inline std::string chosen(const std::function<void(onnx::graph&)>& make, int64_t opset = 18) {
  onnx::graph g;
  g.opset = opset;
  make(g);
  step_builder b{nullptr, g, std::vector<void*>(g.values.size(), nullptr), {}};
  b.build();
  REQUIRE(b.steps.size() == 1);
  return b.steps[0].kernel;
}

} // namespace caf_serving::cuda::testing
