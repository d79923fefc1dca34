#pragma once
/// The com.microsoft operators that onnxruntime's transformer optimizer
/// (onnxruntime.transformers.optimizer.optimize_model) writes into BERT-like,
/// GPT-2, T5-encoder and CLIP models: Attention, MultiHeadAttention, the
/// layer normalizations with a residual (SkipLayerNormalization, ...),
/// EmbedLayerNormalization, the GELU variants and FusedMatMul; and those of
/// onnxruntime-genai's model builder: GroupQueryAttention (rotary inside,
/// grouped KV heads, past/present cache), SkipSimplifiedLayerNormalization and
/// MatMulNBits (4-bit block-quantized weights). Each is one
/// entry of ops_contrib.cpp's table, with shape inference, a reference kernel
/// and the check of what the engine does not implement, as onnxruntime's
/// docs/ContribOperators.md defines it and onnxruntime computes it on the CPU;
/// the registry (op_registry.cpp) holds the table.
///
/// The importer names these nodes "com.microsoft.<op_type>" in node::op, so
/// that they never meet the engine's own fused operators of the same name
/// ("FusedMatMul" is both a com.microsoft operator and an internal fusion with
/// another meaning): passes and kernels that match on "FusedMatMul" see only
/// the engine's.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The prefix of a com.microsoft operator in node::op.
inline constexpr const char* contrib_prefix = "com.microsoft.";

/// The domain's operators, as "com.microsoft.<op_type>" with their versions
/// (all 1: onnxruntime versions the domain as a whole), and onnxruntime's
/// default-domain SimplifiedLayerNormalization (version 1), for op_registry.cpp.
/// Their checks refuse what the engine does not implement (Attention's past
/// state, packed or cached MultiHeadAttention inputs, FusedMatMul's
/// transBatchA, ...), saying what to do instead.
const op_table& contrib_operator_table();

/// The engine's own operator of lower_contrib_ops() (the additive mask of
/// Attention's mask_index), for op_registry.cpp.
const op_table& contrib_engine_table();

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

} // namespace caf_serving::onnx
