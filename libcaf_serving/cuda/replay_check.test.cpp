#include "cuda/replay_check.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

std::vector<uint8_t> floats(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

} // namespace

TEST_CASE("random inputs: floats in [-1, 1), not all zero, the same for the same seed") {
  auto a = replay_inputs(datatype::fp32, 1000, 7);
  REQUIRE(a.size() == 4000);
  CHECK(a == replay_inputs(datatype::fp32, 1000, 7));
  CHECK(a != replay_inputs(datatype::fp32, 1000, 8));
  size_t nonzero = 0;
  for (float f : as_floats(a)) {
    CHECK(f >= -1.0f);
    CHECK(f < 1.0f);
    nonzero += f != 0.0f;
  }
  CHECK(nonzero > 990);
}

TEST_CASE("random integer inputs are 0 or 1: valid ids, masks and indices") {
  auto b = replay_inputs(datatype::int64, 500, 3);
  REQUIRE(b.size() == 500 * 8);
  size_t ones = 0;
  for (size_t i = 0; i < 500; ++i) {
    int64_t v;
    std::memcpy(&v, b.data() + i * 8, 8);
    CHECK((v == 0 || v == 1));
    ones += v == 1;
  }
  CHECK(ones > 100);
  CHECK(ones < 400);
  auto m = replay_inputs(datatype::bool_, 64, 3);
  for (auto x : m)
    CHECK(x <= 1);
}

TEST_CASE("a replay equal to the direct run, or off by float rounding, passes") {
  auto direct = replay_inputs(datatype::fp32, 4096, 11);
  CHECK_FALSE(compare_replay("y", datatype::fp32, direct, direct));
  // One unit in the last place on every element: a reordered sum.
  auto v = as_floats(direct);
  for (auto& f : v)
    f = std::nextafter(f, 2.0f);
  CHECK_FALSE(compare_replay("y", datatype::fp32, floats(v), direct));
}

TEST_CASE("a replay that differs like a capture bug fails, naming the output") {
  auto direct = replay_inputs(datatype::fp32, 4096, 11);
  // A stale buffer: one row of 64 elements from somewhere else.
  auto v = as_floats(direct);
  for (size_t i = 128; i < 192; ++i)
    v[i] = 0.0f;
  auto why = compare_replay("logits", datatype::fp32, floats(v), direct);
  REQUIRE(why);
  CHECK(why->find("'logits'") != std::string::npos);
  CHECK(why->find("allowed") != std::string::npos);
  // The old check (bitwise equality of the first output only) and this one
  // agree here; this one also sees a single element off by 1e-3 relative.
  auto w = as_floats(direct);
  w[5] += 0.5f;
  CHECK(compare_replay("logits", datatype::fp32, floats(w), direct));
}

TEST_CASE("NaN and infinity must fall on the same elements") {
  std::vector<float> d{1, 2, std::numeric_limits<float>::quiet_NaN(), 4};
  CHECK_FALSE(compare_replay("y", datatype::fp32, floats(d), floats(d)));
  auto r = d;
  r[2] = 3;
  CHECK(compare_replay("y", datatype::fp32, floats(r), floats(d)));
  auto inf = d;
  inf[0] = std::numeric_limits<float>::infinity();
  CHECK(compare_replay("y", datatype::fp32, floats(inf), floats(d)));
}

TEST_CASE("all-zero outputs must stay all zero; integer outputs must match exactly") {
  std::vector<float> zeros(16, 0.0f);
  CHECK_FALSE(compare_replay("y", datatype::fp32, floats(zeros), floats(zeros)));
  auto z = zeros;
  z[3] = 1e-20f;
  CHECK(compare_replay("y", datatype::fp32, floats(z), floats(zeros)));
  std::vector<uint8_t> idx(16, 0), other(16, 0);
  other[8] = 1;
  CHECK_FALSE(compare_replay("argmax", datatype::int64, idx, idx));
  auto why = compare_replay("argmax", datatype::int64, other, idx);
  REQUIRE(why);
  CHECK(why->find("exactly") != std::string::npos);
  CHECK(compare_replay("y", datatype::fp32, floats(zeros), floats({0.0f})));
}
