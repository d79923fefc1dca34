#pragma once
/// The operators that hold a network's compute: convolution and pooling (Conv,
/// MaxPool, AveragePool, GlobalAveragePool; 2-D, NCHW), the products (MatMul,
/// Gemm; OpenBLAS), the normalizations (Softmax, LayerNormalization,
/// BatchNormalization) and ReduceMean and ReduceSum, with the engine's fused
/// forms that passes.cpp writes (attributes in brackets):
/// - FusedConv(X, W, B?, R?) [Conv's attributes, activation, act_alpha,
///   act_beta]: act(conv(X, W) + B + R).
/// - FusedMatMul(A, W, B?, R?) [activation]: act(A x W + B) + R, W constant 2-D.
/// - FusedGemm(A, W, C?) [Gemm's attributes, activation].
/// - FusedLayerNorm(X, gamma, beta?) [epsilon]: LayerNorm over the last axis.
/// - FusedAttention(Q, K, V, M?) [num_heads, scale, nan_to_zero]: Q, K, V are
///   [B, S, H*D]; softmax(Q_h K_h^T * scale + M) V_h per head, out [B, S, H*D]. M
///   broadcasts to [B, H, S, S] (typically [B, 1, 1, S]). nan_to_zero = 1 makes NaN
///   probabilities 0 (torch's SDPA: a row masked with -inf throughout).
/// The activations are apply_activation()'s (ops_common.hpp). Each operator is
/// one entry of a table: its versions, shape inference, reference kernel and,
/// where an ONNX version defines something the engine refuses, its check; the
/// registry (op_registry.cpp) holds the tables.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The ONNX operators of ops_nn.cpp with their versions, for op_registry.cpp.
const op_table& nn_operator_table();

/// The engine's own operators of ops_nn.cpp (FusedConv, FusedMatMul, FusedGemm,
/// FusedLayerNorm, FusedAttention), for op_registry.cpp.
const op_table& nn_engine_table();

/// Rewrites a Conv's, MaxPool's or AveragePool's auto_pad (SAME_UPPER,
/// SAME_LOWER, VALID) into explicit pads for its input's known shape, as ONNX
/// defines them, so that every kernel reads `pads` alone. Other nodes, other
/// auto_pad values and unknown shapes are left for inference to judge.
void explicit_pads(const graph& g, node& n);

} // namespace caf_serving::onnx
