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

/// One row of a PagedGroupQueryAttention node once its queries and new keys
/// are rotated: what its attention reads and writes. The layout is that of
/// the engine's kernel (kernels/cpu/paged_attention.hpp), which the CPU
/// backend runs; the model library does not link it.
struct paged_row {
  const float* q = nullptr;          ///< [new_positions][heads][head_dim]
  const float* new_keys = nullptr;   ///< [new_positions][kv_heads][head_dim], rotated
  const float* new_values = nullptr; ///< [new_positions][kv_heads][head_dim]
  const float* pool = nullptr;       ///< the cache's first block; null when context is 0
  const int32_t* blocks = nullptr;   ///< the row's ceil(context / block_tokens) blocks
  int64_t context = 0, new_positions = 1, heads = 1, kv_heads = 1, head_dim = 1;
  int64_t block_tokens = 16, block_floats = 0;
  int64_t key_offset = 0, value_offset = 0; ///< this layer's keys and values in a block, floats
  float scale = 1.0f;
  float* y = nullptr; ///< [new_positions][heads][head_dim]
};

/// Computes one row's attention (softmax(scale * q k^T, causal) v per head).
using paged_row_attention = void (*)(const paged_row& row);

/// The reference: each score a dot product in four partial sums, std::exp,
/// the sum in double, in GroupQueryAttention's reference order.
void paged_row_reference(const paged_row& row);

/// Which rows run_paged_gqa_rows() computes, and with which attention.
struct paged_gqa_rows {
  int64_t first = 0, last = 0; ///< rows [first, last)
  paged_row_attention attend = paged_row_reference;
};

/// Computes rows [first, last) of a PagedGroupQueryAttention node: row b's
/// query attends to its cached positions (read through its block table from
/// the memory bound to the node's `kv_pool`), then to its new positions
/// [0, s]: the rows' checks, rotary and new keys and values (the outputs
/// present.N.key/value) here, the attention itself by `rows.attend`. The
/// reference kernel runs every row with paged_row_reference(); the CPU
/// backend splits the rows among its threads and runs the engine's kernel.
/// Scratch is per thread and grows, so a steady state allocates nothing.
/// Throws std::runtime_error where a row's context or block does not fit the
/// cache (the runner's bookkeeping is wrong).
void run_paged_gqa_rows(const node& n, const std::vector<tensor_ref>& in,
                        const std::vector<tensor_ref>& out, const paged_gqa_rows& rows);

/// run_paged_gqa_rows() with the reference attention.
inline void run_paged_gqa_rows(const node& n, const std::vector<tensor_ref>& in,
                               const std::vector<tensor_ref>& out, int64_t first,
                               int64_t last) {
  run_paged_gqa_rows(n, in, out, paged_gqa_rows{first, last, paged_row_reference});
}

} // namespace caf_serving::onnx
