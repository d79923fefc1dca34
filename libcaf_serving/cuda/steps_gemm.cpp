/// The GEMM device steps: cuBLASLt planned at load (plan_lt_gemm, which
/// FusedMatMul in steps_core.cpp shares), and FusedGemm, ONNX's Gemm with the
/// engine's fused activation: act(alpha op(A) op(W) + beta C).

#include "cuda/steps.hpp"

#include "cuda/cuda_check.hpp"
#include "cuda/epilogue.hpp"
#include "core/half.hpp"
#include "onnx/op_registry.hpp"

#include <cassert>
#include <cstring>
#include <string>

namespace caf_serving::cuda {

namespace k = caf_serving::kernels;

cublasComputeType_t lt_compute_type(precision p) {
  switch (p) {
    case precision::fp16: return CUBLAS_COMPUTE_32F_FAST_16F;
    case precision::bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    default: return CUBLAS_COMPUTE_32F;
  }
}

lt_data_types lt_types(datatype inputs, datatype output, precision compute) {
  assert(output == inputs || output == datatype::fp32);
  switch (inputs) {
    case datatype::fp16:
      return {CUDA_R_16F, output == inputs ? CUDA_R_16F : CUDA_R_32F, CUBLAS_COMPUTE_32F,
              CUDA_R_32F};
    case datatype::bf16:
      return {CUDA_R_16BF, output == inputs ? CUDA_R_16BF : CUDA_R_32F, CUBLAS_COMPUTE_32F,
              CUDA_R_32F};
    default:
      assert(inputs == datatype::fp32);
      return {CUDA_R_32F, CUDA_R_32F, lt_compute_type(compute), CUDA_R_32F};
  }
}

std::optional<gemm_float_types> gemm_types(const step_builder& b, const onnx::node& n) {
  if (auto t = b.float_type(n)) return gemm_float_types{*t, *t};
  const bool half = b.storage == datatype::fp16 || b.storage == datatype::bf16;
  if (!half || n.inputs.size() < 2) return std::nullopt;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const int v = n.inputs[i];
    if (v >= 0 && b.g.values[v].dtype != (i < 2 ? b.storage : datatype::fp32))
      return std::nullopt;
  }
  for (int v : n.outputs)
    if (v >= 0 && b.g.values[v].dtype != datatype::fp32) return std::nullopt;
  return gemm_float_types{b.storage, datatype::fp32};
}

std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
gemm_storage(step_function f) {
  return [f](step_builder& b, const onnx::graph&, const onnx::node& n) -> std::optional<gpu_step> {
    if (!gemm_types(b, n)) return std::nullopt;
    return f(b, n);
  };
}

lt_operands lt_layout(const lt_gemm_config& g) {
  // Row-major w [k, n] read column-major is already op(w)^T (n x k, ld n); stored
  // [n, k] (transB) it is k x n (ld k), and cuBLASLt transposes it. Likewise a:
  // [m, k] is k x m (ld k); stored [k, m] (transA) it is m x k (ld m), transposed.
  lt_operands o;
  o.a = g.w_transposed ? lt_operand{g.k, g.n, static_cast<int64_t>(g.k), true}
                       : lt_operand{g.n, g.k, static_cast<int64_t>(g.n), false};
  o.b = g.a_transposed ? lt_operand{g.m, g.k, static_cast<int64_t>(g.m), true}
                       : lt_operand{g.k, g.m, static_cast<int64_t>(g.k), false};
  o.d = lt_operand{g.n, g.m, static_cast<int64_t>(g.n), false};
  return o;
}

std::function<void(cudaStream_t)> plan_lt_gemm(step_context& ctx, const lt_gemm_config& g) {
  const lt_operands o = lt_layout(g);
  cublasOperation_t op_w = o.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_a = o.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lw, la, ld;
  const lt_data_types t = lt_types(g.type, g.out_type, ctx.compute);
  CAF_CUDA_CHECK(cublasLtMatmulDescCreate(&desc, t.compute, t.scale));
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lw, t.inputs, o.a.rows, o.a.cols, o.a.ld));
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&la, t.inputs, o.b.rows, o.b.cols, o.b.ld));
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&ld, t.output, o.d.rows, o.d.cols, o.d.ld));
  // Kept from here on, so that a throw below leaks nothing.
  ctx.keep.push_back(std::shared_ptr<void>(nullptr, [desc, lw, la, ld](void*) {
    cublasLtMatrixLayoutDestroy(lw); cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(ld); cublasLtMatmulDescDestroy(desc);
  }));
  CAF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_w,
                                                sizeof op_w));
  CAF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a,
                                                sizeof op_a));
  cublasLtMatmulPreference_t pref;
  CAF_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = workspace_bytes;
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(ctx.lt, desc, lw, la, ld, ld, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  CAF_CUDA_CHECK(status);
  if (found == 0)
    throw k::cuda_error("cuBLASLt has no algorithm for the " + std::string(to_string(g.type))
                        + (g.out_type != g.type ? " to " + std::string(to_string(g.out_type))
                                                : std::string())
                        + " GEMM [" + std::to_string(g.m)
                        + " x " + std::to_string(g.k) + "] x [" + std::to_string(g.k) + " x "
                        + std::to_string(g.n) + "]");
  auto lt = ctx.lt;
  void* workspace = ctx.workspace;
  auto algo = heur.algo;
  // Without c, cuBLASLt reads d with beta 0 (its C and D are one matrix).
  const void* c = g.c ? g.c : g.d;
  float alpha = g.alpha, beta = g.c ? g.beta : 0.0f;
  return [=, a = g.a, w = g.w, d = g.d](cudaStream_t s) {
    CAF_CUDA_CHECK(cublasLtMatmul(lt, desc, &alpha, w, lw, a, la, &beta, c, ld, d, ld, &algo,
                                  workspace, workspace_bytes, s));
  };
}

namespace {

/// beta * C of a constant broadcast C (`count` elements) in C's own type (fp32,
/// or the half storage type, scaled in fp32 and rounded once), as bytes.
std::vector<uint8_t> scaled_bias(const onnx::tensor_data& c, float beta, size_t count) {
  std::vector<uint8_t> out(count * element_size(c.dtype));
  for (size_t i = 0; i < count; ++i) {
    if (c.dtype == datatype::fp32) {
      float v = beta * c.as<float>()[i];
      std::memcpy(out.data() + i * sizeof v, &v, sizeof v);
      continue;
    }
    const uint16_t h = c.as<uint16_t>()[i];
    const bool f16 = c.dtype == datatype::fp16;
    float v = beta * (f16 ? fp16_to_float(h) : bf16_to_float(h));
    uint16_t r = f16 ? fp16_from_float(v) : bf16_from_float(v);
    std::memcpy(out.data() + i * sizeof r, &r, sizeof r);
  }
  return out;
}

/// How FusedGemm's C reaches the [m, n] output.
enum class c_kind {
  none,
  full, ///< [m, n]: cuBLASLt's C, times beta
  bias, ///< broadcast ([n], [1, n], [m, 1], a scalar): the epilogue's bias, times beta
};

/// FusedGemm(A, W, C?) [alpha, beta, transA, transB, activation] on cuBLASLt, the
/// transposes as cuBLASLt's operations; a broadcast C and the activation in the
/// epilogue kernel after. A broadcast C with beta other than 1 must be constant
/// (scaled once, at load).
std::optional<gpu_step> gemm_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  auto shape = [&](int v) -> const dims_t& { return b.shape(v); };
  const int y = step_builder::out(n, 0);
  if (!(n.op == "FusedGemm" && shape(in(0)).size() == 2 && shape(in(1)).size() == 2
        && shape(y).size() == 2))
    return std::nullopt;
  auto act = activation_of(n);
  if (!act) return std::nullopt;
  const bool ta = n.get_i("transA", 0) != 0, tb = n.get_i("transB", 0) != 0;
  const float alpha = n.get_f("alpha", 1.0f), beta = n.get_f("beta", 1.0f);
  const uint64_t m = shape(y)[0], nn = shape(y)[1];
  const uint64_t kk = ta ? shape(in(0))[0] : shape(in(0))[1];
  const int cv = in(2);
  c_kind ck = c_kind::none;
  k::bias_layout layout;
  if (cv >= 0 && beta != 0.0f) {
    const auto& cs = shape(cv);
    if (cs.size() > 2) return std::nullopt;
    // C's dimensions right-aligned to [m, n], as numpy broadcasts them.
    int64_t cm = cs.size() == 2 ? cs[0] : 1;
    int64_t cn = cs.empty() ? 1 : cs.back();
    if (cm == static_cast<int64_t>(m) && cn == static_cast<int64_t>(nn) && m > 1) {
      ck = c_kind::full;
    } else if (cm == 1 && (cn == static_cast<int64_t>(nn) || cn == 1)) {
      ck = c_kind::bias;
      layout = {static_cast<size_t>(cn), 1};
    } else if (cm == static_cast<int64_t>(m) && cn == 1) {
      ck = c_kind::bias;
      layout = {static_cast<size_t>(m), static_cast<size_t>(nn)}; // one value per row
    } else {
      return std::nullopt;
    }
    if (ck == c_kind::bias && beta != 1.0f && !b.g.values[cv].constant) return std::nullopt;
  }
  const auto types = *gemm_types(b, n);
  const char* kernel = types.widens() ? "cublaslt+convert" : "cublaslt";
  if (b.dry()) return b.planned(kernel);
  lt_gemm_config g;
  g.m = m;
  g.n = nn;
  g.k = kk;
  g.a_transposed = ta;
  g.w_transposed = tb;
  g.alpha = alpha;
  g.type = types.inputs;
  g.out_type = types.output;
  g.a = b.ptrs[in(0)];
  g.w = b.ptrs[in(1)];
  g.d = b.ptrs[y];
  if (ck == c_kind::full) {
    g.c = b.ptrs[cv];
    g.beta = beta;
  }
  auto gemm = plan_lt_gemm(*b.ctx, g);
  k::epilogue_args e; // on D, with C's bias: in the output type
  e.type = kernel_dtype(g.out_type);
  e.input = g.d;
  e.output = g.d;
  e.count = m * nn;
  e.act = act->act;
  e.params = act->params;
  if (ck == c_kind::bias) {
    e.layout = layout;
    if (beta == 1.0f) {
      e.bias = b.ptrs[cv];
    } else { // beta C, once, in memory of its own that the context keeps
      auto scaled = scaled_bias(*b.g.values[cv].constant, beta, layout.channels);
      void* mem = nullptr;
      CAF_CUDA_CHECK(cudaMalloc(&mem, scaled.size()));
      b.ctx->keep.push_back(std::shared_ptr<void>(mem, [](void* p) { cudaFree(p); }));
      CAF_CUDA_CHECK(cudaMemcpy(mem, scaled.data(), scaled.size(), cudaMemcpyHostToDevice));
      e.bias = mem;
    }
  }
  bool needs_epilogue = e.bias || e.act != k::activation::none;
  return gpu_step{kernel, false, [gemm, e, needs_epilogue](cudaStream_t s) {
    gemm(s);
    if (needs_epilogue) k::launch_epilogue(e, s);
  }};
}

} // namespace

/// One float type, fp32 or the storage type, as the core steps; or half A and
/// W writing an fp32 output (gemm_types).
std::vector<device_kernel> gemm_steps() {
  return {
    {"FusedGemm", {}, "cublaslt", gemm_storage(gemm_step)},
  };
}

} // namespace caf_serving::cuda
