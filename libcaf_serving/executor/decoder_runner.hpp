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
/// in the cache's blocks between steps. Past tensors are padded to a bucket of
/// `past_bucket` positions, so that decoding sequences of different lengths
/// run as one batch and the backend compiles one plan per bucket, not per
/// length. Where a row's positions sit in them is the model's `past_layout`:
///
/// - `masked` (torch.onnx.export, optimum): one masked slot in front (no
///   tensor is ever empty), the row's cached positions at [1, 1 + first),
///   masked padding after; the new positions come back at present index
///   past + j. The attention reads the mask, and masked slots weigh exactly
///   zero in its softmax.
/// - `left_aligned` (onnxruntime-genai's GroupQueryAttention models): the
///   row's cached positions at [0, first), padding after; the mask holds
///   first + count ones then zeros, so that the graph's seqlens_k
///   (ReduceSum(mask) - 1) is first + count - 1 for every row and its
///   total_sequence_length (the mask's width) is past + count; the new
///   positions come back at present index first + j. GroupQueryAttention
///   never reads the mask's positions, only those two numbers.
///
/// Either way a sequence's logits do not depend on which others share its
/// step (up to float reassociation across batch sizes).
///
/// Decoding sequences (one token each) share one run; a prefill chunk runs
/// alone.
///
/// A paged decoder (onnx/paged_attention.hpp: the engine rewrote its
/// GroupQueryAttention) takes no past tensors at all: its attention reads the
/// cache's blocks in place through `kv_block_table` [batch, blocks] and
/// `kv_context_lens` [batch, 1], and its present.N outputs hold the new
/// positions only, [batch, kv_heads, sequence, head_dim], which the runner
/// writes into the cache. Nothing of the past is copied: a step costs the same
/// copies whatever the sequences' lengths. The block table is padded to a
/// multiple of past_bucket / block_tokens blocks, so plans are compiled per
/// bucket as above.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/model_config.hpp"
#include "executor/backend.hpp"
#include "executor/kv_cache.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::executor {

/// Where a step's past tensors hold each row's cached positions (above).
enum class past_layout { masked, left_aligned };

/// The layout named in config.pbtxt's parameter "past_layout" ("masked",
/// "left_aligned"); nothing for any other name.
std::optional<past_layout> past_layout_from_name(std::string_view name);

/// The tensors of a decoder with its cache, found by their names.
struct decoder_signature {
  std::string input_ids;
  std::string attention_mask;
  std::string position_ids; ///< empty: the model takes none
  std::string logits;
  std::vector<std::string> past_keys, past_values;       ///< per layer
  std::vector<std::string> present_keys, present_values; ///< per layer
  uint32_t layers() const { return static_cast<uint32_t>(present_keys.size()); }
  datatype ids_dtype = datatype::int64;
  datatype mask_dtype = datatype::int64;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t vocab = 0;
  past_layout layout = past_layout::masked;
  /// A paged decoder: `block_table` and `context_lens` instead of past tensors
  /// (past_keys and past_values are empty).
  bool paged = false;
  std::string block_table, context_lens;
  /// Inputs in the model's order (what batch_view::inputs follows).
  std::vector<std::string> input_order;
};

/// What the model's other files say about its decoder (onnxruntime-genai's
/// genai_config.json, config.pbtxt's parameters).
struct decoder_hints {
  past_layout layout = past_layout::masked;
  /// The head size where the cache tensors leave it symbolic (genai's
  /// "kv_cache_dim"); 0: it must be fixed in the graph.
  uint32_t head_dim = 0;
};

/// onnxruntime-genai's decoder tensors in their config, as genai_config.json
/// gives them: `config` with input_ids and attention_mask (INT64 [-1]),
/// past_key_values.N.key/value [kv_heads, -1, head_dim] for each of `layers`,
/// logits [-1, vocab] and present.N.key/value, where it does not list them
/// (past the batch). The builder leaves the head size symbolic
/// ("kv_cache_dim"); fixed here, the model compiles one plan per past length
/// instead of probing sizes for it.
struct cache_dims {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t vocab = 0;
  /// The graph was rewritten to read the cache in place: kv_block_table and
  /// kv_context_lens instead of the past inputs.
  bool paged = false;
};
model_config with_cache_dims(model_config config, const cache_dims& dims);

/// The decoder tensors of `config` (inputs and outputs completed from the
/// graph), or what is missing and how to export a model that has it.
result<decoder_signature> find_decoder_signature(const model_config& config,
                                                 const decoder_hints& hints = {});

struct decoder_runner_config {
  /// Past tensors are padded to a multiple of this many positions.
  uint32_t past_bucket = 32;
  /// Decoding sequences run in batches of a power of two rows, at most this.
  uint32_t max_batch = 64;
  /// A paged decoder's external_memory handle (core/external_memory.hpp): the
  /// runner binds its cache to it while it lives. 0 for other decoders.
  uint64_t kv_pool = 0;
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
  ~decoder_runner();
  decoder_runner(const decoder_runner&) = delete;
  decoder_runner& operator=(const decoder_runner&) = delete;

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
  /// run_group's inputs of a paged decoder: the block table and context
  /// lengths instead of past tensors.
  void paged_inputs(const std::vector<const decoder_step_item*>& items, uint32_t rows);

  decoder_signature sig_;
  std::shared_ptr<backend> model_;
  kv_cache cache_;
  decoder_runner_config config_;
  /// The outputs of a run by name; their buffers keep their capacity from
  /// step to step.
  struct output_buffers final : output_writer {
    struct tensor {
      std::vector<int64_t> shape;
      std::vector<uint8_t> bytes;
    };
    std::map<std::string, tensor, std::less<>> outputs;
    uint8_t* allocate(std::string_view name, datatype dtype, const std::vector<int64_t>& shape,
                      size_t bytes) override;
  };

  // Buffers reused from step to step.
  std::vector<int64_t> ids_, mask_, positions_;
  std::vector<int32_t> ids32_, mask32_, positions32_;
  std::vector<int32_t> table_, context_;
  uint32_t table_width_ = 0;
  output_buffers outputs_;
  std::vector<std::vector<float>> past_;
};

} // namespace caf_serving::executor
