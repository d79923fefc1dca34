/// The core device steps (copies, the engine's epilogue, softmax and LayerNorm
/// kernels, cuBLASLt matmuls, cuDNN convolutions and pooling), the host
/// fallback, and the table that joins every family (steps.hpp).

#include "cuda/steps.hpp"

#include "cuda/add_layer_norm.hpp"
#include "cuda/convert.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/storage_plan.hpp"
#include "cuda/epilogue.hpp"
#include "cuda/softmax.hpp"
#include "core/half.hpp"
#include "onnx/op_registry.hpp"

#include <algorithm>
#include <iostream>
#include <mutex>

namespace caf_serving::cuda {

namespace k = caf_serving::kernels;

size_t value_bytes(const onnx::value& v) {
  return static_cast<size_t>(onnx::element_count(v.shape)) * element_size(v.dtype);
}

void conv_desc::destroy() {
  cudnnDestroyTensorDescriptor(x); cudnnDestroyTensorDescriptor(y);
  cudnnDestroyTensorDescriptor(b); cudnnDestroyTensorDescriptor(z);
  cudnnDestroyFilterDescriptor(w); cudnnDestroyConvolutionDescriptor(conv);
  cudnnDestroyActivationDescriptor(act);
}

step_context::~step_context() {
  for (auto& d : convs) d.destroy();
}

std::optional<datatype> step_builder::float_type(const onnx::node& n) const {
  std::optional<datatype> t;
  for (const auto* vs : {&n.inputs, &n.outputs})
    for (int v : *vs) {
      if (v < 0) continue;
      auto d = g.values[v].dtype;
      if ((d != datatype::fp32 && d != storage) || (t && *t != d)) return std::nullopt;
      t = d;
    }
  return t;
}

k::dtype kernel_dtype(datatype t) {
  switch (t) {
    case datatype::fp16: return k::dtype::f16;
    case datatype::bf16: return k::dtype::bf16;
    default: return k::dtype::f32;
  }
}

std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
any_type(step_function f) {
  return [f](step_builder& b, const onnx::graph&, const onnx::node& n) { return f(b, n); };
}

std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
float_storage(step_function f) {
  return [f](step_builder& b, const onnx::graph&, const onnx::node& n) -> std::optional<gpu_step> {
    if (!b.float_type(n)) return std::nullopt;
    return f(b, n);
  };
}

const device_table& device_steps() {
  static const device_table table([] {
    std::vector<device_kernel> all;
    for (auto family : {core_steps, attention_steps, gemm_steps, data_steps, elementwise_steps})
      for (auto& k : family()) all.push_back(std::move(k));
    return all;
  }());
  return table;
}

void step_builder::build() {
  for (const auto& n : g.nodes) {
    if (auto s = device_steps().build(*this, g, n))
      steps.push_back(std::move(*s));
    else
      host(n);
  }
}

namespace {

/// A half-stored tensor of a host step, widened to fp32 for the reference
/// kernel (which computes on the model's own types) and narrowed back.
struct widened {
  datatype storage = datatype::fp16;
  uint16_t* half = nullptr; ///< the pinned copy of the device bytes
  std::vector<float> wide;
};

void widen(const uint16_t* h, datatype t, std::vector<float>& out) {
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = t == datatype::fp16 ? fp16_to_float(h[i]) : bf16_to_float(h[i]);
}

struct host_fallback {
  onnx::node n;
  std::vector<onnx::tensor_ref> ins, outs;
  std::vector<const void*> device_in;  ///< null for constants (read on the host)
  std::vector<void*> device_out;
  std::vector<size_t> in_bytes, out_bytes;
  std::vector<std::unique_ptr<uint8_t, cudaError_t (*)(void*)>> pinned;
  std::vector<widened> wide_in, wide_out; ///< at precision fp16/bf16
  std::vector<std::vector<float>> wide_constants;

  static void CUDART_CB run(void* self) {
    auto* f = static_cast<host_fallback*>(self);
    for (auto& w : f->wide_in) widen(w.half, w.storage, w.wide);
    onnx::run_reference(f->n, f->ins, f->outs);
    for (auto& w : f->wide_out)
      for (size_t i = 0; i < w.wide.size(); ++i)
        w.half[i] = w.storage == datatype::fp16 ? fp16_from_float(w.wide[i])
                                                : bf16_from_float(w.wide[i]);
  }
};

} // namespace

uint8_t* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  CAF_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  return static_cast<uint8_t*>(p);
}

cudaError_t pinned_free(void* p) { return cudaFreeHost(p); }

void step_builder::host(const onnx::node& n) {
  auto is_narrowed = [&](int v) {
    return v >= 0 && narrowed && static_cast<size_t>(v) < narrowed->size() && (*narrowed)[v];
  };
  // At precision fp16/bf16 the host step converts its half values on the host.
  bool converts = std::any_of(n.inputs.begin(), n.inputs.end(), is_narrowed)
                  || std::any_of(n.outputs.begin(), n.outputs.end(), is_narrowed);
  std::string kernel = "host:" + n.op + (converts ? "+convert" : "");
  if (dry()) {
    steps.push_back({kernel, true, {}});
    return;
  }
  auto f = std::make_shared<host_fallback>();
  f->n = n;
  // Reserved so that the widened buffers' addresses stay put.
  f->wide_in.reserve(n.inputs.size());
  f->wide_out.reserve(n.outputs.size());
  f->wide_constants.reserve(n.inputs.size());
  for (int v : n.inputs) {
    onnx::tensor_ref r;
    if (v >= 0) {
      const auto& val = g.values[v];
      const auto count = static_cast<size_t>(onnx::element_count(val.shape));
      r.dtype = is_narrowed(v) ? datatype::fp32 : val.dtype;
      r.shape = val.shape;
      if (val.constant) {
        r.data = const_cast<uint8_t*>(val.constant->bytes.data());
        if (is_narrowed(v)) {
          f->wide_constants.emplace_back(count);
          widen(val.constant->as<uint16_t>(), val.dtype, f->wide_constants.back());
          r.data = f->wide_constants.back().data();
        }
        f->device_in.push_back(nullptr);
        f->in_bytes.push_back(0);
      } else {
        f->pinned.emplace_back(pinned_alloc(value_bytes(val)), pinned_free);
        r.data = f->pinned.back().get();
        if (is_narrowed(v)) {
          f->wide_in.push_back({val.dtype, reinterpret_cast<uint16_t*>(r.data),
                                std::vector<float>(count)});
          r.data = f->wide_in.back().wide.data();
        }
        f->device_in.push_back(ptrs[v]);
        f->in_bytes.push_back(value_bytes(val));
      }
    } else {
      f->device_in.push_back(nullptr);
      f->in_bytes.push_back(0);
    }
    f->ins.push_back(r);
  }
  for (int v : n.outputs) {
    if (v < 0) { // an omitted output (LayerNormalization's Mean) keeps its place, unwritten
      f->outs.push_back(onnx::tensor_ref{});
      f->device_out.push_back(nullptr);
      f->out_bytes.push_back(0);
      continue;
    }
    const auto& val = g.values[v];
    f->pinned.emplace_back(pinned_alloc(value_bytes(val)), pinned_free);
    void* data = f->pinned.back().get();
    if (is_narrowed(v)) {
      f->wide_out.push_back({val.dtype, static_cast<uint16_t*>(data),
                             std::vector<float>(onnx::element_count(val.shape))});
      f->outs.push_back({datatype::fp32, val.shape, f->wide_out.back().wide.data()});
    } else {
      f->outs.push_back({val.dtype, val.shape, data});
    }
    f->device_out.push_back(ptrs[v]);
    f->out_bytes.push_back(value_bytes(val));
  }
  ctx->keep.push_back(f);
  steps.push_back({kernel, true, [f = f.get()](cudaStream_t s) {
    for (size_t i = 0; i < f->ins.size(); ++i)
      if (f->device_in[i])
        CAF_CUDA_CHECK(cudaMemcpyAsync(f->ins[i].data, f->device_in[i], f->in_bytes[i],
                                       cudaMemcpyDeviceToHost, s));
    CAF_CUDA_CHECK(cudaLaunchHostFunc(s, &host_fallback::run, f));
    for (size_t i = 0; i < f->outs.size(); ++i)
      if (f->device_out[i])
        CAF_CUDA_CHECK(cudaMemcpyAsync(f->device_out[i], f->outs[i].data, f->out_bytes[i],
                                       cudaMemcpyHostToDevice, s));
  }});
}


std::optional<epilogue_activation> activation_of(const onnx::node& n) {
  static const std::pair<const char*, k::activation> names[] = {
    {"", k::activation::none},
    {"Relu", k::activation::relu},
    {"Gelu", k::activation::gelu_erf},
    {"GeluTanh", k::activation::gelu_tanh},
    {"Tanh", k::activation::tanh},
    {"Sigmoid", k::activation::sigmoid},
    {"Clip", k::activation::clip},
    {"HardSwish", k::activation::hard_swish},
    {"HardSigmoid", k::activation::hard_sigmoid},
    {"Swish", k::activation::swish},
    {"LeakyRelu", k::activation::leaky_relu},
  };
  auto name = n.get_s("activation", "");
  for (const auto& [onnx_name, act] : names)
    if (name == onnx_name)
      return epilogue_activation{act, {n.get_f("act_alpha", 0.0f), n.get_f("act_beta", 0.0f)}};
  return std::nullopt;
}

namespace {

/// Reshape, Flatten, Squeeze, Unsqueeze, Identity: same bytes, new shape.
std::optional<gpu_step> copy_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  const int y = step_builder::out(n, 0);
  if (b.dry()) return b.planned("copy");
  const void* src = b.ptrs[in(0)];
  void* dst = b.ptrs[y];
  size_t bytes = value_bytes(b.g.values[y]);
  return gpu_step{"copy", false, [src, dst, bytes](cudaStream_t s) {
    if (src != dst) CAF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  }};
}

/// The epilogue kernel over element-wise node `n`'s input 0 and output, with
/// what `fill` adds (a residual, an activation, a bias); a dry run plans it.
template <class Fill>
std::optional<gpu_step> epilogue_of(step_builder& b, const onnx::node& n, Fill fill) {
  if (b.dry()) return b.planned("epilogue");
  const int y = step_builder::out(n, 0);
  k::epilogue_args a;
  a.type = kernel_dtype(b.g.values[y].dtype);
  a.input = b.ptrs[step_builder::in(n, 0)];
  a.output = b.ptrs[y];
  a.count = onnx::element_count(b.shape(y));
  fill(a);
  return gpu_step{"epilogue", false, [a](cudaStream_t s) { k::launch_epilogue(a, s); }};
}

/// Relu.
std::optional<gpu_step> relu_step(step_builder& b, const onnx::node& n) {
  return epilogue_of(b, n, [](k::epilogue_args& a) { a.act = k::activation::relu; });
}

/// Add of equal shapes: X plus a residual.
std::optional<gpu_step> add_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  const int y = step_builder::out(n, 0);
  if (!(b.shape(in(0)) == b.shape(in(1)) && b.shape(in(0)) == b.shape(y)))
    return std::nullopt;
  return epilogue_of(b, n, [&](k::epilogue_args& a) { a.residual = b.ptrs[in(1)]; });
}

/// FusedGelu (erf) or FusedGeluTanh with a bias per last-axis column, or none.
std::optional<gpu_step> gelu_step(step_builder& b, const onnx::node& n) {
  const int bias = step_builder::in(n, 1);
  if (!(bias < 0 || b.shape(bias).size() == 1))
    return std::nullopt;
  return epilogue_of(b, n, [&](k::epilogue_args& a) {
    a.act = n.op == "FusedGeluTanh" ? k::activation::gelu_tanh : k::activation::gelu_erf;
    if (bias >= 0) {
      a.bias = b.ptrs[bias];
      a.layout = {static_cast<size_t>(b.shape(bias)[0]), 1};
    }
  });
}

/// Softmax over the last axis.
std::optional<gpu_step> softmax_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  auto shape = [&](int v) -> const dims_t& { return b.shape(v); };
  const int y = step_builder::out(n, 0);
  if (!(n.op == "Softmax" && (n.get_i("axis", -1) == -1
                            || n.get_i("axis", -1) == static_cast<int64_t>(shape(y).size()) - 1)))
    return std::nullopt;
  if (b.dry()) return b.planned("softmax");
  k::softmax_args a;
  a.type = kernel_dtype(b.g.values[y].dtype);
  a.input = b.ptrs[in(0)];
  a.output = b.ptrs[y];
  a.cols = shape(y).back();
  a.rows = onnx::element_count(shape(y)) / a.cols;
  return gpu_step{"softmax", false, [a](cudaStream_t s) { k::launch_softmax(a, s); }};
}

/// FusedLayerNorm over the last axis, with beta, up to add_layer_norm_max_cols.
std::optional<gpu_step> layer_norm_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  auto shape = [&](int v) -> const dims_t& { return b.shape(v); };
  const int y = step_builder::out(n, 0);
  if (!(n.op == "FusedLayerNorm" && in(2) >= 0 && n.get_i("axis", -1) == -1))
    return std::nullopt;
  if (shape(y).back() > static_cast<int64_t>(k::add_layer_norm_max_cols)) return std::nullopt;
  if (b.dry()) return b.planned("layer_norm");
  k::add_layer_norm_args a;
  a.type = kernel_dtype(b.g.values[y].dtype);
  a.input = b.ptrs[in(0)];
  a.gamma = b.ptrs[in(1)];
  a.beta = b.ptrs[in(2)];
  a.output = b.ptrs[y];
  a.cols = shape(y).back();
  a.rows = onnx::element_count(shape(y)) / a.cols;
  a.eps = n.get_f("epsilon", 1e-5f);
  return gpu_step{"layer_norm", false, [a](cudaStream_t s) { k::launch_add_layer_norm(a, s); }};
}

/// FusedMatMul with constant 2-D weights on cuBLASLt, its epilogue after. With
/// half A and W and an fp32 output (gemm_types), cuBLASLt writes D in fp32 and
/// the epilogue runs on it with the fp32 bias.
std::optional<gpu_step> matmul_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  auto shape = [&](int v) -> const dims_t& { return b.shape(v); };
  const int y = step_builder::out(n, 0);
  if (!(n.op == "FusedMatMul" && b.g.values[in(1)].constant && shape(in(1)).size() == 2))
    return std::nullopt;
  auto act = activation_of(n);
  if (!act) return std::nullopt;
  const auto types = *gemm_types(b, n);
  const char* kernel = types.widens() ? "cublaslt+convert" : "cublaslt";
  if (b.dry()) return b.planned(kernel);
  lt_gemm_config g;
  g.k = shape(in(0)).back();
  g.n = shape(in(1))[1];
  g.m = onnx::element_count(shape(in(0))) / g.k;
  g.type = types.inputs;
  g.out_type = types.output;
  g.a = b.ptrs[in(0)];
  g.w = b.ptrs[in(1)];
  g.d = b.ptrs[y];
  auto gemm = plan_lt_gemm(*b.ctx, g);
  k::epilogue_args e;
  e.type = kernel_dtype(g.out_type);
  e.input = g.d;
  e.output = g.d;
  e.count = g.m * g.n;
  e.act = act->act;
  e.params = act->params;
  if (in(2) >= 0) { e.bias = b.ptrs[in(2)]; e.layout = {g.n, 1}; }
  if (in(3) >= 0) e.residual = b.ptrs[in(3)];
  bool needs_epilogue = e.bias || e.residual || e.act != k::activation::none;
  return gpu_step{kernel, false, [gemm, e, needs_epilogue](cudaStream_t s) {
    gemm(s);
    if (needs_epilogue) k::launch_epilogue(e, s);
  }};
}

/// Says once per process that cuDNN refused a fused bf16 convolution and which
/// path such convolutions take instead (choose_conv_path).
void log_split_bf16_conv(const onnx::node& n, cudnnConvolutionFwdAlgo_t algo) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::cerr << "caf-serving: cuDNN " << cudnnGetVersion()
              << " refused the fused bf16 convolution + bias + activation "
                 "(cudnnConvolutionBiasActivationForward: CUDNN_STATUS_NOT_SUPPORTED) for "
                 "FusedConv '"
              << n.name << "' (algorithm " << static_cast<int>(algo)
              << "); bf16 convolutions it refuses run as cudnnConvolutionForward plus the "
                 "epilogue kernel, with the same result (logged once)"
              << std::endl;
  });
}

/// FusedConv (2-D, any group, symmetric pads, every activation of activation_of)
/// on cuDNN, as act(conv(X, W) + B + R) (onnx/ops_nn.hpp): cuDNN's fused call, or the
/// plain convolution with the algorithm cudnnFind times fastest, then the epilogue
/// kernel in place (bias, residual, activation, in FusedConv's order), as
/// choose_conv_path says. At load the fused call's algorithm is searched and the
/// call run once, so that a bf16 call cuDNN refuses takes the split path instead.
std::optional<gpu_step> conv_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  auto shape = [&](int v) -> const dims_t& { return b.shape(v); };
  const int y = step_builder::out(n, 0);
  if (!(n.op == "FusedConv" && b.g.values[in(1)].constant && shape(in(0)).size() == 4
        && shape(in(1)).size() == 4))
    return std::nullopt;
  auto act = activation_of(n);
  if (!act) return std::nullopt;
  const auto& xs = shape(in(0));
  const auto& ws = shape(in(1));
  const auto& ys = shape(y);
  const int64_t group = n.get_i("group", 1);
  // cuDNN's grouped filter is [K, C / group, kh, kw], as ONNX's.
  if (group < 1 || xs[1] % group != 0 || ws[0] % group != 0 || ws[1] * group != xs[1])
    return std::nullopt;
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  if (st.size() != 2 || pd.size() != 4 || dl.size() != 2) return std::nullopt;
  // cuDNN pads each side alike; none of the target models pads asymmetrically.
  if (pd[0] != pd[2] || pd[1] != pd[3]) return std::nullopt;
  const datatype type = b.g.values[y].dtype;
  conv_path_query query{group, act->act, type};
  auto kernel_of = [](conv_path p) {
    return p == conv_path::fused ? "cudnn_conv" : "cudnn_conv+epilogue";
  };
  if (b.dry()) return b.planned(kernel_of(choose_conv_path(query)));
  const auto types = conv_types(type, b.ctx->compute);
  conv_desc d;
  auto mk4 = [&types](cudnnTensorDescriptor_t& t, const dims_t& s) {
    CAF_CUDA_CHECK(cudnnCreateTensorDescriptor(&t));
    CAF_CUDA_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, types.data,
                                              s[0], s[1], s[2], s[3]));
  };
  mk4(d.x, xs);
  mk4(d.y, ys);
  mk4(d.z, ys);
  mk4(d.b, {1, ys[1], 1, 1});
  CAF_CUDA_CHECK(cudnnCreateFilterDescriptor(&d.w));
  CAF_CUDA_CHECK(cudnnSetFilter4dDescriptor(d.w, types.data, CUDNN_TENSOR_NCHW, ws[0],
                                            ws[1], ws[2], ws[3]));
  CAF_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&d.conv));
  CAF_CUDA_CHECK(cudnnSetConvolution2dDescriptor(d.conv, pd[0], pd[1], st[0], st[1], dl[0],
                                                 dl[1], CUDNN_CROSS_CORRELATION, types.compute));
  CAF_CUDA_CHECK(cudnnSetConvolutionGroupCount(d.conv, static_cast<int>(group)));
  CAF_CUDA_CHECK(cudnnSetConvolutionMathType(d.conv, types.math));
  CAF_CUDA_CHECK(cudnnCreateActivationDescriptor(&d.act));
  CAF_CUDA_CHECK(cudnnSetActivationDescriptor(
    d.act, act->act == k::activation::relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
    CUDNN_NOT_PROPAGATE_NAN, 0.0));
  // Kept (and destroyed with the context) from here on, whatever throws below.
  b.ctx->convs.push_back(d);
  const void* x = b.ptrs[in(0)];
  const void* w = b.ptrs[in(1)];
  void* out = b.ptrs[y];
  auto h = b.ctx->cudnn;
  void* workspace = b.ctx->workspace;

  // The algorithm cudnnFind times fastest within the workspace (its status: the
  // search's own).
  auto search = [&]() -> cudnnStatus_t {
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int got = 0;
    cudnnStatus_t status = cudnnFindConvolutionForwardAlgorithmEx(
      h, d.x, x, d.w, w, d.conv, d.y, out, 8, &got, perf, workspace, workspace_bytes);
    d.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    for (int i = 0; i < got; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= workspace_bytes) {
        d.algo = perf[i].algo;
        break;
      }
    return status;
  };
  auto check_workspace = [&] {
    size_t need = 0;
    CAF_CUDA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, d.algo,
                                                           &need));
    if (need > workspace_bytes)
      throw k::cuda_error("FusedConv '" + n.name + "': cuDNN's algorithm needs "
                          + std::to_string(need) + " bytes of workspace, more than the "
                          + std::to_string(workspace_bytes) + " every step shares");
  };
  const void* bias = in(2) >= 0 ? b.ptrs[in(2)] : b.ctx->zeros;
  const void* z = in(3) >= 0 ? b.ptrs[in(3)] : out;
  const float alpha2 = in(3) >= 0 ? 1.f : 0.f;
  auto fused_call = [=](const cudnnConvolutionFwdAlgo_t algo) {
    float one = 1.f;
    return cudnnConvolutionBiasActivationForward(h, &one, d.x, x, d.w, w, d.conv, algo,
                                                 workspace, workspace_bytes, &alpha2, d.z, z,
                                                 d.b, bias, d.act, d.y, out);
  };

  conv_path path = choose_conv_path(query);
  if (path == conv_path::fused) {
    // cuDNN's fused call runs IDENTITY only with IMPLICIT_PRECOMP_GEMM.
    const char* call = "cudnnFindConvolutionForwardAlgorithmEx";
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    if (act->act == k::activation::none)
      d.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    else
      status = search();
    if (status == CUDNN_STATUS_SUCCESS) {
      check_workspace();
      // Once here at load (the arena holds nothing yet): a refusal shows now.
      call = "cudnnConvolutionBiasActivationForward";
      status = fused_call(d.algo);
    }
    query.fused_status = status;
    path = choose_conv_path(query);
    if (path == conv_path::fused)
      k::cuda_check(status, call, __FILE__, __LINE__);
    else
      log_split_bf16_conv(n, d.algo);
  }
  if (path == conv_path::split) {
    k::cuda_check(search(), "cudnnFindConvolutionForwardAlgorithmEx", __FILE__, __LINE__);
    check_workspace();
  }
  b.ctx->convs.back().algo = d.algo;
  const char* kernel = kernel_of(path);
  if (path == conv_path::fused)
    return gpu_step{kernel, false, [fused_call, algo = d.algo](cudaStream_t) {
      CAF_CUDA_CHECK(fused_call(algo));
    }};
  k::epilogue_args e;
  e.type = kernel_dtype(type);
  e.input = out;
  e.output = out;
  e.count = onnx::element_count(ys);
  e.act = act->act;
  e.params = act->params;
  if (in(2) >= 0) {
    e.bias = b.ptrs[in(2)];
    e.layout = {static_cast<size_t>(ys[1]), static_cast<size_t>(ys[2] * ys[3])};
  }
  if (in(3) >= 0) e.residual = b.ptrs[in(3)];
  e.residual_first = true;
  bool needs_epilogue = e.bias || e.residual || e.act != k::activation::none;
  return gpu_step{kernel, false, [=](cudaStream_t s) {
    float one = 1.f, zero = 0.f;
    CAF_CUDA_CHECK(cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, d.algo, workspace,
                                           workspace_bytes, &zero, d.y, out));
    if (needs_epilogue) k::launch_epilogue(e, s);
  }};
}

/// MaxPool, AveragePool (no ceil_mode, symmetric pads) and GlobalAveragePool on cuDNN.
std::optional<gpu_step> pool_step(step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  auto shape = [&](int v) -> const dims_t& { return b.shape(v); };
  const int y = step_builder::out(n, 0);
  if (!((n.op == "MaxPool" || n.op == "AveragePool" || n.op == "GlobalAveragePool")
        && shape(in(0)).size() == 4))
    return std::nullopt;
  const auto& xs = shape(in(0));
  const auto& ys = shape(y);
  dims_t kk{xs[2], xs[3]}, st{1, 1}, pd{0, 0, 0, 0};
  if (n.op != "GlobalAveragePool") {
    kk = n.get_ints("kernel_shape");
    st = n.get_ints("strides", {1, 1});
    pd = n.get_ints("pads", {0, 0, 0, 0});
    if (n.get_i("ceil_mode", 0) || pd[0] != pd[2] || pd[1] != pd[3]) return std::nullopt;
    auto dl = n.get_ints("dilations", {1, 1});
    if (dl[0] != 1 || dl[1] != 1) return std::nullopt;
  }
  if (b.dry()) return b.planned("cudnn_pool");
  auto mode = n.op == "MaxPool" ? CUDNN_POOLING_MAX
              : n.get_i("count_include_pad", 0) ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  cudnnPoolingDescriptor_t pool;
  cudnnTensorDescriptor_t tx, ty;
  CAF_CUDA_CHECK(cudnnCreatePoolingDescriptor(&pool));
  CAF_CUDA_CHECK(cudnnSetPooling2dDescriptor(pool, mode, CUDNN_NOT_PROPAGATE_NAN, kk[0], kk[1],
                                             pd[0], pd[1], st[0], st[1]));
  CAF_CUDA_CHECK(cudnnCreateTensorDescriptor(&tx));
  CAF_CUDA_CHECK(cudnnCreateTensorDescriptor(&ty));
  // Half tensors pool in fp32 with float alpha/beta, as the convolutions.
  const auto data = conv_types(b.g.values[y].dtype, b.ctx->compute).data;
  CAF_CUDA_CHECK(cudnnSetTensor4dDescriptor(tx, CUDNN_TENSOR_NCHW, data, xs[0], xs[1], xs[2],
                                            xs[3]));
  CAF_CUDA_CHECK(cudnnSetTensor4dDescriptor(ty, CUDNN_TENSOR_NCHW, data, ys[0], ys[1], ys[2],
                                            ys[3]));
  b.ctx->keep.push_back(std::shared_ptr<void>(nullptr, [pool, tx, ty](void*) {
    cudnnDestroyPoolingDescriptor(pool); cudnnDestroyTensorDescriptor(tx);
    cudnnDestroyTensorDescriptor(ty);
  }));
  const void* x = b.ptrs[in(0)];
  void* out = b.ptrs[y];
  auto h = b.ctx->cudnn;
  return gpu_step{"cudnn_pool", false, [=](cudaStream_t) {
    float one = 1.f, zero = 0.f;
    CAF_CUDA_CHECK(cudnnPoolingForward(h, pool, &one, tx, x, &zero, ty, out));
  }};
}

/// StorageCast (storage_plan.hpp): an fp32 input converted to the storage type
/// after copy-in, or a declared output converted back before copy-out.
std::optional<gpu_step> storage_cast_step(step_builder& b, const onnx::node& n) {
  const int x = step_builder::in(n, 0), y = step_builder::out(n, 0);
  if (x < 0 || y < 0 || b.shape(x) != b.shape(y)) return std::nullopt;
  const auto from = b.g.values[x].dtype, to = b.g.values[y].dtype;
  auto half = [&](datatype t) { return t == datatype::fp16 || t == datatype::bf16; };
  if (!((from == datatype::fp32 && half(to)) || (half(from) && to == datatype::fp32)))
    return std::nullopt;
  if (b.dry()) return b.planned("convert");
  k::convert_args a;
  a.from = kernel_dtype(from);
  a.to = kernel_dtype(to);
  a.input = b.ptrs[x];
  a.output = b.ptrs[y];
  a.count = static_cast<size_t>(onnx::element_count(b.shape(y)));
  return gpu_step{"convert", false, [a](cudaStream_t s) {
    if (a.count > 0) k::launch_convert(a, s);
  }};
}

} // namespace

conv_path choose_conv_path(const conv_path_query& q) {
  const bool fusable = q.group == 1
                       && (q.act == k::activation::relu || q.act == k::activation::none);
  if (!fusable) return conv_path::split;
  if (q.type == datatype::bf16 && q.fused_status == CUDNN_STATUS_NOT_SUPPORTED)
    return conv_path::split;
  return conv_path::fused;
}

conv_data_types conv_types(datatype storage, precision compute) {
  switch (storage) {
    case datatype::fp16:
      return {CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH};
    case datatype::bf16:
      return {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH};
    default:
      return {CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
              compute == precision::fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION};
  }
}

/// Besides the copies, the core steps take one float type: fp32, or the
/// instance's storage type (float_storage); FusedMatMul also half A and W
/// writing an fp32 output (gemm_storage).
std::vector<device_kernel> core_steps() {
  return {
    {"Reshape", {}, "copy", any_type(copy_step)},
    {"Flatten", {}, "copy", any_type(copy_step)},
    {"Squeeze", {}, "copy", any_type(copy_step)},
    {"Unsqueeze", {}, "copy", any_type(copy_step)},
    {"Identity", {}, "copy", any_type(copy_step)},
    {storage_cast_op, {}, "convert", any_type(storage_cast_step)},
    {"Relu", {}, "epilogue", float_storage(relu_step)},
    {"Add", {}, "epilogue", float_storage(add_step)},
    {"FusedGelu", {}, "epilogue", float_storage(gelu_step)},
    {"FusedGeluTanh", {}, "epilogue", float_storage(gelu_step)},
    {"Softmax", {}, "softmax", float_storage(softmax_step)},
    {"FusedLayerNorm", {}, "layer_norm", float_storage(layer_norm_step)},
    {"FusedMatMul", {}, "cublaslt", gemm_storage(matmul_step)},
    {"FusedConv", {}, "cudnn_conv", float_storage(conv_step)},
    {"MaxPool", {}, "cudnn_pool", float_storage(pool_step)},
    {"AveragePool", {}, "cudnn_pool", float_storage(pool_step)},
    {"GlobalAveragePool", {}, "cudnn_pool", float_storage(pool_step)},
  };
}

} // namespace caf_serving::cuda
