#pragma once
/// The engine's paged attention for one batch row (issue 35): causal softmax
/// attention with grouped-query heads over keys and values that sit in a KV
/// cache's blocks (read through the row's block table) followed by the row's
/// new positions. The ONNX CPU backend runs it for the engine's
/// PagedGroupQueryAttention (libcaf_serving/onnx/paged_attention.hpp), whose
/// reference kernel is the ground truth it is tested against.
///
/// One block holds [layer][key|value][kv head][position in block][head_dim]
/// floats; a row's cached position j is position j % block_tokens of block
/// blocks[j / block_tokens]. Query position s (of new_positions) attends to the
/// cached positions [0, context) and the new positions [0, s].
///
///     paged_attention_args a;
///     a.q = q; a.new_keys = k; a.new_values = v; a.pool = cache; a.blocks = table_row;
///     a.context = 37; a.new_positions = 1; a.heads = 8; a.kv_heads = 2; a.head_dim = 64;
///     ...
///     engine_paged_attention(a);
///
/// Work per kv head: the scores of up to 16 (query head, key) pairs at once in
/// as many accumulators with one combined horizontal reduction, each key loaded
/// once for all the query heads of its group; the softmax with the engine's
/// vector exp (vector_exp.hpp); the value sum with vector FMAs, each value
/// loaded once per group. Accumulation is fp32 throughout; scratch is
/// thread_local and grows, so a steady state allocates nothing.

#include "cpu_isa.hpp"

#include <cstdint>

namespace caf_serving::kernels::cpu {

struct paged_attention_args {
  /// [new_positions][heads][head_dim]: the row's queries (rotated where the model rotates).
  const float* q = nullptr;
  /// [new_positions][kv_heads][head_dim] each: the row's new keys (rotated) and values.
  const float* new_keys = nullptr;
  const float* new_values = nullptr;
  /// The cache's first block; null when context is 0.
  const float* pool = nullptr;
  /// The row's blocks, ceil(context / block_tokens) of them, each a valid block of the pool.
  const int32_t* blocks = nullptr;
  int64_t context = 0;       ///< cached positions the row attends to
  int64_t new_positions = 1; ///< S: new positions (queries) of the row
  int64_t heads = 1;         ///< query heads, a multiple of kv_heads
  int64_t kv_heads = 1;
  int64_t head_dim = 1;
  int64_t block_tokens = 16; ///< positions per block
  int64_t block_floats = 0;  ///< floats per block (all layers, keys and values)
  /// Where this layer's keys and values start in a block, in floats.
  int64_t key_offset = 0, value_offset = 0;
  float scale = 1.0f; ///< multiplies q . k
  /// [new_positions][heads][head_dim]: the attention's output.
  float* y = nullptr;
  /// The instruction set to run at; a test may pick any up to detected_isa_level().
  isa_level level = engine_isa_level();
};

/// y = softmax(scale * q k^T, causal) v per query head, over the row's cached
/// and new positions (above).
void engine_paged_attention(const paged_attention_args& a);

} // namespace caf_serving::kernels::cpu
