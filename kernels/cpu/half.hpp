/// Host-side fp16 and bf16 storage types with round-to-nearest-even conversion.
///
/// The CPU references and the kernel checks need half-precision numbers on machines
/// without the CUDA toolkit, so this header depends on nothing but the standard
/// library. The bit layouts are those of IEEE binary16 and bfloat16, identical to
/// CUDA's `__half` and `__nv_bfloat16`, so buffers of these types can be copied to
/// and from the device as they are.
#pragma once

#include <cstdint>
#include <cstring>

namespace caf_serving::kernels {

/// IEEE binary16 bits.
struct fp16_bits {
  std::uint16_t bits = 0;
};

/// bfloat16 bits: the upper half of an fp32.
struct bf16_bits {
  std::uint16_t bits = 0;
};

inline std::uint32_t float_to_u32(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline float u32_to_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline bf16_bits to_bf16(float x) {
  std::uint32_t u = float_to_u32(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN stays a quiet NaN
    return {static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u); // round to nearest, ties to even
  return {static_cast<std::uint16_t>(u >> 16)};
}

inline float to_float(bf16_bits h) {
  return u32_to_float(static_cast<std::uint32_t>(h.bits) << 16);
}

inline fp16_bits to_fp16(float x) {
  std::uint32_t u = float_to_u32(x);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u)
    return {static_cast<std::uint16_t>(sign | 0x7e00u)};
  if (abs >= 0x477ff000u) // rounds to 65536 or more: infinity
    return {static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (abs < 0x38800000u) { // below the smallest normal half: subnormal or zero
    // Adding 0.5 makes the FPU round the mantissa at the half subnormal step (2^-24).
    float f = u32_to_float(abs) + 0.5f;
    return {static_cast<std::uint16_t>(sign | (float_to_u32(f) - 0x3f000000u))};
  }
  std::uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd; // rebias exponent (127 -> 15) and round to even
  return {static_cast<std::uint16_t>(sign | (abs >> 13))};
}

inline float to_float(fp16_bits h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu)
    return u32_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) { // subnormal or zero: mant * 2^-24
    float f = static_cast<float>(mant) * u32_to_float(0x33800000u);
    return u32_to_float(float_to_u32(f) | sign);
  }
  return u32_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline float to_float(float x) {
  return x;
}

/// Converts a float to storage type `T` (float, fp16_bits or bf16_bits).
template <class T>
T from_float(float x);

template <>
inline float from_float<float>(float x) {
  return x;
}

template <>
inline fp16_bits from_float<fp16_bits>(float x) {
  return to_fp16(x);
}

template <>
inline bf16_bits from_float<bf16_bits>(float x) {
  return to_bf16(x);
}

} // namespace caf_serving::kernels
