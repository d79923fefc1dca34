/// The CUDA backend's device steps in the operator registry's form: which
/// operators have one. Needs no device (nothing here calls CUDA).

#include "cuda/cuda_backend.hpp"

#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using namespace caf_serving;

TEST_CASE("the registry answers which operators have device steps") {
  auto ops = cuda::device_step_ops();
  CHECK(std::is_sorted(ops.begin(), ops.end()));
  auto has = [&](const std::string& op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  };
  for (const char* op : {"FusedConv", "FusedMatMul", "FusedLayerNorm", "FusedGelu", "Softmax",
                         "Relu", "Add", "MaxPool", "AveragePool", "GlobalAveragePool",
                         "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                         "FusedAttention"}) {
    INFO(op);
    CHECK(has(op));
  }
  // Every other operator runs its reference kernel on the host.
  for (const char* op : {"ArgMax", "GatherElements", "Mul"}) {
    INFO(op);
    CHECK(!has(op));
  }
  for (const auto& op : ops)
    if (op.rfind("Fused", 0) != 0) {
      INFO(op);
      CHECK(onnx::find_operator(op) != nullptr);
    }
}
