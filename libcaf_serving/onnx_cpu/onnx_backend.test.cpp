/// The compiled plans against the reference interpreter on small graphs built
/// in code: every convolution layout (NCHW image input, blocked, NHWC), every
/// way a step is split over threads (by image, by output channel, by row),
/// Winograd, the reorders between layouts, pooling, and Gemm as a oneDNN matmul.

#include "onnx_cpu/onnx_backend.hpp"

#include "engine_kernels.hpp"
#include "onnx/op_registry.hpp"
#include "onnx_cpu/cpu_level.hpp"
#include "onnx/testing.hpp"
#include "onnx_cpu/work_pool.hpp"

#include <doctest/doctest.h>

#include <omp.h>

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <future>
#include <random>
#include <thread>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;

namespace {

/// What this process's ISA runs (cpu_level.hpp), for the plans' texts: the
/// blocked layout ("nChw16c" with AVX-512, else "nChw8c"), oneDNN 2.6's
/// Winograd convolution and the engine's direct one (both AVX-512 only).
const std::string blocked = process_cpu_level().channel_block == 16 ? "nChw16c" : "nChw8c";
const std::string blocked2 = blocked + "->" + blocked;
const std::string wino = process_cpu_level().channel_block == 16 ? "winograd" : "direct";
/// "engine.conv <layouts><split>" where the engine's kernel runs, else oneDNN's `fallback`.
std::string engine_or(const std::string& split, const std::string& fallback) {
  return caf_serving::kernels::cpu::engine_conv_supported() ? "engine.conv " + blocked2 + split
                                                            : fallback;
}

struct writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&, size_t bytes) override {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
};

int add_weights(graph& g, const std::string& name, std::vector<int64_t> shape, std::mt19937& rng,
                float scale) {
  auto t = make_tensor(datatype::fp32, shape);
  auto v = random_floats(t->elements(), rng, scale);
  std::memcpy(t->as_mut<float>(), v.data(), v.size() * 4);
  return g.add_constant(name, t);
}

struct conv_case {
  int64_t ic, oc, h, w, k, stride, group;
  bool residual; ///< adds the block's input (needs ic == oc, stride 1)
  bool chain;    ///< a second convolution after the first, then a Mul (an NCHW reader)
  bool pool;     ///< MaxPool 3x3/2 after the convolution
};

/// x -> Conv(+bias) [-> Add x] -> Relu [-> Conv -> Relu -> Mul 0.5] [-> MaxPool] -> y;
/// with both `chain` and `pool` the MaxPool comes before the second Conv.
graph conv_graph(const conv_case& c, std::mt19937& rng) {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, c.ic, c.h, c.w}, true);
  g.inputs.push_back(x);
  auto conv = [&](int in, int64_t ic, int64_t oc, int64_t k, int64_t stride, int64_t group,
                  const std::string& name) {
    int w = add_weights(g, name + ".w", {oc, ic / group, k, k}, rng, 1.0f / std::sqrt(ic * k * k));
    int b = add_weights(g, name + ".b", {oc}, rng, 0.1f);
    int y = g.add_value(name + ".y");
    auto& n = g.add_node("Conv", name, {in, w, b}, {y});
    n.set_ints("kernel_shape", {k, k});
    n.set_ints("strides", {stride, stride});
    n.set_ints("pads", {k / 2, k / 2, k / 2, k / 2});
    n.set_i("group", group);
    return y;
  };
  int y = conv(x, c.ic, c.oc, c.k, c.stride, c.group, "conv1");
  if (c.residual) {
    int s = g.add_value("sum");
    g.add_node("Add", "add", {y, x}, {s});
    y = s;
  }
  int r = g.add_value("relu1");
  g.add_node("Relu", "relu1", {y}, {r});
  y = r;
  auto pool = [&] {
    int p = g.add_value("pooled");
    auto& n = g.add_node("MaxPool", "pool", {y}, {p});
    n.set_ints("kernel_shape", {3, 3});
    n.set_ints("strides", {2, 2});
    n.set_ints("pads", {1, 1, 1, 1});
    y = p;
  };
  if (c.pool && c.chain)
    pool();
  if (c.chain) {
    y = conv(y, c.oc, c.oc, 3, 1, 1, "conv2");
    int r2 = g.add_value("relu2");
    g.add_node("Relu", "relu2", {y}, {r2});
    auto half = make_tensor(datatype::fp32, {});
    half->as_mut<float>()[0] = 0.5f;
    int hv = g.add_constant("half", half);
    int m = g.add_value("scaled");
    g.add_node("Mul", "mul", {r2, hv}, {m});
    y = m;
  }
  if (c.pool && !c.chain)
    pool();
  g.values[y].name = "y";
  g.outputs.push_back(y);
  return g;
}

/// A model "t" batching up to 8 rows, named as a file in errors.
onnx_model_config test_config() {
  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "t";
  cfg.config.max_batch_size = 8;
  return cfg;
}

/// Random inputs for `g` at `batch` rows and the reference interpreter's
/// output for them (no fusion, no layouts, no Winograd).
struct reference_run {
  int64_t batch = 0;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> data;
  std::vector<float> want;
};

reference_run reference(const graph& g, int64_t batch, std::mt19937& rng) {
  reference_run ref;
  ref.batch = batch;
  std::vector<std::string> inputs;
  for (int v : g.inputs) {
    auto s = g.values[v].shape;
    s[0] = batch;
    ref.shapes.push_back(s);
    ref.data.push_back(random_floats(element_count(s), rng));
    inputs.push_back(as_bytes(ref.data.back()));
  }
  auto plain = specialize(g, ref.shapes);
  REQUIRE_MESSAGE(plain, plain.error().message);
  auto want = run_reference_graph(*plain, inputs);
  REQUIRE(want.size() == 1);
  ref.want = as_floats(std::vector<uint8_t>(want[0].begin(), want[0].end()));
  return ref;
}

/// Runs `g` through a compiled plan (`threads` compute threads, Winograd, the
/// engine's 1x1 convolution and bands of rows as given) on `ref`'s inputs;
/// returns the relative error of the plan's output against `ref`, and the
/// plan text in `plan_text`.
/// The plan of `g` under `cfg` (profiled) against `ref`: its relative error,
/// and its profile's text in `plan_text`.
double plan_error(const graph& g, const reference_run& ref, onnx_model_config cfg,
                  std::string* plan_text) {
  cfg.profile = true;
  auto model = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(ref.batch);
  for (size_t i = 0; i < g.inputs.size(); ++i)
    view.inputs.push_back({g.values[g.inputs[i]].name, datatype::fp32, ref.shapes[i],
                           reinterpret_cast<const uint8_t*>(ref.data[i].data()),
                           ref.data[i].size() * 4});
  writer out;
  auto instance = model->make_instance();
  auto r = instance->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  REQUIRE(out.buffers.size() == 1);
  if (plan_text)
    *plan_text = model->profile_report();
  return relative_error(as_floats(out.buffers[0]), ref.want);
}

double plan_error(const graph& g, const reference_run& ref, unsigned threads, bool winograd,
                  std::string* plan_text = nullptr, bool engine_conv = true,
                  bool conv_bands = true) {
  auto cfg = test_config();
  cfg.threads = threads;
  cfg.winograd = winograd;
  cfg.engine_conv = engine_conv;
  cfg.conv_bands = conv_bands;
  return plan_error(g, ref, cfg, plan_text);
}

/// plan_error() on fresh random inputs at `batch` rows.
double plan_error(const graph& g, int64_t batch, unsigned threads, bool winograd,
                  std::mt19937& rng, std::string* plan_text = nullptr,
                  bool engine_conv = true, bool conv_bands = true) {
  return plan_error(g, reference(g, batch, rng), threads, winograd, plan_text, engine_conv,
                    conv_bands);
}

} // namespace

TEST_CASE("convolutions match the reference in every layout, split and algorithm") {
  std::mt19937 rng(11);
  // ic, oc, h, w, k, stride, group, residual, chain, pool
  std::vector<conv_case> cases{
    {3, 32, 17, 15, 7, 2, 1, false, false, true}, // image input (NCHW) -> blocked, pool
    {32, 64, 9, 9, 1, 1, 1, false, true, false},  // 1x1, then Winograd 3x3, then NCHW Mul
    {32, 32, 10, 11, 3, 1, 1, true, false, false}, // Winograd with the residual
    {32, 48, 9, 9, 3, 2, 1, false, false, false},  // strided 3x3
    {20, 20, 8, 8, 3, 1, 1, true, true, false},    // 20 channels: NHWC, split by rows
    {32, 32, 8, 8, 3, 1, 4, false, false, true},   // grouped: NHWC
    {3, 32, 17, 15, 7, 2, 1, false, true, true},   // MaxPool between blocked convolutions
    {3, 8, 17, 15, 7, 2, 1, false, true, true},    // into 8 channels: NHWC (nChw8c at 8)
    {64, 64, 1, 1, 1, 1, 1, true, false, false},   // 1x1 spatial: layouts share bytes
    {64, 128, 11, 9, 1, 2, 1, false, false, false}, // strided 1x1 (ResNet's downsample)
    {48, 192, 7, 13, 1, 1, 1, false, true, false},  // channel pieces of 48: no Winograd
    // Input heavier than the weights: at batch 1 on several threads the
    // engine's 1x1 kernel, by rows: the residual and a last tile of 5 pixels,
    // stride 2 with rows of 10, two passes of 128 input channels, and bands
    // of 70 pixels that are two chunks (60 + 10) at 2048 input channels.
    {64, 64, 11, 13, 1, 1, 1, true, false, false},
    {64, 128, 22, 19, 1, 2, 1, false, false, false},
    {256, 64, 10, 9, 1, 1, 1, false, true, false},
    {2048, 64, 2, 70, 1, 1, 1, false, false, false},
    // Other convolutions of one such image: bands of rows on dense copies.
    // Winograd (38 rows: bands of whole 4-row tiles, the last one of 2 rows),
    // then a chained 3x3 on 32 channels; stride 2 (12 output rows from 23);
    // a 5x5 kernel (two rows of padding above and below).
    {16, 32, 38, 11, 3, 1, 1, false, true, false},
    {32, 32, 23, 17, 3, 2, 1, false, false, false},
    {16, 16, 40, 12, 5, 1, 1, false, false, false},
    // The engine's direct kernel on other windows (Winograd off, or not
    // applicable): strided 3x3 by rows and, where the weights outweigh the
    // input, by channels; 3x3 with the residual; 5x5; a 7x7 stride-2 window
    // on 16 channels; a 2x2 window (padding 1 on every side: one row and
    // column more out than in); a 1x1 split by channels.
    {32, 64, 23, 17, 3, 2, 1, false, false, false},
    {128, 128, 6, 7, 3, 2, 1, false, false, false},
    {64, 64, 10, 11, 3, 1, 1, true, false, false},
    {16, 64, 12, 9, 5, 1, 1, false, false, false},
    {16, 64, 17, 15, 7, 2, 1, false, false, false},
    {16, 64, 7, 8, 2, 1, 1, false, false, false},
    {256, 256, 3, 3, 1, 1, 1, false, false, false},
    // Depthwise (MobileNet's): blocked where the channels fill whole blocks,
    // split by blocks of channels, each with its own blocks of the input;
    // stride 2; 24 channels (nChw8c with 8-channel blocks, else NHWC).
    {64, 64, 9, 11, 3, 1, 64, false, true, false},
    {32, 32, 13, 10, 5, 2, 32, false, false, true},
    {24, 24, 9, 9, 3, 1, 24, true, false, false},
    // ConvNeXt's 7x7 depthwise over a 2x2 map: oneDNN has no blocked kernel
    // for that window, so it runs NHWC.
    {32, 32, 2, 2, 7, 1, 32, true, false, false},
    {20, 20, 6, 6, 3, 1, 20, true, false, false},
    {32, 32, 8, 8, 3, 1, 4, true, false, false},
    {5, 5, 9, 9, 3, 1, 1, true, false, false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    auto g = conv_graph(cases[i], rng);
    for (int64_t batch : {1, 3}) {
      auto ref = reference(g, batch, rng);
      for (unsigned threads : {1u, 2u, 4u}) // 4 threads on 3 rows: split by image
        for (bool wino : {false, true}) {
          bool engine = !wino; // each way once per batch and thread count
          CAPTURE(batch);
          CAPTURE(threads);
          CAPTURE(wino);
          CAPTURE(engine);
          std::string text;
          double err = plan_error(g, ref, threads, wino, &text, engine);
          CAPTURE(text);
          CHECK(err < 1e-5);
          // Every layout pair chosen has a fast oneDNN kernel.
          CHECK(text.find("reference kernel") == std::string::npos);
        }
    }
  }
}

TEST_CASE("the plan uses Winograd, channel splits and blocked layouts where it should") {
  // At every ISA level the same splits and layouts; Winograd and the engine's
  // kernel where the level has them (AVX-512), oneDNN's direct kernel else.
  std::mt19937 rng(12);
  auto g = conv_graph({32, 128, 9, 9, 1, 1, 1, false, true, false}, rng);
  std::string text;
  CHECK(plan_error(g, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv." + wino + " " + blocked2 + " by channel") != std::string::npos);
  // The 1x1 layer, whose weights outweigh its input: the engine's kernel by channels.
  CHECK(text.find(engine_or(" by channel", "onednn.conv.direct " + blocked2 + " by channel"))
        != std::string::npos);
  CHECK(text.find("ToNCHW") != std::string::npos); // before the Mul
  CHECK(plan_error(g, 1, 2, false, rng, &text) < 1e-5);
  CHECK(text.find("winograd") == std::string::npos);
  // Pieces of 32 channels would each transform the whole input: direct.
  auto narrow = conv_graph({32, 64, 9, 9, 1, 1, 1, false, true, false}, rng);
  CHECK(plan_error(narrow, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("winograd") == std::string::npos);
  CHECK(plan_error(narrow, 1, 1, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv." + wino + " " + blocked2 + "]") != std::string::npos);
  // A 1x1 convolution whose input outweighs its weights: by rows on the
  // engine's kernel, unless that is turned off; on one thread, one item.
  auto wide = conv_graph({64, 128, 22, 19, 1, 2, 1, false, false, false}, rng);
  CHECK(plan_error(wide, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find(engine_or(" by row", "onednn.conv.direct " + blocked2 + " by channel"))
        != std::string::npos);
  CHECK(plan_error(wide, 1, 2, true, rng, &text, false) < 1e-5);
  CHECK(text.find("engine.conv") == std::string::npos);
  CHECK(text.find("onednn.conv.direct " + blocked2 + " by channel") != std::string::npos);
  CHECK(plan_error(wide, 1, 1, true, rng, &text) < 1e-5);
  CHECK(text.find(engine_or("]", "onednn.conv.direct " + blocked2 + "]")) != std::string::npos);
  // A strided 3x3 convolution: the engine's kernel too, by rows where the
  // input outweighs the weights or there are too few groups of 64 output
  // channels for the threads, else by channels; Winograd takes the
  // stride-1 3x3 where it is on, the engine's kernel where it is off.
  auto strided64 = conv_graph({32, 64, 23, 17, 3, 2, 1, false, false, false}, rng);
  CHECK(plan_error(strided64, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find(engine_or(" by row", "onednn.conv.direct " + blocked2 + " by channel"))
        != std::string::npos);
  auto deep = conv_graph({128, 128, 6, 7, 3, 2, 1, false, false, false}, rng);
  CHECK(plan_error(deep, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find(engine_or(" by channel", "onednn.conv.direct " + blocked2 + " by channel"))
        != std::string::npos);
  // Several images in one plan: the engine's kernel where the input of an
  // image outweighs the weights, oneDNN (which reuses weights across images)
  // where it does not.
  CHECK(plan_error(wide, 3, 1, true, rng, &text) < 1e-5);
  CHECK(text.find(engine_or("]", "onednn.conv.direct " + blocked2 + "]")) != std::string::npos);
  CHECK(plan_error(deep, 3, 1, true, rng, &text) < 1e-5);
  CHECK(text.find("engine.conv") == std::string::npos);
  auto same = conv_graph({64, 64, 10, 11, 3, 1, 1, true, false, false}, rng);
  CHECK(plan_error(same, 1, 1, true, rng, &text) < 1e-5);
  CHECK(text.find("engine.conv") == std::string::npos);
  CHECK(plan_error(same, 1, 1, false, rng, &text) < 1e-5);
  CHECK(text.find(engine_or("]", "onednn.conv.direct " + blocked2 + "]")) != std::string::npos);
  // Other convolutions of one image whose input outweighs its weights: bands
  // of rows on dense copies, Winograd where it applies, unless turned off.
  auto tall = conv_graph({16, 32, 38, 11, 3, 1, 1, false, false, false}, rng);
  CHECK(plan_error(tall, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv." + wino + " " + blocked2 + " by row (copies)")
        != std::string::npos);
  CHECK(plan_error(tall, 1, 2, false, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv.direct " + blocked2 + " by row (copies)") != std::string::npos);
  CHECK(plan_error(tall, 1, 2, true, rng, &text, true, false) < 1e-5);
  CHECK(text.find("(copies)") == std::string::npos);
  CHECK(text.find("by channel") != std::string::npos);
  CHECK(plan_error(tall, 1, 1, true, rng, &text) < 1e-5); // one thread: no split
  CHECK(text.find("(copies)") == std::string::npos);
  auto strided = conv_graph({32, 32, 23, 17, 3, 2, 1, false, false, false}, rng);
  CHECK(plan_error(strided, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv.direct " + blocked2 + " by row (copies)") != std::string::npos);
  auto pooled = conv_graph({3, 32, 17, 15, 7, 2, 1, false, true, true}, rng);
  CHECK(plan_error(pooled, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.pool " + blocked + " by channel") != std::string::npos);
  // A depthwise convolution stays blocked, split by blocks of channels.
  auto dw = conv_graph({64, 64, 9, 11, 3, 1, 64, false, true, false}, rng);
  CHECK(plan_error(dw, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv.direct " + blocked2 + " by channel") != std::string::npos);
  CHECK(text.find("nhwc") == std::string::npos);
  // 20 channels are no whole blocks at any level: NHWC.
  auto rows = conv_graph({20, 20, 8, 8, 3, 1, 1, false, true, false}, rng);
  CHECK(plan_error(rows, 1, 2, true, rng, &text) < 1e-5);
  CHECK(text.find("onednn.conv.direct nhwc->nhwc by row") != std::string::npos);
  CHECK(plan_error(rows, 3, 4, true, rng, &text) < 1e-5);
  CHECK(text.find("by image") != std::string::npos);
}

TEST_CASE("parameters blocked_layout \"false\" keeps convolutions and pools NHWC, with the "
          "same answers") {
  std::mt19937 rng(17);
  // An image into 32 channels, MaxPool, a chained convolution; a residual block.
  for (auto c : std::vector<conv_case>{{3, 32, 17, 15, 7, 2, 1, false, true, true},
                                       {32, 32, 10, 11, 3, 1, 1, true, false, false}}) {
    auto g = conv_graph(c, rng);
    for (int64_t batch : {1, 3}) {
      CAPTURE(batch);
      auto cfg = test_config();
      cfg.threads = 2;
      cfg.config.parameters["blocked_layout"] = "false";
      std::string text;
      CHECK(plan_error(g, reference(g, batch, rng), cfg, &text) < 1e-5);
      CAPTURE(text);
      CHECK(text.find("nhwc->nhwc") != std::string::npos);
      CHECK(text.find("nChw") == std::string::npos);
      CHECK(text.find("ToBlocked") == std::string::npos);
      CHECK(text.find("reference kernel") == std::string::npos);
    }
  }
  auto cfg = test_config();
  cfg.config.parameters["blocked_layout"] = "nhwc";
  auto refused =
    load_onnx_graph(conv_graph({3, 32, 9, 9, 3, 1, 1, false, false, false}, rng), cfg);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("parameters \"blocked_layout\" is 'nhwc'")
        != std::string::npos);
}

TEST_CASE("HardSwish after a convolution or a matmul runs as its fused epilogue") {
  // MobileNetV3's block: 3x3 convolution (Winograd where asked) -> HardSwish ->
  // 1x1 convolution -> HardSwish, and a classifier's MatMul + bias -> HardSwish.
  std::mt19937 rng(31);
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 16, 9, 9}, true);
  g.inputs.push_back(x);
  auto conv_hswish = [&](int in, int64_t ic, int64_t oc, int64_t k, const std::string& name) {
    int w = add_weights(g, name + ".w", {oc, ic, k, k}, rng, 1.0f / std::sqrt(ic * k * k));
    int b = add_weights(g, name + ".b", {oc}, rng, 0.5f);
    int c = g.add_value(name + ".conv");
    auto& n = g.add_node("Conv", name, {in, w, b}, {c});
    n.set_ints("kernel_shape", {k, k});
    n.set_ints("pads", {k / 2, k / 2, k / 2, k / 2});
    int y = g.add_value(name + ".y");
    g.add_node("HardSwish", name + ".hswish", {c}, {y});
    return y;
  };
  int y = conv_hswish(conv_hswish(x, 16, 32, 3, "conv1"), 32, 32, 1, "conv2");
  g.values[y].name = "y";
  g.outputs.push_back(y);
  for (int64_t batch : {1, 3}) {
    auto ref = reference(g, batch, rng);
    for (bool wino : {false, true}) {
      CAPTURE(batch);
      CAPTURE(wino);
      std::string text;
      CHECK(plan_error(g, ref, 2, wino, &text) < 1e-5);
      CHECK(text.find("FusedConv+HardSwish") != std::string::npos);
      CHECK(text.find("reference") == std::string::npos);
    }
  }

  graph m;
  m.opset = 17;
  int a = m.add_value("a", datatype::fp32, {-1, 24}, true);
  m.inputs.push_back(a);
  int w = add_weights(m, "w", {24, 40}, rng, 0.3f);
  int b = add_weights(m, "b", {40}, rng, 1.0f);
  int mm = m.add_value("mm"), biased = m.add_value("biased"), out = m.add_value("out");
  m.add_node("MatMul", "matmul", {a, w}, {mm});
  m.add_node("Add", "bias", {mm, b}, {biased});
  m.add_node("HardSwish", "hswish", {biased}, {out});
  m.outputs.push_back(out);
  std::string text;
  CHECK(plan_error(m, 5, 2, false, rng, &text) < 1e-5);
  CHECK(text.find("FusedMatMul+HardSwish") != std::string::npos);
  CHECK(text.find("reference") == std::string::npos);
}

TEST_CASE("element-wise operators split into bands over the threads") {
  // x [-1, 50, 100]: Abs -> Log -> Max(., x) -> Mod(., x, fmod 1) -> HardSigmoid -> Sigmoid
  // -> Mul(., x); at 3 rows 15000 elements, bands of whole 2048-element blocks and a short
  // last one.
  std::mt19937 rng(41);
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 50, 100}, true);
  g.inputs.push_back(x);
  int a = g.add_value("abs"), l = g.add_value("log"), m = g.add_value("max");
  int r = g.add_value("mod");
  int y = g.add_value("y");
  g.add_node("Abs", "abs", {x}, {a});
  g.add_node("Log", "log", {a}, {l});
  g.add_node("Max", "max", {l, x}, {m});
  g.add_node("Mod", "mod", {m, x}, {r}).set_i("fmod", 1);
  int h = g.add_value("hsigmoid"), sg = g.add_value("sigmoid");
  g.add_node("HardSigmoid", "hsigmoid", {r}, {h});
  g.add_node("Sigmoid", "sigmoid", {h}, {sg});
  g.add_node("Mul", "silu", {sg, x}, {y}); // EfficientNet's x * sigmoid(x)
  g.outputs.push_back(y);
  for (int64_t batch : {1, 3}) {
    auto ref = reference(g, batch, rng);
    for (unsigned threads : {1u, 2u, 4u}) {
      CAPTURE(batch);
      CAPTURE(threads);
      std::string text;
      CHECK(plan_error(g, ref, threads, false, &text) == 0); // the same kernel on slices
      CHECK(text.find("engine.elementwise") != std::string::npos);
      CHECK(text.find("reference") == std::string::npos);
    }
  }
}

TEST_CASE("the unary functions of ops_more.cpp and PRelu split into bands over the threads") {
  // x [-1, 40, 100] -> Sin -> Softplus -> Mish -> Softsign -> PRelu (slope of x's shape)
  // -> Selu; at 2 rows 8000 elements, four 2048-element blocks. (Not Gelu: the
  // passes make it FusedGeluTanh or FusedGelu, the engine's own kernels.)
  std::mt19937 rng(43);
  graph g;
  g.opset = 20;
  int x = g.add_value("x", datatype::fp32, {-1, 40, 100}, true);
  g.inputs.push_back(x);
  int v = x;
  for (const char* op : {"Sin", "Softplus", "Mish", "Softsign"}) {
    int next = g.add_value(std::string(op) + ".y");
    g.add_node(op, op, {v}, {next});
    v = next;
  }
  int slope = add_weights(g, "slope", {40, 100}, rng, 1.0f);
  int p = g.add_value("prelu"), y = g.add_value("y");
  g.add_node("PRelu", "prelu", {v, slope}, {p});
  g.add_node("Selu", "selu", {p}, {y});
  g.outputs.push_back(y);
  auto ref = reference(g, 2, rng);
  for (unsigned threads : {1u, 2u, 4u}) {
    CAPTURE(threads);
    std::string text;
    CHECK(plan_error(g, ref, threads, false, &text) == 0); // the same kernel on slices
    CHECK(text.find("engine.elementwise") != std::string::npos);
    // PRelu's slope [40, 100] broadcasts to [2, 40, 100]: a whole reference step.
    CHECK(text.find("reference") != std::string::npos);
  }
}

TEST_CASE("ONNX's Gelu (20) fuses into the MatMul before it; Attention (23) is FusedAttention") {
  // x [-1, 8, 32] -> MatMul + bias -> Gelu -> Attention(h, h, h, float mask [8, 8]), 4 heads
  // -> Attention(a, a, a, is_causal), 2 heads.
  std::mt19937 rng(47);
  graph g;
  g.opset = 23;
  int x = g.add_value("x", datatype::fp32, {-1, 8, 32}, true);
  g.inputs.push_back(x);
  int w = add_weights(g, "w", {32, 32}, rng, 0.3f);
  int b = add_weights(g, "b", {32}, rng, 1.0f);
  int mask = add_weights(g, "mask", {8, 8}, rng, 2.0f);
  int mm = g.add_value("mm"), biased = g.add_value("biased"), h = g.add_value("h");
  int y = g.add_value("y");
  g.add_node("MatMul", "matmul", {x, w}, {mm});
  g.add_node("Add", "bias", {mm, b}, {biased});
  g.add_node("Gelu", "gelu", {biased}, {h});
  int a = g.add_value("a");
  auto& att = g.add_node("Attention", "attention", {h, h, h, mask}, {a});
  att.set_i("q_num_heads", 4);
  att.set_i("kv_num_heads", 4);
  auto& causal = g.add_node("Attention", "causal", {a, a, a}, {y});
  causal.set_i("q_num_heads", 2);
  causal.set_i("kv_num_heads", 2);
  causal.set_i("is_causal", 1);
  g.outputs.push_back(y);
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    std::string text;
    CHECK(plan_error(g, 3, threads, false, rng, &text) < 1e-5);
    CHECK(text.find("FusedMatMul+Gelu") != std::string::npos);
    CHECK(text.find("onednn.matmul+engine.softmax") != std::string::npos);
    CHECK(text.find("reference") == std::string::npos);
  }
}

TEST_CASE("Attention (23) rewritten to FusedAttention gives zeros for a row its mask hides") {
  // A float mask of minus infinity across row 2: ONNX's Attention (the reference
  // kernel) answers zeros there; the fused softmax must not answer NaN.
  std::mt19937 rng(53);
  graph g;
  g.opset = 23;
  int x = g.add_value("x", datatype::fp32, {-1, 4, 8}, true);
  g.inputs.push_back(x);
  auto m = make_tensor(datatype::fp32, {4, 4});
  for (int j = 0; j < 4; ++j)
    m->as_mut<float>()[2 * 4 + j] = -INFINITY;
  int mask = g.add_constant("mask", m);
  int y = g.add_value("y");
  auto& att = g.add_node("Attention", "attention", {x, x, x, mask}, {y});
  att.set_i("q_num_heads", 2);
  att.set_i("kv_num_heads", 2);
  g.outputs.push_back(y);
  std::string text;
  CHECK(plan_error(g, 2, 1, false, rng, &text) < 1e-5);
  CHECK(text.find("engine.softmax") != std::string::npos);
}

TEST_CASE("4-D Attention (torch's scaled_dot_product_attention) runs as FusedAttention") {
  // x [-1, 4, 6, 8] as [B, H, S, D]: Attention(x, k, x, is_causal) with k = x * 0.5,
  // transposed to [B, S, H*D] around the fused step and back.
  std::mt19937 rng(59);
  graph g;
  g.opset = 23;
  int x = g.add_value("x", datatype::fp32, {-1, 4, 6, 8}, true);
  g.inputs.push_back(x);
  auto half = make_tensor(datatype::fp32, {});
  half->as_mut<float>()[0] = 0.5f;
  int k = g.add_value("k"), y = g.add_value("y");
  g.add_node("Mul", "k", {x, g.add_constant("half", half)}, {k});
  g.add_node("Attention", "sdpa", {x, k, x}, {y}).set_i("is_causal", 1);
  g.outputs.push_back(y);
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    std::string text;
    CHECK(plan_error(g, 2, threads, false, rng, &text) < 1e-5);
    CHECK(text.find("onednn.matmul+engine.softmax") != std::string::npos);
  }
}

TEST_CASE("a Pad of zeros before a convolution becomes the convolution's padding") {
  // x [-1, 8, 10, 10] -> Pad (spatial, uneven, zeros) -> Conv 3x3 + bias -> Relu; with a
  // fill of 1.5 instead, the Pad stays a step of its own (the convolution pads zeros).
  for (float fill : {0.0f, 1.5f}) {
    CAPTURE(fill);
    std::mt19937 rng(53);
    graph g;
    g.opset = 17;
    int x = g.add_value("x", datatype::fp32, {-1, 8, 10, 10}, true);
    g.inputs.push_back(x);
    auto pads = make_tensor(datatype::int64, {8});
    const int64_t amounts[8] = {0, 0, 1, 2, 0, 0, 2, 1};
    std::memcpy(pads->as_mut<int64_t>(), amounts, sizeof(amounts));
    auto value = make_tensor(datatype::fp32, {});
    value->as_mut<float>()[0] = fill;
    int padded = g.add_value("padded"), conv = g.add_value("conv"), y = g.add_value("y");
    g.add_node("Pad", "pad", {x, g.add_constant("pads", pads), g.add_constant("fill", value)},
               {padded});
    int w = add_weights(g, "w", {16, 8, 3, 3}, rng, 0.2f);
    int b = add_weights(g, "b", {16}, rng, 0.1f);
    g.add_node("Conv", "conv", {padded, w, b}, {conv}).set_ints("kernel_shape", {3, 3});
    g.add_node("Relu", "relu", {conv}, {y});
    g.outputs.push_back(y);
    std::string text;
    CHECK(plan_error(g, 2, 2, false, rng, &text) < 1e-5);
    CHECK((text.find("reference") == std::string::npos) == (fill == 0.0f));
  }
}

TEST_CASE("SiLU (x * sigmoid(x)) after a convolution or a matmul runs as its fused epilogue") {
  // EfficientNet's activation as torch exports it: Sigmoid(y) and Mul(y, sigmoid), in
  // either order, after a convolution (with a residual Add before it), and after a
  // MatMul + bias.
  std::mt19937 rng(61);
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 32, 9, 9}, true);
  g.inputs.push_back(x);
  auto silu = [&](int v, const std::string& name, bool sigmoid_first) {
    int s = g.add_value(name + ".sigmoid"), y = g.add_value(name + ".silu");
    g.add_node("Sigmoid", name + ".sigmoid", {v}, {s});
    auto operands = sigmoid_first ? std::vector<int>{s, v} : std::vector<int>{v, s};
    g.add_node("Mul", name + ".mul", operands, {y});
    return y;
  };
  auto conv = [&](int in, int64_t k, const std::string& name) {
    int w = add_weights(g, name + ".w", {32, 32, k, k}, rng, 1.0f / std::sqrt(32.0f * k * k));
    int b = add_weights(g, name + ".b", {32}, rng, 0.3f);
    int y = g.add_value(name + ".y");
    auto& n = g.add_node("Conv", name, {in, w, b}, {y});
    n.set_ints("kernel_shape", {k, k});
    n.set_ints("pads", {k / 2, k / 2, k / 2, k / 2});
    return y;
  };
  int a = silu(conv(x, 3, "conv1"), "act1", true);
  int sum = g.add_value("sum");
  g.add_node("Add", "residual", {conv(a, 1, "conv2"), x}, {sum});
  int y = silu(sum, "act2", false);
  g.values[y].name = "y";
  g.outputs.push_back(y);
  for (int64_t batch : {1, 3})
    for (bool wino : {false, true}) {
      CAPTURE(batch);
      CAPTURE(wino);
      std::string text;
      CHECK(plan_error(g, batch, 2, wino, rng, &text) < 1e-5);
      CHECK(text.find("FusedConv+Swish") != std::string::npos);
      CHECK(text.find("FusedConv+Swish+residual") != std::string::npos);
      CHECK(text.find("Sigmoid") == std::string::npos);
      CHECK(text.find("Mul") == std::string::npos);
      CHECK(text.find("reference") == std::string::npos);
    }

  graph m;
  m.opset = 17;
  int in = m.add_value("a", datatype::fp32, {-1, 24}, true);
  m.inputs.push_back(in);
  int w = add_weights(m, "w", {24, 40}, rng, 0.3f);
  int b = add_weights(m, "b", {40}, rng, 1.0f);
  int mm = m.add_value("mm"), biased = m.add_value("biased"), s = m.add_value("s");
  int out = m.add_value("out");
  m.add_node("MatMul", "matmul", {in, w}, {mm});
  m.add_node("Add", "bias", {mm, b}, {biased});
  m.add_node("Sigmoid", "sigmoid", {biased}, {s});
  m.add_node("Mul", "silu", {biased, s}, {out});
  m.outputs.push_back(out);
  std::string text;
  CHECK(plan_error(m, 5, 2, false, rng, &text) < 1e-5);
  CHECK(text.find("FusedMatMul+Swish") != std::string::npos);
  CHECK(text.find("reference") == std::string::npos);
}

TEST_CASE("squeeze-and-excitation's channel scale runs in the convolutions' layout") {
  // Conv -> Relu -> [GlobalAveragePool -> Conv -> Relu -> Conv -> Sigmoid] -> Mul -> Conv:
  // 32 channels stay blocked, 20 NHWC; torchvision writes scale * x, others x * scale.
  std::mt19937 rng(51);
  for (int64_t c : {32, 20})
    for (bool scale_first : {true, false}) {
      graph g;
      g.opset = 17;
      int x = g.add_value("x", datatype::fp32, {-1, c, 10, 9}, true);
      g.inputs.push_back(x);
      auto conv = [&](int in, int64_t ic, int64_t oc, int64_t k, const std::string& name,
                      const char* act) {
        int w = add_weights(g, name + ".w", {oc, ic, k, k}, rng, 1.0f / std::sqrt(ic * k * k));
        int b = add_weights(g, name + ".b", {oc}, rng, 0.2f);
        int y = g.add_value(name + ".y");
        auto& n = g.add_node("Conv", name, {in, w, b}, {y});
        n.set_ints("kernel_shape", {k, k});
        n.set_ints("pads", {k / 2, k / 2, k / 2, k / 2});
        if (!act)
          return y;
        int a = g.add_value(name + ".act");
        g.add_node(act, name + ".act", {y}, {a});
        return a;
      };
      int a = conv(x, c, c, 3, "conv1", "Relu");
      int pooled = g.add_value("pooled");
      g.add_node("GlobalAveragePool", "pool", {a}, {pooled});
      int scale = conv(conv(pooled, c, 8, 1, "se1", "Relu"), 8, c, 1, "se2", "Sigmoid");
      int excited = g.add_value("excited");
      auto operands = scale_first ? std::vector<int>{scale, a} : std::vector<int>{a, scale};
      g.add_node("Mul", "excite", operands, {excited});
      int y = conv(excited, c, 16, 1, "project", nullptr);
      g.values[y].name = "y";
      g.outputs.push_back(y);
      for (int64_t batch : {1, 3}) {
        auto ref = reference(g, batch, rng);
        for (unsigned threads : {1u, 2u}) {
          CAPTURE(c);
          CAPTURE(scale_first);
          CAPTURE(batch);
          CAPTURE(threads);
          std::string text;
          CHECK(plan_error(g, ref, threads, false, &text) < 1e-5);
          CHECK(text.find(c == 32 ? "onednn.channel_scale " + blocked
                                  : std::string("onednn.channel_scale nhwc"))
                != std::string::npos);
          CHECK(text.find("reference") == std::string::npos);
          // One reorder in (the NCHW image) and one out (the graph output, written NCHW).
          CHECK(text.find("ToNCHW [onednn.reorder]  x1") != std::string::npos);
          auto in_reorder = c == 32 ? "ToBlocked [onednn.reorder]  x1"
                                    : "ToNHWC [onednn.reorder]  x1";
          CHECK(text.find(in_reorder) != std::string::npos);
        }
      }
    }
}

TEST_CASE("Gemm with transposed constant weights runs as a split oneDNN matmul") {
  std::mt19937 rng(13);
  for (bool trans_b : {true, false}) {
    CAPTURE(trans_b);
    graph g;
    g.opset = 17;
    int a = g.add_value("a", datatype::fp32, {-1, 96}, true);
    g.inputs.push_back(a);
    int w = add_weights(g, "w", trans_b ? std::vector<int64_t>{200, 96}
                                        : std::vector<int64_t>{96, 200},
                        rng, 0.1f);
    int c = add_weights(g, "c", {200}, rng, 0.1f);
    int y = g.add_value("y");
    auto& n = g.add_node("Gemm", "fc", {a, w, c}, {y});
    n.set_i("transB", trans_b ? 1 : 0);
    g.outputs.push_back(y);
    for (int64_t batch : {1, 5})
      for (unsigned threads : {1u, 2u}) {
        std::string text;
        CHECK(plan_error(g, batch, threads, true, rng, &text) < 1e-5);
        CHECK(text.find("FusedGemm [onednn.matmul]") != std::string::npos);
      }
  }
}

TEST_CASE("plans of every batch size share one copy of the reordered weights, whatever the cache") {
  std::mt19937 rng(14);
  auto g = conv_graph({32, 64, 9, 9, 1, 1, 1, false, true, false}, rng);
  auto cfg = test_config();
  cfg.config.parameters["plan_cache_size"] = "2";
  // Without Winograd every plan wants the same layouts; oneDNN's Winograd
  // layout depends on the batch, so those plans may each hold their own.
  bool wino = false;
  SUBCASE("Winograd off") { wino = false; }
  SUBCASE("Winograd on") { wino = true; }
  cfg.config.parameters["winograd"] = wino ? "true" : "false";
  auto model = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  size_t at_load = model->reordered_weight_bytes();
  CHECK(at_load > 0);
  auto instance = model->make_instance();
  auto x = random_floats(8 * 32 * 9 * 9, rng);
  std::vector<float> first;
  // Batches 1..8 and 1 again: the eight plans compiled at load, which a cache
  // of two for other shapes does not evict.
  for (int64_t batch : {1, 2, 3, 4, 5, 6, 7, 8, 1}) {
    CAPTURE(batch);
    executor::batch_view view;
    view.rows = static_cast<uint32_t>(batch);
    view.inputs.push_back({"x", datatype::fp32, {batch, 32, 9, 9},
                           reinterpret_cast<const uint8_t*>(x.data()),
                           static_cast<size_t>(batch * 32 * 81 * 4)});
    writer out;
    auto r = instance->execute(view, out);
    REQUIRE(r.index() == 0);
    auto got = as_floats(out.buffers.at(0));
    if (first.empty())
      first = got;
    else // the first image's result does not depend on the batch or the plan
      CHECK(relative_error(std::vector<float>(got.begin(), got.begin() + first.size()), first)
            < 1e-6);
  }
  if (wino) // layouts may differ per batch size; all were reordered at load
    CHECK(model->reordered_weight_bytes() <= 4 * at_load);
  else
    CHECK(model->reordered_weight_bytes() == at_load);
}

namespace {

/// CPU seconds of this thread and of the whole process.
std::pair<double, double> cpu_seconds() {
  auto secs = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  rusage self{}, all{};
  getrusage(RUSAGE_THREAD, &self);
  getrusage(RUSAGE_SELF, &all);
  return {secs(self), secs(all)};
}

} // namespace

TEST_CASE("a 1-thread instance computes on its caller alone, whatever OpenMP's default") {
  // oneDNN takes a primitive's thread count from OpenMP when the primitive is
  // created: plans compiled where OpenMP allows 8 threads must still not run
  // OpenMP teams when they execute.
  std::mt19937 rng(16);
  auto g = conv_graph({64, 256, 28, 28, 1, 1, 1, false, false, false}, rng);
  auto cfg = test_config();
  cfg.threads = 1;
  int saved = omp_get_max_threads();
  omp_set_num_threads(8);
  auto model = load_onnx_graph(g, cfg);
  omp_set_num_threads(saved);
  REQUIRE_MESSAGE(model, model.error().message);
  auto instance = model->make_instance();
  auto x = random_floats(64 * 28 * 28, rng);
  executor::batch_view view;
  view.rows = 1;
  view.inputs.push_back({"x", datatype::fp32, {1, 64, 28, 28},
                         reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
  // OpenMP threads that loading woke spin a little, then sleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto [self0, all0] = cpu_seconds();
  double self1 = self0, all1 = all0;
  for (int i = 0; i < 100000 && self1 - self0 < 0.2; ++i) {
    writer out;
    REQUIRE(instance->execute(view, out).index() == 0);
    std::tie(self1, all1) = cpu_seconds();
  }
  double mine = self1 - self0, others = (all1 - all0) - mine;
  CAPTURE(mine);
  CAPTURE(others);
  CHECK(others < 0.1 * mine);
}

TEST_CASE("bad ONNX backend parameters in config.pbtxt are load errors that say what to write") {
  std::mt19937 rng(15);
  auto g = conv_graph({32, 32, 8, 8, 1, 1, 1, false, false, false}, rng);
  auto cfg = test_config();
  // Each bad value in turn (the earlier keys then hold good ones), the error
  // it must name, and a good value to leave in place.
  struct bad_case {
    const char *key, *bad, *good, *says;
  };
  for (auto c : {bad_case{"winograd", "yes", "false", "give string_value \"true\" or \"false\""},
                 bad_case{"plan_cache_size", "0", "3", "a count from 1 to 1024"},
                 bad_case{"engine_conv", "1", "false", "\"true\" or \"false\""},
                 bad_case{"conv_bands", "off", "false", "\"true\" or \"false\""}}) {
    CAPTURE(c.key);
    cfg.config.parameters[c.key] = c.bad;
    auto bad = load_onnx_graph(g, cfg);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.find("\"" + std::string(c.key) + "\" is '" + c.bad + "'")
          != std::string::npos);
    CHECK(bad.error().message.find(c.says) != std::string::npos);
    cfg.config.parameters[c.key] = c.good;
  }
  CHECK(load_onnx_graph(g, cfg));
}

TEST_CASE("config.pbtxt's conv_bands turns bands of rows off, and only them") {
  std::mt19937 rng(16);
  auto g = conv_graph({16, 32, 38, 11, 3, 1, 1, false, false, false}, rng);
  auto ref = reference(g, 1, rng);
  for (const char* bands : {"true", "false"}) {
    CAPTURE(bands);
    auto cfg = test_config();
    cfg.threads = 2;
    cfg.profile = true;
    cfg.config.parameters["conv_bands"] = bands;
    auto model = load_onnx_graph(g, cfg);
    REQUIRE_MESSAGE(model, model.error().message);
    executor::batch_view view;
    view.rows = 1;
    view.inputs.push_back({"x", datatype::fp32, ref.shapes[0],
                           reinterpret_cast<const uint8_t*>(ref.data[0].data()),
                           ref.data[0].size() * 4});
    writer out;
    auto r = model->make_instance()->execute(view, out);
    REQUIRE(r.index() == 0);
    CHECK(relative_error(as_floats(out.buffers[0]), ref.want) < 1e-5);
    auto text = model->profile_report();
    CAPTURE(text);
    bool on = std::string(bands) == "true";
    CHECK((text.find(wino + " " + blocked2 + " by row (copies)") != std::string::npos) == on);
    CHECK((text.find("by channel") != std::string::npos) == !on);
  }
}

namespace {

/// a [-1 or 1, 6] -> Gemm -> y: a graph that batches when `batch_dim` is -1.
graph gemm_graph(int64_t batch_dim, std::mt19937& rng) {
  graph g;
  g.opset = 17;
  int a = g.add_value("a", datatype::fp32, {batch_dim, 6}, true);
  g.inputs.push_back(a);
  int w = add_weights(g, "w", {6, 5}, rng, 0.1f);
  int y = g.add_value("y", datatype::fp32, {batch_dim, 5}); // declared, as the importer keeps it
  g.add_node("Gemm", "fc", {a, w}, {y});
  g.outputs.push_back(y);
  return g;
}

} // namespace

TEST_CASE("auto-complete fills max_batch_size and dynamic batching as Triton's ONNX Runtime "
          "backend does") {
  std::mt19937 rng(21);
  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "auto";
  SUBCASE("a graph with a variable first dimension everywhere batches up to 4") {
    auto m = load_onnx_graph(gemm_graph(-1, rng), cfg);
    REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
    CHECK(m->config.max_batch_size == 4);
    CHECK(m->config.dynamic_batching_enabled);
    REQUIRE(m->config.inputs.size() == 1);
    CHECK(m->config.inputs[0].dims == std::vector<int64_t>{6});
    CHECK(m->config.outputs[0].dims == std::vector<int64_t>{5});
  }
  SUBCASE("a config that lists inputs and outputs is not auto-completed") {
    // Without a batch dimension: the variable one is fixed at 1 here.
    cfg.config.inputs = {{"a", datatype::fp32, {1, 6}}};
    cfg.config.outputs = {{"y", datatype::fp32, {1, 5}}};
    auto m = load_onnx_graph(gemm_graph(-1, rng), cfg);
    REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
    CHECK(m->config.max_batch_size == 0);
    CHECK_FALSE(m->config.dynamic_batching_enabled);
  }
  SUBCASE("--strict-model-config (auto_complete off) leaves max_batch_size 0") {
    // Without a batch dimension the graph's variable first dimension is a
    // variable dimension like any other: dims [-1,6], and the output follows.
    cfg.auto_complete = false;
    auto g = gemm_graph(-1, rng);
    auto m = load_onnx_graph(g, cfg);
    REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
    CHECK(m->config.max_batch_size == 0);
    CHECK(m->config.inputs[0].dims == std::vector<int64_t>{-1, 6});
    CHECK(m->config.outputs[0].dims == std::vector<int64_t>{-1, 5});
    auto x = random_floats(3 * 6, rng);
    auto plain = specialize(g, {{3, 6}});
    REQUIRE(plain);
    auto want = run_reference_graph(*plain, {as_bytes(x)});
    executor::batch_view view;
    view.rows = 1;
    view.inputs.push_back({"a", datatype::fp32, {3, 6},
                           reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
    writer out;
    auto r = m->make_instance()->execute(view, out);
    REQUIRE(std::holds_alternative<std::monostate>(r));
    CHECK(relative_error(as_floats(out.buffers.at(0)), as_floats(want.at(0))) < 1e-5);
    CHECK(out.buffers.at(0).size() == 3 * 5 * 4);
  }
  SUBCASE("a fixed first dimension does not batch, and asking for batches is Triton's error") {
    auto m = load_onnx_graph(gemm_graph(1, rng), cfg);
    REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
    CHECK(m->config.max_batch_size == 0);
    cfg.config.max_batch_size = 8;
    auto bad = load_onnx_graph(gemm_graph(1, rng), cfg);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.find("autofill failed for model 'auto': model does not support "
                                   "batching while non-zero max_batch_size is specified")
          != std::string::npos);
  }
}

TEST_CASE("a reshaped model runs on its reshape and answers in its dims") {
  std::mt19937 rng(22);
  onnx_model_config cfg;
  cfg.model_file = "built-in-test.onnx";
  cfg.config.name = "reshaped";
  cfg.config.max_batch_size = 4;
  tensor_config a{"a", datatype::fp32, {2, 3}};
  a.reshape = std::vector<int64_t>{6};
  tensor_config y{"y", datatype::fp32, {5, 1}};
  y.reshape = std::vector<int64_t>{5};
  cfg.config.inputs = {a};
  cfg.config.outputs = {y};
  auto m = load_onnx_graph(gemm_graph(-1, rng), cfg);
  REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
  CHECK(m->config.inputs[0].dims == std::vector<int64_t>{2, 3});
  CHECK(m->config.outputs[0].dims == std::vector<int64_t>{5, 1});
  auto instance = m->make_instance();
  std::vector<float> x(3 * 6, 0.25f);
  executor::batch_view batch;
  batch.rows = 3;
  batch.inputs.push_back({"a", datatype::fp32, {3, 2, 3},
                          reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
  struct shape_writer final : executor::output_writer {
    std::vector<int64_t> shape;
    std::vector<uint8_t> buffer;
    uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>& s,
                      size_t bytes) override {
      shape = s;
      buffer.resize(bytes);
      return buffer.data();
    }
  } out;
  auto r = instance->execute(batch, out);
  REQUIRE(std::holds_alternative<std::monostate>(r));
  CHECK(out.shape == std::vector<int64_t>{3, 5, 1});
  CHECK(out.buffer.size() == 3 * 5 * 4);
  // dims of another size than the graph's (after reshape) are a load error.
  cfg.config.inputs[0].reshape = std::vector<int64_t>{3, 2};
  auto bad = load_onnx_graph(gemm_graph(-1, rng), cfg);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("[3,2]") != std::string::npos);
  CHECK(bad.error().message.find("the dims checked against the graph are reshape.shape")
        != std::string::npos);
}

namespace {

/// x [batch, seq, 8] -> MatMul [8, 8] -> Softmax -> y [batch, seq, 8]: a
/// graph with a variable sequence axis.
graph seq_graph(std::mt19937& rng) {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, -1, 8}, true);
  g.inputs.push_back(x);
  int w = add_weights(g, "w", {8, 8}, rng, 0.5f);
  int h = g.add_value("h");
  g.add_node("MatMul", "proj", {x, w}, {h});
  int y = g.add_value("y", datatype::fp32, {-1, -1, 8});
  g.add_node("Softmax", "soft", {h}, {y});
  g.outputs.push_back(y);
  return g;
}

/// x [batch, n] -> Reshape [0, -1, 4] -> Neg -> y: runs only where 4 divides n.
graph reshape4_graph() {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, -1}, true);
  g.inputs.push_back(x);
  auto target = make_tensor(datatype::int64, {3});
  target->as_mut<int64_t>()[0] = 0;
  target->as_mut<int64_t>()[1] = -1;
  target->as_mut<int64_t>()[2] = 4;
  int t = g.add_constant("target", target);
  int r = g.add_value("r");
  g.add_node("Reshape", "by_four", {x, t}, {r});
  int y = g.add_value("y");
  g.add_node("Neg", "neg", {r}, {y});
  g.outputs.push_back(y);
  return g;
}

/// Runs `instance` on `x` at `shape`; the error, or the output's relative
/// error against the reference interpreter on `g`.
std::variant<double, serving_error> run_at(executor::backend& instance, const graph& g,
                                           const std::vector<int64_t>& shape, std::mt19937& rng,
                                           std::vector<int64_t>* out_shape = nullptr) {
  auto x = random_floats(static_cast<size_t>(element_count(shape)), rng);
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(shape[0]);
  view.inputs.push_back({"x", datatype::fp32, shape, reinterpret_cast<const uint8_t*>(x.data()),
                         x.size() * 4});
  struct shape_writer final : executor::output_writer {
    std::vector<int64_t> shape;
    std::vector<uint8_t> buffer;
    uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>& s,
                      size_t bytes) override {
      shape = s;
      buffer.resize(bytes);
      return buffer.data();
    }
  } out;
  auto r = instance.execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    return *e;
  if (out_shape)
    *out_shape = out.shape;
  auto plain = specialize(g, {shape});
  REQUIRE_MESSAGE(plain, plain.error().message);
  auto want = run_reference_graph(*plain, {as_bytes(x)});
  return relative_error(as_floats(out.buffer), as_floats(want.at(0)));
}

double error_at(executor::backend& instance, const graph& g, const std::vector<int64_t>& shape,
                std::mt19937& rng) {
  CAPTURE(shape);
  auto r = run_at(instance, g, shape, rng);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  return std::get<double>(r);
}

} // namespace

TEST_CASE("a variable sequence axis: listed shapes compile at load, others on first use") {
  std::mt19937 rng(31);
  auto g = seq_graph(rng);
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    auto cfg = test_config();
    cfg.config.max_batch_size = 4;
    cfg.threads = threads;
    cfg.config.parameters["expected_shapes"] = "x:5x8|x:9x8";
    // Row chunks whatever their matmul rows (row_chunks.test.cpp has the rule).
    cfg.config.parameters["chunk_min_matmul_rows"] = "0";
    auto m = load_onnx_graph(g, cfg);
    REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
    // The output follows the sequence axis.
    CHECK(m->config.inputs[0].dims == std::vector<int64_t>{-1, 8});
    CHECK(m->config.outputs[0].dims == std::vector<int64_t>{-1, 8});
    CHECK(m->summary.find("at 2 listed input shape(s)") != std::string::npos);
    size_t at_load = m->plans_compiled();
    // 1..4 rows at both lengths; on 2 threads, rows 2..4 run 1-row chunk plans.
    CHECK(at_load == (threads == 1 ? 8u : 4u));
    auto instance = m->make_instance();
    for (int64_t rows : {1, 2, 3, 4})
      for (int64_t seq : {5, 9})
        CHECK(error_at(*instance, g, {rows, seq, 8}, rng) < 1e-5);
    CHECK(m->plans_compiled() == at_load);
    CHECK(m->cached_plans() == 0);
    // A new length compiles once, then runs from the cache.
    std::vector<int64_t> shape;
    auto r = run_at(*instance, g, {1, 13, 8}, rng, &shape);
    REQUIRE(std::holds_alternative<double>(r));
    CHECK(std::get<double>(r) < 1e-5);
    CHECK(shape == std::vector<int64_t>{1, 13, 8});
    CHECK(m->plans_compiled() == at_load + 1);
    CHECK(m->cached_plans() == 1);
    CHECK(m->cached_plan_bytes() > 0);
    CHECK(error_at(*instance, g, {1, 13, 8}, rng) < 1e-5);
    // Another instance finds the plan the first compiled.
    auto other = m->make_instance();
    CHECK(error_at(*other, g, {1, 13, 8}, rng) < 1e-5);
    CHECK(m->plans_compiled() == at_load + 1);
  }
}

TEST_CASE("the shape-plan cache keeps to plan_cache_bytes and refuses a plan larger than it") {
  std::mt19937 rng(32);
  auto g = seq_graph(rng);
  auto cfg = test_config();
  cfg.config.max_batch_size = 1;
  cfg.config.parameters["plan_cache_bytes"] = std::to_string(1 << 20);
  auto m = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
  CHECK(m->plans_compiled() == 0); // nothing listed: nothing to compile at load
  auto instance = m->make_instance();
  // Arenas of 32 bytes per position (the MatMul's output): 256, 384 and
  // 512 KiB do not fit in 1 MiB together.
  for (int64_t seq : {8192, 12288, 16384}) {
    CHECK(error_at(*instance, g, {1, seq, 8}, rng) < 1e-5);
    CHECK(m->cached_plan_bytes() <= size_t{1} << 20);
  }
  CHECK(m->cached_plans() == 2);
  CHECK(m->plans_compiled() == 3);
  // The first was evicted: it compiles again.
  CHECK(error_at(*instance, g, {1, 8192, 8}, rng) < 1e-5);
  CHECK(m->plans_compiled() == 4);
  // A plan that alone needs more than the bound is refused, and the model keeps serving.
  auto big = run_at(*instance, g, {1, 40000, 8}, rng);
  REQUIRE(std::holds_alternative<serving_error>(big));
  const auto& e = std::get<serving_error>(big);
  CHECK(e.status == status_code::bad_request);
  CHECK(e.message.find("cannot run inputs x [1,40000,8]") != std::string::npos);
  CHECK(e.message.find("raise parameters \"plan_cache_bytes\"") != std::string::npos);
  CHECK(error_at(*instance, g, {1, 8192, 8}, rng) < 1e-5);
  CHECK(m->cached_plan_bytes() <= size_t{1} << 20);
}

TEST_CASE("a shape the graph cannot take answers 400 naming the shapes and the node") {
  std::mt19937 rng(33);
  auto g = reshape4_graph();
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    auto cfg = test_config();
    cfg.threads = threads;
    auto m = load_onnx_graph(g, cfg);
    REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
    CHECK(m->config.outputs[0].dims == std::vector<int64_t>{-1, 4});
    auto instance = m->make_instance();
    CHECK(error_at(*instance, g, {2, 12}, rng) < 1e-6);
    auto bad = run_at(*instance, g, {2, 6}, rng);
    REQUIRE(std::holds_alternative<serving_error>(bad));
    const auto& e = std::get<serving_error>(bad);
    CHECK(e.status == status_code::bad_request);
    CAPTURE(e.message);
    CHECK(e.message.find("model 't' cannot run inputs x [2,6]: node 'by_four' (operator "
                         "'Reshape', opset 17): cannot reshape")
          != std::string::npos);
    // Size 0 in a variable dimension is refused before any kernel sees it.
    auto empty = run_at(*instance, g, {1, 0}, rng);
    REQUIRE(std::holds_alternative<serving_error>(empty));
    CAPTURE(std::get<serving_error>(empty).message);
    CHECK(std::get<serving_error>(empty).message.find("a dimension of size 0")
          != std::string::npos);
    // The instance keeps serving.
    std::vector<int64_t> shape;
    auto ok = run_at(*instance, g, {3, 8}, rng, &shape);
    REQUIRE(std::holds_alternative<double>(ok));
    CHECK(std::get<double>(ok) < 1e-6);
    CHECK(shape == std::vector<int64_t>{3, 2, 4});
  }
}

TEST_CASE("expected_shapes errors are load errors that say what to write") {
  std::mt19937 rng(34);
  auto g = seq_graph(rng);
  struct bad_case {
    const char *value, *says;
  };
  for (auto c : {bad_case{"x:5x8|", "parameters \"expected_shapes\" set 2 ('') is empty"},
                 bad_case{"y:5x8", "set 1 names input 'y', but the model's inputs are 'x'"},
                 bad_case{"x:5x7", "set 1 gives input 'x' dims [5,7], but the model's are "
                                   "[-1,8]"},
                 bad_case{"x:5", "set 1 gives input 'x' dims [5]"}}) {
    CAPTURE(c.value);
    auto cfg = test_config();
    cfg.config.parameters["expected_shapes"] = c.value;
    auto m = load_onnx_graph(g, cfg);
    REQUIRE_FALSE(m);
    CHECK(m.error().message.find("model 't': built-in-test.onnx: ") == 0);
    CHECK(m.error().message.find(c.says) != std::string::npos);
  }
  // A listed shape that the graph cannot take fails the load and says so.
  auto cfg = test_config();
  cfg.config.parameters["expected_shapes"] = "x:6";
  auto r = load_onnx_graph(reshape4_graph(), cfg);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("the listed input shapes x [1,6] (expected_shapes or "
                               "model_warmup) cannot run: node 'by_four'")
        != std::string::npos);
  cfg.config.parameters["expected_shapes"] = "x:8";
  CHECK(load_onnx_graph(reshape4_graph(), cfg));
  cfg.config.parameters["plan_cache_bytes"] = "1000";
  auto small = load_onnx_graph(reshape4_graph(), cfg);
  REQUIRE_FALSE(small);
  CHECK(small.error().message.find("\"plan_cache_bytes\" is '1000'; give a byte count of at "
                                   "least 1048576")
        != std::string::npos);
}

TEST_CASE("model_warmup's shapes of a variable input compile at load and run") {
  std::mt19937 rng(35);
  auto g = seq_graph(rng);
  auto cfg = test_config();
  cfg.config.max_batch_size = 2;
  warmup_sample w;
  w.name = "len6";
  w.batch_size = 2;
  w.inputs.push_back({"x", datatype::fp32, {6, 8}, warmup_data::random, ""});
  cfg.config.warmup = {w};
  auto m = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
  CHECK(m->summary.find("warmup: 1 sample(s), 1 run(s)") != std::string::npos);
  size_t at_load = m->plans_compiled();
  CHECK(at_load == 2); // batch 1 and 2 at length 6
  CHECK(m->cached_plans() == 0); // warmup ran on the pinned plans
  auto instance = m->make_instance();
  CHECK(error_at(*instance, g, {1, 6, 8}, rng) < 1e-5);
  CHECK(m->plans_compiled() == at_load);
  // A sample must give concrete dims that fit the model's.
  cfg.config.warmup[0].inputs[0].dims = {-1, 8};
  auto bad = load_onnx_graph(g, cfg);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("model_warmup 'len6' input 'x' has dims [-1,8], but the "
                                 "model's are [-1,8] (batch dimension excluded, -1 takes any "
                                 "size)")
        != std::string::npos);
}

TEST_CASE("a variable dimension that only one size fits is a load error that says what to give") {
  // gemm_graph's rows as a variable dimension besides the batch: only 6 fits the weights.
  std::mt19937 rng(36);
  graph g;
  g.opset = 17;
  int a = g.add_value("a", datatype::fp32, {-1, -1}, true);
  g.inputs.push_back(a);
  int w = add_weights(g, "w", {6, 5}, rng, 0.1f);
  int y = g.add_value("y");
  g.add_node("MatMul", "fc", {a, w}, {y});
  g.outputs.push_back(y);
  auto cfg = test_config();
  auto m = load_onnx_graph(g, cfg);
  REQUIRE_FALSE(m);
  CAPTURE(m.error().message);
  CHECK(m.error().message.find("input 'a' [-1] has variable dimensions besides the batch, and "
                               "shape inference failed at all sizes tried")
        != std::string::npos);
  CHECK(m.error().message.find("node 'fc' (operator 'MatMul', opset 17)") != std::string::npos);
  CHECK(m.error().message.find("give the dimension a fixed size in config.pbtxt dims")
        != std::string::npos);
  cfg.config.parameters["expected_shapes"] = "a:6";
  auto one = load_onnx_graph(g, cfg);
  REQUIRE_FALSE(one);
  CHECK(one.error().message.find("failed at all but one of the sizes tried") != std::string::npos);
  // Fixed in config.pbtxt, it loads.
  cfg.config.parameters.erase("expected_shapes");
  cfg.config.inputs = {{"a", datatype::fp32, {6}}};
  auto fixed = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(fixed, (fixed ? "" : fixed.error().message));
  CHECK(fixed->config.outputs[0].dims == std::vector<int64_t>{5});
}

TEST_CASE("a variable dimension carries through a config reshape") {
  std::mt19937 rng(37);
  auto g = seq_graph(rng);
  auto cfg = test_config();
  // Clients send [batch, seq, 2, 4]; the graph runs [batch, seq, 8].
  tensor_config x{"x", datatype::fp32, {-1, 2, 4}};
  x.reshape = std::vector<int64_t>{-1, 8};
  cfg.config.inputs = {x};
  cfg.config.outputs = {{"y", datatype::fp32, {-1, 8}}};
  auto m = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
  CHECK(m->config.inputs[0].dims == std::vector<int64_t>{-1, 2, 4});
  auto instance = m->make_instance();
  auto data = random_floats(3 * 5 * 8, rng);
  executor::batch_view view;
  view.rows = 3;
  view.inputs.push_back({"x", datatype::fp32, {3, 5, 2, 4},
                         reinterpret_cast<const uint8_t*>(data.data()), data.size() * 4});
  struct shape_writer final : executor::output_writer {
    std::vector<int64_t> shape;
    std::vector<uint8_t> buffer;
    uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>& s,
                      size_t bytes) override {
      shape = s;
      buffer.resize(bytes);
      return buffer.data();
    }
  } out;
  auto r = instance->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  CHECK(out.shape == std::vector<int64_t>{3, 5, 8});
  auto plain = specialize(g, {{3, 5, 8}});
  REQUIRE(plain);
  auto want = run_reference_graph(*plain, {as_bytes(data)});
  CHECK(relative_error(as_floats(out.buffer), as_floats(want.at(0))) < 1e-5);
}

TEST_CASE("a new shape compiles before its instance takes the compute pool") {
  // While another instance (of any model) holds the shared pool for its
  // batch, an instance that meets a new shape compiles it meanwhile; it waits
  // only to compute.
  std::mt19937 rng(38);
  auto g = seq_graph(rng);
  auto cfg = test_config();
  cfg.pool = std::make_shared<work_pool>(1);
  auto m = load_onnx_graph(g, cfg);
  REQUIRE_MESSAGE(m, (m ? "" : m.error().message));
  auto instance = m->make_instance();
  auto busy = cfg.pool->hold(); // another instance's batch
  auto x = random_floats(11 * 8, rng);
  using exec_outcome = std::variant<std::monostate, serving_error>;
  std::promise<exec_outcome> done;
  auto answer = done.get_future();
  std::thread client([&] {
    executor::batch_view view;
    view.rows = 1;
    view.inputs.push_back({"x", datatype::fp32, {1, 11, 8},
                           reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
    writer out;
    done.set_value(instance->execute(view, out));
  });
  // The compile finishes while the pool is still held; the batch cannot.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (m->cached_plans() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  CHECK(m->cached_plans() == 1);
  CHECK(answer.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  busy.unlock();
  auto r = answer.get();
  client.join();
  CHECK(std::holds_alternative<std::monostate>(r));
}
