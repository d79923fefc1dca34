/// The CPU backend's kernels in the registry's form: which operators have a
/// CPU kernel beyond the reference, and that a node no CPU kernel takes (an
/// operator without one, or a node its kernel declines) runs the reference
/// kernel in the compiled plan, with the reference interpreter's results.

#include "onnx_cpu/cpu_kernels.hpp"

#include "onnx/op_registry.hpp"
#include "onnx/passes.hpp"
#include "onnx/testing.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;

namespace {

struct writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&, size_t bytes) override {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
};

} // namespace

TEST_CASE("the registry answers which operators have CPU kernels beyond the reference") {
  const auto& k = cpu_kernels();
  for (const char* op : {"FusedConv", "FusedMatMul", "FusedGemm", "FusedLayerNorm", "FusedGelu",
                         "FusedGeluTanh", "FusedAttention", "Softmax", "MaxPool", "AveragePool",
                         "GlobalAveragePool", "QLinearConv", "Mul", "ToBlocked"}) {
    INFO(op);
    CHECK(k.has(op));
  }
  for (const char* op : {"Abs", "ArgMax", "GatherElements", "Conv", "MatMul", "Relu"}) {
    INFO(op);
    CHECK(!k.has(op));
  }
  // Each kernel's operator is one the registry runs (with its shape inference
  // and reference kernel): an ONNX operator, or one of the engine's own (the
  // fused operators that passes.cpp writes, the 8-bit ones that
  // quant_passes.cpp writes); or one of the CPU backend's layout reorders.
  const std::set<std::string> reorders{"ToNHWC", "ToNCHW", "ToBlocked"};
  for (const auto& kernel : k.kernels()) {
    INFO(kernel.op);
    CHECK((find_operator(kernel.op) != nullptr || find_engine_operator(kernel.op) != nullptr
           || reorders.count(kernel.op) == 1));
    CHECK(!kernel.name.empty());
    CHECK(static_cast<bool>(kernel.build));
  }
}

TEST_CASE("a node without a CPU kernel, or one its kernel declines, runs the reference") {
  // x -> Softmax(last axis: the engine's kernel) -> Softmax(axis 1: declined)
  //   -> ArgMax(axis 2: no CPU kernel) -> y
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 4, 6}, true);
  int s1 = g.add_value("s1");
  int s2 = g.add_value("s2");
  int y = g.add_value("y");
  g.add_node("Softmax", "softmax_last", {x}, {s1}).set_i("axis", -1);
  g.add_node("Softmax", "softmax_1", {s1}, {s2}).set_i("axis", 1);
  auto& arg = g.add_node("ArgMax", "argmax", {s2}, {y});
  arg.set_i("axis", 2);
  arg.set_i("keepdims", 0);
  g.inputs = {x};
  g.outputs = {y};

  std::mt19937 rng(7);
  const int64_t batch = 3;
  auto data = random_floats(batch * 4 * 6, rng);
  auto plain = specialize(g, {{batch, 4, 6}});
  REQUIRE_MESSAGE(plain, plain.error().message);
  auto want = run_reference_graph(*plain, {as_bytes(data)});
  REQUIRE(want.size() == 1);

  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "t";
  cfg.config.max_batch_size = 4;
  cfg.threads = 2;
  cfg.profile = true;
  auto model = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  executor::batch_view view;
  view.rows = batch;
  view.inputs.push_back({"x", datatype::fp32, {batch, 4, 6},
                         reinterpret_cast<const uint8_t*>(data.data()), data.size() * 4});
  writer out;
  auto r = model->make_instance()->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  REQUIRE(out.buffers.size() == 1);
  CHECK(out.buffers[0] == want[0]);
  auto text = model->profile_report();
  INFO(text);
  CHECK(text.find("Softmax [engine.softmax]") != std::string::npos);
  CHECK(text.find("Softmax [reference]") != std::string::npos);
  CHECK(text.find("ArgMax [reference]") != std::string::npos);
}

TEST_CASE("GELU's tanh form runs on the engine's kernel alone and on oneDNN after a MatMul") {
  // x -> Gelu(tanh) -> MatMul(constant W) -> Gelu(tanh) -> y: the first has no
  // producer to fuse into (FusedGeluTanh, engine.gelu_tanh); the second is the
  // MatMul's epilogue (FusedMatMul, activation GeluTanh, oneDNN's gelu_tanh).
  const int64_t k = 24, n = 40, batch = 5;
  std::mt19937 rng(12);
  auto w = random_floats(k * n, rng, 0.5f);
  graph g;
  g.opset = 20;
  int x = g.add_value("x", datatype::fp32, {-1, k}, true);
  auto wt = make_tensor(datatype::fp32, {k, n});
  std::memcpy(wt->bytes.data(), w.data(), w.size() * sizeof(float));
  int wv = g.add_constant("w", wt);
  int g1 = g.add_value("g1"), m = g.add_value("m"), y = g.add_value("y");
  g.add_node("Gelu", "gelu1", {x}, {g1}).set_s("approximate", "tanh");
  g.add_node("MatMul", "matmul", {g1, wv}, {m});
  g.add_node("Gelu", "gelu2", {m}, {y}).set_s("approximate", "tanh");
  g.inputs = {x};
  g.outputs = {y};

  // The test's own model, in double.
  auto gelu = [](double v) {
    const double pi = 3.14159265358979323846;
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (v + 0.044715 * v * v * v)));
  };
  auto data = random_floats(batch * k, rng, 3.0f);
  std::vector<float> want;
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i)
        acc += gelu(data[r * k + i]) * w[i * n + c];
      want.push_back(static_cast<float>(gelu(acc)));
    }

  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "t";
  cfg.config.max_batch_size = 8;
  cfg.threads = 2;
  cfg.profile = true;
  auto model = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  executor::batch_view view;
  view.rows = batch;
  view.inputs.push_back({"x", datatype::fp32, {batch, k},
                         reinterpret_cast<const uint8_t*>(data.data()), data.size() * 4});
  writer out;
  auto r = model->make_instance()->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  REQUIRE(out.buffers.size() == 1);
  std::vector<float> got(want.size());
  REQUIRE(out.buffers[0].size() == got.size() * 4);
  std::memcpy(got.data(), out.buffers[0].data(), out.buffers[0].size());
  // oneDNN's gelu_tanh and the engine's kernel each within about 1e-6.
  CHECK(relative_error(got, want) < 1e-5);
  auto text = model->profile_report();
  INFO(text);
  CHECK(text.find("FusedGeluTanh [engine.gelu_tanh]") != std::string::npos);
  CHECK(text.find("FusedMatMul+GeluTanh [onednn.matmul") != std::string::npos);
  CHECK(text.find("  Tanh [") == std::string::npos);
}
