#pragma once
/// Loads a generative model (issue 34): a model directory whose config.pbtxt
/// says `model_transaction_policy { decoupled: true }` and whose version
/// directory holds a decoder exported with its KV cache (model.onnx), the
/// tokenizer (tokenizer.json, tokenizer_config.json) and, optionally,
/// generation_config.json, config.json and onnxruntime-genai's
/// genai_config.json (context_length, eos_token_id, decoder.head_size). The tokenizer files may also sit
/// in the model directory beside config.pbtxt. docs/generative.md has the
/// layout and every parameter.
///
/// config.pbtxt parameters (all optional):
///   max_sequences      sequences decoding at once (64)
///   max_step_tokens    tokens one step computes, prefill chunks included (512)
///   max_context        prompt plus generated tokens of one sequence (default:
///                      config.json's n_positions or max_position_embeddings,
///                      generation_config.json's max_length, or
///                      tokenizer_config.json's model_max_length)
///   kv_cache_bytes     the KV cache's budget (default --kv-cache-bytes, else
///                      room for max_sequences full contexts, at most a quarter
///                      of the machine's memory)
///   kv_block_tokens    positions per cache block (16)
///   past_bucket        past tensors are padded to a multiple of this (32)
///   max_waiting        requests waiting for a place at most (--max-queue-size)
///   past_layout        "masked" or "left_aligned" (decoder_runner.hpp); default
///                      left_aligned where genai_config.json (onnxruntime-genai's
///                      model builder) is present, else masked

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "core/stats.hpp"
#include "server/generative_model.hpp"

#include <caf/actor_system.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace caf_serving::onnx {
class work_pool;
}

namespace caf_serving::server {

struct generative_load_config {
  /// config.pbtxt as parsed (decoupled set).
  model_config config;
  std::filesystem::path model_dir;
  std::filesystem::path version_dir;
  /// --kv-cache-bytes; 0: the default above.
  uint64_t kv_cache_bytes = 0;
  uint32_t max_waiting = 1024;
  std::shared_ptr<onnx::work_pool> compute_pool;
  unsigned threads = 1;
};

struct loaded_generative {
  /// The config completed from the graph (inputs, outputs).
  model_config config;
  /// Starts the model's generation actor and returns what the pipeline holds.
  std::function<std::shared_ptr<generative_model>(caf::actor_system&)> start;
  /// One line for the log: the cache, the limits, the tokenizer.
  std::string summary;
};

/// Reads, checks and compiles what a generative model needs; errors name the
/// file or parameter that is wrong and how to fix it.
result<loaded_generative> load_generative(const generative_load_config& cfg);

} // namespace caf_serving::server
