#pragma once
/// One decoding step of a generative model over the executor's KV cache
/// (issue 34). The model is a decoder exported with its cache as tensors
/// (`torch.onnx.export` / optimum style): inputs `input_ids`,
/// `attention_mask`, optionally `position_ids`, and `past_key_values.N.key` /
/// `.value` [batch, kv_heads, past, head_dim]; outputs `logits`
/// [batch, sequence, vocab] and `present.N.key` / `.value` [batch, kv_heads,
/// past + sequence, head_dim].
///
/// The runner feeds each step's past from the cache and writes the new
/// positions of `present` back into it, so a sequence's keys and values live
/// in the cache's blocks between steps. Past tensors have one masked slot in
/// front (no tensor is ever empty) and are padded to a bucket of
/// `past_bucket` positions, the padding masked too, so that decoding
/// sequences of different lengths run as one batch and the backend compiles
/// one plan per bucket, not per length. Masked slots weigh exactly zero in the
/// attention's softmax, so a sequence's logits do not depend on which others
/// share its step (up to float reassociation across batch sizes).
///
/// Decoding sequences (one token each) share one run; a prefill chunk runs
/// alone.
///
/// Left for later: attention that reads the blocks in place, without copying
/// the past into a tensor each step (the goal).

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/model_config.hpp"
#include "executor/backend.hpp"
#include "executor/kv_cache.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::executor {

/// The tensors of a decoder with its cache, found by their names.
struct decoder_signature {
  std::string input_ids;
  std::string attention_mask;
  std::string position_ids; ///< empty: the model takes none
  std::string logits;
  std::vector<std::string> past_keys, past_values;       ///< per layer
  std::vector<std::string> present_keys, present_values; ///< per layer
  datatype ids_dtype = datatype::int64;
  datatype mask_dtype = datatype::int64;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t vocab = 0;
  /// Inputs in the model's order (what batch_view::inputs follows).
  std::vector<std::string> input_order;
};

/// The decoder tensors of `config` (inputs and outputs completed from the
/// graph), or what is missing and how to export a model that has it.
result<decoder_signature> find_decoder_signature(const model_config& config);

struct decoder_runner_config {
  /// Past tensors are padded to a multiple of this many positions.
  uint32_t past_bucket = 32;
  /// Decoding sequences run in batches of a power of two rows, at most this.
  uint32_t max_batch = 64;
};

/// What one sequence computes in a step.
struct decoder_step_item {
  uint64_t seq = 0;
  /// The position of tokens[0]; the cache holds the positions before it.
  uint32_t first_position = 0;
  /// The tokens it computes (not owned; valid during run()).
  const int32_t* tokens = nullptr;
  uint32_t count = 0;
  /// Whether the step's last token's logits are wanted.
  bool emits = false;
};

class decoder_runner {
public:
  decoder_runner(decoder_signature signature, std::shared_ptr<backend> model,
                 kv_cache_layout cache, decoder_runner_config config);

  /// Runs one step and returns the logits of the emitting items, in their
  /// order, vocab floats each. The cache must have room (the scheduler's
  /// policy keeps its count of blocks); a failed run is an error value.
  result<std::vector<float>> run(const std::vector<decoder_step_item>& items);

  /// Drops `seq`'s cache (it finished, was cancelled or preempted).
  void release(uint64_t seq) { cache_.release(seq); }

  const kv_cache& cache() const { return cache_; }
  const decoder_signature& signature() const { return sig_; }

private:
  /// Runs `items` (all of one token, or one item) as one batch; writes the
  /// logits of emitting items at their `logits_slot` (SIZE_MAX: none).
  std::variant<std::monostate, serving_error>
  run_group(const std::vector<const decoder_step_item*>& items, std::vector<float>& logits,
            const std::vector<size_t>& logits_slot);

  decoder_signature sig_;
  std::shared_ptr<backend> model_;
  kv_cache cache_;
  decoder_runner_config config_;
  // Buffers reused from step to step.
  std::vector<int64_t> ids_, mask_, positions_;
  std::vector<int32_t> ids32_, mask32_;
  std::vector<std::vector<float>> past_;
};

} // namespace caf_serving::executor
