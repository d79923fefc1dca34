#pragma once
/// The post-processing of a generative model's steps (issue 34): per sequence,
/// its sampler (sampling.hpp), its detokenizer and its stop checks
/// (stop_strings.hpp); for each step's logits, every row's next token, its
/// logprobs, its new text and whether the sequence ended. Plain C++: no CAF,
/// no threads; generation_postprocessor_actor.hpp is the actor that owns one.
///
/// A sequence's tokens depend on its own parameters, prompt and logits only:
/// which other rows a step holds, and in which order, changes nothing
/// (sampling.hpp's counter-based draws).
///
/// ## Usage
///
/// ```
/// generation_postprocessor post{{tokenizer, eos_ids}};
/// post.open(sequence);                 // before its first step
/// auto samples = post.sample(logits);  // each step: one row per known seq
/// post.close(id);                      // cancelled, failed elsewhere
/// ```
/// A sequence whose sample ends it (finish_reason or error set) is forgotten
/// by `sample` itself.

#include "core/generation_messages.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace caf_serving::text {
class tokenizer;
}

namespace caf_serving::postprocess {

struct generation_postprocessor_config {
  std::shared_ptr<const text::tokenizer> tokenizer;
  /// The model's end-of-sequence ids.
  std::vector<int32_t> eos_ids;
};

class generation_postprocessor {
public:
  explicit generation_postprocessor(generation_postprocessor_config config);
  ~generation_postprocessor();
  generation_postprocessor(generation_postprocessor&&) noexcept;
  generation_postprocessor& operator=(generation_postprocessor&&) noexcept;

  /// Starts sampling for `seq` (its sampling and stop parameters must pass
  /// `check`, and `seq.stop.max_tokens` be set). Opening an id twice is a bug.
  void open(const generation_sequence& seq);
  /// Forgets `id`; nothing when it is unknown.
  void close(uint64_t id);

  /// One sample per row of `logits` whose sequence is open, in row order
  /// (rows of closed sequences are skipped).
  generation_samples sample(const generation_logits& logits);

  /// Sequences open now.
  size_t open_sequences() const;

private:
  struct sequence;
  generation_sample next(sequence& s, const float* row, uint32_t vocab);

  generation_postprocessor_config config_;
  std::unordered_map<uint64_t, std::unique_ptr<sequence>> sequences_;
};

} // namespace caf_serving::postprocess
