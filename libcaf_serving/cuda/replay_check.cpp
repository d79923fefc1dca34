#include "cuda/replay_check.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

namespace caf_serving::cuda {

namespace {

template <typename T>
std::optional<std::string> compare_floats(const std::string& output,
                                          const std::vector<uint8_t>& replay,
                                          const std::vector<uint8_t>& direct) {
  size_t n = direct.size() / sizeof(T);
  double diff = 0, norm = 0, worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, replay.data() + i * sizeof(T), sizeof(T));
    std::memcpy(&b, direct.data() + i * sizeof(T), sizeof(T));
    bool fa = std::isfinite(a), fb = std::isfinite(b);
    if (!fa || !fb) {
      bool same = (std::isnan(a) && std::isnan(b)) || (!std::isnan(a) && !std::isnan(b) && a == b);
      if (!same) {
        std::ostringstream os;
        os << "output '" << output << "' element " << i << " is " << a << " replayed but " << b
           << " launched directly";
        return os.str();
      }
      continue;
    }
    double d = static_cast<double>(a) - static_cast<double>(b);
    diff += d * d;
    norm += static_cast<double>(b) * static_cast<double>(b);
    if (std::fabs(d) > worst) {
      worst = std::fabs(d);
      worst_at = i;
    }
  }
  double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  // All-zero outputs: any difference at all is a mismatch.
  if (norm == 0 ? diff == 0 : rel <= replay_tolerance)
    return std::nullopt;
  std::ostringstream os;
  os << "output '" << output << "' differs by " << rel << " (relative, allowed "
     << replay_tolerance << "); the largest difference is " << worst << " at element "
     << worst_at;
  return os.str();
}

} // namespace

std::vector<uint8_t> replay_inputs(datatype dtype, size_t elements, uint64_t seed) {
  size_t width = element_size(dtype);
  std::vector<uint8_t> bytes(elements * width, 0);
  std::mt19937_64 rng(seed);
  if (dtype == datatype::fp32 || dtype == datatype::fp64) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (size_t i = 0; i < elements; ++i) {
      if (dtype == datatype::fp32) {
        float v = static_cast<float>(u(rng));
        std::memcpy(bytes.data() + i * 4, &v, 4);
      } else {
        double v = u(rng);
        std::memcpy(bytes.data() + i * 8, &v, 8);
      }
    }
    return bytes;
  }
  if (dtype == datatype::fp16 || dtype == datatype::bf16)
    return bytes; // zeros: no half-precision inputs reach the backend yet
  // Integers and booleans: 0 or 1 in the element's lowest byte (little-endian).
  for (size_t i = 0; i < elements && width > 0; ++i)
    bytes[i * width] = static_cast<uint8_t>(rng() & 1);
  return bytes;
}

std::optional<std::string> compare_replay(const std::string& output, datatype dtype,
                                          const std::vector<uint8_t>& replay,
                                          const std::vector<uint8_t>& direct) {
  if (replay.size() != direct.size())
    return "output '" + output + "' has " + std::to_string(replay.size())
           + " bytes replayed but " + std::to_string(direct.size()) + " launched directly";
  if (dtype == datatype::fp32)
    return compare_floats<float>(output, replay, direct);
  if (dtype == datatype::fp64)
    return compare_floats<double>(output, replay, direct);
  for (size_t i = 0; i < direct.size(); ++i)
    if (replay[i] != direct[i])
      return "output '" + output + "' (" + std::string(to_string(dtype))
             + ") differs at byte " + std::to_string(i) + "; it must match exactly";
  return std::nullopt;
}

} // namespace caf_serving::cuda
