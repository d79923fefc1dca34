#pragma once
/// When a generated sequence ends (issue 34): by a token (an end-of-sequence
/// id, a stop id, max_tokens) or by a stop string in its text. Plain C++: no
/// CAF, no threads, no wire types.
///
/// ## Stop strings (OpenAI's semantics)
///
/// The text ends before the first stop string to appear: the one that
/// completes first, and among those completing at the same character the
/// longest (it starts first). Neither the stop string nor anything after it is
/// ever sent. A `stop_string_checker` is fed the detokenizer's chunks (UTF-8,
/// whole characters) and says what may be sent now: it holds back the end of
/// the text that could still become the start of a stop string, and lets it
/// go as soon as it cannot. A stop string spanning several chunks is found.
/// The matching is an Aho-Corasick automaton over bytes, so a chunk costs
/// O(chunk + longest stop string), whatever came before it.
///
/// ## Usage (what the post-processor does for each sequence)
///
/// ```
/// if (auto why = check(stop)) reject the request (400) with *why;
/// stop_string_checker strings{stop.stop};
/// sampler.suppress(ending_tokens(stop, eos_ids), stop.min_tokens);
/// // each step: the token, then its text
/// auto end = end_after_token(stop, eos_ids, generated, token);
/// auto scan = generated < stop.min_tokens ? strings.feed_before_min_tokens(text)
///                                         : strings.feed(text);
/// send scan.text; if scan.stop or end: finish ("stop" or end->reason),
/// else at the end of the sequence send strings.flush().
/// ```
#include "core/generation_params.hpp"
#include "postprocess/sampling.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::postprocess {

/// Why `params` cannot end a sequence as asked: names the field and what it
/// must be. nullopt: they can.
std::optional<std::string> check(const stop_params& params);

// ---- Stop strings --------------------------------------------------------------

/// What a chunk of text lets through.
struct stop_scan {
  /// The text that may be sent now (possibly empty).
  std::string text;
  /// The index in the stop list of the stop string that ended the text, once
  /// one has; every later chunk is then ignored.
  std::optional<std::size_t> stop;
};

/// The stop strings of one sequence, fed its text chunk by chunk.
class stop_string_checker {
public:
  /// Empty strings in `stops` never match (`check` refuses them).
  explicit stop_string_checker(const std::vector<std::string>& stops);

  /// Scans `chunk` (whole UTF-8 characters) after the text before it.
  stop_scan feed(std::string_view chunk);
  /// The same before the sequence has `min_tokens` tokens: the text is held
  /// back alike, but no stop string completing in it ends the sequence.
  stop_scan feed_before_min_tokens(std::string_view chunk);
  /// At the end of a sequence that no stop string ended: the text held back.
  std::string flush();

  /// The stop string that ended the text, if one has.
  std::optional<std::size_t> stopped() const { return stopped_; }
  /// Bytes held back now: the longest end of the text that begins a stop string.
  std::size_t held() const { return held_.size(); }

private:
  /// A node of the automaton: the longest stop-string prefix that ends the text.
  struct node {
    std::vector<std::pair<unsigned char, uint32_t>> edges;
    uint32_t fail = 0;
    uint32_t depth = 0;
    /// The longest stop string ending here (0: none) and its index.
    uint32_t match_length = 0;
    std::size_t match_index = 0;
  };

  enum class matching { ends_text, ignored };

  uint32_t step(uint32_t state, unsigned char byte) const;
  stop_scan scan(std::string_view chunk, matching mode);

  std::vector<node> nodes_;
  uint32_t state_ = 0;
  std::string held_;
  std::optional<std::size_t> stopped_;
};

// ---- Tokens ----------------------------------------------------------------------

/// Why a sequence ended, as OpenAI and vLLM name it: "stop" (an
/// end-of-sequence id, a stop id or a stop string) or "length" (max_tokens).
enum class finish_reason { stop, length };

/// "stop" or "length".
const char* to_string(finish_reason reason);

/// How a sequence ended by its newest token.
struct sequence_end {
  finish_reason reason = finish_reason::stop;
  /// The end-of-sequence or stop id that ended it; unset for "length".
  std::optional<int32_t> token;
};

/// Whether the sequence ends with `token`, its `generated`-th token (counting
/// it). An end-of-sequence id (unless `ignore_eos`) or a stop id ends it once
/// it has `min_tokens` tokens; `max_tokens` ends it with "length" otherwise.
std::optional<sequence_end> end_after_token(const stop_params& params,
                                            const_span<int32_t> eos_ids, uint32_t generated,
                                            int32_t token);

/// The ids that end a sequence (its end-of-sequence ids unless `ignore_eos`,
/// and its stop ids): the sampler suppresses them before `min_tokens`
/// (`sequence_sampler::suppress`), as vLLM and Hugging Face do.
std::vector<int32_t> ending_tokens(const stop_params& params, const_span<int32_t> eos_ids);

} // namespace caf_serving::postprocess
