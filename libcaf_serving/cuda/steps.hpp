#pragma once
/// The CUDA backend's steps, private to libcaf_serving/cuda/: how one node of an
/// optimized bucket graph becomes work on the compute stream.
///
/// A step family is a source file (steps_core.cpp, ...) whose registrations
/// (`core_steps()`, ...) device_steps() concatenates into the operator
/// registry's kernel table (onnx/op_registry.hpp). A registration's build
/// function first checks that it takes the node (types, shapes, attributes:
/// nothing else), returns nothing when it does not, and then:
///
///     if (b.dry()) return b.planned("softmax");   // a dry run stops here
///     ... create descriptors, read b.ptrs, capture them in the launch lambda ...
///
/// In a dry run (plan_model(), no device needed) the builder has no context and
/// null pointers, so the choice of device step or host step is made by exactly
/// the checks the real build makes. A node that no registration takes runs its
/// reference kernel on the host (step_builder::host), between device copies.

#include "cpu/types.hpp"
#include "cuda/device_flags.hpp"
#include "cuda/gpu_options.hpp"
#include "onnx/ir.hpp"
#include "onnx/op_registry.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace caf_serving::cuda {

using dims_t = std::vector<int64_t>;

/// cuBLASLt and cuDNN get one fixed workspace, so a captured graph's pointer to it
/// never changes. 64 MiB covers cuDNN's fastest ResNet-50 algorithms at batch 128.
constexpr size_t workspace_bytes = size_t{64} << 20;

/// Bytes of a value's tensor.
size_t value_bytes(const onnx::value& v);

/// Page-locked host memory (at least one byte), and its release.
uint8_t* pinned_alloc(size_t bytes);
cudaError_t pinned_free(void* p);

/// A step enqueues its work on the compute stream. A dry run's steps have no
/// launch.
struct gpu_step {
  std::string kernel;
  bool host = false;
  std::function<void(cudaStream_t)> launch;
};

/// One convolution's cuDNN descriptors and algorithm.
struct conv_desc {
  cudnnTensorDescriptor_t x{}, y{}, b{}, z{};
  cudnnFilterDescriptor_t w{};
  cudnnConvolutionDescriptor_t conv{};
  cudnnActivationDescriptor_t act{};
  cudnnConvolutionFwdAlgo_t algo{};
  void destroy();
};

/// What steps need of the instance that runs them, and what they leave for it to
/// keep alive (descriptors, host-fallback buffers) until it is destroyed.
struct step_context {
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  void* workspace = nullptr; ///< workspace_bytes long
  precision compute = precision::fp32;
  const void* zeros = nullptr; ///< a zero bias long enough for any convolution
  std::vector<std::shared_ptr<void>> keep;
  std::vector<conv_desc> convs;
  device_flags flags; ///< set by device steps (Gather), read after each batch

  step_context() = default;
  step_context(const step_context&) = delete;
  step_context& operator=(const step_context&) = delete;
  ~step_context();
};

/// Builds the steps of one bucket graph over fixed device pointers, or, without
/// a context, only chooses them (a dry run).
struct step_builder {
  step_context* ctx = nullptr; ///< null: a dry run
  const onnx::graph& g;
  std::vector<void*> ptrs; ///< per value: device address (all null in a dry run)
  std::vector<gpu_step> steps;
  /// The staging slot these steps serve. Two batches may be in flight, one per
  /// slot, so each slot's steps get their own device flags (flags.add(what,
  /// slot)), read and cleared only with that slot's batch.
  uint32_t slot = 0;
  /// What float values between steps are stored in: fp32, or the instance's half
  /// type (precision fp16/bf16, storage_plan.hpp).
  datatype storage = datatype::fp32;
  /// Per value: narrowed from fp32 to `storage` (null or empty at fp32). A host
  /// step widens those back to fp32 around the reference kernel.
  const std::vector<bool>* narrowed = nullptr;

  bool dry() const { return ctx == nullptr; }
  /// What a dry run records for a node a device step takes.
  static gpu_step planned(std::string kernel) { return gpu_step{std::move(kernel), false, {}}; }

  /// Input or output `i` of `n`, -1 when absent.
  static int in(const onnx::node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }
  static int out(const onnx::node& n, size_t i) {
    return i < n.outputs.size() ? n.outputs[i] : -1;
  }
  const dims_t& shape(int v) const { return g.values[v].shape; }
  /// The one float type every present input and output of `n` has, when it is
  /// fp32 or `storage`; nothing for a node mixing types or with others.
  std::optional<datatype> float_type(const onnx::node& n) const;

  /// Every node in order: its device step, or its reference kernel on the host.
  void build();
  void host(const onnx::node& n);
};

using device_table = onnx::kernel_table<step_builder, gpu_step>;
using device_kernel = device_table::kernel;

/// The device steps, per operator, in the order tried: every family's
/// registrations. A node that none takes runs on the host.
const device_table& device_steps();

/// The families (one source file each).
std::vector<device_kernel> core_steps(); ///< steps_core.cpp
std::vector<device_kernel> attention_steps(); ///< steps_attention.cpp
std::vector<device_kernel> data_steps(); ///< steps_data.cpp
std::vector<device_kernel> gemm_steps(); ///< steps_gemm.cpp
std::vector<device_kernel> elementwise_steps(); ///< steps_elementwise.cpp

/// A fused node's activation (its `activation`, `act_alpha` and `act_beta`
/// attributes) as the epilogue kernel's; nothing for one it does not have.
struct epilogue_activation {
  kernels::activation act = kernels::activation::none;
  kernels::activation_params params;
};
std::optional<epilogue_activation> activation_of(const onnx::node& n);

/// cuBLASLt's compute type for the instance's `precision` (fp32 accumulation).
cublasComputeType_t lt_compute_type(precision p);

/// cuBLASLt's types for a GEMM whose A and B are stored in `inputs` and whose C
/// and D are stored in `output`: the same type, or half A/B with fp32 C/D (a
/// GEMM that writes a declared fp32 output itself, storage_plan.hpp). fp32
/// tensors compute as `compute` says (lt_compute_type: tensor cores on rounded
/// inputs at fp16/bf16); half A/B compute with CUBLAS_COMPUTE_32F (fp32
/// accumulation); the scale (alpha, beta) is fp32 always. Any other pair is a bug.
struct lt_data_types {
  cudaDataType_t inputs = CUDA_R_32F; ///< A and B
  cudaDataType_t output = CUDA_R_32F; ///< C and D
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
};
lt_data_types lt_types(datatype inputs, datatype output, precision compute);

/// cuDNN's types for a convolution or pooling over tensors stored in `storage`:
/// the tensor and filter type, the convolution's compute type (fp32 always) and
/// math type (tensor cores for half tensors; for fp32 ones as `compute` says).
struct conv_data_types {
  cudnnDataType_t data = CUDNN_DATA_FLOAT;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_FMA_MATH;
};
conv_data_types conv_types(datatype storage, precision compute);

/// How a FusedConv runs on cuDNN.
enum class conv_path {
  fused, ///< cudnnConvolutionBiasActivationForward: convolution, residual, bias, activation
  split, ///< cudnnConvolutionForward, then the epilogue kernel in place (kernel "+epilogue")
};

/// What the choice of a conv_path depends on.
struct conv_path_query {
  int64_t group = 1;
  kernels::activation act = kernels::activation::none;
  datatype type = datatype::fp32; ///< of the tensors: fp32 or the storage type
  /// What cuDNN answered when the fused call was tried at load (its algorithm
  /// search, then one run); success before it is tried (and in a dry run).
  cudnnStatus_t fused_status = CUDNN_STATUS_SUCCESS;
};

/// fused for an ungrouped convolution with ReLU or no activation: the fused call
/// runs only RELU and IDENTITY, and for grouped convolutions its algorithms are
/// not the plain call's. split for every other convolution, and for a bf16 one
/// whose fused call cuDNN refused with CUDNN_STATUS_NOT_SUPPORTED (some cuDNN
/// versions and algorithms do): the split call computes the same, the epilogue
/// kernel at bf16. Any other failure of the fused call stays an error.
conv_path choose_conv_path(const conv_path_query& q);

/// One row-major GEMM on cuBLASLt:
/// d[m, n] = alpha op(a)[m, k] op(w)[k, n] + beta c[m, n].
struct lt_gemm_config {
  uint64_t m = 0, n = 0, k = 0;
  bool a_transposed = false; ///< `a` is stored [k, m] (Gemm's transA)
  bool w_transposed = false; ///< `w` is stored [n, k] (Gemm's transB)
  datatype type = datatype::fp32;     ///< of a and w: fp32, fp16 or bf16
  datatype out_type = datatype::fp32; ///< of c and d: `type`, or fp32 (lt_types)
  float alpha = 1.0f;
  float beta = 0.0f; ///< 0 when there is no `c`
  const void* a = nullptr;
  const void* w = nullptr;
  const void* c = nullptr; ///< [m, n], or null for none
  void* d = nullptr;
};

/// One cuBLASLt operand: the column-major matrix as stored (rows x cols, leading
/// dimension `ld`), and whether cuBLASLt transposes it (CUBLAS_OP_T).
struct lt_operand {
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  bool transposed = false;
};

/// cuBLASLt's view of `g`: its A is `w`, its B is `a`, its C and D are `d`
/// (row-major d[m, n] is column-major n x m, so d^T = op(w)^T op(a)^T).
struct lt_operands {
  lt_operand a, b, d;
};
lt_operands lt_layout(const lt_gemm_config& g);

/// Creates `g`'s descriptors and chooses its algorithm now (at load), keeping them
/// in `ctx`; the function enqueues the GEMM. Throws when cuBLASLt has no algorithm.
std::function<void(cudaStream_t)> plan_lt_gemm(step_context& ctx, const lt_gemm_config& g);

/// The kernels' dtype of a float storage type (fp32, fp16, bf16).
kernels::dtype kernel_dtype(datatype t);

/// Wraps a family's step function as a registration's build function that
/// first requires every input and output to be of one float type, fp32 or the
/// instance's storage type (step_builder::float_type).
using step_function = std::optional<gpu_step> (*)(step_builder&, const onnx::node&);
std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
float_storage(step_function f);

/// A GEMM node's float types: of A and W (inputs 0 and 1), and of everything
/// else (bias, C, residual: added to D) and the output.
struct gemm_float_types {
  datatype inputs = datatype::fp32;
  datatype output = datatype::fp32;
  /// The GEMM writes fp32 from half A and W (kernel "cublaslt+convert").
  bool widens() const { return inputs != output; }
};
/// `n`'s types when they are one float type (step_builder::float_type), or A
/// and W in the instance's half storage type and the rest fp32 (a declared fp32
/// output written by its GEMM, storage_plan.hpp); nothing otherwise.
std::optional<gemm_float_types> gemm_types(const step_builder& b, const onnx::node& n);
/// Wraps a GEMM step function: the node must have gemm_types.
std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
gemm_storage(step_function f);
std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
any_type(step_function f);

} // namespace caf_serving::cuda
