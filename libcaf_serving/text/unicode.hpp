#pragma once
/// The little Unicode the tokenizer needs: UTF-8 decoding that never fails,
/// the character classes of its regex patterns (\p{L}, \p{N}, \s), and the
/// "lossy" UTF-8 repair that Hugging Face's decoders apply.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace caf_serving::text {

/// The classes the pre-tokenizer patterns distinguish. They are disjoint: no
/// White_Space character is a letter or a number.
enum class char_class : uint8_t {
  other,
  letter,     ///< general category L (Lu Ll Lt Lm Lo)
  number,     ///< general category N (Nd Nl No)
  whitespace, ///< the White_Space property, Oniguruma's \s
};

char_class classify(char32_t c);

/// A word character as Rust regex's \w has it (Alphabetic, marks, decimal
/// digits, connector punctuation, ZWNJ/ZWJ): what an added token marked
/// single_word must not touch.
bool is_word_char(char32_t c);

/// One code point read from UTF-8. An invalid or truncated sequence reads as
/// one byte (`c` is U+FFFD, `size` 1), so that every byte of the input lands in
/// exactly one character and byte-level tokenizers still round-trip it.
struct utf8_char {
  char32_t c;
  uint32_t size;
};
utf8_char next_utf8(std::string_view s, size_t pos);

void append_utf8(std::string& out, char32_t c);

/// `bytes` with every maximal invalid subsequence replaced by U+FFFD, as Rust's
/// String::from_utf8_lossy does (the Unicode "maximal subpart" practice).
std::string utf8_lossy(std::string_view bytes);

/// `s` in Normalization Form C (canonical decomposition, canonical order,
/// canonical composition). Bytes that are not valid UTF-8 pass through as they
/// are and end any composition.
std::string nfc(std::string_view s);

namespace detail {
struct char_range {
  char32_t first;
  char32_t last;
  char_class cls;
};
struct word_range {
  char32_t first;
  char32_t last;
};
struct combining_range {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};
/// `cp` decomposes (fully, canonically) into decomposition_chars[offset, +size).
struct decomposition {
  char32_t cp;
  uint16_t offset;
  uint8_t size;
};
struct composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};
extern const char* const unicode_version;
extern const std::array<char_range, 782> letter_number_ranges;
extern const std::array<word_range, 759> word_ranges;
extern const std::array<combining_range, 382> combining_classes;
extern const std::array<decomposition, 2061> decompositions;
extern const std::array<char32_t, 3406> decomposition_chars;
extern const std::array<composition, 941> compositions;
} // namespace detail

} // namespace caf_serving::text
