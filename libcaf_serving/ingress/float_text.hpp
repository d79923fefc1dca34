#pragma once
/// Shortest round-trip text of a float for JSON output, byte for byte what
/// std::to_chars(first, last, value) writes, but without Ryu's cost for the
/// floats that tensors often hold: small integers (0, 3, -17, 4096) and
/// short binary fractions (0.5, 1.25, 4095.75), whose exact decimal value is
/// already their shortest text. Any other float goes to std::to_chars.
///
///   char buf[float_text_max_chars];
///   char* end = ingress::write_float(buf, 1.25f); // "1.25"

#include <cstddef>

namespace caf_serving::ingress {

/// Room write_float needs: "-1.17549435e-38" and the like.
inline constexpr size_t float_text_max_chars = 16;

/// Writes `v` (finite) as std::to_chars(p, p + float_text_max_chars, v) would;
/// returns the end of the text.
char* write_float(char* p, float v);

} // namespace caf_serving::ingress
