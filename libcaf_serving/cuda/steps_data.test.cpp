/// Which data-movement and reduction nodes become device steps (steps_data.cpp),
/// as dry runs of the step selection: no device needed. The numerics run on a
/// GPU in tests/gpu/cuda_backend.test.cpp against ONNX Runtime.

#include "cuda/dry_run_testing.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <string>

using namespace caf_serving;
using namespace caf_serving::cuda;
namespace fs = std::filesystem;

namespace {

const fs::path fixtures = CAF_SERVING_ONNX_FIXTURES;

long steps_of(const std::string& name, const std::string& kernel) {
  return cuda::testing::steps_of(fixtures, name, kernel);
}

using cuda::testing::chosen;

int int64s(onnx::graph& g, const std::string& name, std::vector<int64_t> v) {
  auto t = onnx::make_tensor(datatype::int64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t->as_mut<int64_t>());
  return g.add_constant(name, t);
}

} // namespace

TEST_CASE("the data-movement and reduction fixtures run on the device at every bucket") {
  CHECK(steps_of("op_transpose", "permute") == 1);
  CHECK(steps_of("op_split", "split") == 1);
  CHECK(steps_of("opset18_split_num_outputs", "split") == 1);
  CHECK(steps_of("op_tile", "tile") == 1);
  CHECK(steps_of("op_pad", "pad") == 1);
  for (const char* name : {"op_reducemax", "op_reducemax_opset20", "op_reduceprod", "op_reducesum"})
    CHECK_MESSAGE(steps_of(name, "reduce") == 1, name);
  CHECK(steps_of("opset18_reduce_axes", "reduce") == 4); // axes as an input
  // BERT's embeddings: word, position and token-type Gathers, the mask's Expand.
  CHECK(steps_of("bert_2layer_opset17", "gather") == 4);
  CHECK(steps_of("bert_2layer_opset17", "expand") == 1);
  CHECK(steps_of("bert_2layer_opset17", "host:Gather") == 0);
  // ViT: the class token's Concat, the patches' Transpose.
  CHECK(steps_of("zoo_vit_tiny_dynamo_opset18", "concat") == 1);
  CHECK(steps_of("zoo_vit_tiny_dynamo_opset18", "permute") == 9);
}

TEST_CASE("what the data kernels cannot take stays a host step") {
  CHECK(steps_of("op_pad_edge_crop", "host:Pad") == 1);          // mode edge
  CHECK(steps_of("op_reducemin", "host:ReduceMin") == 1);        // int64: the kernel reduces floats
  // Reduced axes that are not adjacent.
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp32, {2, 3, 4}, true);
          int y = g.add_value("y", datatype::fp32, {3}, true);
          g.add_node("ReduceSum", "r", {x, int64s(g, "axes", {0, 2})}, {y}).set_i("keepdims", 0);
        })
        == "host:ReduceSum");
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp32, {2, 3, 4}, true);
          int y = g.add_value("y", datatype::fp32, {2, 3}, true);
          g.add_node("ReduceSum", "r", {x, int64s(g, "axes", {-1})}, {y}).set_i("keepdims", 0);
        })
        == "reduce");
  // A constant index outside the axis: the host kernel says which.
  auto gather = [](std::vector<int64_t> ids) {
    return chosen([ids](onnx::graph& g) {
      int x = g.add_value("x", datatype::fp16, {5, 8}, true);
      int y = g.add_value("y", datatype::fp16, {static_cast<int64_t>(ids.size()), 8}, true);
      g.add_node("Gather", "g", {x, int64s(g, "ids", ids)}, {y});
    });
  };
  CHECK(gather({0, 4, -5}) == "gather");
  CHECK(gather({0, 5}) == "host:Gather");
  // Runtime indices are checked on the device (an error flag per step).
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::int8, {5, 8}, true);
          int i = g.add_value("i", datatype::int32, {2, 3}, true);
          int y = g.add_value("y", datatype::int8, {2, 3, 8}, true);
          g.add_node("Gather", "g", {x, i}, {y});
        })
        == "gather");
  // Slice with runtime starts: its box is not known at plan time.
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp32, {4, 6}, true);
          int s = g.add_value("s", datatype::int64, {1}, true);
          int y = g.add_value("y", datatype::fp32, {4, 3}, true);
          g.add_node("Slice", "s", {x, s, int64s(g, "e", {6}), int64s(g, "a", {1})}, {y});
        })
        == "host:Slice");
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp32, {4, 6}, true);
          int y = g.add_value("y", datatype::fp32, {4, 3}, true);
          g.add_node("Slice", "s", {x, int64s(g, "b", {-1}), int64s(g, "e", {-7}), int64s(g, "a", {1}),
                                     int64s(g, "st", {-2})}, {y});
        })
        == "slice");
  // Element sizes 1/2/4/8 move; rank 7 and strings do not.
  for (auto t : {datatype::bool_, datatype::bf16, datatype::int32, datatype::int64}) {
    CAPTURE(static_cast<int>(t));
    CHECK(chosen([t](onnx::graph& g) {
            int x = g.add_value("x", t, {2, 3, 4}, true);
            int y = g.add_value("y", t, {4, 3, 2}, true);
            g.add_node("Transpose", "t", {x}, {y});
          })
          == "permute");
  }
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp32, {2, 2, 2, 2, 2, 2, 2}, true);
          int y = g.add_value("y", datatype::fp32, {2, 2, 2, 2, 2, 2, 2}, true);
          g.add_node("Transpose", "t", {x}, {y});
        })
        == "host:Transpose");
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::bytes, {2, 3}, true);
          int y = g.add_value("y", datatype::bytes, {3, 2}, true);
          g.add_node("Transpose", "t", {x}, {y});
        })
        == "host:Transpose");
}

TEST_CASE("the GlobalAveragePools cuDNN's step leaves (fp16, 3-D) are reductions") {
  auto pool = [](const char* op, datatype t, std::vector<int64_t> xs) {
    return chosen([=](onnx::graph& g) {
      int x = g.add_value("x", t, xs, true);
      auto ys = xs;
      for (size_t d = 2; d < ys.size(); ++d) ys[d] = 1;
      int y = g.add_value("y", t, ys, true);
      g.add_node(op, "p", {x}, {y});
    });
  };
  CHECK(pool("GlobalAveragePool", datatype::fp32, {2, 8, 7, 7}) == "cudnn_pool");
  CHECK(pool("GlobalAveragePool", datatype::fp16, {2, 8, 7, 7}) == "reduce");
  CHECK(pool("GlobalAveragePool", datatype::fp32, {2, 8, 7}) == "reduce");
  CHECK(pool("GlobalAveragePool", datatype::int32, {2, 8, 7, 7}) == "host:GlobalAveragePool");
}

TEST_CASE("ReduceL2, ReduceSumSquare and GlobalMaxPool plan as reductions; ReduceL1, "
          "ReduceLogSum and ReduceLogSumExp, which have no device kernel, as host steps") {
  // x [2, 3, 4] over its last axis (the axes input of opset 18).
  auto last_axis = [](const std::string& op, datatype t) {
    return chosen([=](onnx::graph& g) {
      int x = g.add_value("x", t, {2, 3, 4}, true);
      int y = g.add_value("y", t, {2, 3, 1}, true);
      g.add_node(op, "r", {x, int64s(g, "axes", {-1})}, {y});
    });
  };
  for (const char* op : {"ReduceL2", "ReduceSumSquare"}) {
    CAPTURE(op);
    CHECK(last_axis(op, datatype::fp32) == "reduce");
    CHECK(last_axis(op, datatype::bf16) == "reduce");
    CHECK(last_axis(op, datatype::int64) == std::string("host:") + op); // integers: the host
  }
  for (const char* op : {"ReduceL1", "ReduceLogSum", "ReduceLogSumExp"}) {
    CAPTURE(op);
    CHECK(last_axis(op, datatype::fp32) == std::string("host:") + op);
  }
  // ReduceSumSquare-18 over no axes squares each element: the kernel's zero-axis form.
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp32, {2, 3}, true);
          int y = g.add_value("y", datatype::fp32, {2, 3}, true);
          g.add_node("ReduceSumSquare", "r", {x}, {y}).set_i("noop_with_empty_axes", 1);
        })
        == "reduce");
  auto pool = [](datatype t, std::vector<int64_t> xs) {
    return chosen([=](onnx::graph& g) {
      int x = g.add_value("x", t, xs, true);
      auto ys = xs;
      for (size_t d = 2; d < ys.size(); ++d) ys[d] = 1;
      int y = g.add_value("y", t, ys, true);
      g.add_node("GlobalMaxPool", "p", {x}, {y});
    });
  };
  CHECK(pool(datatype::fp32, {2, 8, 7, 7}) == "reduce");
  CHECK(pool(datatype::fp16, {2, 8, 7}) == "reduce");
  CHECK(pool(datatype::fp32, {2, 8}) == "host:GlobalMaxPool"); // no spatial axes to reduce
  CHECK(pool(datatype::int32, {2, 8, 7, 7}) == "host:GlobalMaxPool");
}
