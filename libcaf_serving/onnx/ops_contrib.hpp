#pragma once
/// The com.microsoft operators that onnxruntime's transformer optimizer
/// (onnxruntime.transformers.optimizer.optimize_model) writes into BERT-like,
/// GPT-2, T5-encoder and CLIP models: Attention, MultiHeadAttention, the
/// layer normalizations with a residual (SkipLayerNormalization, ...),
/// EmbedLayerNormalization, the GELU variants and FusedMatMul. Each is
/// registered once, in ops_contrib.cpp's table, with shape inference and a
/// reference kernel, as onnxruntime's docs/ContribOperators.md defines it and
/// onnxruntime computes it on the CPU.
///
/// The importer names these nodes "com.microsoft.<op_type>" in node::op, so
/// that they never meet the engine's own fused operators of the same name
/// ("FusedMatMul" is both a com.microsoft operator and an internal fusion with
/// another meaning): passes and kernels that match on "FusedMatMul" see only
/// the engine's.
///
/// Usage (ops.cpp, op_registry.cpp):
///
///     if (is_contrib_op(n.op)) return infer_contrib_op(g, n);
///     if (is_contrib_op(n.op)) run_contrib_op(n, inputs, outputs);
///     if (is_contrib_op(n.op)) return check_contrib_node(n);

#include "onnx/ir.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/ops.hpp"

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// The prefix of a com.microsoft operator in node::op.
inline constexpr const char* contrib_prefix = "com.microsoft.";

/// The domain's operators, as "com.microsoft.<op_type>" with their versions
/// (all 1: onnxruntime versions the domain as a whole), and onnxruntime's
/// default-domain SimplifiedLayerNormalization (version 1), for op_registry.cpp.
const op_table& contrib_operator_table();

bool is_contrib_op(const std::string& op);

/// What in `n`'s attributes, inputs or outputs the engine does not implement
/// (Attention's past state, packed or cached MultiHeadAttention inputs,
/// FusedMatMul's transBatchA, ...); the text says what to do instead.
std::optional<std::string> check_contrib_node(const node& n);

/// Output types and shapes of `n` (one entry per output slot); the error names
/// the input whose shape or type does not fit.
std::variant<std::vector<inferred>, std::string> infer_contrib_op(const graph& g, const node& n);

/// Rewrites, in a specialized graph (every shape known), the contrib nodes that
/// the engine's own operators compute alike into those, so that the fusion
/// passes that follow fold them into matmul epilogues and threaded steps:
/// BiasGelu(X, B) and Gelu(X) become Add + FusedGelu; SkipLayerNormalization
/// whose mean and inv_std_var outputs are unused becomes Add(X, bias),
/// Add(skip) (the input_skip_bias_sum output) and FusedLayerNorm; Attention
/// with constant weights and bias, no causal mask, no attention_bias and no
/// mask or a [B] / [B, L] one becomes three MatMul + Add and FusedAttention
/// (with an engine-internal node that turns the mask into FusedAttention's
/// additive [B, 1, 1, L]). The others stay (their reference kernels run them).
void lower_contrib_ops(graph& g);

/// Runs `n` on shapes and types that infer_contrib_op() accepted; omitted
/// outputs have no data.
void run_contrib_op(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out);

} // namespace caf_serving::onnx
