#pragma once
/// A tokenizer read from Hugging Face's tokenizer.json, giving the same ids as
/// HF `tokenizers` (0.23) for the families generative models use:
///
///  - byte-level BPE as GPT-2 (ByteLevel pre-tokenizer with GPT-2's regex) and
///    as Llama-3 / Qwen2 (Split with their regex, then ByteLevel without one;
///    Qwen2's NFC normalizer), with the ByteLevel decoder;
///  - byte-fallback BPE as Llama-2 / Mistral (<0xXX> tokens), with the
///    normalizer Sequence[Prepend("▁"), Replace(" ", "▁")] or a Metaspace
///    pre-tokenizer, and the decoders Replace, ByteFallback, Fuse, Strip or
///    Metaspace.
///
/// Anything else in the file that would change the ids (an NFKC normalizer, a
/// regex this library has no matcher for, a WordPiece model...) is refused when
/// the file loads, with the component named: never a silently different
/// tokenization.
///
///   auto tok = tokenizer::load_file("model/tokenizer.json");
///   if (!tok) return tok.error();
///   std::vector<int32_t> ids = tok->encode("Hello", {.add_special_tokens = true});
///   std::string text = tok->decode(ids, {.skip_special_tokens = true});
///
///   detokenizer stream{*tok, prompt_ids, {.skip_special_tokens = true}};
///   for (int32_t id : generated) send(stream.push(id)); // whole characters only
///   send(stream.flush());

#include "core/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::text {

struct encode_options {
  /// Add what the post-processor adds (TemplateProcessing: a bos token, say).
  bool add_special_tokens = true;
};

struct decode_options {
  /// Leave out added tokens marked "special" (<s>, <|im_end|>...).
  bool skip_special_tokens = false;
};

/// One entry of tokenizer.json's "added_tokens": matched in the text before
/// anything else, as HF's AddedVocabulary does.
struct added_token {
  int32_t id = 0;
  std::string content;
  bool single_word = false; ///< only where no letter, digit or _ touches it
  bool lstrip = false;      ///< takes the whitespace before it
  bool rstrip = false;      ///< takes the whitespace after it
  bool normalized = true;   ///< matched in the normalized text, not the raw
  bool special = false;     ///< left out by decode's skip_special_tokens
};

/// What is known of the special tokens. tokenizer.json does not say which is
/// bos or eos: bos is the token the post-processor puts first, eos the first
/// special token with a conventional end name (</s>, <|endoftext|>, <|eot_id|>,
/// <|im_end|>, <|end_of_text|>, <eos>); a model's tokenizer_config.json, where
/// present, is the better source and may override both.
struct special_token_ids {
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  std::optional<int32_t> unk;
};

class tokenizer {
public:
  /// Parses tokenizer.json's text. Errors (400) name the unsupported or
  /// inconsistent component.
  static result<tokenizer> load(std::string_view json);
  static result<tokenizer> load_file(const std::string& path);

  /// Text to ids. Text that is not valid UTF-8 reads each bad byte as a
  /// character of its own (a byte-level vocabulary still encodes it exactly).
  std::vector<int32_t> encode(std::string_view text, encode_options options = {}) const;
  /// Ids to text, as HF's decode. Unknown ids are left out; invalid UTF-8 from
  /// byte tokens becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, decode_options options = {}) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(int32_t id) const;
  /// The largest id plus one: the rows an embedding needs.
  size_t vocab_size() const;
  const special_token_ids& special_ids() const;
  bool is_special(int32_t id) const;
  const std::vector<added_token>& added_tokens() const;

  struct impl;

private:
  friend class detokenizer;
  explicit tokenizer(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_; ///< immutable once loaded; copies share it
};

/// Incremental decoding for streaming, as vLLM and TGI do it: the text pushes
/// return, joined with flush's, is decode(prompt + generated) less its first
/// decode(prompt).size() bytes, so Llama-2's first generated "▁Hello" gives
/// " Hello", not decode's lone "Hello". A push never ends inside a UTF-8
/// character: text ending in U+FFFD (an incomplete character, as decode shows
/// it) is held back until a later token completes it or flush.
///
/// Each push decodes a short window of the latest tokens (from the last text
/// returned on), so its cost does not grow with the sequence.
class detokenizer {
public:
  detokenizer(tokenizer tok, const std::vector<int32_t>& prompt, decode_options options = {});

  std::string push(int32_t id);
  /// What is still held back (an incomplete character shows as U+FFFD).
  std::string flush();

private:
  std::string emit(bool final);

  tokenizer tok_;
  decode_options options_;
  std::vector<int32_t> window_; ///< ids from prefix_ on
  size_t prefix_ = 0;           ///< window_ index: decoding starts here
  size_t read_ = 0;             ///< window_ index: text up to here has been returned
};

} // namespace caf_serving::text
