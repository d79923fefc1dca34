#include "ingress/float_text.hpp"

#include <doctest/doctest.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>

using namespace caf_serving::ingress;

namespace {

std::string ours(float v) {
  char buf[float_text_max_chars];
  return std::string(buf, write_float(buf, v));
}

std::string reference(float v) {
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

float from_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

} // namespace

TEST_CASE("integers and short binary fractions are written as std::to_chars writes them") {
  // Expected texts spelled out, so that a change of std::to_chars shows too.
  CHECK(ours(0.0f) == "0");
  CHECK(ours(-0.0f) == "-0");
  CHECK(ours(1.0f) == "1");
  CHECK(ours(-17.0f) == "-17");
  CHECK(ours(10000.0f) == "10000");
  CHECK(ours(100000.0f) == "1e+05");
  CHECK(ours(120000.0f) == "120000");
  CHECK(ours(16777215.0f) == "16777215");
  CHECK(ours(16777216.0f) == "16777216");
  CHECK(ours(0.5f) == "0.5");
  CHECK(ours(0.125f) == "0.125");
  CHECK(ours(-1.25f) == "-1.25");
  CHECK(ours(4095.25f) == "4095.25");
  CHECK(ours(3.00390625f) == "3.0039062"); // 8 fraction bits at 3: shorter text reads back
  CHECK(ours(0.1f) == "0.1");
  CHECK(ours(1e-10f) == "1e-10");
}

TEST_CASE("every float of a sweep over the fast path's range matches std::to_chars") {
  // The fast path takes floats in [0.125, 2^24) and zero; a stride through
  // their bit patterns (both signs) reaches every exponent and many fraction
  // lengths. A full sweep of all 2^32 floats agreed when this was written.
  size_t checked = 0;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t bits = 0x3E000000u - 64; bits < 0x4B800000u + 64; bits += 211) {
      float v = from_bits(bits | sign);
      REQUIRE_MESSAGE(ours(v) == reference(v), "bits " << (bits | sign));
      ++checked;
    }
  }
  // Every integer up to 2^17 and every multiple of 1/256 up to 256: the
  // values tensors of counts and quantised data hold.
  for (uint32_t i = 0; i <= (1u << 17); ++i)
    REQUIRE_MESSAGE(ours(static_cast<float>(i)) == reference(static_cast<float>(i)), i);
  for (uint32_t i = 0; i <= (1u << 16); ++i) {
    float v = static_cast<float>(i) / 256.0f;
    REQUIRE_MESSAGE(ours(v) == reference(v), i);
    REQUIRE_MESSAGE(ours(-v) == reference(-v), i);
  }
  CHECK(checked > 2000000);
}

TEST_CASE("floats outside the fast path are std::to_chars' text") {
  for (float v : {1e-45f, 1.17549435e-38f, 0.1f, 0.3333333f, 3.4028235e38f, 16777218.0f, 1e20f})
    CHECK(ours(v) == reference(v));
}
