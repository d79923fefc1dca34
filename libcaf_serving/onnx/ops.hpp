#pragma once
/// Shape inference and reference kernels for every operator the engine runs,
/// ONNX's and its own fused ones. The simple element-wise and indexing
/// operators live in ops_simple.cpp, each in one table entry; these functions
/// hand them there.
///
/// The reference kernels are plain, single-threaded C++ (MatMul and Gemm call
/// OpenBLAS). They fold constants at compile time, run the operators that have no
/// faster kernel, and are what every fused kernel is checked against.
///
/// Fused operators (attributes in brackets):
/// - FusedConv(X, W, B?, R?) [Conv's attributes, activation, alpha, beta]:
///   act(conv(X, W) + B) (+ R when `residual_first` is 0: act(conv + B + R)).
/// - FusedMatMul(A, W, B?, R?) [activation]: act(A x W + B + R), W constant 2-D.
/// - FusedGemm(A, W, C?) [Gemm's attributes, activation].
/// - FusedLayerNorm(X, gamma, beta?) [epsilon]: LayerNorm over the last axis.
/// - FusedGelu(X, B?): erf-GELU of X (+ B).
/// - FusedAttention(Q, K, V, M?) [num_heads, scale, nan_to_zero]: Q, K, V are
///   [B, S, H*D]; softmax(Q_h K_h^T * scale + M) V_h per head, out [B, S, H*D]. M
///   broadcasts to [B, H, S, S] (typically [B, 1, 1, S]). nan_to_zero = 1 makes NaN
///   probabilities 0 (torch's SDPA: a row masked with -inf throughout).
///
/// Activations: "" (none), "Relu", "Gelu" (erf), "Tanh", "Sigmoid", "Clip" (alpha=min,
/// beta=max), "HardSwish" (x * clip(alpha * x + beta, 0, 1); alpha 1/6, beta 1/2),
/// "Swish" (x * sigmoid(alpha * x); alpha 1 is SiLU).

#include "onnx/ir.hpp"

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// A tensor in memory that a kernel reads or writes.
struct tensor_ref {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  void* data = nullptr;

  template <class T>
  T* as() const { return static_cast<T*>(data); }
  int64_t elements() const { return element_count(shape); }
};

/// An output's inferred type and shape.
struct inferred {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
};

/// Output types and shapes of `n` given its input values (which must have known
/// shapes; shape-determining inputs such as Reshape's target must be constants).
/// The error says what does not fit, without the node's name (the caller adds it).
std::variant<std::vector<inferred>, std::string> infer_shapes(const graph& g, const node& n);

/// Runs the reference kernel of `n`. Shapes are those infer_shapes() gave.
void run_reference(const node& n, const std::vector<tensor_ref>& inputs,
                   const std::vector<tensor_ref>& outputs);

/// Runs a specialized graph (every shape known) with the reference kernels
/// only: the baseline that optimized graphs and compiled plans are checked
/// against. `inputs` holds the graph inputs' bytes in order; returns the
/// outputs' bytes in order.
std::vector<std::vector<uint8_t>> run_reference_graph(const graph& g,
                                                      const std::vector<std::string>& inputs);

/// Rewrites a Conv's, MaxPool's or AveragePool's auto_pad (SAME_UPPER,
/// SAME_LOWER, VALID) into explicit pads for its input's known shape, as ONNX
/// defines them, so that every kernel reads `pads` alone. Other nodes, other
/// auto_pad values and unknown shapes are left for inference to judge.
void explicit_pads(const graph& g, node& n);

/// Whether folding `op` on constants is worth it (every op but those that
/// materialise large tensors from tiny ones).
bool foldable(const std::string& op);

/// Applies an activation named as in FusedConv's `activation` attribute.
float apply_activation(const std::string& act, float x, float alpha, float beta);

/// Numpy broadcast of two shapes; nothing when they do not broadcast.
std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a,
                                                     const std::vector<int64_t>& b);

} // namespace caf_serving::onnx
