#pragma once
/// rewrite_decoder_attention: a decoder exported by torch.onnx.export with
/// its KV cache as tensors (tests/generative/fixtures/tiny_gpt2, tiny_llama,
/// tiny_qwen2; tools/generative_fixtures.py) computes each layer's attention
/// as a chain of operators:
///
///     present_k = Concat(past_k [B, kv, P, hd], k [B, kv, S, hd], axis 2)
///     present_v = Concat(past_v, v, axis 2)
///     K, V      = present_k, present_v, or with kv < N heads repeat_kv of them:
///                 Reshape(Expand(Unsqueeze(x, 2), [B, kv, N / kv, T, hd]),
///                         [B, N, T, hd])
///     scores    = MatMul(q [B, N, S, hd] * a, Transpose(K, (0, 1, 3, 2)) * b) * c
///     p         = Softmax(scores + bias, -1), optionally Where(IsNaN(p), 0, p)
///     o         = MatMul(p, V)                                   [B, N, S, hd]
///
/// with `bias` built from attention_mask alone (and the tensors' shapes). The
/// pass makes each layer one com.microsoft.GroupQueryAttention (ops_contrib.hpp),
/// as onnxruntime-genai's builder writes it, with do_rotary 0 (the graph has
/// already rotated q and k) and scale a * b * c:
///
///     seqlens_k = Cast(ReduceSum(attention_mask, 1) - 1, int32)     (shared)
///     total     = Cast(Shape(attention_mask)[1], int32)               (shared)
///     y, present_k, present_v = GroupQueryAttention(
///         Reshape(Transpose(q, (0, 2, 1, 3)), [0, 0, -1]), (k, v likewise),
///         past_k, past_v, seqlens_k, total)
///     o = Transpose(Reshape(y, [0, 0, N, hd]), (0, 2, 1, 3))
///
/// so that the model runs with past_layout left_aligned (decoder_runner.hpp),
/// the form the engine's KV cache serves to GroupQueryAttention.
///
/// GroupQueryAttention computes causal attention over each row's valid
/// positions; the chain computes whatever its bias says. So the pass checks
/// what the bias is: it folds the bias (specialize(), passes.hpp) for a few
/// probe shapes and masks, with holes and padding, and requires 0 exactly
/// where key j <= P + i and attention_mask[b, j] is 1 and at most -1e30
/// elsewhere, over a context longer than twice any integer constant the bias
/// reads (a sliding window shows). Anything else leaves the graph as it is and
/// says why: a bias that is not causal plus padding (alibi, a window, none),
/// an operator between the scores and the softmax (softcapping), a scores or
/// probabilities tensor read elsewhere, an input the probes cannot shape, a
/// Softmax outside a recognised layer, a cache not read by a recognised layer.
/// All layers are rewritten or none: the two past layouts do not mix.
///
/// Usage (the generative loader, through pass_config::rewrite_decoder_attention):
///
///     auto r = rewrite_decoder_attention(g);
///     if (r.layers > 0) hints.layout = executor::past_layout::left_aligned;
///     else log(r.refused);

#include "onnx/ir.hpp"

#include <string>

namespace caf_serving::onnx {

/// What rewrite_decoder_attention did.
struct decoder_attention_result {
  /// Layers now computed by GroupQueryAttention; 0: the graph is unchanged.
  int layers = 0;
  /// Why the graph is unchanged (empty when rewritten): what did not match,
  /// naming the node or tensor.
  std::string refused;
};

/// Rewrites every layer's attention of a torch-exported decoder `g` (as
/// imported: shapes not yet specialized) into GroupQueryAttention, or
/// leaves `g` unchanged (above).
decoder_attention_result rewrite_decoder_attention(graph& g);

/// A decoder computes its logits for every position of the step, but a step
/// samples from the last one only: with a vocabulary of 50k, the language-model
/// head's matmul over a prefill chunk of 128 positions was half the chunk's
/// time. When the graph output `logits` comes straight from a MatMul (or
/// com.microsoft.MatMulNBits) of a [batch, sequence, hidden] input by constant
/// weights, a Slice of the last position goes in front of it, so that
/// `logits` becomes [batch, 1, vocab]. Returns whether it did; any other
/// graph is left as it is. The runner (decoder_runner.hpp) reads either shape.
bool last_position_logits(graph& g);

} // namespace caf_serving::onnx
