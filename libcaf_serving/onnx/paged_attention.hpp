#pragma once
/// Attention that reads the generative executor's KV cache in place (issue 34).
///
/// A decoder exported with its cache as tensors takes each layer's past keys
/// and values as inputs and returns past + new as outputs, so a server that
/// feeds it copies every sequence's whole past into padded tensors at every
/// step, and copies it back out. rewrite_paged_attention() turns each layer's
/// com.microsoft.GroupQueryAttention (onnxruntime-genai's builder writes it)
/// into the engine's PagedGroupQueryAttention, which reads the past straight
/// from the cache's blocks through a block table:
///
///     before: GQA(query, key, value, past_key_values.N.key, .value, seqlens_k,
///                 total_sequence_length, cos, sin) -> y, present.N.key, .value
///     after:  PagedGQA(query, key, value, kv_block_table, kv_context_lens,
///                      cos, sin) -> y, present.N.key, present.N.value
///
/// - `kv_block_table` INT32 [batch, blocks]: row b's cache blocks in order
///   (positions [i * block_tokens, (i + 1) * block_tokens) in block table[b][i]);
///   entries past the row's positions are not read.
/// - `kv_context_lens` INT32 [batch, 1]: how many positions row b has cached;
///   its new tokens sit at positions ctx, ctx + 1, ... (rotary included).
/// - `present.N.key/value` [batch, kv_heads, sequence, head_dim]: the new
///   positions only (rotated keys), which the runner writes into the cache.
/// - The cache itself is the memory bound to the node's `kv_pool` handle
///   (core/external_memory.hpp), laid out as executor::kv_cache's blocks:
///   [block][layer][key|value][kv head][position in block][head_dim] floats.
///
/// The past_key_values inputs leave the graph, and with them the nodes that
/// only fed GroupQueryAttention's seqlens_k and total_sequence_length from the
/// attention mask (the mask input stays; the runner feeds it [batch, sequence]
/// ones). Query position s of row b attends to cached positions [0, ctx) and
/// new positions [0, s], exactly what GroupQueryAttention computes over a
/// left-aligned past, in the same order of arithmetic.

#include "onnx/ir.hpp"
#include "onnx/ops_common.hpp"

#include <cstdint>
#include <string>

namespace caf_serving::onnx {

/// node::op of the engine's paged attention (never imported).
inline constexpr const char* paged_gqa_op = "com.microsoft.PagedGroupQueryAttention (engine)";

/// The graph inputs that the rewrite adds.
inline constexpr const char* kv_block_table_input = "kv_block_table";
inline constexpr const char* kv_context_lens_input = "kv_context_lens";

struct paged_attention_config {
  /// The external_memory handle the cache will be bound to.
  uint64_t kv_pool = 0;
  uint32_t block_tokens = 16;
};

struct paged_attention_result {
  uint32_t layers = 0;
  /// Why the graph was left as it was (empty when rewritten).
  std::string refused;
};

/// Rewrites every GroupQueryAttention of a decoder (above), or none: when any
/// layer's attention is not one the paged operator computes alike (past not
/// the graph input past_key_values.N.key/value, present not the graph output
/// present.N.key/value, an attribute or input GroupQueryAttention's check
/// refuses), the graph is unchanged and `refused` says why.
paged_attention_result rewrite_paged_attention(graph& g, const paged_attention_config& config);

/// Computes rows [first, last) of a PagedGroupQueryAttention node: row b's
/// query attends to its cached positions (read through its block table from
/// the memory bound to the node's `kv_pool`), then to its new positions
/// [0, s], summed in GroupQueryAttention's reference order. The reference
/// kernel runs every row; the CPU backend splits the rows among its threads.
/// Throws std::runtime_error where a row's context or block does not fit the
/// cache (the runner's bookkeeping is wrong).
void run_paged_gqa_rows(const node& n, const std::vector<tensor_ref>& in,
                        const std::vector<tensor_ref>& out, int64_t first, int64_t last);

} // namespace caf_serving::onnx
