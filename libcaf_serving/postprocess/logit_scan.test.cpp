#include "postprocess/logit_scan.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace caf_serving::postprocess;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

/// Rows with NaNs, infinities and lengths that leave every possible tail.
std::vector<std::vector<float>> rows() {
  std::mt19937_64 rng(41);
  std::normal_distribution<float> normal(0.0f, 5.0f);
  std::vector<std::vector<float>> out;
  for (std::size_t n : {0, 1, 3, 4, 15, 16, 17, 31, 33, 1023, 1024, 1025, 3000, 5003}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> row(n);
      for (auto& x : row)
        x = normal(rng);
      for (std::size_t i = 0; i < n && variant > 0; i += 7 + variant)
        row[i] = variant == 1 ? std::numeric_limits<float>::quiet_NaN() : -inf;
      out.push_back(row);
    }
  }
  return out;
}

} // namespace

TEST_CASE("max_of, first_at_least and first_above match plain loops, NaN never counting") {
  for (const auto& row : rows()) {
    CAPTURE(row.size());
    float top = -inf;
    for (float x : row)
      if (x > top)
        top = x;
    CHECK(logit_scan::max_of(row.data(), row.size()) == top);
    for (float bound : {top, 0.0f, 3.0f, -inf, inf}) {
      std::size_t at_least = row.size(), above = row.size();
      for (std::size_t i = row.size(); i-- > 0;) {
        if (row[i] >= bound)
          at_least = i;
        if (row[i] > bound)
          above = i;
      }
      CHECK(logit_scan::first_at_least(row.data(), row.size(), bound) == at_least);
      CHECK(logit_scan::first_above(row.data(), row.size(), bound) == above);
    }
  }
}

TEST_CASE("weigh, exp_sum and mass_at_least match std::exp within 1e-6 relative") {
  for (const auto& row : rows()) {
    CAPTURE(row.size());
    const float top = logit_scan::max_of(row.data(), row.size());
    for (float inv_t : {1.0f, 1.25f, 0.3f}) {
      for (float floor : {0.0f, 0.05f}) {
        std::vector<float> w(row.size());
        std::vector<double> blocks((row.size() + logit_scan::block_size - 1)
                                   / logit_scan::block_size);
        const double total =
          logit_scan::weigh({row.data(), row.size(), top, inv_t, floor, w.data(), blocks.data()});
        double expected_total = 0, block_total = 0;
        for (std::size_t i = 0; i < row.size(); ++i) {
          const double d = (static_cast<double>(row[i]) - top) * inv_t;
          double e = std::isnan(d) ? 0.0 : std::exp(d);
          if (d < logit_scan::exp_floor || e < floor)
            e = 0.0;
          // Within rounding of an edge, either side is right.
          const bool edge = std::abs(d - logit_scan::exp_floor) < 1e-4
                            || std::abs(e - floor) < 1e-6 * floor;
          if (!edge)
            CHECK(w[i] == doctest::Approx(e).epsilon(1e-6));
          else
            e = w[i];
          expected_total += e;
        }
        for (double b : blocks)
          block_total += b;
        CHECK(total == doctest::Approx(expected_total).epsilon(1e-6));
        CHECK(block_total == doctest::Approx(total).epsilon(1e-12));
        double mass = 0;
        for (float x : w)
          mass += x >= 0.01f ? x : 0.0f;
        CHECK(logit_scan::mass_at_least(w.data(), w.size(), 0.01f)
              == doctest::Approx(mass).epsilon(1e-6));
      }
    }
    double sum = 0;
    for (float x : row)
      if (static_cast<double>(x) - top >= logit_scan::exp_floor) // not NaN, not -inf
        sum += std::exp(static_cast<double>(x) - top);
    CHECK(logit_scan::exp_sum(row.data(), row.size(), top) == doctest::Approx(sum).epsilon(1e-6));
  }
}
