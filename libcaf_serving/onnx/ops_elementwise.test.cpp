/// ops_elementwise.cpp's reference kernels where they take shortcuts: the element-wise
/// binary operators on a broadcast input that is one value per row (SE blocks'
/// channel scale) or one vector per row (a bias), in either operand order,
/// against values worked out by hand, and the general broadcast beside them.

#include "onnx/op_registry.hpp"

#include "engine_kernels.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

template <class T>
struct tensor {
  datatype dtype;
  std::vector<int64_t> shape;
  std::vector<T> values;
};

/// y = op(a, b) through shape inference and the reference kernel.
template <class T>
std::vector<T> binary(const std::string& op, const tensor<T>& a, const tensor<T>& b,
                      const std::vector<int64_t>& want_shape) {
  graph g;
  g.opset = 17;
  int va = g.add_value("a", a.dtype, a.shape, true);
  int vb = g.add_value("b", b.dtype, b.shape, true);
  int vy = g.add_value("y");
  auto& n = g.add_node(op, op, {va, vb}, {vy});
  auto inf = infer_shapes(g, n);
  REQUIRE(std::holds_alternative<std::vector<inferred>>(inf));
  const auto& o = std::get<std::vector<inferred>>(inf).at(0);
  CHECK(o.shape == want_shape);
  std::vector<T> y(static_cast<size_t>(element_count(o.shape)));
  run_reference(n,
                {{a.dtype, a.shape, const_cast<T*>(a.values.data())},
                 {b.dtype, b.shape, const_cast<T*>(b.values.data())}},
                {{o.dtype, o.shape, y.data()}});
  return y;
}

using f = std::vector<float>;

} // namespace

TEST_CASE("binary operators with a value per row: the SE scale, in either order") {
  tensor<float> x{datatype::fp32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}};
  tensor<float> per_row{datatype::fp32, {2, 1, 1}, {10, 100}};
  CHECK(binary("Sub", x, per_row, {2, 2, 2}) == f{-9, -8, -7, -6, -95, -94, -93, -92});
  CHECK(binary("Sub", per_row, x, {2, 2, 2}) == f{9, 8, 7, 6, 95, 94, 93, 92});
  CHECK(binary("Mul", x, per_row, {2, 2, 2}) == f{10, 20, 30, 40, 500, 600, 700, 800});
  // [N,C,1,1] against [N,C,H,W]: rows of H*W.
  tensor<float> image{datatype::fp32, {1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}};
  tensor<float> scale{datatype::fp32, {1, 2, 1, 1}, {0.5f, 2}};
  CHECK(binary("Mul", scale, image, {1, 2, 2, 2}) == f{0.5f, 1, 1.5f, 2, 10, 12, 14, 16});
  // A scalar is one row.
  tensor<float> two{datatype::fp32, {}, {2}};
  CHECK(binary("Div", two, x, {2, 2, 2})
        == f{2, 1, 2.0f / 3, 0.5f, 0.4f, 2.0f / 6, 2.0f / 7, 0.25f});
}

TEST_CASE("binary operators with a vector per row: a bias, in either order, integers") {
  tensor<float> x{datatype::fp32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}};
  tensor<float> cols{datatype::fp32, {2}, {1, 2}};
  CHECK(binary("Div", x, cols, {2, 2, 2}) == f{1, 1, 3, 2, 5, 3, 7, 4});
  CHECK(binary("Div", cols, x, {2, 2, 2})
        == f{1, 1, 1.0f / 3, 0.5f, 0.2f, 2.0f / 6, 1.0f / 7, 0.25f});
  tensor<float> plane{datatype::fp32, {1, 2, 2}, {10, 20, 30, 40}};
  CHECK(binary("Add", x, plane, {2, 2, 2}) == f{11, 22, 33, 44, 15, 26, 37, 48});
  // The engine's integer division by zero gives 0.
  tensor<int64_t> ints{datatype::int64, {2, 2}, {1, 2, 3, 4}};
  tensor<int64_t> divisors{datatype::int64, {2}, {0, 2}};
  CHECK(binary("Div", ints, divisors, {2, 2}) == std::vector<int64_t>{0, 1, 0, 2});
  CHECK(binary("Pow", ints, divisors, {2, 2}) == std::vector<int64_t>{1, 4, 1, 16});
}

TEST_CASE("binary operators on equal shapes, in order") {
  tensor<float> x{datatype::fp32, {2, 3}, {1, 2, 3, 4, 5, 6}};
  tensor<float> y{datatype::fp32, {2, 3}, {6, 5, 4, 3, 2, 1}};
  CHECK(binary("Sub", x, y, {2, 3}) == f{-5, -3, -1, 1, 3, 5});
  CHECK(binary("Div", y, x, {2, 3}) == f{6, 2.5f, 4.0f / 3, 0.75f, 0.4f, 1.0f / 6});
  CHECK(binary("Mul", x, y, {2, 3}) == f{6, 10, 12, 12, 10, 6});
}

TEST_CASE("other broadcasts take the general path with the same results") {
  tensor<float> x{datatype::fp32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}};
  tensor<float> middle{datatype::fp32, {2, 1, 2}, {10, 20, 30, 40}};
  CHECK(binary("Add", x, middle, {2, 2, 2}) == f{11, 22, 13, 24, 35, 46, 37, 48});
  tensor<float> column{datatype::fp32, {2, 1}, {1, 2}};
  tensor<float> row{datatype::fp32, {1, 3}, {10, 20, 30}};
  CHECK(binary("Sub", column, row, {2, 3}) == f{-9, -19, -29, -8, -18, -28});
  tensor<float> empty{datatype::fp32, {2, 0}, {}};
  CHECK(binary("Mul", empty, column, {2, 0}).empty());
}

namespace {

/// Cast `x` (fp32) with attribute `to` (and the importer's "storage" mark),
/// output of `out` type, through shape inference and the reference kernel.
template <class Out>
std::vector<Out> cast_floats(const std::vector<float>& x, int64_t to, bool storage,
                             datatype out) {
  graph g;
  g.opset = 17;
  int vx = g.add_value("x", datatype::fp32, {static_cast<int64_t>(x.size())}, true);
  int vy = g.add_value("y");
  auto& n = g.add_node("Cast", "cast", {vx}, {vy});
  n.set_i("to", to);
  if (storage)
    n.set_i("storage", 1);
  auto inf = infer_shapes(g, n);
  REQUIRE(std::holds_alternative<std::vector<inferred>>(inf));
  const auto& o = std::get<std::vector<inferred>>(inf).at(0);
  CHECK(o.dtype == out);
  std::vector<Out> y(x.size());
  auto xs = x;
  run_reference(n, {{datatype::fp32, {static_cast<int64_t>(x.size())}, xs.data()}},
                {{o.dtype, o.shape, y.data()}});
  return y;
}

} // namespace

TEST_CASE("Cast to FLOAT16 and BFLOAT16 rounds to nearest, ties to even") {
  // Ties between two halves go to the even one; past FP16's largest finite
  // value is infinity; below half its smallest subnormal is zero.
  std::vector<float> x{1 + 0x1p-11f, 1 + 3 * 0x1p-11f, 65519.0f, 65520.0f, 1e-8f, 3e-8f,
                       -2.5f, 1 + 0x1p-8f, 1 + 3 * 0x1p-8f};
  auto bits = cast_floats<uint16_t>(x, 10, true, datatype::fp16);
  CHECK(bits == std::vector<uint16_t>{0x3c00, 0x3c02, 0x7bff, 0x7c00, 0x0000, 0x0001, 0xc100,
                                      0x3c04, 0x3c0c});
  // Inside the graph the half is held as fp32: the same values, rounded.
  auto rounded = cast_floats<float>(x, 10, false, datatype::fp32);
  CHECK(rounded[0] == 1.0f);
  CHECK(rounded[1] == 1 + 0x1p-9f);
  CHECK(rounded[2] == 65504.0f);
  CHECK(std::isinf(rounded[3]));
  CHECK(rounded[4] == 0.0f);
  CHECK(rounded[5] == 0x1p-24f);
  auto bf = cast_floats<uint16_t>(x, 16, true, datatype::bf16);
  CHECK(bf[6] == 0xc020);            // -2.5 exactly
  CHECK(bf[7] == 0x3f80);            // 1 + 2^-8: a tie, to even (1.0)
  CHECK(bf[8] == 0x3f82);            // 1 + 3 * 2^-8: a tie, to even (1 + 2^-6)
  auto bf_rounded = cast_floats<float>(x, 16, false, datatype::fp32);
  CHECK(bf_rounded[8] == 1 + 0x1p-6f);
}

TEST_CASE("Relu refuses INT16 (a type its integer kernel does not take); Identity moves it") {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::int16, {4}, true);
  auto& relu = g.add_node("Relu", "relu", {x}, {g.add_value("y")});
  auto inf = infer_shapes(g, relu);
  REQUIRE(std::holds_alternative<std::string>(inf));
  CHECK(std::get<std::string>(inf).find("input 'x' is INT16; the engine runs Relu on FP32")
        != std::string::npos);
  // Identity and Cast move any type.
  auto& id = g.add_node("Identity", "id", {x}, {g.add_value("z")});
  auto copied = infer_shapes(g, id);
  REQUIRE(std::holds_alternative<std::vector<inferred>>(copied));
  CHECK(std::get<std::vector<inferred>>(copied).at(0).dtype == datatype::int16);
}

TEST_CASE("the engine's softmax gives masked scores exact zeros, never subnormals") {
  // torch's masks add finfo(float32).min: those probabilities must be 0, and
  // no probability may be subnormal (the matmul with V slows down on them).
  for (int64_t width : {5, 16, 40, 160}) {
    CAPTURE(width);
    std::vector<float> row(width);
    for (int64_t i = 0; i < width; ++i)
      row[i] = i % 4 == 3 ? -FLT_MAX : 0.1f * static_cast<float>(i % 7);
    row[1] = -60.0f; // far below the rest, but not masked: small and normal
    auto expected = row;
    float mx = *std::max_element(expected.begin(), expected.end());
    double sum = 0;
    for (auto v : expected) sum += std::exp(static_cast<double>(v) - mx);
    caf_serving::kernels::cpu::engine_softmax(row.data(), 1, width, 1);
    for (int64_t i = 0; i < width; ++i) {
      CAPTURE(i);
      CHECK(std::fpclassify(row[i]) != FP_SUBNORMAL);
      if (i % 4 == 3)
        CHECK(row[i] == 0.0f);
      else
        CHECK(row[i] == doctest::Approx(std::exp(static_cast<double>(expected[i]) - mx) / sum)
                          .epsilon(1e-5));
    }
  }
}
