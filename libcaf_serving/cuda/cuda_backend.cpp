#include "cuda/cuda_backend.hpp"

#include "cuda/add_layer_norm.hpp"
#include "cuda/capture_order.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/epilogue.hpp"
#include "cuda/softmax.hpp"
#include "onnx/importer.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/model_config.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/ops.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

namespace caf_serving::cuda {

namespace {

namespace k = caf_serving::kernels;
using dims_t = std::vector<int64_t>;
using exec_result = std::variant<std::monostate, serving_error>;

/// cuBLASLt and cuDNN get one fixed workspace, so a captured graph's pointer to it
/// never changes. 64 MiB covers cuDNN's fastest ResNet-50 algorithms at batch 128.
constexpr size_t workspace_bytes = size_t{64} << 20;
constexpr uint32_t staging_slots = 2;

size_t value_bytes(const onnx::value& v) {
  return static_cast<size_t>(onnx::element_count(v.shape)) * element_size(v.dtype);
}

/// Content key of a constant, so the folded weights of different bucket plans
/// (new tensor_data objects with equal bytes) share one device copy.
struct constant_key {
  int dtype;
  dims_t shape;
  uint64_t hash;
  bool operator<(const constant_key& o) const {
    return std::tie(dtype, shape, hash) < std::tie(o.dtype, o.shape, o.hash);
  }
};

constant_key key_of(const onnx::tensor_data& t) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : t.bytes) h = (h ^ b) * 1099511628211ull;
  return {static_cast<int>(t.dtype), t.shape, h};
}

/// One bucket's optimized graph and its liveness plan (host side only).
struct bucket_graph {
  uint32_t rows = 0;
  onnx::graph g;
  onnx::memory_plan memory;
};

/// A step enqueues its work on the compute stream.
struct gpu_step {
  std::string kernel;
  bool host = false;
  std::function<void(cudaStream_t)> launch;
};

/// Runs a node's CPU reference on pinned host copies, enqueued as a host function
/// between device copies (all three capturable).
struct host_fallback {
  onnx::node n;
  std::vector<onnx::tensor_ref> ins, outs;
  std::vector<const void*> device_in;  ///< null for constants (read on the host)
  std::vector<void*> device_out;
  std::vector<size_t> in_bytes, out_bytes;
  std::vector<std::unique_ptr<uint8_t, cudaError_t (*)(void*)>> pinned;

  static void CUDART_CB run(void* self) {
    auto* f = static_cast<host_fallback*>(self);
    onnx::run_reference(f->n, f->ins, f->outs);
  }
};

uint8_t* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  CAF_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  return static_cast<uint8_t*>(p);
}

cudaError_t pinned_free(void* p) { return cudaFreeHost(p); }

k::activation activation_of(const std::string& a, bool& ok) {
  ok = true;
  if (a.empty()) return k::activation::none;
  if (a == "Relu") return k::activation::relu;
  if (a == "Gelu") return k::activation::gelu_erf;
  ok = false;
  return k::activation::none;
}

cublasComputeType_t compute_type(precision p) {
  switch (p) {
    case precision::fp16: return CUBLAS_COMPUTE_32F_FAST_16F;
    case precision::bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    default: return CUBLAS_COMPUTE_32F;
  }
}

class cuda_backend;

/// Builds the steps of one bucket graph over fixed device pointers.
struct step_builder {
  cuda_backend& be;
  const onnx::graph& g;
  std::vector<void*> ptrs; ///< per value: device address
  std::vector<gpu_step> steps;

  void build();
  void host(const onnx::node& n);
  bool all_fp32(const onnx::node& n) const;

  /// The device steps that device_steps() registers: each returns nothing for
  /// a node it does not take, which then runs on the host.
  std::optional<gpu_step> copy_step(const onnx::node& n);
  std::optional<gpu_step> epilogue_step(const onnx::node& n);
  std::optional<gpu_step> softmax_step(const onnx::node& n);
  std::optional<gpu_step> layer_norm_step(const onnx::node& n);
  std::optional<gpu_step> matmul_step(const onnx::node& n);
  std::optional<gpu_step> conv_step(const onnx::node& n);
  std::optional<gpu_step> pool_step(const onnx::node& n);
};

// ---------------------------------------------------------------- the backend

class cuda_backend final : public executor::backend {
public:
  struct setup {
    std::shared_ptr<const onnx::graph> graph; ///< inputs in config order
    model_config config;
    gpu_options options;
    onnx::pass_config passes;
    gpu_placement place;
  };

  explicit cuda_backend(setup s) : s_(std::move(s)) {}

  ~cuda_backend() override {
    cudaSetDevice(s_.place.device);
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
    if (compute_) cudaStreamSynchronize(compute_);
    for (auto& [rows, mem] : direct_arenas_) cudaFree(mem);
    if (base_) cudaFree(base_);
    for (auto* p : staging_) if (p) cudaFreeHost(p);
    for (auto& [k, d] : conv_descs_) d.destroy();
    if (cudnn_) cudnnDestroy(cudnn_);
    if (lt_) cublasLtDestroy(lt_);
    for (auto st : {copy_in_, compute_, copy_out_}) if (st) cudaStreamDestroy(st);
    for (auto ev : {in_done_, compute_done_}) if (ev) cudaEventDestroy(ev);
  }

  bool blocks() const override { return true; }

  /// Everything of the class comment: handles, plans, arena, capture.
  instance_report prepare();

  exec_result execute(const executor::batch_view& batch, executor::output_writer& out) override;

  // Used by step_builder.
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* workspace_ = nullptr;
  precision compute_precision() const { return s_.options.compute; }
  const void* device_constant(const onnx::tensor_data& t) { return constants_.at(key_of(t)); }
  std::vector<std::shared_ptr<void>> keep_; ///< objects steps point into

  struct conv_desc {
    cudnnTensorDescriptor_t x{}, y{}, b{}, z{};
    cudnnFilterDescriptor_t w{};
    cudnnConvolutionDescriptor_t conv{};
    cudnnActivationDescriptor_t act{};
    cudnnConvolutionFwdAlgo_t algo{};
    void destroy() {
      cudnnDestroyTensorDescriptor(x); cudnnDestroyTensorDescriptor(y);
      cudnnDestroyTensorDescriptor(b); cudnnDestroyTensorDescriptor(z);
      cudnnDestroyFilterDescriptor(w); cudnnDestroyConvolutionDescriptor(conv);
      cudnnDestroyActivationDescriptor(act);
    }
  };
  std::vector<std::pair<int, conv_desc>> conv_descs_;
  const void* zeros_ = nullptr; ///< a zero bias long enough for any convolution

private:
  result<bucket_graph> plan_bucket(uint32_t rows);
  std::vector<dims_t> shapes_at(uint32_t rows) const;
  /// Pointer table of `bg` with activations at `arena` and I/O in `slot`.
  std::vector<void*> pointers(const bucket_graph& bg, uint8_t* arena, uint32_t slot) const;
  std::vector<gpu_step> build_steps(const bucket_graph& bg, uint8_t* arena, uint32_t slot);
  void run_steps(const std::vector<gpu_step>& steps) {
    for (const auto& st : steps) st.launch(compute_);
  }
  bool batched() const { return s_.config.max_batch_size > 0; }

  setup s_;
  cudaStream_t copy_in_ = nullptr, compute_ = nullptr, copy_out_ = nullptr;
  cudaEvent_t in_done_ = nullptr, compute_done_ = nullptr;
  uint8_t* base_ = nullptr;
  device_arena_layout layout_;
  std::vector<uint8_t*> staging_;
  std::map<constant_key, const void*> constants_;
  std::map<uint32_t, bucket_graph> buckets_;
  std::map<std::pair<uint32_t, uint32_t>, cudaGraphExec_t> graphs_; ///< (bucket, slot)
  std::map<std::pair<uint32_t, uint32_t>, std::vector<gpu_step>> direct_steps_;
  std::map<uint32_t, bucket_graph> direct_graphs_;
  std::map<uint32_t, void*> direct_arenas_;
  uint32_t next_slot_ = 0;
  uint32_t max_rows_ = 1;
};

std::vector<dims_t> cuda_backend::shapes_at(uint32_t rows) const {
  std::vector<dims_t> shapes;
  for (const auto& t : s_.config.inputs) {
    dims_t d = t.dims;
    if (batched()) d.insert(d.begin(), rows);
    shapes.push_back(d);
  }
  return shapes;
}

result<bucket_graph> cuda_backend::plan_bucket(uint32_t rows) {
  auto opt = onnx::optimize(*s_.graph, shapes_at(rows), s_.passes);
  if (!opt) return opt.error();
  bucket_graph bg;
  bg.rows = rows;
  bg.g = std::move(*opt);
  std::vector<bool> external(bg.g.values.size(), false);
  for (int v : bg.g.inputs) external[v] = true;
  for (int v : bg.g.outputs) external[v] = true;
  onnx::memory_plan_config mc;
  mc.external = [&](int v) { return external[v]; };
  mc.alignment = device_alignment;
  bg.memory = onnx::plan_memory(bg.g, mc);
  return bg;
}

std::vector<void*> cuda_backend::pointers(const bucket_graph& bg, uint8_t* arena,
                                          uint32_t slot) const {
  const auto& g = bg.g;
  std::vector<void*> p(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (g.values[v].constant)
      p[v] = const_cast<void*>(constants_.at(key_of(*g.values[v].constant)));
    else if (bg.memory.offsets[v] >= 0)
      p[v] = arena + bg.memory.offsets[v];
  }
  for (size_t i = 0; i < g.inputs.size(); ++i)
    p[g.inputs[i]] = base_ + layout_.inputs[slot][i].offset;
  for (size_t i = 0; i < s_.config.outputs.size(); ++i)
    for (int v : g.outputs)
      if (g.values[v].name == s_.config.outputs[i].name)
        p[v] = base_ + layout_.outputs[slot][i].offset;
  return p;
}

std::vector<gpu_step> cuda_backend::build_steps(const bucket_graph& bg, uint8_t* arena,
                                                uint32_t slot) {
  step_builder b{*this, bg.g, pointers(bg, arena, slot), {}};
  b.build();
  return std::move(b.steps);
}

instance_report cuda_backend::prepare() {
  CAF_CUDA_CHECK(cudaSetDevice(s_.place.device));
  for (auto* st : {&copy_in_, &compute_, &copy_out_})
    CAF_CUDA_CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
  CAF_CUDA_CHECK(cudaEventCreateWithFlags(&in_done_, cudaEventDisableTiming));
  CAF_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  CAF_CUDA_CHECK(cublasLtCreate(&lt_));
  CAF_CUDA_CHECK(cudnnCreate(&cudnn_));
  CAF_CUDA_CHECK(cudnnSetStream(cudnn_, compute_));

  // Plan every bucket on the host; collect the constants they read.
  max_rows_ = static_cast<uint32_t>(std::max(s_.config.max_batch_size, 1));
  device_arena_request req;
  std::vector<const onnx::tensor_data*> unique;
  std::map<constant_key, size_t> seen;
  for (uint32_t rows : s_.options.buckets) {
    auto bg = plan_bucket(rows);
    if (!bg) throw std::runtime_error(bg.error().message);
    for (const auto& v : bg->g.values)
      if (v.constant && seen.emplace(key_of(*v.constant), unique.size()).second)
        unique.push_back(v.constant.get());
    req.bucket_arenas.push_back(bg->memory.arena_bytes);
    buckets_.emplace(rows, std::move(*bg));
  }
  for (const auto* t : unique) req.weights.push_back(t->bytes.size());
  size_t max_channels = 1;
  for (const auto& [rows, bg] : buckets_)
    for (const auto& n : bg.g.nodes)
      if (n.op == "FusedConv") max_channels = std::max<size_t>(max_channels, bg.g.values[n.outputs[0]].shape[1]);
  req.weights.push_back(max_channels * sizeof(float)); // zeros_
  auto row_bytes = [&](const tensor_config& t) {
    return static_cast<size_t>(onnx::element_count(t.dims)) * element_size(t.dtype);
  };
  for (const auto& t : s_.config.inputs) req.input_row_bytes.push_back(row_bytes(t));
  for (const auto& t : s_.config.outputs) req.output_row_bytes.push_back(row_bytes(t));
  req.max_rows = max_rows_;
  req.slots = staging_slots;
  req.workspace = workspace_bytes;
  layout_ = plan_device_arena(req);

  CAF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), layout_.total_bytes));
  CAF_CUDA_CHECK(cudaMemset(base_, 0, layout_.total_bytes));
  for (size_t i = 0; i < unique.size(); ++i) {
    void* dst = base_ + layout_.weights[i].offset;
    CAF_CUDA_CHECK(cudaMemcpy(dst, unique[i]->bytes.data(), unique[i]->bytes.size(),
                              cudaMemcpyHostToDevice));
    constants_[key_of(*unique[i])] = dst;
  }
  zeros_ = base_ + layout_.weights.back().offset;
  // The legacy-stream memset and copies above do not order against the
  // non-blocking streams; finish them before any step runs.
  CAF_CUDA_CHECK(cudaDeviceSynchronize());
  workspace_ = base_ + layout_.workspace.offset;
  for (uint32_t s = 0; s < staging_slots; ++s)
    staging_.push_back(pinned_alloc(layout_.staging_bytes_per_slot));

  instance_report report;
  report.device = s_.place.device;
  report.device_bytes = layout_.total_bytes;
  report.pinned_bytes = layout_.staging_bytes_per_slot * staging_slots;
  report.arena = describe(layout_);

  // Steps per (bucket, slot), then warm-up / capture / verify in capture_order.
  uint8_t* arena = base_ + layout_.activations.offset;
  for (auto& [rows, bg] : buckets_)
    for (uint32_t slot = 0; slot < staging_slots; ++slot)
      direct_steps_[{rows, slot}] = build_steps(bg, arena, slot);
  if (!buckets_.empty()) {
    const auto& first = direct_steps_.begin()->second;
    report.steps = first.size();
    report.host_steps = std::count_if(first.begin(), first.end(), [](const gpu_step& s) { return s.host; });
  }
  auto order = capture_order(s_.options.buckets);
  if (auto broken = check_capture_order(order); !broken.empty())
    throw std::logic_error("capture order: " + broken);
  std::map<uint32_t, std::vector<uint8_t>> warm_outputs;
  auto read_outputs = [&](uint32_t rows) {
    std::vector<uint8_t> bytes;
    for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
      size_t n = req.output_row_bytes[i] * (batched() ? rows : 1);
      size_t at = bytes.size();
      bytes.resize(at + n);
      CAF_CUDA_CHECK(cudaMemcpy(bytes.data() + at, base_ + layout_.outputs[0][i].offset, n,
                                cudaMemcpyDeviceToHost));
    }
    return bytes;
  };
  for (const auto& step : order) {
    auto key = std::make_pair(step.bucket, 0u);
    switch (step.action) {
      case prepare_action::warm_up:
        // Inputs are zeros (the arena was cleared): a fixed, deterministic batch.
        for (uint32_t slot = 0; slot < staging_slots; ++slot)
          run_steps(direct_steps_.at({step.bucket, slot}));
        CAF_CUDA_CHECK(cudaStreamSynchronize(compute_));
        warm_outputs[step.bucket] = read_outputs(step.bucket);
        break;
      case prepare_action::capture:
        for (uint32_t slot = 0; slot < staging_slots; ++slot) {
          cudaGraph_t graph = nullptr;
          CAF_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
          run_steps(direct_steps_.at({step.bucket, slot}));
          CAF_CUDA_CHECK(cudaStreamEndCapture(compute_, &graph));
          cudaGraphExec_t exec = nullptr;
          CAF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          CAF_CUDA_CHECK(cudaGraphDestroy(graph));
          graphs_[{step.bucket, slot}] = exec;
        }
        break;
      case prepare_action::verify: {
        CAF_CUDA_CHECK(cudaMemsetAsync(base_ + layout_.outputs[0][0].offset, 0xff,
                                       layout_.outputs[0][0].bytes, compute_));
        CAF_CUDA_CHECK(cudaGraphLaunch(graphs_.at(key), compute_));
        CAF_CUDA_CHECK(cudaStreamSynchronize(compute_));
        if (read_outputs(step.bucket) != warm_outputs.at(step.bucket))
          throw std::runtime_error("the captured graph of batch size " + std::to_string(step.bucket)
                                   + " computed other outputs than its direct launch");
        break;
      }
      case prepare_action::ready:
        break;
    }
  }
  return report;
}

exec_result cuda_backend::execute(const executor::batch_view& batch, executor::output_writer& out) {
  try {
    CAF_CUDA_CHECK(cudaSetDevice(s_.place.device));
    uint32_t rows = batched() ? batch.rows : 1;
    if (rows > max_rows_)
      return serving_error{status_code::bad_request,
                           "model '" + s_.config.name + "': batch of " + std::to_string(rows)
                             + " rows exceeds max_batch_size " + std::to_string(max_rows_)};
    auto shape = shape_for(s_.options.buckets, rows);
    uint32_t slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % staging_slots;
    uint8_t* stage = staging_[slot];
    size_t slot_base = layout_.inputs[slot].empty() ? layout_.outputs[slot][0].offset
                                                    : layout_.inputs[slot][0].offset;
    // Copy in: the real rows through pinned staging; padding rows are zeroed on
    // the device, so the graph of the bucket reads a defined batch.
    for (size_t i = 0; i < s_.config.inputs.size(); ++i) {
      const auto& t = batch.inputs.at(i);
      const auto& r = layout_.inputs[slot][i];
      if (t.size > r.bytes)
        return serving_error{status_code::bad_request,
                             "model '" + s_.config.name + "': input '" + std::string(t.name)
                               + "' has " + std::to_string(t.size) + " bytes, more than "
                               + std::to_string(r.bytes) + " for " + std::to_string(max_rows_)
                               + " rows"};
      std::memcpy(stage + (r.offset - slot_base), t.data, t.size);
      CAF_CUDA_CHECK(cudaMemcpyAsync(base_ + r.offset, stage + (r.offset - slot_base), t.size,
                                     cudaMemcpyHostToDevice, copy_in_));
      size_t padded = t.size / std::max(rows, 1u) * shape.bucket;
      if (padded > t.size)
        CAF_CUDA_CHECK(cudaMemsetAsync(base_ + r.offset + t.size, 0, padded - t.size, copy_in_));
    }
    CAF_CUDA_CHECK(cudaEventRecord(in_done_, copy_in_));
    CAF_CUDA_CHECK(cudaStreamWaitEvent(compute_, in_done_, 0));
    if (shape.graph) {
      CAF_CUDA_CHECK(cudaGraphLaunch(graphs_.at({shape.bucket, slot}), compute_));
    } else {
      auto key = std::make_pair(rows, slot);
      if (!direct_steps_.count(key)) {
        if (!direct_graphs_.count(rows)) {
          auto bg = plan_bucket(rows);
          if (!bg) return serving_error{status_code::bad_request, bg.error().message};
          for (const auto& v : bg->g.values)
            if (v.constant && !constants_.count(key_of(*v.constant)))
              return serving_error{status_code::internal,
                                   "model '" + s_.config.name + "': the plan at batch "
                                     + std::to_string(rows) + " folds a constant ('" + v.name
                                     + "') no captured bucket has; list this size in "
                                       "parameter cuda_graph_batch_sizes"};
          void* mem = nullptr;
          CAF_CUDA_CHECK(cudaMalloc(&mem, std::max<size_t>(bg->memory.arena_bytes, 1)));
          direct_arenas_[rows] = mem;
          direct_graphs_.emplace(rows, std::move(*bg));
        }
        direct_steps_[key] = build_steps(direct_graphs_.at(rows),
                                         static_cast<uint8_t*>(direct_arenas_.at(rows)), slot);
      }
      run_steps(direct_steps_.at(key));
    }
    CAF_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
    CAF_CUDA_CHECK(cudaStreamWaitEvent(copy_out_, compute_done_, 0));
    std::vector<std::pair<size_t, size_t>> out_spans; // (staging offset, bytes)
    for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
      const auto& r = layout_.outputs[slot][i];
      size_t bytes = r.bytes / max_rows_ * (batched() ? rows : 1);
      CAF_CUDA_CHECK(cudaMemcpyAsync(stage + (r.offset - slot_base), base_ + r.offset, bytes,
                                     cudaMemcpyDeviceToHost, copy_out_));
      out_spans.emplace_back(r.offset - slot_base, bytes);
    }
    CAF_CUDA_CHECK(cudaStreamSynchronize(copy_out_));
    for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
      const auto& t = s_.config.outputs[i];
      dims_t shape_out = t.dims;
      if (batched()) shape_out.insert(shape_out.begin(), rows);
      uint8_t* dst = out.allocate(t.name, t.dtype, shape_out, out_spans[i].second);
      std::memcpy(dst, stage + out_spans[i].first, out_spans[i].second);
    }
    return {};
  } catch (const std::exception& e) {
    return serving_error{status_code::internal,
                         "model '" + s_.config.name + "' on GPU " + std::to_string(s_.place.device)
                           + ": " + e.what()};
  }
}

// ---------------------------------------------------------------- steps

bool step_builder::all_fp32(const onnx::node& n) const {
  for (int v : n.inputs) if (v >= 0 && g.values[v].dtype != datatype::fp32) return false;
  for (int v : n.outputs) if (v >= 0 && g.values[v].dtype != datatype::fp32) return false;
  return true;
}

using device_table = onnx::kernel_table<step_builder, gpu_step>;

/// The CUDA backend's device steps in the operator registry's form
/// (onnx/op_registry.hpp), per operator; a node that none takes runs its
/// reference kernel on the host (step_builder::host). Besides the copies, the
/// device steps take fp32 tensors only.
const device_table& device_steps() {
  using member = std::optional<gpu_step> (step_builder::*)(const onnx::node&);
  auto any_type = [](member f) {
    return [f](step_builder& b, const onnx::graph&, const onnx::node& n) { return (b.*f)(n); };
  };
  auto fp32 = [](member f) {
    return [f](step_builder& b, const onnx::graph&,
               const onnx::node& n) -> std::optional<gpu_step> {
      if (!b.all_fp32(n)) return std::nullopt;
      return (b.*f)(n);
    };
  };
  static const device_table table({
    {"Reshape", {}, "copy", any_type(&step_builder::copy_step)},
    {"Flatten", {}, "copy", any_type(&step_builder::copy_step)},
    {"Squeeze", {}, "copy", any_type(&step_builder::copy_step)},
    {"Unsqueeze", {}, "copy", any_type(&step_builder::copy_step)},
    {"Identity", {}, "copy", any_type(&step_builder::copy_step)},
    {"Relu", {}, "epilogue", fp32(&step_builder::epilogue_step)},
    {"Add", {}, "epilogue", fp32(&step_builder::epilogue_step)},
    {"FusedGelu", {}, "epilogue", fp32(&step_builder::epilogue_step)},
    {"Softmax", {}, "softmax", fp32(&step_builder::softmax_step)},
    {"FusedLayerNorm", {}, "layer_norm", fp32(&step_builder::layer_norm_step)},
    {"FusedMatMul", {}, "cublaslt", fp32(&step_builder::matmul_step)},
    {"FusedConv", {}, "cudnn_conv", fp32(&step_builder::conv_step)},
    {"MaxPool", {}, "cudnn_pool", fp32(&step_builder::pool_step)},
    {"AveragePool", {}, "cudnn_pool", fp32(&step_builder::pool_step)},
    {"GlobalAveragePool", {}, "cudnn_pool", fp32(&step_builder::pool_step)},
  });
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

void step_builder::host(const onnx::node& n) {
  auto f = std::make_shared<host_fallback>();
  f->n = n;
  for (int v : n.inputs) {
    onnx::tensor_ref r;
    if (v >= 0) {
      const auto& val = g.values[v];
      r.dtype = val.dtype;
      r.shape = val.shape;
      if (val.constant) {
        r.data = const_cast<uint8_t*>(val.constant->bytes.data());
        f->device_in.push_back(nullptr);
        f->in_bytes.push_back(0);
      } else {
        f->pinned.emplace_back(pinned_alloc(value_bytes(val)), pinned_free);
        r.data = f->pinned.back().get();
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
    f->outs.push_back({val.dtype, val.shape, f->pinned.back().get()});
    f->device_out.push_back(ptrs[v]);
    f->out_bytes.push_back(value_bytes(val));
  }
  be.keep_.push_back(f);
  steps.push_back({"host:" + n.op, true, [f = f.get()](cudaStream_t s) {
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

/// Reshape, Flatten, Squeeze, Unsqueeze, Identity: same bytes, new shape.
std::optional<gpu_step> step_builder::copy_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  const void* src = ptrs[in(0)];
  void* dst = ptrs[y];
  size_t bytes = value_bytes(g.values[y]);
  return gpu_step{"copy", false, [src, dst, bytes](cudaStream_t s) {
    if (src != dst) CAF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  }};
}

/// Relu, Add of equal shapes, FusedGelu with a bias per last-axis column.
std::optional<gpu_step> step_builder::epilogue_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  auto shape = [&](int v) -> const dims_t& { return g.values[v].shape; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  if (!(n.op == "Relu" || (n.op == "Add" && shape(in(0)) == shape(in(1)) && shape(in(0)) == shape(y))
      || (n.op == "FusedGelu" && (in(1) < 0 || shape(in(1)).size() == 1))))
    return std::nullopt;
  k::epilogue_args a;
  a.input = ptrs[in(0)];
  a.output = ptrs[y];
  a.count = onnx::element_count(shape(y));
  if (n.op == "Add") a.residual = ptrs[in(1)];
  if (n.op == "Relu") a.act = k::activation::relu;
  if (n.op == "FusedGelu") {
    a.act = k::activation::gelu_erf;
    if (in(1) >= 0) {
      a.bias = ptrs[in(1)];
      a.layout = {static_cast<size_t>(shape(in(1))[0]), 1};
    }
  }
  return gpu_step{"epilogue", false, [a](cudaStream_t s) { k::launch_epilogue(a, s); }};
}

/// Softmax over the last axis.
std::optional<gpu_step> step_builder::softmax_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  auto shape = [&](int v) -> const dims_t& { return g.values[v].shape; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  if (!(n.op == "Softmax" && (n.get_i("axis", -1) == -1
                            || n.get_i("axis", -1) == static_cast<int64_t>(shape(y).size()) - 1)))
    return std::nullopt;
  k::softmax_args a;
  a.input = ptrs[in(0)];
  a.output = ptrs[y];
  a.cols = shape(y).back();
  a.rows = onnx::element_count(shape(y)) / a.cols;
  return gpu_step{"softmax", false, [a](cudaStream_t s) { k::launch_softmax(a, s); }};
}

/// FusedLayerNorm over the last axis, with beta, up to add_layer_norm_max_cols.
std::optional<gpu_step> step_builder::layer_norm_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  auto shape = [&](int v) -> const dims_t& { return g.values[v].shape; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  if (!(n.op == "FusedLayerNorm" && in(2) >= 0 && n.get_i("axis", -1) == -1))
    return std::nullopt;
  k::add_layer_norm_args a;
  a.input = ptrs[in(0)];
  a.gamma = ptrs[in(1)];
  a.beta = ptrs[in(2)];
  a.output = ptrs[y];
  a.cols = shape(y).back();
  a.rows = onnx::element_count(shape(y)) / a.cols;
  a.eps = n.get_f("epsilon", 1e-5f);
  if (a.cols > k::add_layer_norm_max_cols) return std::nullopt;
  return gpu_step{"layer_norm", false, [a](cudaStream_t s) { k::launch_add_layer_norm(a, s); }};
}

/// FusedMatMul with constant 2-D weights on cuBLASLt, its epilogue after.
std::optional<gpu_step> step_builder::matmul_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  auto shape = [&](int v) -> const dims_t& { return g.values[v].shape; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  if (!(n.op == "FusedMatMul" && g.values[in(1)].constant && shape(in(1)).size() == 2))
    return std::nullopt;
  bool ok = true;
  auto act = activation_of(n.get_s("activation", ""), ok);
  if (!ok) return std::nullopt;
  const auto& as = shape(in(0));
  uint64_t kk = as.back(), nn = shape(in(1))[1];
  uint64_t m = onnx::element_count(as) / kk;
  // Row-major C[m,n] = A[m,k] W[k,n] is column-major C^T = W^T A^T: cuBLASLt's
  // "A" is W (n x k, ld n), its "B" is A (k x m, ld k).
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lw, la, lc;
  CAF_CUDA_CHECK(cublasLtMatmulDescCreate(&desc, compute_type(be.compute_precision()), CUDA_R_32F));
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lw, CUDA_R_32F, nn, kk, nn));
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, kk, m, kk));
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, nn, m, nn));
  cublasLtMatmulPreference_t pref;
  CAF_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = workspace_bytes;
  CAF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  CAF_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(be.lt_, desc, lw, la, lc, lc, pref, 1, &heur, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) return std::nullopt;
  auto keep = std::shared_ptr<void>(nullptr, [desc, lw, la, lc](void*) {
    cublasLtMatrixLayoutDestroy(lw); cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(desc);
  });
  be.keep_.push_back(keep);
  const void* w = ptrs[in(1)];
  const void* a = ptrs[in(0)];
  void* c = ptrs[y];
  auto lt = be.lt_;
  void* workspace = be.workspace_;
  auto algo = heur.algo;
  k::epilogue_args e;
  e.input = c;
  e.output = c;
  e.count = m * nn;
  e.act = act;
  if (in(2) >= 0) { e.bias = ptrs[in(2)]; e.layout = {nn, 1}; }
  if (in(3) >= 0) e.residual = ptrs[in(3)];
  bool needs_epilogue = e.bias || e.residual || act != k::activation::none;
  return gpu_step{"cublaslt", false, [=](cudaStream_t s) {
    float one = 1.f, zero = 0.f;
    CAF_CUDA_CHECK(cublasLtMatmul(lt, desc, &one, w, lw, a, la, &zero, c, lc, c, lc, &algo,
                                  workspace, workspace_bytes, s));
    if (needs_epilogue) k::launch_epilogue(e, s);
  }};
}

/// FusedConv (2-D, group 1, symmetric pads, Relu or none) on cuDNN.
std::optional<gpu_step> step_builder::conv_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  auto shape = [&](int v) -> const dims_t& { return g.values[v].shape; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
  if (!(n.op == "FusedConv" && g.values[in(1)].constant && shape(in(0)).size() == 4
        && n.get_i("group", 1) == 1))
    return std::nullopt;
  auto act = n.get_s("activation", "");
  if (!act.empty() && act != "Relu") return std::nullopt;
  const auto& xs = shape(in(0));
  const auto& ws = shape(in(1));
  const auto& ys = shape(y);
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  if (pd[0] != pd[2] || pd[1] != pd[3]) return std::nullopt; // cuDNN pads symmetrically
  cuda_backend::conv_desc d;
  auto mk4 = [](cudnnTensorDescriptor_t& t, const dims_t& s) {
    CAF_CUDA_CHECK(cudnnCreateTensorDescriptor(&t));
    CAF_CUDA_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                              s[0], s[1], s[2], s[3]));
  };
  mk4(d.x, xs);
  mk4(d.y, ys);
  mk4(d.z, ys);
  mk4(d.b, {1, ys[1], 1, 1});
  CAF_CUDA_CHECK(cudnnCreateFilterDescriptor(&d.w));
  CAF_CUDA_CHECK(cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, ws[0],
                                            ws[1], ws[2], ws[3]));
  CAF_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&d.conv));
  CAF_CUDA_CHECK(cudnnSetConvolution2dDescriptor(d.conv, pd[0], pd[1], st[0], st[1], dl[0],
                                                 dl[1], CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  CAF_CUDA_CHECK(cudnnSetConvolutionMathType(
    d.conv, be.compute_precision() == precision::fp32 ? CUDNN_FMA_MATH
                                                      : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  CAF_CUDA_CHECK(cudnnCreateActivationDescriptor(&d.act));
  CAF_CUDA_CHECK(cudnnSetActivationDescriptor(
    d.act, act.empty() ? CUDNN_ACTIVATION_IDENTITY : CUDNN_ACTIVATION_RELU,
    CUDNN_NOT_PROPAGATE_NAN, 0.0));
  if (act.empty()) {
    // cuDNN's fused call runs IDENTITY only with this algorithm.
    d.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  } else {
    // Chosen once, here at load, by timing the candidates (cudnnFind).
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int got = 0;
    CAF_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
      be.cudnn_, d.x, ptrs[in(0)], d.w, ptrs[in(1)], d.conv, d.y, ptrs[y], 8, &got, perf,
      be.workspace_, workspace_bytes));
    d.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    for (int i = 0; i < got; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= workspace_bytes) {
        d.algo = perf[i].algo;
        break;
      }
  }
  size_t need = 0;
  CAF_CUDA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(be.cudnn_, d.x, d.w, d.conv, d.y,
                                                         d.algo, &need));
  if (need > workspace_bytes) { d.destroy(); return std::nullopt; }
  be.conv_descs_.emplace_back(y, d);
  const void* x = ptrs[in(0)];
  const void* w = ptrs[in(1)];
  const void* bias = in(2) >= 0 ? ptrs[in(2)] : be.zeros_;
  const void* z = in(3) >= 0 ? ptrs[in(3)] : ptrs[y];
  float alpha2 = in(3) >= 0 ? 1.f : 0.f;
  void* out = ptrs[y];
  auto h = be.cudnn_;
  void* workspace = be.workspace_;
  return gpu_step{"cudnn_conv", false, [=](cudaStream_t) {
    float one = 1.f;
    CAF_CUDA_CHECK(cudnnConvolutionBiasActivationForward(
      h, &one, d.x, x, d.w, w, d.conv, d.algo, workspace, workspace_bytes, &alpha2, d.z, z,
      d.b, bias, d.act, d.y, out));
  }};
}

/// MaxPool, AveragePool (no ceil_mode, symmetric pads) and GlobalAveragePool on cuDNN.
std::optional<gpu_step> step_builder::pool_step(const onnx::node& n) {
  auto in = [&](size_t i) -> int { return i < n.inputs.size() ? n.inputs[i] : -1; };
  auto shape = [&](int v) -> const dims_t& { return g.values[v].shape; };
  const int y = n.outputs.empty() ? -1 : n.outputs[0];
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
  CAF_CUDA_CHECK(cudnnSetTensor4dDescriptor(tx, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, xs[0],
                                            xs[1], xs[2], xs[3]));
  CAF_CUDA_CHECK(cudnnSetTensor4dDescriptor(ty, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, ys[0],
                                            ys[1], ys[2], ys[3]));
  be.keep_.push_back(std::shared_ptr<void>(nullptr, [pool, tx, ty](void*) {
    cudnnDestroyPoolingDescriptor(pool); cudnnDestroyTensorDescriptor(tx);
    cudnnDestroyTensorDescriptor(ty);
  }));
  const void* x = ptrs[in(0)];
  void* out = ptrs[y];
  auto h = be.cudnn_;
  return gpu_step{"cudnn_pool", false, [=](cudaStream_t) {
    float one = 1.f, zero = 0.f;
    CAF_CUDA_CHECK(cudnnPoolingForward(h, pool, &one, tx, x, &zero, ty, out));
  }};
}

} // namespace

std::vector<std::string> device_step_ops() {
  return device_steps().ops();
}

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

result<cuda_model> load_cuda_model(const cuda_model_config& mcfg) {
  auto bad = [&](const std::string& what) {
    return serving_error{status_code::bad_request, "model '" + mcfg.config.name + "': " + what};
  };
  auto options = read_gpu_options(mcfg.config);
  if (!options) return options.error();
  int devices = visible_devices();
  if (devices == 0)
    return serving_error{status_code::unavailable,
                         "model '" + mcfg.config.name + "' asks for KIND_GPU instances, but no "
                         "CUDA device is visible (driver missing or CUDA_VISIBLE_DEVICES empty); "
                         "use instance_group { kind: KIND_CPU } on this machine"};
  for (const auto& p : options->placements)
    if (p.device >= devices)
      return bad("instance_group lists GPU " + std::to_string(p.device) + ", but only "
                 + std::to_string(devices) + " CUDA device(s) are visible (0.."
                 + std::to_string(devices - 1) + ")");
  auto imported = onnx::import_model(mcfg.model_file);
  if (!imported) return bad(imported.error().message);
  onnx::graph g = std::move(*imported);
  if (!g.strings.inputs.empty())
    return bad("the graph has STRING tensors, which KIND_GPU instances do not pass through; use "
               "instance_group { kind: KIND_CPU }");
  // The model library completes and checks the configuration against the
  // graph, as for the CPU backend; the GPU instances then plan from the graph.
  auto completed = onnx::complete_model_config(g, {mcfg.model_file, mcfg.config});
  if (!completed) return completed.error();
  // The GPU plans run fixed shapes besides the batch; the CPU backend takes
  // variable ones (onnx_cpu/onnx_backend.hpp).
  for (const auto& t : completed->client.inputs)
    for (auto d : t.dims)
      if (d < 0)
        return bad("input '" + t.name + "' has a variable dimension besides the batch ("
                   + onnx::shape_string(t.dims) + "), which KIND_GPU instances do not run; give "
                   "it a fixed size in config.pbtxt dims, or use instance_group { kind: "
                   "KIND_CPU }");
  std::vector<int> ordered;
  for (const auto& t : completed->client.inputs)
    for (int v : g.inputs)
      if (g.values[v].name == t.name) ordered.push_back(v);
  g.inputs = ordered;
  auto shared = std::make_shared<const onnx::graph>(std::move(g));

  cuda_model m;
  m.config = completed->client;
  m.options = *options;
  std::ostringstream os;
  os << "CUDA, precision " << to_string(options->compute) << ", " << options->placements.size()
     << " instance(s), graphs at batch sizes [";
  for (size_t i = 0; i < options->buckets.size(); ++i)
    os << (i ? "," : "") << options->buckets[i];
  os << "]";
  m.summary = os.str();
  // QDQ groups stay DQ -> fp32 operator -> Q on the GPU: the QLinearConv,
  // QLinearMatMul, QLinearAdd and QMaxPool that fuse_qdq writes have no device
  // step here, and would run as host reference kernels.
  auto gpu_passes = mcfg.passes;
  gpu_passes.fuse_qdq = false;
  m.make_instance = [shared, c = m.config, o = *options, passes = gpu_passes](
                      const gpu_placement& p) -> result<cuda_instance> {
    try {
      auto be = std::make_shared<cuda_backend>(cuda_backend::setup{shared, c, o, passes, p});
      auto report = be->prepare();
      return cuda_instance{be, report};
    } catch (const std::exception& e) {
      return serving_error{status_code::internal,
                           "model '" + c.name + "' on GPU " + std::to_string(p.device)
                             + ": preparing the executor failed: " + e.what()};
    }
  };
  return m;
}

} // namespace caf_serving::cuda
