#include "text/pre_tokenizer.hpp"

#include "text/unicode.hpp"

#include <array>

namespace caf_serving::text {

namespace {

constexpr std::string_view gpt2_regex
  = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_regex
  = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view qwen2_regex
  = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// The text as characters: each with its class and byte offset; one more entry
/// at the end holds the text's length, so char k spans [off[k], off[k+1]).
struct char_view {
  std::vector<char32_t> c;
  std::vector<char_class> cls;
  std::vector<uint32_t> off;

  explicit char_view(std::string_view text) {
    c.reserve(text.size());
    cls.reserve(text.size());
    off.reserve(text.size() + 1);
    for (size_t pos = 0; pos < text.size();) {
      auto u = next_utf8(text, pos);
      c.push_back(u.c);
      cls.push_back(classify(u.c));
      off.push_back(static_cast<uint32_t>(pos));
      pos += u.size;
    }
    off.push_back(static_cast<uint32_t>(text.size()));
  }
  size_t size() const { return c.size(); }
  /// The end of the run of `k` class characters starting at i.
  size_t run(size_t i, char_class k) const {
    while (i < size() && cls[i] == k)
      ++i;
    return i;
  }
  bool is(size_t i, char_class k) const { return i < size() && cls[i] == k; }
  bool is_char(size_t i, char32_t ch) const { return i < size() && c[i] == ch; }
  bool is_newline(size_t i) const { return is_char(i, '\r') || is_char(i, '\n'); }
};

/// 's 't 're 've 'm 'll 'd at i: the match's length in characters, 0 if none.
/// `fold` matches them case-insensitively as Oniguruma's (?i) does, where the
/// long s (U+017F) folds to s.
size_t contraction(const char_view& v, size_t i, bool fold) {
  if (!v.is_char(i, '\''))
    return 0;
  auto lower = [&](size_t k) -> char32_t {
    if (k >= v.size())
      return 0;
    char32_t ch = v.c[k];
    if (!fold)
      return ch;
    if (ch >= 'A' && ch <= 'Z')
      return ch + 32;
    return ch == 0x17F ? U's' : ch;
  };
  char32_t a = lower(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd')
    return 2;
  char32_t b = lower(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
    return 3;
  return 0;
}

/// \s+(?!\S)|\s+ at i, where i is whitespace: the whole run if it ends the
/// text, else the run less its last character (which then leads the next
/// word), but never less than one character.
size_t whitespace_run(const char_view& v, size_t i) {
  size_t j = v.run(i, char_class::whitespace);
  if (j == v.size())
    return j;
  return j - 1 > i ? j - 1 : j;
}

/// The end (in characters) of the GPT-2 pattern's match at i.
size_t match_gpt2(const char_view& v, size_t i) {
  if (size_t n = contraction(v, i, false))
    return i + n;
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run.
  size_t start = v.is_char(i, ' ') && i + 1 < v.size() && !v.is(i + 1, char_class::whitespace)
                   ? i + 1
                   : i;
  if (!v.is(start, char_class::whitespace))
    return v.run(start, v.cls[start]);
  return whitespace_run(v, i);
}

/// The end (in characters) of the Llama-3 / Qwen2 pattern's match at i.
size_t match_llama3(const char_view& v, size_t i, size_t max_digits) {
  if (size_t n = contraction(v, i, true))
    return i + n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (v.is(i, char_class::letter))
    return v.run(i, char_class::letter);
  if (!v.is_newline(i) && !v.is(i, char_class::number) && v.is(i + 1, char_class::letter))
    return v.run(i + 1, char_class::letter);
  // \p{N}{1,max}
  if (v.is(i, char_class::number)) {
    size_t j = i;
    while (j < v.size() && j - i < max_digits && v.cls[j] == char_class::number)
      ++j;
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = v.is_char(i, ' ') && v.is(i + 1, char_class::other) ? i + 1 : i;
  if (v.is(start, char_class::other)) {
    size_t j = v.run(start, char_class::other);
    while (v.is_newline(j))
      ++j;
    return j;
  }
  // Here i is whitespace. \s*[\r\n]+: up to the run's last newline.
  size_t j = v.run(i, char_class::whitespace);
  for (size_t k = j; k > i; --k)
    if (v.is_newline(k - 1))
      return k;
  return whitespace_run(v, i);
}

} // namespace

std::optional<split_pattern> known_split_pattern(std::string_view regex) {
  for (auto p : {split_pattern::gpt2, split_pattern::llama3, split_pattern::qwen2})
    if (regex == regex_of(p))
      return p;
  return std::nullopt;
}

std::string_view regex_of(split_pattern pattern) {
  switch (pattern) {
    case split_pattern::gpt2: return gpt2_regex;
    case split_pattern::llama3: return llama3_regex;
    case split_pattern::qwen2: return qwen2_regex;
  }
  return {};
}

std::vector<std::string_view> split_isolated(std::string_view text, split_pattern pattern) {
  std::vector<std::string_view> pieces;
  char_view v{text};
  for (size_t i = 0; i < v.size();) {
    size_t j = pattern == split_pattern::gpt2 ? match_gpt2(v, i)
                                              : match_llama3(v, i, pattern == split_pattern::llama3
                                                                     ? 3
                                                                     : 1);
    pieces.push_back(text.substr(v.off[i], v.off[j] - v.off[i]));
    i = j;
  }
  return pieces;
}

namespace {

/// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
/// the other 68 take the code points from U+0100 on, in byte order.
struct byte_level_table {
  std::array<char32_t, 256> to_char{};
  byte_level_table() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
    }
  }
};

const byte_level_table& byte_level() {
  static const byte_level_table table;
  return table;
}

} // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const auto& t = byte_level().to_char;
  for (char ch : bytes)
    append_utf8(out, t[static_cast<uint8_t>(ch)]);
  return out;
}

std::optional<uint8_t> byte_level_decode(char32_t c) {
  if ((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))
    return static_cast<uint8_t>(c);
  if (c >= 256 && c < 256 + 68) {
    const auto& t = byte_level().to_char;
    for (int b = 0; b < 256; ++b)
      if (t[b] == c)
        return static_cast<uint8_t>(b);
  }
  return std::nullopt;
}

} // namespace caf_serving::text
