/// The engine's paged attention against a naive loop in double precision
/// written here, at every instruction-set level this CPU has (picked through
/// paged_attention_args::level, so one process covers them all): head sizes
/// that are and are not multiples of 16 and 8, groups of 1, 2, 4 and 6 query
/// heads per kv head, one new position (decode) and several (prefill),
/// contexts of 0, within one block, at and across block boundaries. Cache
/// memory no row may read holds NaN, so a stray read fails the comparison.

#include "paged_attention.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace caf_serving::kernels::cpu;

namespace {

struct case_shape {
  int64_t heads, kv_heads, head_dim, new_positions, block_tokens;
};

std::vector<float> uniform(size_t n, float bound, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-bound, bound);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// softmax(scale * q k^T) v per query head over positions [0, context + s], in
/// double, from the keys and values as plain [kv][positions][head_dim] arrays.
std::vector<double> naive_attention(const case_shape& c, int64_t context, const float* q,
                                    const std::vector<float>& keys,
                                    const std::vector<float>& values, float scale) {
  const int64_t S = c.new_positions, D = c.head_dim, positions = context + S;
  const int64_t group = c.heads / c.kv_heads;
  std::vector<double> y(static_cast<size_t>(S * c.heads * D), 0.0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t hk = h / group, length = context + s + 1;
      const float* qs = q + (s * c.heads + h) * D;
      std::vector<double> p(static_cast<size_t>(length));
      for (int64_t j = 0; j < length; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += double(qs[d]) * keys[(hk * positions + j) * D + d];
        p[j] = dot * scale;
      }
      const double mx = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (auto& x : p) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < length; ++j)
        for (int64_t d = 0; d < D; ++d)
          y[(s * c.heads + h) * D + d] += p[j] / sum * values[(hk * positions + j) * D + d];
    }
  return y;
}

/// Runs one shape and context at `level` and compares with naive_attention().
void check_case(const case_shape& c, int64_t context, isa_level level, std::mt19937& rng) {
  const int64_t S = c.new_positions, D = c.head_dim, kv = c.kv_heads, bt = c.block_tokens;
  const int64_t layers = 2, layer = 1, positions = context + S;
  // Keys and values of all positions, [kv][positions][D]; the first `context` go to the cache.
  auto keys = uniform(kv * positions * D, 1.f, rng);
  auto values = uniform(kv * positions * D, 1.f, rng);
  auto q = uniform(S * c.heads * D, 2.f, rng);
  std::vector<float> new_keys(S * kv * D), new_values(new_keys.size());
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < kv; ++h)
      for (int64_t d = 0; d < D; ++d) {
        new_keys[(s * kv + h) * D + d] = keys[(h * positions + context + s) * D + d];
        new_values[(s * kv + h) * D + d] = values[(h * positions + context + s) * D + d];
      }
  // The cache: the row's blocks scattered among unused ones, all else NaN.
  const int64_t used = (context + bt - 1) / bt, pool_blocks = 2 * used + 3;
  const int64_t block_floats = layers * 2 * kv * bt * D;
  std::vector<float> pool(pool_blocks * block_floats, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(used);
  for (int64_t h = 0; h < kv; ++h)
    for (int64_t j = 0; j < context; ++j)
      for (int kind = 0; kind < 2; ++kind) {
        float* at = pool.data() + ids[j / bt] * block_floats
                    + (((layer * 2 + kind) * kv + h) * bt + j % bt) * D;
        const auto& from = kind == 0 ? keys : values;
        std::copy_n(&from[(h * positions + j) * D], D, at);
      }

  paged_attention_args a;
  a.q = q.data();
  a.new_keys = new_keys.data();
  a.new_values = new_values.data();
  a.pool = context > 0 ? pool.data() : nullptr;
  a.blocks = ids.data();
  a.context = context;
  a.new_positions = S;
  a.heads = c.heads;
  a.kv_heads = kv;
  a.head_dim = D;
  a.block_tokens = bt;
  a.block_floats = block_floats;
  a.key_offset = layer * 2 * kv * bt * D;
  a.value_offset = a.key_offset + kv * bt * D;
  a.scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> y(S * c.heads * D, std::numeric_limits<float>::quiet_NaN());
  a.y = y.data();
  a.level = level;
  engine_paged_attention(a);

  auto want = naive_attention(c, context, q.data(), keys, values, a.scale);
  for (size_t i = 0; i < y.size(); ++i)
    REQUIRE_MESSAGE(y[i] == doctest::Approx(want[i]).epsilon(1e-5), "element " << i);
}

std::vector<isa_level> levels_here() {
  std::vector<isa_level> levels{isa_level::baseline};
  if (detected_isa_level() >= isa_level::avx2)
    levels.push_back(isa_level::avx2);
  if (detected_isa_level() >= isa_level::avx512)
    levels.push_back(isa_level::avx512);
  return levels;
}

} // namespace

TEST_CASE("paged attention matches a naive double-precision loop at every level of this CPU") {
  std::mt19937 rng(35);
  const std::vector<case_shape> shapes{
    {12, 12, 64, 1, 16}, // GPT-2's decode: group 1
    {8, 2, 32, 1, 16},   // the quick Llama's decode: group 4
    {8, 2, 80, 5, 16},   // prefill, a head of 5 chunks of 16
    {4, 4, 40, 3, 5},    // 40 floats (2.5 chunks of 16), blocks of 5 positions
    {6, 3, 17, 1, 4},    // group 2, a head of 17
    {12, 2, 128, 2, 16}, // group 6: tiles of 4 and of 2 queries, a head of 2 passes of 64
    {3, 1, 7, 4, 3},     // a head shorter than one vector, group 3: tiles of 2 and 1
  };
  for (isa_level level : levels_here()) {
    const std::string level_name = isa_level_name(level);
    CAPTURE(level_name);
    for (const auto& c : shapes)
      for (int64_t context : {0, 1, 15, 16, 17, 37, 130}) {
        CAPTURE(c.heads);
        CAPTURE(c.kv_heads);
        CAPTURE(c.head_dim);
        CAPTURE(c.new_positions);
        CAPTURE(c.block_tokens);
        CAPTURE(context);
        check_case(c, context, level, rng);
      }
  }
}

TEST_CASE("scores far below the maximum weigh nothing, and a large scale stays finite") {
  // One key much closer to the query than the rest: with a scale of 1000 the
  // others' exp(score - max) underflow; the output is that key's value.
  const int64_t D = 24, context = 20, bt = 8;
  std::vector<float> q(D, 0.f), pool(3 * 2 * bt * D, 0.f), nk(D, 0.f), nv(D, 0.f);
  q[0] = 1.f;
  for (int64_t j = 0; j < context; ++j) {
    float* key = pool.data() + (j / bt) * 2 * bt * D + (j % bt) * D;
    float* value = key + bt * D;
    key[0] = j == 11 ? 1.f : 0.5f;
    for (int64_t d = 0; d < D; ++d)
      value[d] = static_cast<float>(j * 100 + d);
  }
  const std::vector<int32_t> blocks{0, 1, 2};
  for (isa_level level : levels_here()) {
    const std::string level_name = isa_level_name(level);
    CAPTURE(level_name);
    paged_attention_args a;
    a.q = q.data();
    a.new_keys = nk.data();
    a.new_values = nv.data();
    a.pool = pool.data();
    a.blocks = blocks.data();
    a.context = context;
    a.head_dim = D;
    a.block_tokens = bt;
    a.block_floats = 2 * bt * D;
    a.value_offset = bt * D;
    a.scale = 1000.f;
    std::vector<float> y(D);
    a.y = y.data();
    a.level = level;
    engine_paged_attention(a);
    for (int64_t d = 0; d < D; ++d)
      CHECK(y[d] == doctest::Approx(1100.0 + d).epsilon(1e-6));
  }
}
