#include "ingress/float_text.hpp"

#include <charconv>
#include <cstdint>
#include <cstring>

namespace caf_serving::ingress {

namespace {

constexpr uint32_t pow10_u32[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
constexpr uint32_t pow5_u32[] = {1, 5, 25, 125, 625, 3125, 15625, 78125, 390625};

/// The text of `v` when its exact decimal value is also its shortest
/// round-trip text and std::to_chars would write it in plain (not
/// exponent) notation; nullptr otherwise (nothing written then).
///
/// v = m * 2^-shift, m the 24-bit significand. Its fractional part, when
/// not zero, has k = (fractional bits in use) decimal digits, the last a 5.
/// A text with fewer digits is a multiple of 10^(1-k), at least 5 * 10^-k
/// away from v, so it reads back as v only when half an ulp, 2^-(shift+1),
/// reaches that far: never when 10^(k-1) < 2^shift. Among texts of k digits
/// the exact one is the closest, so to_chars picks it; with at least one
/// digit before the point (or v >= 0.1), plain notation is the shorter.
/// An integer below 2^24 (ulp <= 1) is shortest as its own digits; plain
/// notation is no longer than the exponent form unless it ends in five or
/// more zeros, left to to_chars.
char* write_exact(char* p, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bool negative = (bits >> 31) != 0;
  uint32_t biased = (bits >> 23) & 0xFF;
  uint32_t field = bits & 0x7FFFFF;
  if (biased == 0) {
    if (field != 0)
      return nullptr; // subnormal
    if (negative)
      *p++ = '-';
    *p++ = '0';
    return p;
  }
  int exponent = static_cast<int>(biased) - 127;
  // v in [0.125, 2^24): plain notation throughout (see above).
  if (exponent < -3 || exponent > 23)
    return nullptr;
  uint32_t m = field | (uint32_t{1} << 23);
  int shift = 23 - exponent; // 0..26
  uint32_t whole = shift >= 24 ? 0 : m >> shift;
  uint32_t fraction = m & ((uint32_t{1} << shift) - 1);
  if (fraction == 0) {
    if (whole % 100000 == 0)
      return nullptr;
    if (negative)
      *p++ = '-';
    return std::to_chars(p, p + 8, whole).ptr;
  }
  int trailing = __builtin_ctz(fraction);
  int k = shift - trailing;
  if (k > 8 || pow10_u32[k - 1] >= (uint64_t{1} << shift))
    return nullptr;
  if (negative)
    *p++ = '-';
  p = std::to_chars(p, p + 8, whole).ptr;
  *p++ = '.';
  // The fraction is f / 2^k = f * 5^k / 10^k: k digits of f * 5^k.
  uint32_t digits = (fraction >> trailing) * pow5_u32[k];
  for (int i = k - 1; i >= 0; --i) {
    p[i] = static_cast<char>('0' + digits % 10);
    digits /= 10;
  }
  return p + k;
}

} // namespace

char* write_float(char* p, float v) {
  if (char* end = write_exact(p, v))
    return end;
  return std::to_chars(p, p + float_text_max_chars, v).ptr;
}

} // namespace caf_serving::ingress
