#pragma once
/// Helpers shared by the ONNX backend's unit tests: random inputs and the
/// relative error the accuracy target is stated in.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace caf_serving::onnx::testing {

/// sqrt(sum (a - b)^2 / sum b^2): the error of the whole output relative to `b`.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  if (a.size() != b.size())
    return INFINITY;
  return std::sqrt(num / std::max(den, 1e-30));
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), f.size() * 4);
  return f;
}

inline std::string as_bytes(const std::vector<float>& f) {
  return std::string(reinterpret_cast<const char*>(f.data()), f.size() * 4);
}

} // namespace caf_serving::onnx::testing
