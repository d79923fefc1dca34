#include "text/unicode.hpp"

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

namespace caf_serving::text {

char_class classify(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      return char_class::letter;
    if (c >= '0' && c <= '9')
      return char_class::number;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D))
      return char_class::whitespace;
    return char_class::other;
  }
  // White_Space outside ASCII (stable since Unicode 6.3).
  if (c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028
      || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000)
    return char_class::whitespace;
  const auto& table = detail::letter_number_ranges;
  auto it = std::upper_bound(table.begin(), table.end(), c,
                             [](char32_t v, const detail::char_range& r) { return v < r.first; });
  if (it == table.begin())
    return char_class::other;
  --it;
  return c <= it->last ? it->cls : char_class::other;
}

bool is_word_char(char32_t c) {
  if (c < 0x80)
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  const auto& t = detail::word_ranges;
  auto it = std::upper_bound(t.begin(), t.end(), c,
                             [](char32_t v, const detail::word_range& r) { return v < r.first; });
  return it != t.begin() && c <= std::prev(it)->last;
}

namespace {

/// Length of the valid UTF-8 sequence at `pos`, or of its longest valid prefix
/// negated (0 when even the first byte cannot start one). Follows the
/// well-formed byte sequences of Unicode's table 3-7.
int utf8_sequence(std::string_view s, size_t pos) {
  auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80)
    return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0)
      lo = 0xA0;
    else if (b0 == 0xED)
      hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0)
      lo = 0x90;
    else if (b0 == 0xF4)
      hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < need; ++k) {
    if (pos + k >= s.size())
      return -k;
    auto b = static_cast<uint8_t>(s[pos + k]);
    if (b < lo || b > hi)
      return -k;
    lo = 0x80;
    hi = 0xBF;
  }
  return need;
}

} // namespace

utf8_char next_utf8(std::string_view s, size_t pos) {
  int n = utf8_sequence(s, pos);
  auto b = [&](int k) { return static_cast<char32_t>(static_cast<uint8_t>(s[pos + k])); };
  switch (n) {
    case 1: return {b(0), 1};
    case 2: return {((b(0) & 0x1F) << 6) | (b(1) & 0x3F), 2};
    case 3: return {((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F), 3};
    case 4:
      return {((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6)
                | (b(3) & 0x3F),
              4};
    default: return {0xFFFD, 1};
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    int n = utf8_sequence(bytes, pos);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out += "\xEF\xBF\xBD";
      pos += n == 0 ? 1 : static_cast<size_t>(-n);
    }
  }
  return out;
}

namespace {

// Hangul syllables compose and decompose by arithmetic (Unicode 3.12).
constexpr char32_t hangul_s = 0xAC00, hangul_l = 0x1100, hangul_v = 0x1161, hangul_t = 0x11A7;
constexpr char32_t hangul_l_count = 19, hangul_v_count = 21, hangul_t_count = 28;
constexpr char32_t hangul_n = hangul_v_count * hangul_t_count;
constexpr char32_t hangul_count = hangul_l_count * hangul_n;

/// Stands for an invalid byte in the code point buffer: never composes.
constexpr char32_t raw_byte = 0x110000;

uint8_t combining_class(char32_t c) {
  if (c < 0x300 || c >= raw_byte)
    return 0;
  const auto& t = detail::combining_classes;
  auto it = std::upper_bound(t.begin(), t.end(), c,
                             [](char32_t v, const detail::combining_range& r) {
                               return v < r.first;
                             });
  if (it == t.begin())
    return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= hangul_s && c < hangul_s + hangul_count) {
    char32_t s = c - hangul_s;
    out.push_back(hangul_l + s / hangul_n);
    out.push_back(hangul_v + (s % hangul_n) / hangul_t_count);
    if (s % hangul_t_count != 0)
      out.push_back(hangul_t + s % hangul_t_count);
    return;
  }
  const auto& t = detail::decompositions;
  auto it = std::lower_bound(t.begin(), t.end(), c,
                             [](const detail::decomposition& d, char32_t v) {
                               return d.cp < v;
                             });
  if (it == t.end() || it->cp != c) {
    out.push_back(c);
    return;
  }
  for (int k = 0; k < it->size; ++k)
    out.push_back(detail::decomposition_chars[it->offset + k]);
}

std::optional<char32_t> compose(char32_t a, char32_t b) {
  if (a >= hangul_l && a < hangul_l + hangul_l_count && b >= hangul_v
      && b < hangul_v + hangul_v_count)
    return hangul_s + ((a - hangul_l) * hangul_v_count + (b - hangul_v)) * hangul_t_count;
  if (a >= hangul_s && a < hangul_s + hangul_count && (a - hangul_s) % hangul_t_count == 0
      && b > hangul_t && b < hangul_t + hangul_t_count)
    return a + (b - hangul_t);
  const auto& t = detail::compositions;
  auto it = std::lower_bound(t.begin(), t.end(), std::pair{a, b},
                             [](const detail::composition& c, std::pair<char32_t, char32_t> v) {
                               return std::pair{c.first, c.second} < v;
                             });
  if (it == t.end() || it->first != a || it->second != b)
    return std::nullopt;
  return it->composite;
}

/// Whether NFC may change `c` or join it to what precedes it: it has a
/// combining class, a decomposition (Hangul syllables aside: they come back
/// as they were) or is the second of a composition. Text of none of these is
/// its own NFC. A bitmap for the BMP, the tables above it.
bool nfc_active(char32_t c) {
  static const std::vector<bool> bmp = [] {
    std::vector<bool> bits(0x10000);
    for (const auto& r : detail::combining_classes)
      for (char32_t x = r.first; x <= r.last && x < 0x10000; ++x)
        bits[x] = true;
    for (const auto& d : detail::decompositions)
      if (d.cp < 0x10000)
        bits[d.cp] = true;
    for (const auto& k : detail::compositions)
      if (k.second < 0x10000)
        bits[k.second] = true;
    for (char32_t t = hangul_v; t < hangul_v + hangul_v_count; ++t)
      bits[t] = true;
    for (char32_t t = hangul_t + 1; t < hangul_t + hangul_t_count; ++t)
      bits[t] = true;
    return bits;
  }();
  if (c < 0x10000)
    return bmp[c];
  if (c >= raw_byte)
    return false;
  if (combining_class(c) != 0)
    return true;
  std::vector<char32_t> d;
  decompose(c, d);
  if (d.size() != 1 || d[0] != c)
    return true;
  return std::any_of(detail::compositions.begin(), detail::compositions.end(),
                     [c](const detail::composition& k) { return k.second == c; });
}

} // namespace

std::string nfc(std::string_view s) {
  bool active = false;
  for (size_t pos = 0; pos < s.size() && !active;) {
    if (static_cast<uint8_t>(s[pos]) < 0xCC) { // below U+0300: never active
      ++pos;
      continue;
    }
    auto u = next_utf8(s, pos);
    active = nfc_active(u.size == 1 && u.c == 0xFFFD ? raw_byte : u.c);
    pos += u.size;
  }
  if (!active)
    return std::string{s};
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    auto u = next_utf8(s, pos);
    if (u.c == 0xFFFD && u.size == 1) // an invalid byte (U+FFFD itself takes three)
      cps.push_back(raw_byte + static_cast<uint8_t>(s[pos]));
    else
      decompose(u.c, cps);
    pos += u.size;
  }
  // Canonical order: each run of non-starters sorted (stably) by class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0)
      ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i),
                     cps.begin() + static_cast<std::ptrdiff_t>(j), [](char32_t a, char32_t b) {
                       return combining_class(a) < combining_class(b);
                     });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless a
  // character between them has a class as high as its own (or is a starter).
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::optional<size_t> starter; // index in `out`
  uint8_t last_class = 0;
  for (char32_t c : cps) {
    uint8_t cls = combining_class(c);
    if (starter && c < raw_byte && out[*starter] < raw_byte) {
      bool adjacent = *starter + 1 == out.size();
      bool blocked = !adjacent && (last_class == 0 || last_class >= cls);
      if (!blocked)
        if (auto composite = compose(out[*starter], c)) {
          out[*starter] = *composite;
          continue;
        }
    }
    if (cls == 0)
      starter = out.size();
    last_class = cls;
    out.push_back(c);
  }
  std::string text;
  text.reserve(s.size());
  for (char32_t c : out) {
    if (c >= raw_byte)
      text += static_cast<char>(c - raw_byte);
    else
      append_utf8(text, c);
  }
  return text;
}

} // namespace caf_serving::text
