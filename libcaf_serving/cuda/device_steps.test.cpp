/// The CUDA backend's device steps in the operator registry's form: which
/// operators have one, and which nodes a step takes, by a dry run of the step
/// builder (cuda/steps.hpp). Needs no device (nothing here calls CUDA).

#include "cuda/cuda_backend.hpp"
#include "cuda/steps.hpp"

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
  for (const char* op : {"FusedConv", "FusedMatMul", "FusedGemm", "FusedLayerNorm", "FusedGelu", "Softmax",
                         "Relu", "Add", "MaxPool", "AveragePool", "GlobalAveragePool",
                         "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                         "FusedAttention", "Mul", "Where", "Cast", "HardSigmoid"}) {
    INFO(op);
    CHECK(has(op));
  }
  // Every other operator runs its reference kernel on the host.
  for (const char* op : {"ArgMax", "GatherElements", "Mod"}) {
    INFO(op);
    CHECK(!has(op));
  }
  for (const auto& op : ops)
    if (op.rfind("Fused", 0) != 0) {
      INFO(op);
      CHECK(onnx::find_operator(op) != nullptr);
    }
}

namespace {

using caf_serving::datatype;

/// A one-node graph: `op` over inputs of the given shapes (null shape: an omitted
/// input), constants where `constant` says so, and an output of shape `out`.
struct one_node {
  onnx::graph g;

  one_node(const std::string& op, const std::vector<std::vector<int64_t>>& ins,
           const std::vector<bool>& constant, std::vector<int64_t> out) {
    std::vector<int> in_values;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (constant[i])
        in_values.push_back(g.add_constant("c" + std::to_string(i),
                                           onnx::make_tensor(datatype::fp32, ins[i])));
      else
        in_values.push_back(g.add_value("v" + std::to_string(i), datatype::fp32, ins[i], true));
    }
    int y = g.add_value("y", datatype::fp32, std::move(out), true);
    g.add_node(op, op + "_0", in_values, {y});
  }

  onnx::node& n() { return g.nodes[0]; }

  /// The kernel the dry run chooses ("host:..." when no device step takes it).
  std::string kernel() const {
    cuda::step_builder b{nullptr, g, std::vector<void*>(g.values.size(), nullptr), {}};
    b.build();
    REQUIRE(b.steps.size() == 1);
    return b.steps[0].kernel;
  }
};

one_node conv(int64_t group, const std::string& act, bool bias, bool residual) {
  // x [2, 8, 9, 9], 3x3 pads 1: y [2, 8, 9, 9]; filter [8, 8 / group, 3, 3].
  std::vector<std::vector<int64_t>> ins{{2, 8, 9, 9}, {8, 8 / group, 3, 3}};
  std::vector<bool> constant{false, true};
  if (bias || residual) { ins.push_back({8}); constant.push_back(true); }
  if (residual) { ins.push_back({2, 8, 9, 9}); constant.push_back(false); }
  one_node t("FusedConv", ins, constant, {2, 8, 9, 9});
  if (bias || residual) t.n().inputs[2] = bias ? t.n().inputs[2] : -1;
  t.n().set_i("group", group);
  t.n().set_ints("pads", {1, 1, 1, 1});
  t.n().set_ints("kernel_shape", {3, 3});
  if (!act.empty()) t.n().set_s("activation", act);
  return t;
}

} // namespace

TEST_CASE("FusedConv: grouped and depthwise, with every activation, is a device step") {
  const char* acts[] = {"", "Relu", "Gelu", "Tanh", "Sigmoid", "Clip", "HardSwish",
                        "HardSigmoid", "Swish", "LeakyRelu"};
  for (int64_t group : {1, 2, 8}) // 8: depthwise
    for (const char* act : acts)
      for (bool bias : {false, true})
        for (bool residual : {false, true}) {
          CAPTURE(group);
          CAPTURE(act);
          CAPTURE(bias);
          CAPTURE(residual);
          std::string a = act;
          // cuDNN's fused call where it runs the activation, else the epilogue kernel.
          bool fused = group == 1 && (a.empty() || a == "Relu");
          CHECK(conv(group, act, bias, residual).kernel()
                == (fused ? "cudnn_conv" : "cudnn_conv+epilogue"));
        }
}

TEST_CASE("FusedConv that cuDNN cannot run stays on the host") {
  auto asymmetric = conv(1, "Relu", true, false);
  asymmetric.n().set_ints("pads", {0, 0, 1, 1}); // cuDNN pads both sides alike
  CHECK(asymmetric.kernel() == "host:FusedConv");
  auto unknown = conv(1, "Softplus", true, false);
  CHECK(unknown.kernel() == "host:FusedConv");
}

TEST_CASE("FusedGemm: transposes, alpha, and every broadcast of C are device steps") {
  // A [4, 6] (transA: [6, 4]), W [6, 5] (transB: [5, 6]), y [4, 5].
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (std::vector<int64_t> c : std::vector<std::vector<int64_t>>{
             {}, {5}, {1, 5}, {4, 1}, {1}, {1, 1}, {4, 5}})
        for (bool c_constant : {true, false}) {
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(onnx::shape_string(c));
          CAPTURE(c_constant);
          one_node t("FusedGemm",
                     {ta ? std::vector<int64_t>{6, 4} : std::vector<int64_t>{4, 6},
                      tb ? std::vector<int64_t>{5, 6} : std::vector<int64_t>{6, 5}, c},
                     {false, true, c_constant}, {4, 5});
          t.n().set_i("transA", ta);
          t.n().set_i("transB", tb);
          t.n().set_f("alpha", 0.5f);
          t.n().set_s("activation", "Tanh");
          CHECK(t.kernel() == "cublaslt");
        }
}

TEST_CASE("FusedGemm: beta scales a constant broadcast C once; a computed one stays on the host") {
  for (bool c_constant : {true, false}) {
    CAPTURE(c_constant);
    one_node t("FusedGemm", {{4, 6}, {6, 5}, {5}}, {false, true, c_constant}, {4, 5});
    t.n().set_f("beta", 2.0f);
    CHECK(t.kernel() == (c_constant ? "cublaslt" : "host:FusedGemm"));
    // A full C takes beta in cuBLASLt, constant or not.
    one_node full("FusedGemm", {{4, 6}, {6, 5}, {4, 5}}, {false, true, c_constant}, {4, 5});
    full.n().set_f("beta", 2.0f);
    CHECK(full.kernel() == "cublaslt");
  }
}

TEST_CASE("FusedMatMul takes every epilogue activation") {
  for (const char* act : {"Relu", "Gelu", "Tanh", "Sigmoid", "Clip", "HardSwish", "Swish"}) {
    CAPTURE(act);
    one_node t("FusedMatMul", {{3, 4, 6}, {6, 5}, {5}}, {false, true, true}, {3, 4, 5});
    t.n().set_s("activation", act);
    CHECK(t.kernel() == "cublaslt");
  }
}

namespace {

/// What cuBLASLt computes (its documented column-major semantics) from the
/// operands lt_layout gives: D = alpha op(A) op(B) + beta C, element (i, j) of
/// a stored operand at [i + j * ld].
std::vector<float> column_major_gemm(const cuda::lt_operands& o, const std::vector<float>& a,
                                     const std::vector<float>& b, const std::vector<float>& c,
                                     float alpha, float beta) {
  auto at = [](const cuda::lt_operand& l, const std::vector<float>& x, uint64_t i, uint64_t j) {
    return l.transposed ? x[j + i * l.ld] : x[i + j * l.ld];
  };
  uint64_t rows = o.a.transposed ? o.a.cols : o.a.rows; // op(A) is rows x inner
  uint64_t inner = o.a.transposed ? o.a.rows : o.a.cols;
  uint64_t cols = o.b.transposed ? o.b.rows : o.b.cols; // op(B) is inner x cols
  REQUIRE((o.b.transposed ? o.b.cols : o.b.rows) == inner);
  REQUIRE(o.d.rows == rows);
  REQUIRE(o.d.cols == cols);
  std::vector<float> d(o.d.ld * cols);
  for (uint64_t i = 0; i < rows; ++i)
    for (uint64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (uint64_t p = 0; p < inner; ++p) sum += double(at(o.a, a, i, p)) * at(o.b, b, p, j);
      d[i + j * o.d.ld] = float(alpha * sum + beta * c[i + j * o.d.ld]);
    }
  return d;
}

} // namespace

TEST_CASE("cuBLASLt's column-major operands compute Gemm's row-major result, every transpose") {
  const uint64_t m = 3, n = 5, k = 4;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      cuda::lt_gemm_config g;
      g.m = m;
      g.n = n;
      g.k = k;
      g.a_transposed = ta;
      g.w_transposed = tb;
      // Row-major A [m, k] (transA: stored [k, m]), W [k, n] (transB: [n, k]), C [m, n].
      std::vector<float> a(m * k), w(k * n), c(m * n);
      for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 7) - 3.0f + 0.25f * float(i);
      for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 5) * 0.5f - 1.0f;
      for (size_t i = 0; i < c.size(); ++i) c[i] = float(i);
      auto a_at = [&](uint64_t r, uint64_t p) { return ta ? a[p * m + r] : a[r * k + p]; };
      auto w_at = [&](uint64_t p, uint64_t col) { return tb ? w[col * k + p] : w[p * n + col]; };
      auto got = column_major_gemm(cuda::lt_layout(g), w, a, c, 0.5f, 2.0f);
      for (uint64_t r = 0; r < m; ++r)
        for (uint64_t col = 0; col < n; ++col) {
          double want = 2.0 * c[r * n + col];
          for (uint64_t p = 0; p < k; ++p) want += 0.5 * double(a_at(r, p)) * w_at(p, col);
          CHECK(got[r * n + col] == doctest::Approx(want).epsilon(1e-6));
        }
    }
}
