/// The CUDA backend's device steps in the operator registry's form: which
/// operators have one, and which nodes a step takes, by a dry run of the step
/// builder (cuda/steps.hpp). Needs no device (nothing here calls CUDA).

#include "cuda/cuda_backend.hpp"
#include "cuda/steps.hpp"
#include "cuda/storage_plan.hpp"

#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
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
  CHECK(has(cuda::storage_cast_op)); // half storage's edge conversions
  for (const auto& op : ops)
    if (op.rfind("Fused", 0) != 0 && op != cuda::storage_cast_op) {
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

  /// The same, with every fp32 value (constants converted) stored as `type`, for
  /// an instance whose storage type is `storage`, as store_in_half leaves it.
  std::string kernel_stored(datatype type, datatype storage) {
    std::vector<bool> narrowed(g.values.size(), false);
    for (size_t v = 0; v < g.values.size(); ++v) {
      auto& val = g.values[v];
      if (val.dtype != datatype::fp32) continue;
      if (val.constant) val.constant = cuda::half_copy(*val.constant, type);
      val.dtype = type;
      narrowed[v] = true;
    }
    cuda::step_builder b{nullptr, g, std::vector<void*>(g.values.size(), nullptr), {}, 0,
                         storage, &narrowed};
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

TEST_CASE("FusedConv's path: fused where cuDNN's call runs it, split where a bf16 one is refused") {
  using cuda::conv_path;
  namespace k = caf_serving::kernels;
  const k::activation acts[] = {k::activation::none, k::activation::relu, k::activation::gelu_erf,
                                k::activation::clip, k::activation::hard_swish};
  for (auto type : {datatype::fp32, datatype::fp16, datatype::bf16})
    for (int64_t group : {1, 2, 8})
      for (auto act : acts) {
        CAPTURE(to_string(type));
        CAPTURE(group);
        CAPTURE(static_cast<int>(act));
        const bool fusable = group == 1 && (act == k::activation::none || act == k::activation::relu);
        // Before cuDNN is asked (and in a dry run): fused wherever the call can run it.
        cuda::conv_path_query q{group, act, type};
        CHECK(cuda::choose_conv_path(q) == (fusable ? conv_path::fused : conv_path::split));
        // cuDNN refused the fused call: split at bf16; at fp32 and fp16 the fused
        // call is expected to run, so a refusal stays the error it is.
        q.fused_status = CUDNN_STATUS_NOT_SUPPORTED;
        const bool split = !fusable || type == datatype::bf16;
        CHECK(cuda::choose_conv_path(q) == (split ? conv_path::split : conv_path::fused));
        // Any other failure is no reason to run another path.
        for (auto status : {CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_EXECUTION_FAILED,
                            CUDNN_STATUS_SUCCESS}) {
          q.fused_status = status;
          CHECK(cuda::choose_conv_path(q) == (fusable ? conv_path::fused : conv_path::split));
        }
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

TEST_CASE("half storage: each family takes the instance's storage type, and no other") {
  struct sample {
    std::string name;
    std::function<one_node()> make;
    const char* kernel;
  };
  auto matmul = [] {
    one_node t("FusedMatMul", {{4, 16}, {16, 8}, {8}}, {false, true, true}, {4, 8});
    t.n().set_s("activation", "Gelu");
    return t;
  };
  auto layer_norm = [] {
    one_node t("FusedLayerNorm", {{4, 16}, {16}, {16}}, {false, true, true}, {4, 16});
    t.n().set_i("axis", -1);
    return t;
  };
  auto gemm = [] {
    one_node t("FusedGemm", {{4, 16}, {8, 16}, {8}}, {false, true, true}, {4, 8});
    t.n().set_i("transB", 1);
    t.n().set_f("beta", 0.5f); // scaled once at load, in the storage type
    return t;
  };
  const sample samples[] = {
    {"conv", [] { return conv(1, "Relu", true, true); }, "cudnn_conv"},
    {"depthwise conv", [] { return conv(8, "HardSwish", true, false); }, "cudnn_conv+epilogue"},
    {"matmul", matmul, "cublaslt"},
    {"gemm", gemm, "cublaslt"},
    {"layer norm", layer_norm, "layer_norm"},
    {"softmax", [] { return one_node("Softmax", {{4, 16}}, {false}, {4, 16}); }, "softmax"},
    {"epilogue", [] { return one_node("FusedGelu", {{4, 16}, {16}}, {false, true}, {4, 16}); },
     "epilogue"},
    {"pool", [] {
       one_node t("MaxPool", {{2, 8, 9, 9}}, {false}, {2, 8, 4, 4});
       t.n().set_ints("kernel_shape", {2, 2});
       t.n().set_ints("strides", {2, 2});
       return t;
     }, "cudnn_pool"},
  };
  for (const auto& s : samples) {
    CAPTURE(s.name);
    CHECK(s.make().kernel() == s.kernel);
    for (auto half : {datatype::fp16, datatype::bf16}) {
      CAPTURE(to_string(half));
      CHECK(s.make().kernel_stored(half, half) == s.kernel);
      // Half tensors in an instance that stores fp32 (or the other half type):
      // a host step, which converts its half values around the reference kernel.
      auto other = half == datatype::fp16 ? datatype::bf16 : datatype::fp16;
      auto op = s.make().g.nodes[0].op;
      CHECK(s.make().kernel_stored(half, datatype::fp32) == "host:" + op + "+convert");
      CHECK(s.make().kernel_stored(half, other) == "host:" + op + "+convert");
    }
  }
  // One value of another float type than the rest: a host step.
  auto mixed = matmul();
  mixed.g.values[mixed.n().outputs[0]].dtype = datatype::fp16;
  cuda::step_builder b{nullptr, mixed.g, std::vector<void*>(mixed.g.values.size(), nullptr), {},
                       0, datatype::fp16, nullptr};
  b.build();
  CHECK(b.steps.at(0).kernel == "host:FusedMatMul");
}

TEST_CASE("StorageCast converts between fp32 and the storage type, either way") {
  for (auto half : {datatype::fp16, datatype::bf16}) {
    for (bool to_half : {true, false}) {
      onnx::graph g;
      int x = g.add_value("x", to_half ? datatype::fp32 : half, {3, 5}, true);
      int y = g.add_value("y", to_half ? half : datatype::fp32, {3, 5}, true);
      g.add_node(cuda::storage_cast_op, "c", {x}, {y});
      cuda::step_builder b{nullptr, g, std::vector<void*>(2, nullptr), {}, 0, half, nullptr};
      b.build();
      CHECK(b.steps.at(0).kernel == "convert");
    }
  }
  onnx::graph g; // not a conversion the kernel makes
  int x = g.add_value("x", datatype::int64, {3}, true);
  int y = g.add_value("y", datatype::fp16, {3}, true);
  g.add_node(cuda::storage_cast_op, "c", {x}, {y});
  cuda::step_builder b{nullptr, g, std::vector<void*>(2, nullptr), {}, 0, datatype::fp16, nullptr};
  b.build();
  CHECK(b.steps.at(0).host);
}

TEST_CASE("cuBLASLt and cuDNN types: half tensors with fp32 accumulation and fp32 scale") {
  for (auto p : {cuda::precision::fp32, cuda::precision::fp16, cuda::precision::bf16}) {
    CAPTURE(cuda::to_string(p));
    // fp32 tensors: as before, the precision sets the compute type only.
    auto f = cuda::lt_types(datatype::fp32, datatype::fp32, p);
    CHECK(f.inputs == CUDA_R_32F);
    CHECK(f.output == CUDA_R_32F);
    CHECK(f.scale == CUDA_R_32F);
    CHECK(f.compute == cuda::lt_compute_type(p));
    auto c = cuda::conv_types(datatype::fp32, p);
    CHECK(c.data == CUDNN_DATA_FLOAT);
    CHECK(c.compute == CUDNN_DATA_FLOAT);
    CHECK(c.math == (p == cuda::precision::fp32 ? CUDNN_FMA_MATH
                                                : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  }
  CHECK(cuda::lt_compute_type(cuda::precision::fp32) == CUBLAS_COMPUTE_32F);
  struct want {
    datatype storage;
    cudaDataType_t lt;
    cudnnDataType_t dnn;
  };
  for (auto w : {want{datatype::fp16, CUDA_R_16F, CUDNN_DATA_HALF},
                 want{datatype::bf16, CUDA_R_16BF, CUDNN_DATA_BFLOAT16}}) {
    CAPTURE(to_string(w.storage));
    auto t = cuda::lt_types(w.storage, w.storage,
                            cuda::storage_type(cuda::precision::fp16) == w.storage
                              ? cuda::precision::fp16
                              : cuda::precision::bf16);
    CHECK(t.inputs == w.lt);
    CHECK(t.output == w.lt);
    CHECK(t.compute == CUBLAS_COMPUTE_32F); // fp32 accumulation, never 16F
    CHECK(t.scale == CUDA_R_32F);           // alpha and beta stay float
    auto c = cuda::conv_types(w.storage, cuda::precision::fp16);
    CHECK(c.data == w.dnn);
    CHECK(c.compute == CUDNN_DATA_FLOAT);
    CHECK(c.math == CUDNN_TENSOR_OP_MATH);
  }
}

TEST_CASE("cuBLASLt types of a GEMM writing fp32 from half A and B: fp32 C and D") {
  for (auto [half, lt] : {std::pair{datatype::fp16, CUDA_R_16F}, {datatype::bf16, CUDA_R_16BF}})
    for (auto p : {cuda::precision::fp16, cuda::precision::bf16}) {
      CAPTURE(to_string(half));
      CAPTURE(cuda::to_string(p));
      auto t = cuda::lt_types(half, datatype::fp32, p);
      CHECK(t.inputs == lt);                  // A and B as stored
      CHECK(t.output == CUDA_R_32F);          // C and D: the fp32 output slot
      CHECK(t.compute == CUBLAS_COMPUTE_32F); // fp32 accumulation, as half A/B/C/D
      CHECK(t.scale == CUDA_R_32F);
    }
}

namespace {

/// `t`'s A and W (inputs 0 and 1) stored as `ab`, the rest (constants
/// converted) and the output as `out`, planned for an instance storing `storage`.
std::string kernel_widening(one_node t, datatype ab, datatype out, datatype storage) {
  auto& g = t.g;
  std::vector<bool> narrowed(g.values.size(), false);
  auto store = [&](int v, datatype type) {
    if (v < 0 || type == datatype::fp32) return;
    auto& val = g.values[v];
    if (val.constant) val.constant = cuda::half_copy(*val.constant, type);
    val.dtype = type;
    narrowed[v] = true;
  };
  const auto& n = t.n();
  for (size_t i = 0; i < n.inputs.size(); ++i) store(n.inputs[i], i < 2 ? ab : out);
  store(n.outputs[0], out);
  cuda::step_builder b{nullptr, g, std::vector<void*>(g.values.size(), nullptr), {}, 0,
                       storage, &narrowed};
  b.build();
  REQUIRE(b.steps.size() == 1);
  return b.steps[0].kernel;
}

} // namespace

TEST_CASE("GEMM steps take half A and W with an fp32 bias and output, and no other mix") {
  auto matmul = [] {
    one_node t("FusedMatMul", {{2, 4, 16}, {16, 8}, {8}}, {false, true, true}, {2, 4, 8});
    t.n().set_s("activation", "Gelu");
    return t;
  };
  auto gemm = [](std::vector<int64_t> c) {
    one_node t("FusedGemm", {{4, 16}, {8, 16}, c}, {false, true, true}, {4, 8});
    t.n().set_i("transB", 1);
    t.n().set_f("beta", 0.5f);
    return t;
  };
  const auto f32 = datatype::fp32;
  for (auto half : {datatype::fp16, datatype::bf16}) {
    CAPTURE(to_string(half));
    CHECK(kernel_widening(matmul(), half, f32, half) == "cublaslt+convert");
    CHECK(kernel_widening(gemm({8}), half, f32, half) == "cublaslt+convert");    // bias: epilogue
    CHECK(kernel_widening(gemm({4, 8}), half, f32, half) == "cublaslt+convert"); // C: cuBLASLt's
    // One type throughout is the plain step.
    CHECK(kernel_widening(matmul(), half, half, half) == "cublaslt");
    // cuBLASLt has no fp32 A/B with half D; an instance storing fp32 (or the
    // other half type) has no half GEMM; a half bias with an fp32 output
    // would have to be added in fp32.
    auto other = half == datatype::fp16 ? datatype::bf16 : datatype::fp16;
    CHECK(kernel_widening(matmul(), f32, half, half) == "host:FusedMatMul+convert");
    CHECK(kernel_widening(matmul(), half, f32, f32) == "host:FusedMatMul+convert");
    CHECK(kernel_widening(matmul(), half, f32, other) == "host:FusedMatMul+convert");
    auto half_bias = matmul();
    half_bias.g.values[half_bias.n().inputs[2]].constant =
      cuda::half_copy(*half_bias.g.values[half_bias.n().inputs[2]].constant, half);
    half_bias.g.values[half_bias.n().inputs[2]].dtype = half;
    CHECK(kernel_widening(half_bias, half, f32, half) == "host:FusedMatMul+convert");
  }
}

TEST_CASE("what store_in_half lets a GEMM write in fp32, its GEMM step writes") {
  // The rewrite's rule (writes_fp32_output) and the steps' (gemm_types) agree:
  // each node below ends a graph as its declared output's producer.
  struct sample {
    std::string name;
    std::function<one_node()> make;
  };
  const sample samples[] = {
    {"lm head", [] { return one_node("FusedMatMul", {{2, 4, 16}, {16, 8}}, {false, true}, {2, 4, 8}); }},
    {"matmul with bias", [] {
       one_node t("FusedMatMul", {{4, 16}, {16, 8}, {8}}, {false, true, true}, {4, 8});
       t.n().set_s("activation", "Tanh");
       return t;
     }},
    {"classifier gemm", [] {
       one_node t("FusedGemm", {{4, 16}, {8, 16}, {8}}, {false, true, true}, {4, 8});
       t.n().set_i("transB", 1);
       return t;
     }},
    {"gemm with full C", [] {
       return one_node("FusedGemm", {{4, 16}, {16, 8}, {4, 8}}, {false, true, true}, {4, 8});
     }},
  };
  for (const auto& s : samples)
    for (auto half : {datatype::fp16, datatype::bf16}) {
      CAPTURE(s.name);
      CAPTURE(to_string(half));
      auto t = s.make();
      t.g.inputs = {t.n().inputs[0]};
      t.g.outputs = {t.n().outputs[0]};
      CHECK(cuda::writes_fp32_output(t.g, t.n()));
      auto narrowed = cuda::store_in_half(t.g, {half, [](int) { return true; }, nullptr});
      cuda::step_builder b{nullptr, t.g, std::vector<void*>(t.g.values.size(), nullptr), {}, 0,
                           half, &narrowed};
      b.build();
      std::vector<std::string> kernels;
      for (const auto& st : b.steps) kernels.push_back(st.kernel);
      // The input's conversion, then the GEMM writing the fp32 output.
      CHECK(kernels == std::vector<std::string>{"convert", "cublaslt+convert"});
    }
}
