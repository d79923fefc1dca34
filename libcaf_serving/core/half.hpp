#pragma once
/// IEEE binary16 (FP16) and bfloat16 (BF16) conversions. The engine stores
/// half tensors only at the model's edges (its inputs, outputs and the
/// initializers in the file) and computes in fp32: these convert between the
/// two, rounding to nearest, ties to even, as ONNX's Cast specifies. The KServe
/// codec writes FP16 and BF16 outputs sent as JSON with them, and
/// classification ranks half outputs with them.

#include <cstdint>
#include <cstring>

namespace caf_serving {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// fp32 -> fp16 bits. Overflow gives infinity, NaN stays a (quiet) NaN,
/// values below fp16's smallest normal become subnormals or zero.
inline uint16_t fp16_from_float(float value) {
  uint32_t u = float_bits(value);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint16_t out;
  if (u >= (127u + 16) << 23) { // 65536 or more (rounding may still overflow below)
    out = u > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (u < 113u << 23) { // below 2^-14: subnormal or zero
    // Adding 0.5 aligns the ten mantissa bits at the bottom of the float; the
    // FPU's own rounding (nearest, ties to even) rounds them.
    float f = bits_float(u) + 0.5f;
    out = static_cast<uint16_t>(float_bits(f) - float_bits(0.5f));
  } else {
    uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | sign);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) { // zero or subnormal: mant * 2^-24
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return bits_float(float_bits(f) | sign);
  }
  if (exp == 31)
    return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

/// fp32 -> bfloat16 bits: the top half of the float, rounded.
inline uint16_t bf16_from_float(float value) {
  uint32_t u = float_bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a quiet NaN
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

} // namespace caf_serving
