// Tests of the element-wise pieces the CUDA kernels share with their references
// (cpu/elementwise_math.hpp: broadcast layout, cursor, operators, Cast conversions)
// and of the references themselves, against hand-worked values and a naive
// multi-index broadcast written independently here.
#include "cpu/elementwise_math.hpp"
#include "cpu/half.hpp"
#include "cpu/reference.hpp"
#include "cpu/reference_elementwise.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace caf_serving::kernels;

namespace {

using dims = std::vector<std::int64_t>;

template <class T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
std::vector<T> values_of(const std::vector<std::uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

/// The offset of output element `i` in an input of shape `in` broadcast to `out`,
/// by the definition: right-align, index 0 on size-1 dims, row-major.
std::int64_t naive_offset(const dims& out, const dims& in, std::int64_t i) {
  std::vector<std::int64_t> coord(out.size());
  for (std::size_t d = out.size(); d-- > 0;) {
    coord[d] = i % out[d];
    i /= out[d];
  }
  std::int64_t offset = 0;
  std::size_t shift = out.size() - in.size();
  for (std::size_t d = 0; d < in.size(); ++d)
    offset = offset * in[d] + (in[d] == 1 ? 0 : coord[d + shift]);
  return offset;
}

std::int64_t count_of(const dims& d) {
  std::int64_t n = 1;
  for (auto v : d)
    n *= v;
  return n;
}

} // namespace

TEST_CASE("broadcast shapes and strides follow NumPy's rules") {
  CHECK(broadcast_shape({{2, 3, 4}, {4}}) == dims{2, 3, 4});
  CHECK(broadcast_shape({{8, 1, 6, 1}, {7, 1, 5}}) == dims{8, 7, 6, 5});
  CHECK(broadcast_shape({{}, {3}}) == dims{3});
  CHECK(broadcast_shape({{2, 1, 1, 5}, {2, 4, 5, 5}}) == dims{2, 4, 5, 5});
  CHECK_THROWS_WITH_AS(broadcast_shape({{2, 3}, {4}}), doctest::Contains("do not broadcast"),
                       std::invalid_argument);
  auto s = broadcast_strides({2, 3, 4}, {3, 1});
  CHECK(s[0] == 0);
  CHECK(s[1] == 1);
  CHECK(s[2] == 0);
  s = broadcast_strides({2, 3, 4}, {2, 3, 4});
  CHECK(s[0] == 12);
  CHECK(s[1] == 4);
  CHECK(s[2] == 1);
  CHECK_THROWS_AS(broadcast_strides({3}, {2}), std::invalid_argument);
  CHECK_THROWS_AS(broadcast_strides({3}, {1, 3}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_broadcast_layout<1>({1, 1, 1, 1, 1, 1, 2}, {dims{2}}),
                       doctest::Contains("at most 6"), std::invalid_argument);
}

TEST_CASE("collapse merges what every operand walks contiguously and drops size-1 dims") {
  // [B,S,H] + [H] -> [B*S, H]
  auto l = collapse(make_broadcast_layout<2>({4, 5, 6}, {dims{4, 5, 6}, dims{6}}));
  REQUIRE(l.rank == 2);
  CHECK(l.shape[0] == 20);
  CHECK(l.shape[1] == 6);
  CHECK(l.strides[0][0] == 6);
  CHECK(l.strides[0][1] == 1);
  CHECK(l.strides[1][0] == 0);
  CHECK(l.strides[1][1] == 1);
  // [B,H,S,S] + [B,1,1,S] -> [B, H*S, S] with the mask's strides [S, 0, 1]
  l = collapse(make_broadcast_layout<2>({2, 3, 7, 7}, {dims{2, 3, 7, 7}, dims{2, 1, 1, 7}}));
  REQUIRE(l.rank == 3);
  CHECK(l.shape[0] == 2);
  CHECK(l.shape[1] == 21);
  CHECK(l.shape[2] == 7);
  CHECK(l.strides[1][0] == 7);
  CHECK(l.strides[1][1] == 0);
  CHECK(l.strides[1][2] == 1);
  // Same shapes: one contiguous dim; scalar operand: stride 0.
  l = collapse(make_broadcast_layout<2>({3, 1, 5}, {dims{3, 1, 5}, dims{}}));
  REQUIRE(l.rank == 1);
  CHECK(l.shape[0] == 15);
  CHECK(l.strides[0][0] == 1);
  CHECK(l.strides[1][0] == 0);
  // [N,C,H,W] * [N,C,1,1] -> [N*C, H*W] with the scale's strides [1, 0]
  l = collapse(make_broadcast_layout<2>({2, 5, 7, 7}, {dims{2, 5, 7, 7}, dims{2, 5, 1, 1}}));
  REQUIRE(l.rank == 2);
  CHECK(l.shape[0] == 10);
  CHECK(l.shape[1] == 49);
  CHECK(l.strides[1][0] == 1);
  CHECK(l.strides[1][1] == 0);
  // A scalar output: one element, every stride 0.
  l = collapse(make_broadcast_layout<2>({}, {dims{}, dims{}}));
  CHECK(l.rank == 1);
  CHECK(l.shape[0] == 1);
  // An empty output.
  l = collapse(make_broadcast_layout<2>({3, 0, 2}, {dims{3, 0, 2}, dims{2}}));
  CHECK(element_count(l) == 0);
}

TEST_CASE("the cursor visits the same operand elements as the naive broadcast") {
  std::mt19937_64 rng(20261202);
  std::uniform_int_distribution<int> rank_dist(0, 6), dim_dist(1, 5), coin(0, 2);
  for (int trial = 0; trial < 300; ++trial) {
    int rank = rank_dist(rng);
    dims out(rank);
    for (auto& d : out)
      d = dim_dist(rng);
    std::array<dims, 3> in;
    for (auto& x : in) { // a suffix of the output's dims, some of them 1
      x.assign(out.begin() + std::uniform_int_distribution<int>(0, rank)(rng), out.end());
      for (auto& d : x)
        if (coin(rng) == 0)
          d = 1;
    }
    auto full = make_broadcast_layout<3>(out, in);
    auto plan = collapse(full);
    INFO("trial ", trial, " rank ", rank, " collapsed to ", plan.rank);
    REQUIRE(element_count(plan) == count_of(out));
    // Walked with next() and 32-bit indices, as the kernels do; seek() from anywhere.
    auto narrow_plan = narrow<std::uint32_t>(plan);
    broadcast_cursor<3, std::uint32_t> walk;
    walk.seek(narrow_plan, 0);
    for (std::int64_t i = 0; i < count_of(out); ++i) {
      if (i > 0)
        walk.next(narrow_plan, static_cast<std::uint32_t>(i));
      broadcast_cursor<3, std::int64_t> jump;
      jump.seek(plan, i);
      for (int k = 0; k < 3; ++k) {
        REQUIRE(walk.offsets[k] == naive_offset(out, in[k], i));
        REQUIRE(jump.offsets[k] == naive_offset(out, in[k], i));
      }
      // The kernels' chunk path: the rest of the row is `inner_step` apart.
      REQUIRE(jump.inner == walk.inner);
      REQUIRE(jump.inner_shape == plan.shape[plan.rank - 1]);
      for (std::int64_t j = 1; jump.inner + j < jump.inner_shape; ++j)
        for (int k = 0; k < 3; ++k)
          REQUIRE(jump.offsets[k] + j * jump.inner_step[k] == naive_offset(out, in[k], i + j));
    }
    for (int k = 0; k < 3; ++k)
      CHECK(operand_extent(plan, k) == count_of(in[k]));
  }
}

TEST_CASE("integer arithmetic truncates, wraps, and defines division by zero") {
  using i64 = std::int64_t;
  constexpr i64 lo = std::numeric_limits<i64>::min(), hi = std::numeric_limits<i64>::max();
  CHECK(apply_binary<i64>(binary_op::div, 7, 2) == 3);
  CHECK(apply_binary<i64>(binary_op::div, -7, 2) == -3); // toward zero, not floor
  CHECK(apply_binary<i64>(binary_op::div, 7, -2) == -3);
  CHECK(apply_binary<i64>(binary_op::div, 7, 0) == 0);
  CHECK(apply_binary<i64>(binary_op::div, lo, -1) == lo);
  CHECK(apply_binary<std::int32_t>(binary_op::div, std::numeric_limits<std::int32_t>::min(), -1)
        == std::numeric_limits<std::int32_t>::min());
  CHECK(apply_binary<i64>(binary_op::add, hi, 1) == lo);
  CHECK(apply_binary<i64>(binary_op::sub, lo, 1) == hi);
  CHECK(apply_binary<std::int32_t>(binary_op::mul, 65536, 65536) == 0);
  CHECK(apply_binary<i64>(binary_op::pow, 3, 4) == 81);
  CHECK(apply_binary<i64>(binary_op::pow, -2, 3) == -8);
  CHECK(apply_binary<i64>(binary_op::pow, 5, 0) == 1);
  CHECK(apply_binary<i64>(binary_op::pow, 2, -1) == 0);
  CHECK(apply_binary<i64>(binary_op::pow, -1, -3) == -1);
  CHECK(apply_binary<i64>(binary_op::pow, 2, 64) == 0); // wraps
  CHECK(apply_binary<i64>(binary_op::max, -3, 2) == 2);
  CHECK(apply_unary_int<i64>(unary_op::neg, lo) == lo);
  CHECK(apply_unary_int<i64>(unary_op::abs, -5) == 5);
}

TEST_CASE("float operators: NaN in Max/Min, comparisons, half-to-even Round") {
  float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(apply_binary(binary_op::max, nan, 1.0f)));
  CHECK(std::isnan(apply_binary(binary_op::max, 1.0f, nan)));
  CHECK(std::isnan(apply_binary(binary_op::min, 1.0f, nan)));
  CHECK(apply_binary(binary_op::min, -1.0f, 2.0f) == -1.0f);
  CHECK_FALSE(apply_compare(binary_op::equal, nan, nan));
  CHECK(apply_compare(binary_op::less_or_equal, 2.0f, 2.0f));
  CHECK_FALSE(apply_compare(binary_op::greater, 2.0f, 2.0f));
  CHECK(apply_binary(binary_op::logical_xor, true, false));
  unary_params p;
  CHECK(apply_unary(unary_op::round, 0.5f, p) == 0.0f);
  CHECK(apply_unary(unary_op::round, 1.5f, p) == 2.0f);
  CHECK(apply_unary(unary_op::round, -2.5f, p) == -2.0f);
  CHECK(apply_unary(unary_op::floor, -0.25f, p) == -1.0f);
  CHECK(apply_unary(unary_op::ceil, -0.25f, p) == 0.0f);
}

TEST_CASE("activations match their closed forms and the fused epilogue's references") {
  unary_params p;
  for (float x : {-3.0f, -0.5f, 0.0f, 0.7f, 2.5f}) {
    INFO(x);
    CHECK(apply_unary(unary_op::gelu_erf, x, p)
          == doctest::Approx(ref::activate(activation::gelu_erf, x)).epsilon(1e-6));
    CHECK(apply_unary(unary_op::gelu_tanh, x, p)
          == doctest::Approx(ref::activate(activation::gelu_tanh, x)).epsilon(1e-6));
    double sig = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    CHECK(apply_unary(unary_op::sigmoid, x, p) == doctest::Approx(sig).epsilon(1e-6));
    CHECK(apply_unary(unary_op::silu, x, p) == doctest::Approx(x * sig).epsilon(1e-6));
    CHECK(apply_unary(unary_op::softplus, x, p)
          == doctest::Approx(std::log1p(std::exp(static_cast<double>(x)))).epsilon(1e-6));
    double hs = x * std::fmin(1.0, std::fmax(0.0, x / 6.0 + 0.5));
    CHECK(apply_unary(unary_op::hard_swish, x, p) == doctest::Approx(hs).epsilon(1e-6));
  }
  CHECK(apply_unary(unary_op::softplus, 50.0f, p) == 50.0f); // no overflow
  auto hard_sigmoid = default_params(unary_op::hard_sigmoid);
  CHECK(apply_unary(unary_op::hard_sigmoid, 1.0f, hard_sigmoid) == doctest::Approx(0.7f));
  CHECK(apply_unary(unary_op::hard_sigmoid, 10.0f, hard_sigmoid) == 1.0f);
  CHECK(apply_unary(unary_op::leaky_relu, -2.0f, default_params(unary_op::leaky_relu))
        == doctest::Approx(-0.02f));
  CHECK(apply_unary(unary_op::elu, -1.0f, default_params(unary_op::elu))
        == doctest::Approx(std::expm1(-1.0)));
  unary_params relu6;
  relu6.lo = 0;
  relu6.hi = 6;
  CHECK(apply_unary(unary_op::clip, 7.5f, relu6) == 6.0f);
  CHECK(apply_unary(unary_op::clip, -1.0f, relu6) == 0.0f);
}

TEST_CASE("Cast conversions: truncation toward zero, saturation, NaN, wrap, bool") {
  CHECK(float_to_int<std::int64_t>(-2.7f) == -2);
  CHECK(float_to_int<std::int32_t>(2.7f) == 2);
  CHECK(float_to_int<std::int32_t>(3e9f) == std::numeric_limits<std::int32_t>::max());
  CHECK(float_to_int<std::int32_t>(-3e9f) == std::numeric_limits<std::int32_t>::min());
  CHECK(float_to_int<std::int64_t>(1e30f) == std::numeric_limits<std::int64_t>::max());
  CHECK(float_to_int<std::int8_t>(-200.0f) == -128);
  CHECK(float_to_int<std::int8_t>(127.9f) == 127);
  CHECK(float_to_int<std::uint8_t>(-0.5f) == 0);
  CHECK(float_to_int<std::uint8_t>(300.0f) == 255);
  CHECK(float_to_int<std::int32_t>(std::numeric_limits<float>::quiet_NaN()) == 0);
  CHECK(int_to_int<std::uint8_t>(300) == 44);
  CHECK(int_to_int<std::int8_t>(200) == -56);
  CHECK(int_to_int<std::int32_t>(std::int64_t{1} << 32) == 0);

  std::vector<float> f{1.5f, -2.5f, 0.0f, std::numeric_limits<float>::quiet_NaN(), 70000.0f};
  auto to_bool = ref::cast(dtype::f32, dtype::boolean, bytes_of(f).data(), f.size());
  CHECK(to_bool == std::vector<std::uint8_t>{1, 1, 0, 1, 1});
  auto to_i8 = values_of<std::int8_t>(ref::cast(dtype::f32, dtype::i8, bytes_of(f).data(), 5));
  CHECK(to_i8 == std::vector<std::int8_t>{1, -2, 0, 0, 127});
  auto to_f16 = values_of<std::uint16_t>(ref::cast(dtype::f32, dtype::f16, bytes_of(f).data(), 5));
  CHECK(to_f16[0] == to_fp16(1.5f).bits);
  CHECK(to_f16[4] == 0x7c00); // past 65504: infinity
  std::vector<std::int64_t> big{(std::int64_t{1} << 40) + 3, -1, 0};
  auto to_i32 = values_of<std::int32_t>(ref::cast(dtype::i64, dtype::i32, bytes_of(big).data(), 3));
  CHECK(to_i32 == std::vector<std::int32_t>{3, -1, 0});
  auto to_f32 = values_of<float>(ref::cast(dtype::i64, dtype::f32, bytes_of(big).data(), 3));
  CHECK(to_f32[0] == 1099511627776.0f);
  std::vector<std::uint8_t> flags{0, 1, 1};
  auto bf = values_of<std::uint16_t>(ref::cast(dtype::boolean, dtype::bf16, flags.data(), 3));
  CHECK(bf == std::vector<std::uint16_t>{0, 0x3f80, 0x3f80});
}

TEST_CASE("the binary reference broadcasts and types its output") {
  // [2, 3] + [3] in f32
  std::vector<float> a{1, 2, 3, 4, 5, 6}, b{10, 20, 30};
  auto l = make_broadcast_layout<2>({2, 3}, {dims{2, 3}, dims{3}});
  auto sum = values_of<float>(ref::binary(binary_op::add, dtype::f32, l, bytes_of(a).data(),
                                          bytes_of(b).data()));
  CHECK(sum == std::vector<float>{11, 22, 33, 14, 25, 36});
  // [2, 1] < [1, 3]: a bool [2, 3]
  std::vector<std::int32_t> col{1, 25}, row{0, 20, 30};
  auto lt = ref::binary(binary_op::less, dtype::i32,
                        make_broadcast_layout<2>({2, 3}, {dims{2, 1}, dims{1, 3}}),
                        bytes_of(col).data(), bytes_of(row).data());
  CHECK(lt == std::vector<std::uint8_t>{0, 1, 1, 0, 0, 1});
  // f16 in, computed in f32, rounded once.
  std::vector<std::uint16_t> h{to_fp16(1.0f).bits, to_fp16(3.0f).bits};
  auto third = values_of<std::uint16_t>(
    ref::binary(binary_op::div, dtype::f16, make_broadcast_layout<2>({1}, {dims{1}, dims{1}}),
                bytes_of(h).data(), bytes_of(h).data() + 2));
  CHECK(third[0] == to_fp16(1.0f / 3.0f).bits);
  CHECK_THROWS_WITH_AS(ref::binary(binary_op::logical_and, dtype::f32, l, nullptr, nullptr),
                       doctest::Contains("And is not defined on f32"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(ref::binary(binary_op::sub, dtype::boolean, l, nullptr, nullptr),
                       doctest::Contains("Sub is not defined on bool"), std::invalid_argument);
}

TEST_CASE("the Where reference selects with a broadcast causal mask") {
  // condition [1,1,3,3] lower-triangular, x [1,2,3,3] = 0..17, y a scalar -1
  std::vector<std::uint8_t> mask{1, 0, 0, 1, 1, 0, 1, 1, 1};
  std::vector<std::int64_t> x(18), y{-1};
  for (int i = 0; i < 18; ++i)
    x[i] = i;
  auto l = make_broadcast_layout<3>({1, 2, 3, 3}, {dims{1, 1, 3, 3}, dims{1, 2, 3, 3}, dims{}});
  auto out = values_of<std::int64_t>(
    ref::where(dtype::i64, l, mask.data(), bytes_of(x).data(), bytes_of(y).data()));
  CHECK(out == std::vector<std::int64_t>{0, -1, -1, 3, 4, -1, 6, 7, 8,
                                         9, -1, -1, 12, 13, -1, 15, 16, 17});
}

TEST_CASE("the unary reference: types, bool Not, integer Neg, rejection") {
  std::vector<std::uint8_t> flags{0, 1, 1, 0};
  CHECK(ref::unary(unary_op::logical_not, dtype::boolean, {}, flags.data(), 4)
        == std::vector<std::uint8_t>{1, 0, 0, 1});
  std::vector<std::int32_t> v{3, -4};
  CHECK(values_of<std::int32_t>(ref::unary(unary_op::neg, dtype::i32, {}, bytes_of(v).data(), 2))
        == std::vector<std::int32_t>{-3, 4});
  std::vector<std::uint16_t> h{to_bf16(2.0f).bits};
  auto sq = values_of<std::uint16_t>(ref::unary(unary_op::sqrt, dtype::bf16, {}, bytes_of(h).data(), 1));
  CHECK(sq[0] == to_bf16(std::sqrt(2.0f)).bits);
  CHECK_THROWS_WITH_AS(ref::unary(unary_op::exp, dtype::i64, {}, nullptr, 0),
                       doctest::Contains("Exp is not defined on i64"), std::invalid_argument);
  CHECK_THROWS_AS(ref::unary(unary_op::logical_not, dtype::f32, {}, nullptr, 0),
                  std::invalid_argument);
}
