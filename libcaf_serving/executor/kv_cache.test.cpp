#include "executor/kv_cache.hpp"

#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>

using namespace caf_serving::executor;

TEST_CASE("blocks are taken as a sequence grows and given back when it ends") {
  kv_cache c({.layers = 2, .kv_heads = 3, .head_dim = 4, .block_tokens = 16, .blocks = 4});
  CHECK(kv_block_bytes(c.layout()) == 2 * 2 * 3 * 16 * 4 * 4);
  CHECK(c.free_blocks() == 4);
  CHECK(c.reserve(7, 1));
  CHECK(c.capacity(7) == 16);
  CHECK(c.reserve(7, 16));
  CHECK(c.used_blocks() == 1);
  CHECK(c.reserve(7, 17));
  CHECK(c.used_blocks() == 2);
  CHECK(c.reserve(8, 32));
  CHECK(c.free_blocks() == 0);
  CHECK_FALSE(c.reserve(9, 1));
  CHECK_FALSE(c.reserve(7, 33));
  CHECK(c.capacity(7) == 32); // a refused reserve takes nothing
  c.release(7);
  CHECK(c.free_blocks() == 2);
  c.release(7); // twice: nothing
  CHECK(c.free_blocks() == 2);
  CHECK_THROWS(c.row(7, 0, false, 0, 0));
  CHECK_THROWS(c.row(8, 0, false, 0, 32));
}

TEST_CASE("rows of different sequences, layers, heads and positions never overlap") {
  kv_cache_layout l{.layers = 3, .kv_heads = 2, .head_dim = 5, .block_tokens = 4, .blocks = 20};
  kv_cache c(l);
  std::mt19937 rng(3);
  std::map<uint64_t, uint32_t> length;
  // Interleaved growth and releases, each row stamped with what it is.
  auto stamp = [](uint64_t s, uint32_t layer, int kv, uint32_t h, uint32_t p, uint32_t d) {
    return static_cast<float>(((((s * 7 + layer) * 2 + kv) * 5 + h) * 1000 + p) * 8 + d);
  };
  for (int round = 0; round < 400; ++round) {
    uint64_t s = rng() % 6;
    if (rng() % 5 == 0) {
      c.release(s);
      length.erase(s);
      continue;
    }
    uint32_t from = length[s], to = from + 1 + rng() % 5;
    if (!c.reserve(s, to)) {
      CHECK(c.free_blocks() < (to - c.capacity(s) + l.block_tokens - 1) / l.block_tokens);
      if (from == 0)
        length.erase(s);
      continue;
    }
    for (uint32_t layer = 0; layer < l.layers; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (uint32_t h = 0; h < l.kv_heads; ++h)
          for (uint32_t p = from; p < to; ++p)
            for (uint32_t d = 0; d < l.head_dim; ++d)
              c.row(s, layer, kv == 1, h, p)[d] = stamp(s, layer, kv, h, p, d);
    length[s] = to;
    for (auto [t, n] : length)
      for (uint32_t layer = 0; layer < l.layers; ++layer)
        for (int kv = 0; kv < 2; ++kv)
          for (uint32_t h = 0; h < l.kv_heads; ++h)
            for (uint32_t p = 0; p < n; ++p)
              for (uint32_t d = 0; d < l.head_dim; ++d)
                REQUIRE(c.row(t, layer, kv == 1, h, p)[d] == stamp(t, layer, kv, h, p, d));
  }
  uint32_t used = 0;
  for (auto [t, n] : length)
    used += c.capacity(t) / l.block_tokens;
  CHECK(used == c.used_blocks());
}
