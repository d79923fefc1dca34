#pragma once
/// The pieces of Hugging Face's pre-tokenizers that split text into words:
/// the regex patterns of GPT-2, Llama-3 and Qwen2 (each a hand-written
/// matcher, not a regex engine: a tokenizer.json with any other pattern is
/// refused when it loads) and GPT-2's byte-to-character map of ByteLevel.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::text {

/// A split pattern the tokenizer knows, with the exact regex string it stands for.
enum class split_pattern {
  /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  /// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  ///  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  llama3,
  /// As llama3 but \p{N} one digit at a time (Qwen2, Qwen2.5, Qwen3).
  qwen2,
};

/// The pattern whose regex string is exactly `regex`, if one is known.
std::optional<split_pattern> known_split_pattern(std::string_view regex);
std::string_view regex_of(split_pattern pattern);

/// `text` cut as HF's Split(pattern, behavior = Isolated) cuts it: every match
/// is a piece and so is every stretch between matches. Pieces are views of
/// `text`, in order, together covering it exactly.
std::vector<std::string_view> split_isolated(std::string_view text, split_pattern pattern);

/// GPT-2's ByteLevel map: each byte becomes one printable character, so that
/// byte strings can be vocabulary keys.
std::string byte_level_encode(std::string_view bytes);
/// The byte a ByteLevel character stands for, if it is one of the 256.
std::optional<uint8_t> byte_level_decode(char32_t c);

} // namespace caf_serving::text
