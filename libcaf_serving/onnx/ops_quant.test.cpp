/// The integer operators of ops_quant.cpp: ConvInteger and MatMulInteger
/// against the engine's FP32 Conv and MatMul on the zero-point-shifted values
/// (exact in FP32 at these sizes), requantisation's rounding and saturation and
/// DynamicQuantizeLinear worked out by hand, and the errors that name what the
/// engine does not take. ONNX Runtime's outputs are checked through the server
/// by onnx.server.test (tests/onnx/fixtures/models/quant_*).

#include "onnx/ops_quant.hpp"

#include "onnx/ops_testing.hpp"

#include <doctest/doctest.h>

#include <random>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;

namespace {

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

template <class T>
std::vector<T> random_ints(size_t n, int lo, int hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(gen));
  return v;
}

/// The values minus a zero point per `inner`-sized run of `extent` channels, as FP32.
template <class T>
tensor shifted(const tensor& t, const std::vector<int>& zero, int64_t inner) {
  auto v = t.values<T>();
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    f[i] = float(int(v[i]) - zero[zero.size() == 1 ? 0 : (i / inner) % zero.size()]);
  return f32(t.shape, f);
}

std::vector<int32_t> as_ints(const std::vector<float>& f) {
  return std::vector<int32_t>(f.begin(), f.end());
}

} // namespace

TEST_CASE("ConvInteger equals FP32 Conv of the shifted values: padding, stride, groups, "
          "a zero point per output channel") {
  auto x = make<uint8_t>(datatype::uint8, {2, 4, 6, 5}, random_ints<uint8_t>(240, 0, 255, 1));
  auto w = make<int8_t>(datatype::int8, {6, 2, 3, 3}, random_ints<int8_t>(108, -128, 127, 2));
  auto xz = make<uint8_t>(datatype::uint8, {}, {117});
  auto wz = make<int8_t>(datatype::int8, {6}, {0, -3, 5, 1, 127, -128});
  auto attrs_ = std::map<std::string, attribute>{{"pads", ints_attr({1, 0, 2, 1})},
                                                 {"strides", ints_attr({2, 1})},
                                                 {"dilations", ints_attr({1, 2})},
                                                 {"group", int_attr(2)}};
  auto y = ok1({"ConvInteger", {x, constant(w), constant(xz), constant(wz)}, attrs_, 10});
  CHECK(y.dtype == datatype::int32);
  auto ref = ok1({"Conv", {shifted<uint8_t>(x, {117}, 1),
                           constant(shifted<int8_t>(w, {0, -3, 5, 1, 127, -128}, 18))},
                  attrs_});
  CHECK(y.shape == ref.shape);
  CHECK(y.values<int32_t>() == as_ints(ref.values<float>()));
  // Without zero points; SAME_UPPER padding.
  auto same = std::map<std::string, attribute>{{"auto_pad", string_attr("SAME_UPPER")},
                                               {"group", int_attr(2)}};
  auto y0 = ok1({"ConvInteger", {x, constant(w)}, same, 10});
  auto ref0 = ok1({"Conv", {shifted<uint8_t>(x, {0}, 1), constant(shifted<int8_t>(w, {0}, 1))},
                   same});
  CHECK(y0.shape == std::vector<int64_t>{2, 6, 6, 5});
  CHECK(y0.values<int32_t>() == as_ints(ref0.values<float>()));
}

TEST_CASE("MatMulInteger equals FP32 MatMul of the shifted values, batch broadcast, a zero "
          "point per column of B") {
  auto a = make<int8_t>(datatype::int8, {2, 3, 5}, random_ints<int8_t>(30, -128, 127, 3));
  auto b = make<uint8_t>(datatype::uint8, {5, 4}, random_ints<uint8_t>(20, 0, 255, 4));
  auto az = make<int8_t>(datatype::int8, {}, {-9});
  auto bz = make<uint8_t>(datatype::uint8, {4}, {0, 128, 255, 7});
  auto y = ok1({"MatMulInteger", {a, constant(b), constant(az), constant(bz)}, {}, 10});
  CHECK(y.dtype == datatype::int32);
  CHECK(y.shape == std::vector<int64_t>{2, 3, 4});
  // B's zero points run along its last axis: inner 1, extent 4.
  auto ref = ok1({"MatMul", {shifted<int8_t>(a, {-9}, 1),
                             shifted<uint8_t>(b, {0, 128, 255, 7}, 1)}});
  CHECK(y.values<int32_t>() == as_ints(ref.values<float>()));
  // 1-D A drops its dimension.
  auto v = make<int8_t>(datatype::int8, {5}, {1, -2, 3, -4, 5});
  CHECK(ok1({"MatMulInteger", {v, constant(b)}, {}, 10}).shape == std::vector<int64_t>{4});
  CHECK(has(refused({"MatMulInteger", {a, constant(b), constant(make<int8_t>(datatype::int8, {3},
                                                                          {1, 2, 3}))}, {}, 10}),
            "one value"));
  CHECK(has(refused({"MatMulInteger", {f32({1, 5}, {1, 2, 3, 4, 5}), constant(b)}, {}, 10}),
            "UINT8 or INT8"));
}

TEST_CASE("QLinearMatMul and QLinearConv requantise: halves to even, saturation, per-channel "
          "scales") {
  // A [1, 4] . B [4, 1] = 1 + 1 + 1 + 2 = 5 (after zero points); 5 * (0.5 * 1 / 2) = 1.25 -> 1.
  // With y_scale 1/... each column of B [4, 3]: multipliers 0.25, 0.5, 2.5 on sums 5, 5, 5 ->
  // 1.25 -> 1, 2.5 -> 2 (even), 12.5 -> 12 (even); + y zero point 250 saturates the last.
  auto a = make<uint8_t>(datatype::uint8, {1, 4}, {11, 11, 11, 12});
  auto az = make<uint8_t>(datatype::uint8, {}, {10});
  auto as = f32({}, {0.5f});
  auto b = make<int8_t>(datatype::int8, {4, 3}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  auto bs = f32({3}, {1, 2, 10});
  auto bz = make<int8_t>(datatype::int8, {3}, {0, 0, 0});
  auto ys = f32({}, {2});
  auto yz = make<uint8_t>(datatype::uint8, {}, {0});
  auto y = ok1({"QLinearMatMul", {a, constant(as), constant(az), constant(b), constant(bs),
                                  constant(bz), constant(ys), constant(yz)}, {}, 10});
  CHECK(y.dtype == datatype::uint8);
  CHECK(y.values<uint8_t>() == std::vector<uint8_t>{1, 2, 12});
  auto yz250 = make<uint8_t>(datatype::uint8, {}, {250});
  CHECK(ok1({"QLinearMatMul", {a, constant(as), constant(az), constant(b), constant(bs),
                               constant(bz), constant(ys), constant(yz250)}, {}, 21})
          .values<uint8_t>() == std::vector<uint8_t>{251, 252, 255});
  // QLinearConv: a 1x1 convolution is the same matmul per pixel; INT32 bias -4 per channel
  // gives 1 * 0.25 -> 0, 1 * 0.5 -> 0 (half to even), 1 * 2.5 -> 2; an INT8 output
  // zero point of -128 saturates the negative ones below.
  auto x = make<uint8_t>(datatype::uint8, {1, 4, 1, 1}, {11, 11, 11, 12});
  auto w = make<int8_t>(datatype::int8, {3, 4, 1, 1}, std::vector<int8_t>(12, 1));
  auto bias = make<int32_t>(datatype::int32, {3}, {-4, -4, -4});
  auto yz8 = make<int8_t>(datatype::int8, {}, {0});
  auto c = ok1({"QLinearConv", {x, constant(as), constant(az), constant(w), constant(bs),
                                constant(bz), constant(ys), constant(yz8), constant(bias)},
                {}, 10});
  CHECK(c.dtype == datatype::int8);
  CHECK(c.shape == std::vector<int64_t>{1, 3, 1, 1});
  CHECK(c.values<int8_t>() == std::vector<int8_t>{0, 0, 2});
  auto neg = make<int32_t>(datatype::int32, {3}, {-1000, -1000, -1000});
  auto low = make<int8_t>(datatype::int8, {}, {-128});
  CHECK(ok1({"QLinearConv", {x, constant(as), constant(az), constant(w), constant(bs),
                             constant(bz), constant(ys), constant(low), constant(neg)}, {}, 10})
          .values<int8_t>() == std::vector<int8_t>{-128, -128, -128});
  CHECK(has(refused({"QLinearConv", {x, constant(as), constant(az), constant(w), constant(bs),
                                     constant(bz), constant(ys), constant(yz8),
                                     constant(f32({3}, {0, 0, 0}))}, {}, 10}),
            "INT32 with one value per output channel"));
  CHECK(has(refused({"QLinearConv", {x, constant(bs), constant(az), constant(w), constant(bs),
                                     constant(bz), constant(ys), constant(yz8)}, {}, 10}),
            "one value"));
  CHECK(has(refused({"QLinearConv", {make<uint8_t>(datatype::uint8, {1, 4, 3}, std::vector<uint8_t>(12)),
                                     constant(as), constant(az), constant(w), constant(bs),
                                     constant(bz), constant(ys), constant(yz8)}, {}, 10}),
            "2-D QLinearConv"));
}

TEST_CASE("DynamicQuantizeLinear: the range includes 0, halves round to even, all-zero input") {
  // Range [-1, 1.55]: scale 2.55 / 255 = 0.01, zero point 100; x / 0.01 + 100.
  auto x = f32({1, 4}, {-1, 1.55f, 0.025f, 0});
  auto r = ok(run_node({"DynamicQuantizeLinear", {x}, {}, 11, 3}));
  CHECK(r[0].values<uint8_t>() == std::vector<uint8_t>{0, 255, 102, 100});
  CHECK(r[1].shape.empty());
  CHECK(r[1].values<float>()[0] == doctest::Approx(0.01f));
  CHECK(r[2].values<uint8_t>() == std::vector<uint8_t>{100});
  // Only positive values: the range starts at 0, zero point 0.
  auto p = ok(run_node({"DynamicQuantizeLinear", {f32({2}, {2.55f, 1.27f})}, {}, 11, 3}));
  CHECK(p[0].values<uint8_t>() == std::vector<uint8_t>{255, 127});
  CHECK(p[2].values<uint8_t>() == std::vector<uint8_t>{0});
  // All zeros: scale 1 (as onnxruntime), not a division by zero.
  auto z = ok(run_node({"DynamicQuantizeLinear", {f32({3}, {0, 0, 0})}, {}, 11, 3}));
  CHECK(z[1].values<float>()[0] == 1.0f);
  CHECK(z[0].values<uint8_t>() == std::vector<uint8_t>{0, 0, 0});
  CHECK(has(refused({"DynamicQuantizeLinear", {x}, {}, 10, 3}), "exists from opset 11"));
}
