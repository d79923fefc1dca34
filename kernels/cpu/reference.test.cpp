// Tests of the CPU references against values worked out by hand or by identities,
// so that the GPU checks compare against something known to be right.
#include "cpu/half.hpp"
#include "cpu/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace caf_serving::kernels;

TEST_CASE("fp16 conversion rounds to nearest even and round-trips every half") {
  CHECK(to_fp16(1.0f).bits == 0x3c00);
  CHECK(to_fp16(-2.0f).bits == 0xc000);
  CHECK(to_fp16(65504.0f).bits == 0x7bff);
  CHECK(to_fp16(65520.0f).bits == 0x7c00); // halfway to 65536 rounds up to infinity
  CHECK(to_fp16(0.1f).bits == 0x2e66);
  CHECK(to_fp16(5.960464477539063e-08f).bits == 0x0001); // smallest subnormal
  CHECK(to_fp16(2.98e-08f).bits == 0x0000);
  // 1 + 2^-11 lies halfway between 1 and the next half: ties go to the even mantissa.
  CHECK(to_fp16(1.0f + 1.0f / 2048).bits == 0x3c00);
  CHECK(to_fp16(1.0f + 3.0f / 2048).bits == 0x3c02);
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    fp16_bits h{static_cast<std::uint16_t>(bits)};
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0)
      continue; // NaN payloads are not preserved bit for bit
    REQUIRE(to_fp16(to_float(h)).bits == bits);
  }
}

TEST_CASE("bf16 conversion keeps the upper half of an fp32, rounded to even") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  CHECK(to_float(bf16_bits{0x3f80}) == 1.0f);
  CHECK(to_bf16(1.0f + 1.0f / 256).bits == 0x3f80); // tie, even stays
  CHECK(to_bf16(1.0f + 3.0f / 256).bits == 0x3f82); // tie, odd rounds up
  CHECK(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("activations match their closed forms") {
  CHECK(ref::activate(activation::relu, -1.5f) == 0.0f);
  CHECK(ref::activate(activation::relu, 2.5f) == 2.5f);
  CHECK(ref::activate(activation::gelu_erf, 1.0f) == doctest::Approx(0.8413447).epsilon(1e-6));
  CHECK(ref::activate(activation::gelu_erf, -1.0f) == doctest::Approx(-0.1586553).epsilon(1e-6));
  CHECK(ref::activate(activation::gelu_tanh, 1.0f) == doctest::Approx(0.8411920).epsilon(1e-6));
  CHECK(ref::activate(activation::none, -3.0f) == -3.0f);
  CHECK(ref::activate(activation::tanh, 0.5f) == doctest::Approx(0.4621172).epsilon(1e-6));
  CHECK(ref::activate(activation::sigmoid, 1.0f) == doctest::Approx(0.7310586).epsilon(1e-6));
  CHECK(ref::activate(activation::sigmoid, -200.0f) == 0.0f);
  CHECK(ref::activate(activation::clip, 7.0f, {0.0f, 6.0f}) == 6.0f);
  CHECK(ref::activate(activation::clip, -1.0f, {0.0f, 6.0f}) == 0.0f);
  CHECK(ref::activate(activation::clip, 2.5f, {0.0f, 6.0f}) == 2.5f);
  activation_params hs{1.0f / 6, 0.5f};
  CHECK(ref::activate(activation::hard_swish, 1.0f, hs) == doctest::Approx(2.0 / 3).epsilon(1e-6));
  CHECK(ref::activate(activation::hard_swish, -3.5f, hs) == 0.0f);
  CHECK(ref::activate(activation::hard_swish, 4.0f, hs) == 4.0f);
  CHECK(ref::activate(activation::hard_sigmoid, 1.0f, {0.2f, 0.5f})
        == doctest::Approx(0.7).epsilon(1e-6));
  CHECK(ref::activate(activation::hard_sigmoid, 3.0f, {0.2f, 0.5f}) == 1.0f);
  CHECK(ref::activate(activation::swish, 1.0f, {1.0f, 0.0f})
        == doctest::Approx(0.7310586).epsilon(1e-6));
  CHECK(ref::activate(activation::swish, 1.0f, {2.0f, 0.0f})
        == doctest::Approx(0.8807971).epsilon(1e-6));
  CHECK(ref::activate(activation::leaky_relu, -2.0f, {0.1f, 0.0f})
        == doctest::Approx(-0.2).epsilon(1e-6));
  CHECK(ref::activate(activation::leaky_relu, 2.0f, {0.1f, 0.0f}) == 2.0f);
}

TEST_CASE("bias broadcasts along columns for GEMM and along channels for NCHW") {
  std::vector<float> x(12, 0.0f);
  auto gemm = ref::add_bias(x, {1, 2, 3}, {3, 1});
  CHECK(gemm == std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3});
  auto nchw = ref::add_bias(x, {1, 2, 3}, {3, 2});
  CHECK(nchw == std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
}

TEST_CASE("layer norm of 1..4 gives the standardised values") {
  auto out = ref::layer_norm({1, 2, 3, 4}, {1, 4}, {1, 1, 1, 2}, {0, 0, 0, 1}, 0.0f);
  double s = 1.0 / std::sqrt(1.25);
  CHECK(out[0] == doctest::Approx(-1.5 * s));
  CHECK(out[1] == doctest::Approx(-0.5 * s));
  CHECK(out[2] == doctest::Approx(0.5 * s));
  CHECK(out[3] == doctest::Approx(2 * 1.5 * s + 1));
}

TEST_CASE("softmax honours additive and boolean masks") {
  auto plain = ref::softmax({0.0f, std::log(2.0f)}, {1, 2}, {});
  CHECK(plain[0] == doctest::Approx(1.0 / 3));
  CHECK(plain[1] == doctest::Approx(2.0 / 3));
  ref::softmax_mask add;
  add.kind = mask_kind::additive;
  add.additive = {std::log(2.0f), 0.0f};
  auto shifted = ref::softmax({0.0f, std::log(2.0f), 0.0f, std::log(2.0f)}, {2, 2},
                              add); // one mask row serves both rows
  CHECK(shifted[0] == doctest::Approx(0.5));
  CHECK(shifted[3] == doctest::Approx(0.5));
  ref::softmax_mask keep;
  keep.kind = mask_kind::boolean;
  keep.keep = {1, 0, 1, 0, 0, 0};
  keep.mask_rows = 2;
  auto masked = ref::softmax({5, 7, 5, 1, 2, 3}, {2, 3}, keep);
  CHECK(masked[0] == doctest::Approx(0.5));
  CHECK(masked[1] == 0.0f);
  CHECK(masked[2] == doctest::Approx(0.5));
  CHECK(masked[3] == 0.0f); // a fully masked row is zeros, not NaN
  CHECK(masked[4] == 0.0f);
  CHECK(masked[5] == 0.0f);
}

TEST_CASE("softmax with an additive mask stored in fp16 or bf16, as the kernel reads it") {
  // The kernel widens a half mask (softmax_args::mask_type) to fp32 before adding
  // it; the check cases give the reference the same rounded values. Rounding keeps
  // what a mask means: -inf and large negatives still hide their key, a fully
  // masked row is still zeros, and a small bias moves the result by its rounding.
  const float inf = std::numeric_limits<float>::infinity();
  auto as_fp16 = [](float x) { return to_float(to_fp16(x)); };
  auto as_bf16 = [](float x) { return to_float(to_bf16(x)); };
  for (auto round : {+as_fp16, +as_bf16}) {
    ref::softmax_mask m;
    m.kind = mask_kind::additive;
    m.mask_rows = 3;
    // Row 0 hides key 1 with -inf and key 2 with -1e4; row 1 hides every key;
    // row 2 favours key 0 by 0.1 (not exact in either half type).
    for (float v : {0.0f, -inf, -1e4f, -inf, -inf, -inf, 0.1f, 0.0f, 0.0f})
      m.additive.push_back(round(v));
    CHECK(m.additive[1] == -inf);
    CHECK(m.additive[2] < -9000.0f);
    CHECK(m.additive[6] != 0.1f);
    auto p = ref::softmax({1, 2, 3, 1, 2, 3, 0, 0, 0}, {3, 3}, m);
    CHECK(p[0] == 1.0f);
    CHECK(p[1] == 0.0f);
    CHECK(p[2] == 0.0f);
    for (int i = 3; i < 6; ++i) CHECK(p[i] == 0.0f); // fully masked: zeros, not NaN
    const double e = std::exp(double(m.additive[6]));
    CHECK(p[6] == doctest::Approx(e / (e + 2)));
    CHECK(std::fabs(p[6] - std::exp(0.1) / (std::exp(0.1) + 2)) < 1e-3); // bf16: 0.1 +- 4e-4
  }
  // fp16 cannot hold fp32's lowest (the mask value PyTorch's exporters use): it
  // rounds to -inf, which still masks; adding it to a finite logit never gives NaN.
  CHECK(as_fp16(std::numeric_limits<float>::lowest()) == -inf);
}

TEST_CASE("softmax reads a broadcast attention mask through its strides") {
  // Scores [B=2, H=2, Q=2] x K=2, all zero: each row is uniform but for its mask.
  std::vector<float> x(8 * 2, 0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  ref::softmax_mask padding; // [B, 1, 1, K]: batch 0 hides key 1, batch 1 hides both
  padding.kind = mask_kind::additive;
  padding.additive = {0.0f, -inf, -inf, -inf};
  padding.layout = {2, 2, 2, 0, 0};
  auto p = ref::softmax(x, {8, 2}, padding);
  for (std::size_t r = 0; r < 8; ++r) {
    INFO(r);
    CHECK(p[r * 2] == (r < 4 ? 1.0f : 0.0f));
    CHECK(p[r * 2 + 1] == 0.0f);
  }
  ref::softmax_mask causal; // [Q, K], the same for every batch and head
  causal.kind = mask_kind::additive;
  causal.additive = {0.0f, -inf, 0.0f, 0.0f};
  causal.layout = {2, 2, 0, 0, 2};
  auto c = ref::softmax(x, {8, 2}, causal);
  for (std::size_t r = 0; r < 8; ++r) {
    INFO(r);
    CHECK(c[r * 2] == (r % 2 == 0 ? 1.0f : 0.5f));
  }
  ref::softmax_mask head; // [1, H, 1, K]: head 1 prefers key 1 by log 3
  head.kind = mask_kind::additive;
  head.additive = {0.0f, 0.0f, 0.0f, std::log(3.0f)};
  head.layout = {2, 2, 0, 2, 0};
  auto h = ref::softmax(x, {8, 2}, head);
  for (std::size_t r = 0; r < 8; ++r) {
    INFO(r);
    CHECK(h[r * 2 + 1] == doctest::Approx((r / 2) % 2 == 1 ? 0.75 : 0.5));
  }
  CHECK(mask_row_offset(mask_strides{3, 5, 100, 10, 1}, 1, 7, (2 * 3 + 1) * 5 + 4) == 214);
  CHECK(mask_row_offset(mask_strides{}, 2, 7, 5) == 7); // rows: r % mask_rows
}

TEST_CASE("matmul handles both layouts of B") {
  std::vector<float> a{1, 2, 3, 4, 5, 6};      // [2,3]
  std::vector<float> b{1, 0, 0, 1, 1, 1};      // [3,2]
  std::vector<float> bt{1, 0, 1, 0, 1, 1};     // the same B stored [2,3]
  std::vector<float> want{4, 5, 10, 11};
  CHECK(ref::matmul(a, b, {2, 2, 3, false}) == want);
  CHECK(ref::matmul(a, bt, {2, 2, 3, true}) == want);
}

TEST_CASE("attention over one key returns that key's value; padding hides keys") {
  ref::attention_shape s{1, 1, 3, 2};
  std::vector<float> q{1, 0, 0, 1, 1, 1};
  std::vector<float> k{9, 9, -3, 4, 7, 7};
  std::vector<float> v{1, 2, 3, 4, 5, 6};
  auto out = ref::attention(q, k, v, s, {{1}}, 0.5f);
  for (int i = 0; i < 3; ++i) {
    CHECK(out[2 * i] == doctest::Approx(1));
    CHECK(out[2 * i + 1] == doctest::Approx(2));
  }
  // Equal keys give a plain average of the values.
  std::vector<float> same(6, 1.0f);
  auto avg = ref::attention(q, same, v, s, {}, 1.0f);
  CHECK(avg[0] == doctest::Approx(3));
  CHECK(avg[1] == doctest::Approx(4));
  // A sequence of length zero gives zeros.
  auto none = ref::attention(q, k, v, s, {{0}}, 1.0f);
  CHECK(none == std::vector<float>(6, 0.0f));
}

TEST_CASE("attention adds a strided mask: padding, causal, both, and fully masked rows") {
  // Q = K = 0: every score is 0, so each output row is the mask's softmax
  // weighting of V, whose rows are the key positions (v[j] = {j, 10 j}).
  const float inf = std::numeric_limits<float>::infinity();
  ref::attention_shape s{2, 2, 3, 2}; // [B, H, S, D]
  std::vector<float> zeros(2 * 2 * 3 * 2, 0.0f), v;
  for (int bh = 0; bh < 4; ++bh)
    for (int j = 0; j < 3; ++j)
      v.insert(v.end(), {float(j), 10.0f * j});
  auto at = [&](const std::vector<float>& o, int b, int h, int i) {
    return o[static_cast<std::size_t>(((b * 2 + h) * 3 + i) * 2)];
  };
  // Padding [B, 1, 1, S]: batch 0 hides key 2; batch 1 weighs key 0 twice.
  ref::attention_masks padding;
  padding.additive = {0, 0, -inf, std::log(2.0f), 0, 0};
  padding.batch = 3;
  auto p = ref::attention(zeros, zeros, v, s, padding, 1.0f);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i) {
      CAPTURE(h);
      CAPTURE(i);
      CHECK(at(p, 0, h, i) == doctest::Approx(0.5));        // (0 + 1) / 2
      CHECK(at(p, 1, h, i) == doctest::Approx(3.0 / 4.0));  // (2·0 + 1 + 2) / 4
    }
  // Causal [S, S]: query i sees keys 0..i.
  ref::attention_masks causal;
  causal.additive = {0, -inf, -inf, 0, 0, -inf, 0, 0, 0};
  causal.query = 3;
  auto c = ref::attention(zeros, zeros, v, s, causal, 1.0f);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i)
        CHECK(at(c, b, h, i) == doctest::Approx(i / 2.0)); // mean of 0..i
  // Both at once, [B, 1, S, S] as GPT-2's graph writes it: batch 1 left-padded
  // by one key, so its query 0 sees no key at all and gives zeros; with
  // finfo(float32).min instead of -inf that row is uniform (finite logits).
  const float lowest = std::numeric_limits<float>::lowest();
  for (float masked : {-inf, lowest}) {
    CAPTURE(masked);
    ref::attention_masks both;
    both.additive = {0,      masked, masked, 0,      0,      masked, 0,      0, 0,
                     masked, masked, masked, masked, 0,      masked, masked, 0, 0};
    both.batch = 9;
    both.query = 3;
    auto o = ref::attention(zeros, zeros, v, s, both, 1.0f);
    for (int h = 0; h < 2; ++h) {
      CHECK(at(o, 0, h, 2) == doctest::Approx(1.0));
      CHECK(at(o, 1, h, 0) == doctest::Approx(masked == -inf ? 0.0 : 1.0));
      CHECK(at(o, 1, h, 1) == doctest::Approx(1.0));
      CHECK(at(o, 1, h, 2) == doctest::Approx(1.5));
    }
  }
  // A per-head mask [1, H, 1, S], and key lengths on top of a mask.
  ref::attention_masks per_head;
  per_head.additive = {-inf, 0, 0, 0, -inf, -inf};
  per_head.head = 3;
  per_head.key_lengths = {3, 2};
  auto ph = ref::attention(zeros, zeros, v, s, per_head, 1.0f);
  CHECK(at(ph, 0, 0, 0) == doctest::Approx(1.5)); // keys 1, 2
  CHECK(at(ph, 0, 1, 0) == doctest::Approx(0.0)); // key 0
  CHECK(at(ph, 1, 0, 0) == doctest::Approx(1.0)); // key 1 (key 2 past the length)
  CHECK(at(ph, 1, 1, 0) == doctest::Approx(0.0)); // key 0
}

TEST_CASE("gather and scatter are inverses") {
  std::vector<std::vector<std::uint8_t>> reqs{{1, 2, 3}, {}, {4}, {5, 6}};
  auto batch = ref::gather(reqs);
  CHECK(batch == std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6});
  CHECK(ref::scatter(batch, {3, 0, 1, 2}) == reqs);
}

TEST_CASE("softmax top-k ranks by probability, ties to the lower index") {
  auto rows = ref::softmax_top_k({0, 2, 1, 2, -1}, {1, 5}, 3);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].indices == std::vector<std::int32_t>{1, 3, 2});
  double z = 1 + 2 * std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  CHECK(rows[0].probabilities[0] == doctest::Approx(std::exp(2.0) / z));
  CHECK(rows[0].probabilities[2] == doctest::Approx(std::exp(1.0) / z));
}
