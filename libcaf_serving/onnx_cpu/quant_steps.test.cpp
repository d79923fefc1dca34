/// QLinearConv on oneDNN's int8 convolution (quant_steps.cpp) against the
/// exact integer reference kernel of ops_quant.cpp, through compiled plans:
/// UINT8 and INT8 inputs and outputs, zero points, per-channel scales, INT32
/// bias, padding, strides, dilations and groups, batches split by image over
/// threads (one image: its output rows split), activation Relu: equal but for
/// rare halves rounded the other way (one quantum) where oneDNN requantises
/// (VNNI or AMX), to the bit on the exact path (no VNNI, cpu_level.hpp); with
/// int8_onednn false, the reference kernel, exactly. Weight zero points that
/// are not 0 keep the reference kernel. CTest runs this at every ISA level
/// (ONEDNN_MAX_CPU_ISA), so one machine tests both paths.

#include "onnx_cpu/quant_steps.hpp"

#include "onnx_cpu/cpu_level.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/passes.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <random>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

struct writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&, size_t bytes) override {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
};

struct qconv_case {
  int64_t c, k, h, w, kernel, stride, dilation, pad, group;
  datatype x, y;
  int32_t x_zero, y_zero, w_zero;
  bool per_channel, bias;
  bool relu = false; ///< activation "Relu" (quant_passes.hpp): clamped at y_zero
};

template <class T>
int constant(graph& g, const std::string& name, datatype dt, std::vector<int64_t> shape,
             const std::vector<T>& v) {
  auto t = make_tensor(dt, std::move(shape));
  std::memcpy(t->as_mut<T>(), v.data(), v.size() * sizeof(T));
  return g.add_constant(name, t);
}

int zero_point(graph& g, const std::string& name, datatype dt, int32_t v) {
  if (dt == datatype::int8)
    return constant<int8_t>(g, name, dt, {}, {static_cast<int8_t>(v)});
  return constant<uint8_t>(g, name, dt, {}, {static_cast<uint8_t>(v)});
}

graph qconv_graph(const qconv_case& c, std::mt19937& rng) {
  graph g;
  g.opset = 13;
  int x = g.add_value("x", c.x, {-1, c.c, c.h, c.w}, true);
  g.inputs.push_back(x);
  std::uniform_int_distribution<int> s8(-128, 127);
  std::vector<int8_t> wv(static_cast<size_t>(c.k * (c.c / c.group) * c.kernel * c.kernel));
  for (auto& v : wv) v = static_cast<int8_t>(s8(rng));
  int w = constant(g, "w", datatype::int8, {c.k, c.c / c.group, c.kernel, c.kernel}, wv);
  std::vector<float> ws(c.per_channel ? c.k : 1);
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.002f + 0.001f * static_cast<float>(i);
  int64_t nws = static_cast<int64_t>(ws.size());
  std::vector<int> ins{x,
                       constant<float>(g, "xs", datatype::fp32, {}, {0.05f}),
                       zero_point(g, "xz", c.x, c.x_zero),
                       w,
                       constant<float>(g, "ws", datatype::fp32, {nws}, ws),
                       constant<int8_t>(g, "wz", datatype::int8, {nws},
                                        std::vector<int8_t>(ws.size(), c.w_zero)),
                       constant<float>(g, "ys", datatype::fp32, {}, {0.3f}),
                       zero_point(g, "yz", c.y, c.y_zero)};
  if (c.bias) {
    std::vector<int32_t> b(static_cast<size_t>(c.k));
    std::uniform_int_distribution<int> bd(-2000, 2000);
    for (auto& v : b) v = bd(rng);
    ins.push_back(constant<int32_t>(g, "b", datatype::int32, {c.k}, b));
  }
  int y = g.add_value("y");
  auto& n = g.add_node("QLinearConv", "qconv", ins, {y});
  n.set_ints("kernel_shape", {c.kernel, c.kernel});
  n.set_ints("strides", {c.stride, c.stride});
  n.set_ints("dilations", {c.dilation, c.dilation});
  n.set_ints("pads", {c.pad, c.pad, c.pad + 1, c.pad});
  n.set_i("group", c.group);
  if (c.relu)
    n.set_s("activation", "Relu");
  g.outputs.push_back(y);
  return g;
}

} // namespace

TEST_CASE("QLinearConv on oneDNN's int8 convolution equals the integer reference exactly") {
  std::mt19937 rng(21);
  auto u8 = datatype::uint8, s8 = datatype::int8;
  std::vector<qconv_case> cases{
    {3, 8, 12, 11, 3, 1, 1, 1, 1, u8, u8, 128, 100, 0, true, true},  // onnxruntime's QOperator
    {8, 16, 9, 9, 3, 2, 1, 1, 1, u8, u8, 0, 0, 0, false, false},     // no zero points, no bias
    {8, 8, 10, 7, 3, 1, 2, 2, 4, s8, s8, -5, 7, 0, true, true},      // INT8, groups, dilation
    {16, 32, 6, 6, 1, 1, 1, 0, 1, s8, u8, 3, 128, 0, true, true},    // 1x1
    {4, 4, 7, 7, 3, 1, 1, 1, 4, u8, s8, 17, -3, 0, false, true},     // depthwise
    {8, 48, 9, 9, 3, 1, 1, 1, 1, u8, u8, 128, 100, 0, true, true, true}, // Relu
    {16, 40, 5, 6, 1, 1, 1, 0, 1, s8, s8, -7, -30, 0, false, true, true}, // Relu at -30
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    auto g = qconv_graph(cases[i], rng);
    // oneDNN 2.6 has no AVX2 int8 kernel for groups of several channels
    // (ONEDNN_VERBOSE: ref_int8): the engine's reference kernel runs those.
    const auto& c = cases[i];
    bool on_onednn = !(process_cpu_level().channel_block == 8 && c.group > 1 && c.group != c.c);
    CHECK(qlinear_conv_runs_on_onednn(g, g.nodes[0]) == on_onednn);
    for (int64_t batch : {1, 3}) {
      CAPTURE(batch);
      std::vector<int64_t> shape{batch, cases[i].c, cases[i].h, cases[i].w};
      std::vector<uint8_t> xb(static_cast<size_t>(element_count(shape)));
      std::uniform_int_distribution<int> bytes(0, 255);
      for (auto& v : xb) v = static_cast<uint8_t>(bytes(rng));
      auto plain = specialize(g, {shape});
      REQUIRE_MESSAGE(plain, plain.error().message);
      auto want = run_reference_graph(*plain, {std::string(xb.begin(), xb.end())});
      for (unsigned threads : {1u, 2u}) for (bool onednn : {true, false}) {
        CAPTURE(threads);
        CAPTURE(onednn);
        onnx_model_config cfg;
        cfg.model_file = "built-in-test.onnx";
        cfg.config.name = "t";
        cfg.config.max_batch_size = 8;
        cfg.threads = threads;
        cfg.profile = true;
        cfg.int8_onednn = onednn;
        auto model = load_onnx_graph(g, cfg);
        REQUIRE_MESSAGE(model, model.error().message);
        executor::batch_view view;
        view.rows = static_cast<uint32_t>(batch);
        view.inputs.push_back({"x", cases[i].x, shape, xb.data(), xb.size()});
        writer out;
        auto instance = model->make_instance();
        auto r = instance->execute(view, out);
        if (auto* e = std::get_if<serving_error>(&r))
          FAIL(e->message);
        REQUIRE(out.buffers.size() == 1);
        if (!cfg.int8_onednn) {
          CHECK(out.buffers[0] == std::vector<uint8_t>(want[0].begin(), want[0].end()));
          continue;
        }
        // oneDNN requantises in float in another order: an output exactly
        // between two integers can round the other way (seen: 1 to 2 in
        // 600 to 4,000 outputs), never more than one quantum.
        int64_t off_by_one = 0;
        for (size_t e = 0; e < want[0].size(); ++e) {
          bool s8 = cases[i].y == datatype::int8;
          int a = s8 ? int(int8_t(out.buffers[0][e])) : int(out.buffers[0][e]);
          int b = s8 ? int(int8_t(want[0][e])) : int(want[0][e]);
          CHECK(std::abs(a - b) <= 1);
          off_by_one += a != b;
        }
        CHECK(off_by_one * 200 <= static_cast<int64_t>(want[0].size()));
        // Without VNNI, the exact path: the reference's requantisation, to the bit.
        bool exact = !process_cpu_level().int8_vnni;
        CHECK((off_by_one == 0 || !exact));
        CHECK((model->profile_report().find("onednn.qlinear_conv") != std::string::npos)
              == (onednn && on_onednn));
        CHECK((model->profile_report().find(" exact") != std::string::npos)
              == (exact && on_onednn));
        // One image on two threads: output rows split into bands.
        CHECK((model->profile_report().find("qlinear_conv nchw->nchw by row")
               != std::string::npos)
              == (onednn && on_onednn && batch < threads));
      }
    }
  }
  // A weight zero point that is not 0: oneDNN has none per channel; the reference runs it.
  auto g = qconv_graph({3, 4, 5, 5, 3, 1, 1, 1, 1, u8, u8, 1, 2, 3, true, false}, rng);
  CHECK_FALSE(qlinear_conv_runs_on_onednn(g, g.nodes[0]));
}

TEST_CASE("QuantizeLinear and DequantizeLinear in vectorised spans equal the reference kernels "
          "to the bit, ties and saturation included") {
  for (auto type : {datatype::int8, datatype::uint8}) {
    CAPTURE(static_cast<int>(type));
    graph g;
    g.opset = 13;
    int x = g.add_value("x", datatype::fp32, {-1, 5000}, true);
    g.inputs.push_back(x);
    float scale = 0.25f; // x / scale lands exactly on halves for x = k/4 + 1/8
    int q = g.add_value("q");
    int s = constant<float>(g, "s", datatype::fp32, {}, {scale});
    int z = zero_point(g, "z", type, type == datatype::int8 ? -3 : 131);
    g.add_node("QuantizeLinear", "quant", {x, s, z}, {q});
    int y = g.add_value("y");
    g.add_node("DequantizeLinear", "dequant", {q, s, z}, {y});
    g.outputs.push_back(q);
    g.outputs.push_back(y);
    int64_t batch = 3;
    std::vector<float> xs(static_cast<size_t>(batch * 5000));
    for (size_t i = 0; i < xs.size(); ++i) // halves, then values past both ends
      xs[i] = static_cast<float>(static_cast<int64_t>(i % 600) - 300) * 0.125f
              + (i % 7 == 0 ? 0.01f : 0.0f) + (i > 12000 ? 1000.0f * (i % 2 ? 1 : -1) : 0.0f);
    std::string bytes(reinterpret_cast<const char*>(xs.data()), xs.size() * 4);
    auto plain = specialize(g, {{batch, 5000}});
    REQUIRE_MESSAGE(plain, plain.error().message);
    auto want = run_reference_graph(*plain, {bytes});
    for (unsigned threads : {1u, 2u}) {
      onnx_model_config cfg;
      cfg.model_file = "built-in-test.onnx";
      cfg.config.name = "t";
      cfg.config.max_batch_size = 8;
      cfg.threads = threads;
      cfg.profile = true;
      auto model = load_onnx_graph(g, cfg);
      REQUIRE_MESSAGE(model, model.error().message);
      executor::batch_view view;
      view.rows = static_cast<uint32_t>(batch);
      view.inputs.push_back({"x", datatype::fp32, {batch, 5000},
                             reinterpret_cast<const uint8_t*>(xs.data()), xs.size() * 4});
      writer out;
      auto instance = model->make_instance();
      auto r = instance->execute(view, out);
      if (auto* e = std::get_if<serving_error>(&r))
        FAIL(e->message);
      REQUIRE(out.buffers.size() == 2);
      CHECK(out.buffers[0] == want[0]);
      CHECK(out.buffers[1] == want[1]);
      auto report = model->profile_report();
      CHECK(report.find("engine.quantize") != std::string::npos);
      CHECK(report.find("engine.dequantize") != std::string::npos);
    }
  }
}

TEST_CASE("QLinearMatMul on oneDNN's int8 matmul equals the integer reference but for rare "
          "halves") {
  std::mt19937 rng(33);
  using types = std::pair<datatype, datatype>; // A's, Y's
  for (auto [atype, ytype] : {types{datatype::uint8, datatype::uint8},
                              types{datatype::uint8, datatype::int8},
                              types{datatype::int8, datatype::int8}}) {
    CAPTURE(static_cast<int>(atype));
    CAPTURE(static_cast<int>(ytype));
    graph g;
    g.opset = 13;
    int a = g.add_value("a", atype, {-1, 3, 64}, true);
    g.inputs.push_back(a);
    std::uniform_int_distribution<int> s8(-128, 127);
    std::vector<int8_t> w(64 * 48);
    for (auto& v : w) v = static_cast<int8_t>(s8(rng));
    std::vector<float> ws(48);
    for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.0021f + 0.00013f * static_cast<float>(i);
    std::vector<int32_t> bias(48);
    for (auto& v : bias) v = s8(rng) * 37;
    int y = g.add_value("y");
    g.add_node("QLinearMatMul", "qmm",
               {a, constant<float>(g, "as", datatype::fp32, {}, {0.043f}),
                zero_point(g, "az", atype, atype == datatype::int8 ? 11 : 131),
                constant(g, "w", datatype::int8, {64, 48}, w),
                constant(g, "ws", datatype::fp32, {48}, ws),
                constant(g, "wz", datatype::int8, {48}, std::vector<int8_t>(48, 0)),
                constant<float>(g, "ys", datatype::fp32, {}, {0.61f}),
                zero_point(g, "yz", ytype, ytype == datatype::int8 ? -9 : 117),
                constant(g, "b", datatype::int32, {48}, bias)},
               {y});
    g.outputs.push_back(y);
    CHECK(qlinear_matmul_runs_on_onednn(g, g.nodes[0]));
    for (int64_t batch : {1, 40}) {
      CAPTURE(batch);
      std::vector<uint8_t> ab(static_cast<size_t>(batch * 3 * 64));
      std::uniform_int_distribution<int> bytes(0, 255);
      for (auto& v : ab) v = static_cast<uint8_t>(bytes(rng));
      auto plain = specialize(g, {{batch, 3, 64}});
      REQUIRE_MESSAGE(plain, plain.error().message);
      auto want = run_reference_graph(*plain, {std::string(ab.begin(), ab.end())});
      onnx_model_config cfg;
      cfg.model_file = "built-in-test.onnx";
      cfg.config.name = "t";
      cfg.config.max_batch_size = 64;
      cfg.threads = 2;
      cfg.profile = true;
      auto model = load_onnx_graph(g, cfg);
      REQUIRE_MESSAGE(model, model.error().message);
      executor::batch_view view;
      view.rows = static_cast<uint32_t>(batch);
      view.inputs.push_back({"a", atype, {batch, 3, 64}, ab.data(), ab.size()});
      writer out;
      auto instance = model->make_instance();
      auto r = instance->execute(view, out);
      if (auto* e = std::get_if<serving_error>(&r))
        FAIL(e->message);
      REQUIRE(out.buffers.size() == 1);
      int64_t off_by_one = 0;
      for (size_t e = 0; e < want[0].size(); ++e) {
        bool s = ytype == datatype::int8;
        int x = s ? int(int8_t(out.buffers[0][e])) : int(out.buffers[0][e]);
        int z = s ? int(int8_t(want[0][e])) : int(want[0][e]);
        CHECK(std::abs(x - z) <= 1);
        off_by_one += x != z;
      }
      CHECK(off_by_one * 200 <= static_cast<int64_t>(want[0].size()));
      bool exact = !process_cpu_level().int8_vnni;
      CHECK((off_by_one == 0 || !exact));
      CHECK(model->profile_report().find("onednn.qlinear_matmul") != std::string::npos);
      CHECK((model->profile_report().find("qlinear_matmul exact") != std::string::npos) == exact);
    }
  }
}
