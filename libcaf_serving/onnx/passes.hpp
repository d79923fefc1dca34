#pragma once
/// Graph passes. `optimize()` runs them all in order on a graph whose input shapes
/// are set:
///
///   1. specialize: shape inference for one concrete set of input shapes, and
///      constant folding (Shape of a known shape and every operator whose inputs
///      are all constants);
///   2. fold_batchnorm: Conv followed by BatchNormalization becomes one Conv with
///      rescaled weights and a bias;
///   3. fuse_layernorm, fuse_gelu, fuse_packed_attention, fuse_attention: the
///      decomposed patterns of opsets below 17 (and LayerNormalization itself)
///      become FusedLayerNorm, FusedGelu, FusedGeluTanh and FusedAttention
///      (ops_nn.hpp, ops_elementwise.hpp); then cancel_transposes;
///   4. fuse_epilogues: bias, activation and residual add folded into FusedConv,
///      FusedMatMul and FusedGemm;
///   5. remove_dead_nodes.
///
/// Before them all, fuse_qdq (quant_passes.hpp) rewrites the QDQ groups of
/// int8 models onto integer operators, while the weights are still INT8.
///
/// Every pass keeps nodes in topological order and the graph outputs intact.

#include "core/error.hpp"
#include "onnx/ir.hpp"

#include <string>
#include <vector>

namespace caf_serving::onnx {

/// Copies `g` with the given input shapes (one per graph input, in order),
/// infers every shape and folds constants. The error names the node, its
/// operator and the opset.
result<graph> specialize(const graph& g, const std::vector<std::vector<int64_t>>& input_shapes);

void fold_batchnorm(graph& g);
void fuse_layernorm(graph& g);
void fuse_gelu(graph& g);
void fuse_attention(graph& g);
/// torch's nn.MultiheadAttention(batch_first=True) with a packed in-projection
/// (torchvision's ViT) as TorchScript exports it (passes_mha.cpp).
void fuse_packed_attention(graph& g);
void fuse_epilogues(graph& g);
void remove_dead_nodes(graph& g);
/// Transpose(Transpose(x, p), q) whose inner result nothing else reads becomes
/// one Transpose of x by the composed permutation, or x itself where that is
/// the identity: rewrite_decoder_attention (passes_decoder.hpp) transposes
/// each of q, k, v back to [B, S, N, hd] right after the export's Transpose
/// to [B, N, S, hd], and its output forth before the export's Transpose back.
/// A Reshape to its own shape, which may sit between the two (GPT-2's), goes
/// first: its readers read its input.
void cancel_transposes(graph& g);

/// Which passes optimize() runs; all by default (tests turn some off to
/// compare fused against unfused).
struct pass_config {
  bool fold_batchnorm = true;
  bool fuse_patterns = true;
  bool fuse_epilogues = true;
  /// QDQ groups onto QLinearConv and QLinearAdd (quant_passes.hpp).
  /// config.pbtxt: parameters "qdq_fusion" ("true" or "false").
  bool fuse_qdq = true;
  /// Each layer's attention of a torch-exported decoder becomes
  /// GroupQueryAttention (passes_decoder.hpp), once, on the imported graph;
  /// the generative loader sets it (config.pbtxt: parameters
  /// "rewrite_attention" "false" turns it off).
  bool rewrite_decoder_attention = false;
};

/// specialize() followed by the passes `cfg` selects.
result<graph> optimize(const graph& g, const std::vector<std::vector<int64_t>>& input_shapes,
                       const pass_config& cfg = {});

} // namespace caf_serving::onnx
