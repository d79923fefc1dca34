/// The row-chunk rule (row_chunks.hpp): which plans starve their matmuls when
/// a batch is cut into chunks, and that such a batch then runs as one plan
/// split across the threads, with the same outputs.

#include "onnx_cpu/row_chunks.hpp"

#include "onnx_cpu/onnx_backend.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/passes.hpp"
#include "onnx/testing.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;

namespace {

int add_weights(graph& g, const std::string& name, std::vector<int64_t> shape, std::mt19937& rng,
                float scale) {
  auto t = make_tensor(datatype::fp32, shape);
  auto v = random_floats(t->elements(), rng, scale);
  std::memcpy(t->as_mut<float>(), v.data(), v.size() * 4);
  return g.add_constant(name, t);
}

/// A transformer's feed-forward block: x [B, tokens, 64] -> MatMul 64x256 +
/// bias -> Relu -> MatMul 256x64 -> y.
graph mlp_graph(int64_t tokens, std::mt19937& rng) {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, tokens, 64}, true);
  g.inputs.push_back(x);
  int w1 = add_weights(g, "w1", {64, 256}, rng, 0.125f);
  int b1 = add_weights(g, "b1", {256}, rng, 0.1f);
  int w2 = add_weights(g, "w2", {256, 64}, rng, 0.0625f);
  int h = g.add_value("h"), hb = g.add_value("hb"), r = g.add_value("r"), y = g.add_value("y");
  g.add_node("MatMul", "mm1", {x, w1}, {h});
  g.add_node("Add", "bias1", {h, b1}, {hb});
  g.add_node("Relu", "relu", {hb}, {r});
  g.add_node("MatMul", "mm2", {r, w2}, {y});
  g.outputs.push_back(y);
  return g;
}

/// x [B, 16, 12, 12] -> Conv 3x3 (16 -> 32) -> Relu -> Flatten -> Gemm -> y [B, 10].
graph cnn_graph(std::mt19937& rng) {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 16, 12, 12}, true);
  g.inputs.push_back(x);
  int w = add_weights(g, "w", {32, 16, 3, 3}, rng, 0.08f);
  int fc = add_weights(g, "fc", {32 * 144, 10}, rng, 0.01f);
  int c = g.add_value("c"), r = g.add_value("r"), f = g.add_value("f"), y = g.add_value("y");
  auto& conv = g.add_node("Conv", "conv", {x, w}, {c});
  conv.set_ints("kernel_shape", {3, 3});
  conv.set_ints("pads", {1, 1, 1, 1});
  g.add_node("Relu", "relu", {c}, {r});
  g.add_node("Flatten", "flatten", {r}, {f});
  g.add_node("Gemm", "fc", {f, fc}, {y});
  g.outputs.push_back(y);
  return g;
}

matmul_work work_at(const graph& g, int64_t batch) {
  auto shape = g.values[g.inputs[0]].shape;
  shape[0] = batch;
  auto opt = optimize(g, {shape});
  REQUIRE_MESSAGE(opt, opt.error().message);
  return measure_matmul_work(*opt);
}

struct writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&, size_t bytes) override {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
};

/// Runs `g` on `rows` random rows with 2 compute threads; returns the
/// relative error against the reference interpreter and the profile.
std::pair<double, std::string> run_two_threads(const graph& g, int64_t rows,
                                               int64_t chunk_min_matmul_rows) {
  std::mt19937 rng(7);
  auto shape = g.values[g.inputs[0]].shape;
  shape[0] = rows;
  auto x = random_floats(static_cast<size_t>(element_count(shape)), rng);
  std::string bytes(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  auto plain = specialize(g, {shape});
  REQUIRE_MESSAGE(plain, plain.error().message);
  auto want = run_reference_graph(*plain, {bytes});
  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "t";
  cfg.config.max_batch_size = 8;
  cfg.threads = 2;
  cfg.profile = true;
  cfg.chunk_min_matmul_rows = chunk_min_matmul_rows;
  auto model = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(rows);
  view.inputs.push_back({"x", datatype::fp32, shape,
                         reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
  writer out;
  auto r = model->make_instance()->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  REQUIRE(out.buffers.size() == 1);
  return {relative_error(as_floats(out.buffers[0]), as_floats(want[0])), model->profile_report()};
}

} // namespace

TEST_CASE("a matmul-bound plan at few rows per chunk starves its matmuls; convolutions do not") {
  std::mt19937 rng(3);
  auto mlp = mlp_graph(16, rng);
  // One row: 16 tokens of rows for every weight matrix.
  auto one = work_at(mlp, 1);
  CHECK(one.matmul_rows == 16);
  CHECK(one.conv_flop == 0);
  CHECK(one.matmul_flop == doctest::Approx(2.0 * 16 * 64 * 256 * 2));
  CHECK(chunks_starve_matmuls(one, 64));
  CHECK_FALSE(chunks_starve_matmuls(one, 16));
  CHECK_FALSE(chunks_starve_matmuls(one, 0)); // 0: always row chunks
  // Four rows: 64 tokens, enough.
  auto four = work_at(mlp, 4);
  CHECK(four.matmul_rows == 64);
  CHECK_FALSE(chunks_starve_matmuls(four, 64));
  // A CNN whose classifier is a one-row Gemm: the convolution's FLOPs rule.
  auto cnn = work_at(cnn_graph(rng), 1);
  CHECK(cnn.matmul_rows == 1);
  CHECK(cnn.conv_flop > cnn.matmul_flop);
  CHECK_FALSE(chunks_starve_matmuls(cnn, 64));
}

TEST_CASE("a batch whose row chunks would starve the matmuls runs as one plan on both threads") {
  std::mt19937 rng(4);
  auto mlp = mlp_graph(16, rng);
  // 4 rows on 2 threads: chunks of one row (16 matmul rows) starve at 64.
  auto [err, text] = run_two_threads(mlp, 4, 64);
  CHECK(err < 1e-5);
  CHECK(text.find("plan: batch 4, steps split for 2 thread(s), 1 run(s)") != std::string::npos);
  CHECK(text.find("plan: batch 1, steps split for 1 thread(s)") == std::string::npos);
  // 0 keeps the row chunks: four one-row plans, one thread each.
  auto [chunk_err, chunk_text] = run_two_threads(mlp, 4, 0);
  CHECK(chunk_err < 1e-5);
  CHECK(chunk_text.find("plan: batch 1, steps split for 1 thread(s), 4 run(s)")
        != std::string::npos);
  // A CNN keeps its row chunks at the default.
  auto [cnn_err, cnn_text] = run_two_threads(cnn_graph(rng), 4, 64);
  CHECK(cnn_err < 1e-5);
  CHECK(cnn_text.find("plan: batch 1, steps split for 1 thread(s), 4 run(s)")
        != std::string::npos);
}

TEST_CASE("config.pbtxt's chunk_min_matmul_rows: a row count, else a clear load error") {
  std::mt19937 rng(5);
  auto g = mlp_graph(16, rng);
  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "t";
  cfg.config.max_batch_size = 4;
  cfg.threads = 2;
  for (std::string bad : {"-1", "many", "", "70000"}) {
    CAPTURE(bad);
    cfg.config.parameters["chunk_min_matmul_rows"] = bad;
    auto model = load_onnx_graph(g, cfg);
    REQUIRE_FALSE(model);
    CHECK(model.error().message.find("\"chunk_min_matmul_rows\" is '" + bad + "'")
          != std::string::npos);
    CHECK(model.error().message.find("from 0 (always row chunks) to 65536") != std::string::npos);
  }
  cfg.config.parameters["chunk_min_matmul_rows"] = "0";
  CHECK(load_onnx_graph(g, cfg));
}
