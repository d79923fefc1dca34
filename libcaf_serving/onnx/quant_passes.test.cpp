/// fuse_qdq (quant_passes.hpp): the QDQ groups onnxruntime's quantizer writes
/// become QLinearConv and QLinearAdd, and the rewritten graph computes what
/// the fp32 QDQ graph computes (the 8-bit outputs within one quantum, the
/// same tensors when dequantized within one quantum's share); groups that do
/// not qualify are left alone and run unchanged.

#include "onnx/quant_passes.hpp"

#include "onnx/op_registry.hpp"
#include "onnx/ops_quant.hpp"
#include "onnx/passes.hpp"
#include "onnx_cpu/onnx_backend.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

template <class T>
int constant(graph& g, const std::string& name, datatype dt, std::vector<int64_t> shape,
             const std::vector<T>& v) {
  auto t = make_tensor(dt, std::move(shape));
  std::memcpy(t->as_mut<T>(), v.data(), v.size() * sizeof(T));
  return g.add_constant(name, t);
}

int scalar(graph& g, const std::string& name, float v) {
  return constant<float>(g, name, datatype::fp32, {}, {v});
}

int zero_u8(graph& g, const std::string& name, uint8_t v) {
  return constant<uint8_t>(g, name, datatype::uint8, {}, {v});
}

/// How the test graph's conv weights are quantized.
struct weight_case {
  bool constant = true; ///< else the INT8 weights are a graph input
  int64_t axis = 0;     ///< the weight DQ's axis (per-channel scales)
  bool per_channel = true;
};

/// x [n, 4, 6, 6] FLOAT -> Q (uint8) -> DQ -> Conv 8 3x3 pad 1 (DQ'd INT8
/// weights, bias as DQ of INT32) -> Relu -> Q -> DQ ---------------------+
///                                  \-> DQ -> Conv 8 1x1 (same) -> Q -> DQ -> Add -> Q
///   -> DQ -> Conv 8 1x1 -> Q -> DQ -> y
struct qdq_graph {
  graph g;
  std::vector<std::string> input_names;
};

qdq_graph make_qdq_graph(const weight_case& wc, std::mt19937& rng) {
  qdq_graph q;
  graph& g = q.g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 4, 6, 6}, true);
  g.inputs.push_back(x);
  q.input_names.push_back("x");
  auto dq = [&](int v, int s, int z, const std::string& name) {
    int out = g.add_value(name);
    std::vector<int> ins{v, s};
    if (z >= 0) ins.push_back(z);
    g.add_node("DequantizeLinear", name, ins, {out});
    return out;
  };
  auto quant = [&](int v, float s, uint8_t z, const std::string& name) {
    int out = g.add_value(name);
    g.add_node("QuantizeLinear", name, {v, scalar(g, name + "_s", s), zero_u8(g, name + "_z", z)},
               {out});
    return std::make_pair(out, g.nodes.back().inputs);
  };
  auto [xq, xqp] = quant(x, 0.0193f, 128, "xq");
  int xd = dq(xq, xqp[1], xqp[2], "xd");
  std::uniform_int_distribution<int> s8(-127, 127);
  auto conv = [&](int in, int64_t c, int64_t k, int64_t ks, const std::string& name) {
    std::vector<int8_t> w(static_cast<size_t>(k * c * ks * ks));
    for (auto& v : w) v = static_cast<int8_t>(s8(rng));
    int64_t scales = !wc.per_channel ? 1 : wc.axis == 0 ? k : c;
    std::vector<float> ws(static_cast<size_t>(scales));
    for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.00413f + 0.000531f * static_cast<float>(i);
    int wv;
    if (wc.constant) {
      wv = constant(g, name + "_w", datatype::int8, {k, c, ks, ks}, w);
    } else {
      wv = g.add_value(name + "_w", datatype::int8, {k, c, ks, ks}, true);
      g.inputs.push_back(wv);
      q.input_names.push_back(name + "_w");
    }
    int wsv = constant(g, name + "_ws", datatype::fp32, {scales}, ws);
    int wz = constant(g, name + "_wz", datatype::int8, {scales},
                      std::vector<int8_t>(ws.size(), 0));
    int wd = g.add_value(name + "_wd");
    auto& n = g.add_node("DequantizeLinear", name + "_wd", {wv, wsv, wz}, {wd});
    if (wc.per_channel)
      n.set_i("axis", wc.axis);
    // The bias as the quantizer writes it: INT32 with scale x_scale * w_scale[0].
    std::vector<int32_t> b(static_cast<size_t>(k));
    std::uniform_int_distribution<int> bd(-3000, 3000);
    for (auto& v : b) v = bd(rng);
    int bq = constant(g, name + "_bq", datatype::int32, {k}, b);
    int bd_out = dq(bq, scalar(g, name + "_bs", 0.0193f * ws[0]),
                    constant<int32_t>(g, name + "_bz", datatype::int32, {}, {0}), name + "_b");
    int out = g.add_value(name);
    auto& cn = g.add_node("Conv", name, {in, wd, bd_out}, {out});
    cn.set_ints("pads", {ks / 2, ks / 2, ks / 2, ks / 2});
    return out;
  };
  int c1 = conv(xd, 4, 8, 3, "c1");
  int r1 = g.add_value("r1");
  g.add_node("Relu", "r1", {c1}, {r1});
  auto [r1q, r1p] = quant(r1, 0.0517f, 0, "r1q");
  int r1d = dq(r1q, r1p[1], r1p[2], "r1d");
  int r1d2 = dq(r1q, r1p[1], r1p[2], "r1d2");
  int c2 = conv(r1d, 8, 8, 1, "c2");
  auto [c2q, c2p] = quant(c2, 0.1033f, 120, "c2q");
  int c2d = dq(c2q, c2p[1], c2p[2], "c2d");
  int sum = g.add_value("sum");
  g.add_node("Add", "add", {c2d, r1d2}, {sum});
  auto [sq, sp] = quant(sum, 0.1033f, 110, "sq");
  int c3 = conv(dq(sq, sp[1], sp[2], "sd"), 8, 8, 1, "c3");
  auto [c3q, c3p] = quant(c3, 0.1187f, 125, "c3q");
  int y = dq(c3q, c3p[1], c3p[2], "y");
  g.outputs.push_back(y);
  return q;
}

int count(const graph& g, const std::string& op) {
  int c = 0;
  for (const auto& n : g.nodes)
    c += n.op == op;
  return c;
}

std::vector<float> floats_of(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

/// Runs `q` (optimized with and without fuse_qdq) on the reference kernels;
/// returns {fused, unfused} outputs for the same random inputs.
std::pair<std::vector<float>, std::vector<float>> run_both(const qdq_graph& q, int64_t batch,
                                                           std::mt19937& rng) {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> inputs;
  std::uniform_real_distribution<float> xf(-2.0f, 2.0f);
  std::uniform_int_distribution<int> s8(-127, 127);
  for (int v : q.g.inputs) {
    auto shape = q.g.values[v].shape;
    if (shape[0] < 0) shape[0] = batch;
    shapes.push_back(shape);
    std::string bytes;
    if (q.g.values[v].dtype == datatype::fp32) {
      std::vector<float> f(static_cast<size_t>(element_count(shape)));
      for (auto& e : f) e = xf(rng);
      bytes.assign(reinterpret_cast<const char*>(f.data()), f.size() * 4);
    } else {
      bytes.resize(static_cast<size_t>(element_count(shape)));
      for (auto& e : bytes) e = static_cast<char>(s8(rng));
    }
    inputs.push_back(bytes);
  }
  pass_config on, off;
  off.fuse_qdq = false;
  auto fused = optimize(q.g, shapes, on);
  auto plain = optimize(q.g, shapes, off);
  REQUIRE_MESSAGE(fused, fused.error().message);
  REQUIRE_MESSAGE(plain, plain.error().message);
  return {floats_of(run_reference_graph(*fused, inputs)[0]),
          floats_of(run_reference_graph(*plain, inputs)[0])};
}

/// Outputs of a Q -> DQ pair: each a multiple of `scale`; fused and unfused
/// may round a value near a midpoint to the neighbouring quantum, and that
/// difference may carry through the next layer, so: most equal, none far.
/// (Scales like 0.1 and 0.05 would put one sum in 12 exactly on a midpoint,
/// where float rounding decides: the test's scales are as uneven as a
/// calibrated model's.)
void check_close(const std::vector<float>& a, const std::vector<float>& b, float scale) {
  REQUIRE(a.size() == b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(std::fabs(a[i] - b[i]) <= 2.01f * scale);
    differ += a[i] != b[i];
  }
  CHECK(differ * 20 <= a.size());
}

} // namespace

TEST_CASE("fuse_qdq rewrites DQ -> Conv [-> Relu] -> Q and DQ + DQ -> Add -> Q onto "
          "integer operators") {
  std::mt19937 rng(7);
  auto q = make_qdq_graph({}, rng);
  graph g = q.g;
  auto done = fuse_qdq(g);
  CHECK(done.convs == 3);
  CHECK(done.adds == 1);
  CHECK(count(g, "Conv") == 0);
  CHECK(count(g, "Relu") == 0);
  CHECK(count(g, "Add") == 0);
  CHECK(count(g, "QLinearConv") == 3);
  CHECK(count(g, quant_add_op) == 1);
  // Left: the input's Q and the output's DQ; every activation between stays 8-bit.
  CHECK(count(g, "QuantizeLinear") == 1);
  CHECK(count(g, "DequantizeLinear") == 1);
  for (const auto& n : g.nodes)
    if (n.op == "QLinearConv")
      CHECK(n.get_s("activation", "") == (n.name == "c1" ? "Relu" : ""));

  for (int64_t batch : {1, 3}) {
    CAPTURE(batch);
    auto [fused, plain] = run_both(q, batch, rng);
    check_close(fused, plain, 0.1187f);
  }
}

TEST_CASE("fuse_qdq leaves groups that do not qualify alone, and they still compute the same") {
  std::mt19937 rng(8);
  SUBCASE("weights that are a graph input, not a constant") {
    auto q = make_qdq_graph({false, 0, true}, rng);
    graph g = q.g;
    auto done = fuse_qdq(g);
    CHECK(done.convs == 0);
    CHECK(done.adds == 1); // the Add's inputs are still per-tensor activations
    CHECK(count(g, "Conv") == 3);
    auto [fused, plain] = run_both(q, 2, rng);
    check_close(fused, plain, 0.1187f);
  }
  SUBCASE("per-channel weight scales on the input-channel axis") {
    auto q = make_qdq_graph({true, 1, true}, rng);
    graph g = q.g;
    CHECK(fuse_qdq(g).convs == 0);
    CHECK(count(g, "Conv") == 3);
    auto [fused, plain] = run_both(q, 2, rng);
    check_close(fused, plain, 0.1187f);
  }
  SUBCASE("per-tensor weights qualify") {
    auto q = make_qdq_graph({true, 0, false}, rng);
    graph g = q.g;
    CHECK(fuse_qdq(g).convs == 3);
  }
  SUBCASE("a Conv output the graph also returns keeps its fp32 Conv") {
    auto q = make_qdq_graph({}, rng);
    graph g = q.g;
    for (size_t v = 0; v < g.values.size(); ++v)
      if (g.values[v].name == "c2")
        g.outputs.push_back(static_cast<int>(v));
    auto done = fuse_qdq(g);
    CHECK(done.convs == 2);
    CHECK(count(g, "Conv") == 1);
  }
}

TEST_CASE("a fused QDQ graph runs on the compiled plan (oneDNN int8 in NHWC, the QLinearAdd "
          "step) as on the reference kernels") {
  std::mt19937 rng(9);
  auto q = make_qdq_graph({}, rng);
  for (int64_t batch : {1, 3})
    for (unsigned threads : {1u, 2u}) {
      CAPTURE(batch);
      CAPTURE(threads);
      std::vector<int64_t> shape{batch, 4, 6, 6};
      std::vector<float> x(static_cast<size_t>(element_count(shape)));
      std::uniform_real_distribution<float> xf(-2.0f, 2.0f);
      for (auto& e : x) e = xf(rng);
      std::string bytes(reinterpret_cast<const char*>(x.data()), x.size() * 4);
      auto plain = optimize(q.g, {shape});
      REQUIRE_MESSAGE(plain, plain.error().message);
      auto want = floats_of(run_reference_graph(*plain, {bytes})[0]);

      onnx_model_config cfg;
      cfg.model_file = "built-in-test.onnx";
      cfg.config.name = "t";
      cfg.config.max_batch_size = 8;
      cfg.threads = threads;
      cfg.profile = true;
      auto model = load_onnx_graph(q.g, cfg);
      REQUIRE_MESSAGE(model, model.error().message);
      struct writer final : executor::output_writer {
        std::vector<std::vector<uint8_t>> buffers;
        uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&,
                          size_t n) override {
          buffers.emplace_back(n);
          return buffers.back().data();
        }
      } out;
      executor::batch_view view;
      view.rows = static_cast<uint32_t>(batch);
      view.inputs.push_back(
        {"x", datatype::fp32, shape, reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
      auto instance = model->make_instance();
      auto r = instance->execute(view, out);
      if (auto* e = std::get_if<serving_error>(&r))
        FAIL(e->message);
      REQUIRE(out.buffers.size() == 1);
      check_close(floats_of(out.buffers[0]), want, 0.1187f);
      auto report = model->profile_report();
      CHECK(report.find("engine.qlinear_add") != std::string::npos);
      // The 8-bit tensors between the convolutions and the Add stay NHWC
      // (assign_int8_layouts); the input and the output are NCHW.
      CHECK(report.find("onednn.qlinear_conv nchw->nhwc") != std::string::npos);
      CHECK(report.find("onednn.qlinear_conv nhwc->nhwc") != std::string::npos);
      CHECK(report.find("onednn.qlinear_conv nhwc->nchw") != std::string::npos);
      CHECK((report.find(" by row") != std::string::npos) == (batch < threads));
    }
}

namespace {

/// x -> Q -> DQ -> Conv 8 3x3 -> Q(c) -> DQ -> MaxPool 3x3 stride 2 pad 1 -> Q(p)
///   -> DQ -> Conv 8 1x1 -> Q -> DQ -> y; Q(p) as Q(c) when `same`.
graph pool_graph(bool same, std::mt19937& rng) {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 3, 9, 9}, true);
  g.inputs.push_back(x);
  int next = 0;
  auto fresh = [&](const std::string& base) { return base + std::to_string(next++); };
  auto q = [&](int v, float s, uint8_t z) {
    int out = g.add_value(fresh("q"));
    g.add_node("QuantizeLinear", g.values[out].name,
               {v, scalar(g, fresh("s"), s), zero_u8(g, fresh("z"), z)}, {out});
    return out;
  };
  auto dq = [&](int v) {
    const auto& qn = *std::find_if(g.nodes.begin(), g.nodes.end(), [&](const node& n) {
      return n.op == "QuantizeLinear" && n.outputs[0] == v;
    });
    int out = g.add_value(fresh("d"));
    auto ins = std::vector<int>{v, qn.inputs[1], qn.inputs[2]};
    g.add_node("DequantizeLinear", g.values[out].name, ins, {out});
    return out;
  };
  std::uniform_int_distribution<int> s8(-127, 127);
  auto conv = [&](int in, int64_t c, int64_t ks) {
    std::vector<int8_t> w(static_cast<size_t>(8 * c * ks * ks));
    for (auto& v : w) v = static_cast<int8_t>(s8(rng));
    int wq = constant(g, fresh("w"), datatype::int8, {8, c, ks, ks}, w);
    int wd = g.add_value(fresh("wd"));
    g.add_node("DequantizeLinear", g.values[wd].name,
               {wq, scalar(g, fresh("ws"), 0.00731f), constant<int8_t>(g, fresh("wz"),
                                                                      datatype::int8, {}, {0})},
               {wd});
    int out = g.add_value(fresh("c"));
    g.add_node("Conv", g.values[out].name, {in, wd}, {out})
      .set_ints("pads", {ks / 2, ks / 2, ks / 2, ks / 2});
    return out;
  };
  int c1 = q(conv(dq(q(x, 0.0211f, 128)), 3, 3), 0.0613f, 120);
  int pooled = g.add_value("pooled");
  auto& mp = g.add_node("MaxPool", "pool", {dq(c1)}, {pooled});
  mp.set_ints("kernel_shape", {3, 3});
  mp.set_ints("strides", {2, 2});
  mp.set_ints("pads", {1, 1, 1, 1});
  int pq = same ? g.add_value("pq") : q(pooled, 0.0587f, 121);
  if (same) {
    const auto& cq = *std::find_if(g.nodes.begin(), g.nodes.end(), [&](const node& n) {
      return n.op == "QuantizeLinear" && n.outputs[0] == c1;
    });
    auto ins = std::vector<int>{pooled, cq.inputs[1], cq.inputs[2]};
    g.add_node("QuantizeLinear", "pq", ins, {pq});
  }
  int y = dq(q(conv(dq(pq), 8, 1), 0.1187f, 125));
  g.outputs.push_back(y);
  return g;
}

} // namespace

TEST_CASE("DQ -> MaxPool -> Q of one quantization becomes QMaxPool on the 8-bit tensor, "
          "NHWC between the convolutions; another output quantization keeps fp32 MaxPool") {
  std::mt19937 rng(10);
  for (bool same : {true, false}) {
    CAPTURE(same);
    qdq_graph q{pool_graph(same, rng), {"x"}};
    graph g = q.g;
    auto done = fuse_qdq(g);
    CHECK(done.convs == 2);
    CHECK(done.max_pools == (same ? 1 : 0));
    CHECK(count(g, "MaxPool") == (same ? 0 : 1));
    auto [fused, plain] = run_both(q, 2, rng);
    check_close(fused, plain, 0.1187f);
    if (!same)
      continue;
    onnx_model_config cfg;
    cfg.model_file = "built-in-test.onnx";
    cfg.config.name = "t";
    cfg.config.max_batch_size = 8;
    cfg.threads = 2;
    cfg.profile = true;
    auto model = load_onnx_graph(q.g, cfg);
    REQUIRE_MESSAGE(model, model.error().message);
    std::vector<float> x(2 * 3 * 9 * 9);
    std::uniform_real_distribution<float> xf(-2.0f, 2.0f);
    for (auto& e : x) e = xf(rng);
    struct writer final : executor::output_writer {
      std::vector<std::vector<uint8_t>> buffers;
      uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&,
                        size_t n) override {
        buffers.emplace_back(n);
        return buffers.back().data();
      }
    } out;
    executor::batch_view view;
    view.rows = 2;
    view.inputs.push_back({"x", datatype::fp32, {2, 3, 9, 9},
                           reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
    auto instance = model->make_instance();
    auto r = instance->execute(view, out);
    if (auto* e = std::get_if<serving_error>(&r))
      FAIL(e->message);
    auto reference = optimize(q.g, {{2, 3, 9, 9}});
    REQUIRE_MESSAGE(reference, reference.error().message);
    std::string bytes(reinterpret_cast<const char*>(x.data()), x.size() * 4);
    check_close(floats_of(out.buffers.at(0)),
                floats_of(run_reference_graph(*reference, {bytes})[0]), 0.1187f);
    CHECK(model->profile_report().find("onednn.qmax_pool nhwc") != std::string::npos);
  }
}

TEST_CASE("DQ -> Gemm (transB, C) -> Q and DQ -> MatMul -> Q become QLinearMatMul on oneDNN's "
          "int8 matmul") {
  std::mt19937 rng(11);
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 40}, true);
  g.inputs.push_back(x);
  auto q = [&](int v, float s, uint8_t z, const std::string& name) {
    int out = g.add_value(name);
    g.add_node("QuantizeLinear", name, {v, scalar(g, name + "_s", s), zero_u8(g, name + "_z", z)},
               {out});
    return out;
  };
  auto dq = [&](int v, const std::string& qname, const std::string& name) {
    int out = g.add_value(name);
    int s = -1, z = -1;
    for (size_t i = 0; i < g.values.size(); ++i) {
      if (g.values[i].name == qname + "_s") s = static_cast<int>(i);
      if (g.values[i].name == qname + "_z") z = static_cast<int>(i);
    }
    g.add_node("DequantizeLinear", name, {v, s, z}, {out});
    return out;
  };
  std::uniform_int_distribution<int> s8(-127, 127);
  auto weights = [&](int64_t rows, int64_t cols, int64_t axis, const std::string& name) {
    std::vector<int8_t> w(static_cast<size_t>(rows * cols));
    for (auto& v : w) v = static_cast<int8_t>(s8(rng));
    int64_t n = axis == 0 ? rows : cols;
    std::vector<float> ws(static_cast<size_t>(n));
    for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.00313f + 0.000217f * static_cast<float>(i);
    int wd = g.add_value(name);
    g.add_node("DequantizeLinear", name,
               {constant(g, name + "_q", datatype::int8, {rows, cols}, w),
                constant(g, name + "_s", datatype::fp32, {n}, ws),
                constant(g, name + "_z", datatype::int8, {n}, std::vector<int8_t>(ws.size(), 0))},
               {wd})
      .set_i("axis", axis);
    return wd;
  };
  int xq = q(x, 0.0217f, 128, "xq");
  std::vector<int32_t> b(24);
  std::uniform_int_distribution<int> bd(-4000, 4000);
  for (auto& v : b) v = bd(rng);
  int bias = g.add_value("bias");
  g.add_node("DequantizeLinear", "bias",
             {constant(g, "bias_q", datatype::int32, {24}, b), scalar(g, "bias_s", 0.0217f * 0.00313f),
              constant<int32_t>(g, "bias_z", datatype::int32, {}, {0})},
             {bias});
  int h = g.add_value("h");
  g.add_node("Gemm", "gemm", {dq(xq, "xq", "xd"), weights(24, 40, 0, "w1"), bias}, {h})
    .set_i("transB", 1);
  int hq = q(h, 0.0731f, 119, "hq");
  int o = g.add_value("o");
  g.add_node("MatMul", "matmul", {dq(hq, "hq", "hd"), weights(24, 10, 1, "w2")}, {o});
  int y = dq(q(o, 0.1187f, 125, "oq"), "oq", "y");
  g.outputs.push_back(y);

  graph fused = g;
  auto done = fuse_qdq(fused);
  CHECK(done.matmuls == 2);
  CHECK(count(fused, "QLinearMatMul") == 2);
  CHECK(count(fused, "Gemm") == 0);
  qdq_graph qg{g, {"x"}};
  for (int64_t batch : {1, 70}) {
    CAPTURE(batch);
    auto [f, plain] = run_both(qg, batch, rng);
    check_close(f, plain, 0.1187f);
    onnx_model_config cfg;
    cfg.model_file = "built-in-test.onnx";
    cfg.config.name = "t";
    cfg.config.max_batch_size = 128;
    cfg.threads = 2;
    cfg.profile = true;
    auto model = load_onnx_graph(g, cfg);
    REQUIRE_MESSAGE(model, model.error().message);
    std::vector<float> xs(static_cast<size_t>(batch * 40));
    std::uniform_real_distribution<float> xf(-2.0f, 2.0f);
    for (auto& e : xs) e = xf(rng);
    struct writer final : executor::output_writer {
      std::vector<std::vector<uint8_t>> buffers;
      uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&,
                        size_t n) override {
        buffers.emplace_back(n);
        return buffers.back().data();
      }
    } out;
    executor::batch_view view;
    view.rows = static_cast<uint32_t>(batch);
    view.inputs.push_back({"x", datatype::fp32, {batch, 40},
                           reinterpret_cast<const uint8_t*>(xs.data()), xs.size() * 4});
    auto instance = model->make_instance();
    auto r = instance->execute(view, out);
    if (auto* e = std::get_if<serving_error>(&r))
      FAIL(e->message);
    auto reference = optimize(g, {{batch, 40}});
    REQUIRE_MESSAGE(reference, reference.error().message);
    std::string bytes(reinterpret_cast<const char*>(xs.data()), xs.size() * 4);
    check_close(floats_of(out.buffers.at(0)),
                floats_of(run_reference_graph(*reference, {bytes})[0]), 0.1187f);
    CHECK(model->profile_report().find("onednn.qlinear_matmul") != std::string::npos);
  }
}
