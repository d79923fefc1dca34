/// The operators of ops_nd.cpp against values worked out by hand (each case
/// says how), through the public shape inference and reference kernels:
/// negative indices, batch_dims, ScatterND's reductions, every Pad mode with
/// negative pads and axes, Resize's coordinate modes, Einsum's implicit form
/// and ellipsis, and the errors that name what the engine does not take.

#include "onnx/ops_nd.hpp"

#include "onnx/importer.hpp"
#include "onnx/ops_testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;

namespace {

/// 0, 1, 2, ... in `shape`.
tensor iota(std::vector<int64_t> shape) {
  std::vector<float> v(element_count(shape));
  std::iota(v.begin(), v.end(), 0.0f);
  return f32(std::move(shape), v);
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("the importer lists the operators of ops_nd.cpp") {
  const auto& all = supported_operators();
  CHECK(std::is_sorted(all.begin(), all.end()));
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  for (const auto& e : nd_operator_table())
    CHECK_MESSAGE(std::binary_search(all.begin(), all.end(), e.op), e.op);
  CHECK(nd_operator_table().size() == 9);
}

TEST_CASE("GatherND: tuples of indices, negative ones, batch_dims") {
  auto x = iota({2, 3, 2}); // element (a, b, c) is a*6 + b*2 + c
  // (1, -1) is (1, 2): 1*6 + 2*2 = 10, and the slice over c: 10, 11.
  auto y = ok1({"GatherND", {x, i64({1, 2}, {1, -1})}});
  CHECK(y.shape == std::vector<int64_t>{1, 2});
  CHECK(y.values<float>() == std::vector<float>{10, 11});
  // A 1-tuple (-2) is row 0: all six elements.
  CHECK(ok1({"GatherND", {x, i64({1, 1}, {-2})}}).values<float>()
        == std::vector<float>{0, 1, 2, 3, 4, 5});
  // batch_dims 1: batch 0 takes its row 2 (4, 5), batch 1 its row -3 = 0 (6, 7).
  auto b = ok1({"GatherND", {x, i64({2, 1}, {2, -3})}, {{"batch_dims", int_attr(1)}}});
  CHECK(b.shape == std::vector<int64_t>{2, 2});
  CHECK(b.values<float>() == std::vector<float>{4, 5, 6, 7});
  CHECK(has(refused({"GatherND", {x, i64({1, 4}, {0, 0, 0, 0})}}), "last dimension of indices"));
  CHECK(has(refused({"GatherND", {x, i64({2, 1}, {0, 0})}, {{"batch_dims", int_attr(2)}}}),
            "batch_dims 2"));
  CHECK(has(refused({"GatherND", {x, make<int32_t>(datatype::int32, {1, 1}, {0})}}),
            "INT64 indices"));
  // An empty dimension has no row to read; a kernel must not guess one.
  CHECK(has(refused({"GatherND", {f32({0, 2}, {}), i64({1, 1}, {0})}}), "which is empty"));
  CHECK(ok1({"GatherND", {f32({0, 2}, {}), i64({0, 1}, {})}}).shape == std::vector<int64_t>{0, 2});
}

TEST_CASE("ScatterND: later updates win, reductions combine, max and min from opset 18") {
  auto zeros = f32({3, 2}, {0, 0, 0, 0, 0, 0});
  auto idx = i64({3, 1}, {0, 2, -3}); // rows 0, 2 and 0 again (-3 + 3)
  auto upd = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  CHECK(ok1({"ScatterND", {zeros, idx, upd}}).values<float>()
        == std::vector<float>{5, 6, 0, 0, 3, 4});
  // add: row 0 is 1 + 5, 2 + 6.
  CHECK(ok1({"ScatterND", {zeros, idx, upd}, {{"reduction", string_attr("add")}}})
          .values<float>() == std::vector<float>{6, 8, 0, 0, 3, 4});
  // mul on ones: row 0 is 1 * 5, 2 * 6.
  auto ones = f32({3, 2}, {1, 1, 1, 1, 1, 1});
  CHECK(ok1({"ScatterND", {ones, idx, upd}, {{"reduction", string_attr("mul")}}})
          .values<float>() == std::vector<float>{5, 12, 1, 1, 3, 4});
  CHECK(ok1({"ScatterND", {ones, idx, upd}, {{"reduction", string_attr("min")}}, 18})
          .values<float>() == std::vector<float>{1, 1, 1, 1, 1, 1});
  CHECK(ok1({"ScatterND", {ones, idx, upd}, {{"reduction", string_attr("max")}}, 18})
          .values<float>() == std::vector<float>{5, 6, 1, 1, 3, 4});
  CHECK(has(refused({"ScatterND", {ones, idx, upd}, {{"reduction", string_attr("max")}}, 17}),
            "from opset 18"));
  CHECK(has(refused({"ScatterND", {ones, idx, upd}, {{"reduction", string_attr("avg")}}}),
            "reduction='avg'"));
  CHECK(has(refused({"ScatterND", {ones, idx, f32({3, 1}, {1, 2, 3})}}), "updates [3,1]"));
  CHECK(has(refused({"ScatterND", {f32({0, 2}, {}), i64({1, 1}, {0}), f32({1, 2}, {1, 2})}}),
            "which is empty"));
}

TEST_CASE("Pad: constant, reflect, edge and wrap, negative pads, axes") {
  auto x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto pads = [](std::vector<int64_t> p) {
    auto n = static_cast<int64_t>(p.size());
    return constant(i64({n}, p));
  };
  // pads are [begin of each axis, end of each axis]: a column before, a row after.
  auto c = ok1({"Pad", {x, pads({0, 1, 1, 0}), constant(f32({}, {9}))}});
  CHECK(c.shape == std::vector<int64_t>{3, 4});
  CHECK(c.values<float>() == std::vector<float>{9, 1, 2, 3, 9, 4, 5, 6, 9, 9, 9, 9});
  // reflect 2 before and 1 after along [1, 2, 3]: 3 2 | 1 2 3 | 2 (the edge is not repeated).
  auto r = ok1({"Pad", {x, pads({0, 2, 0, 1})}, {{"mode", string_attr("reflect")}}});
  CHECK(r.values<float>() == std::vector<float>{3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5});
  // edge: a row before (a copy of row 0), two columns after (copies of the last).
  auto e = ok1({"Pad", {x, pads({1, 0, 0, 2})}, {{"mode", string_attr("edge")}}});
  CHECK(e.values<float>()
        == std::vector<float>{1, 2, 3, 3, 3, 1, 2, 3, 3, 3, 4, 5, 6, 6, 6});
  // wrap: 2 before from the end (2 3), 1 after from the start (1).
  auto w = ok1({"Pad", {x, pads({0, 2, 0, 1})}, {{"mode", string_attr("wrap")}}, 19});
  CHECK(w.values<float>() == std::vector<float>{2, 3, 1, 2, 3, 1, 5, 6, 4, 5, 6, 4});
  CHECK(has(refused({"Pad", {x, pads({0, 2, 0, 1})}, {{"mode", string_attr("wrap")}}, 17}),
            "from opset 19"));
  // A negative pad crops: the first column goes; edge then repeats the new last one.
  CHECK(ok1({"Pad", {x, pads({0, -1, 0, 0})}}).values<float>()
        == std::vector<float>{2, 3, 5, 6});
  CHECK(ok1({"Pad", {x, pads({0, -1, 0, 1})}, {{"mode", string_attr("edge")}}}).values<float>()
        == std::vector<float>{2, 3, 3, 5, 6, 6});
  // axes (opset 18): pads for the last axis only.
  auto a = ok1({"Pad", {x, pads({1, 1}), omitted(), constant(i64({1}, {-1}))}, {}, 18});
  CHECK(a.values<float>() == std::vector<float>{0, 1, 2, 3, 0, 0, 4, 5, 6, 0});
  CHECK(has(refused({"Pad", {x, pads({1, 1}), omitted(), constant(i64({1}, {-1}))}, {}, 17}),
            "from opset 18"));
  CHECK(has(refused({"Pad", {x, pads({0, 3, 0, 0})}, {{"mode", string_attr("reflect")}}}),
            "reflect' pads at most 2"));
  CHECK(has(refused({"Pad", {x, i64({4}, {0, 1, 0, 1})}}), "must be known before the model runs"));
  CHECK(has(refused({"Pad", {x, pads({0, 1, 0, 1})}, {{"mode", string_attr("mirror")}}}),
            "mode='mirror'"));
  CHECK(has(refused({"Pad", {x, pads({0, 1})}}), "2 per padded axis"));
}

TEST_CASE("Trilu keeps the lower or upper triangle from diagonal k") {
  auto x = iota({3, 3}); // rows 0 1 2 / 3 4 5 / 6 7 8
  CHECK(ok1({"Trilu", {x}, {{"upper", int_attr(0)}}}).values<float>()
        == std::vector<float>{0, 0, 0, 3, 4, 0, 6, 7, 8});
  // upper from the first diagonal above the main one: j - i >= 1.
  CHECK(ok1({"Trilu", {x, i64({}, {1})}}).values<float>()
        == std::vector<float>{0, 1, 2, 0, 0, 5, 0, 0, 0});
  CHECK(has(refused({"Trilu", {f32({3}, {1, 2, 3})}}), "rank of at least 2"));
}

TEST_CASE("Tile, TopK and NonZero") {
  CHECK(ok1({"Tile", {f32({2}, {1, 2}), constant(i64({1}, {3}))}}).values<float>()
        == std::vector<float>{1, 2, 1, 2, 1, 2});
  CHECK(has(refused({"Tile", {f32({2}, {1, 2}), i64({1}, {3})}}), "repeats"));
  // Equal values come by lower index first.
  auto x = f32({4}, {3, 1, 3, 2});
  auto big = ok(run_node({"TopK", {x, constant(i64({1}, {2}))}, {}, 17, 2}));
  CHECK(big.at(0).values<float>() == std::vector<float>{3, 3});
  CHECK(big.at(1).values<int64_t>() == std::vector<int64_t>{0, 2});
  auto small = ok(run_node({"TopK", {x, constant(i64({1}, {2}))}, {{"largest", int_attr(0)}},
                            17, 2}));
  CHECK(small.at(0).values<float>() == std::vector<float>{1, 2});
  CHECK(small.at(1).values<int64_t>() == std::vector<int64_t>{1, 3});
  CHECK(has(refused({"TopK", {x, constant(i64({1}, {5}))}, {}, 17, 2}), "K must be one value"));
  // NonZero of a constant [[1, 0], [0, 2]]: rows 0 1, columns 0 1.
  auto nz = ok1({"NonZero", {constant(f32({2, 2}, {1, 0, 0, 2}))}});
  CHECK(nz.shape == std::vector<int64_t>{2, 2});
  CHECK(nz.values<int64_t>() == std::vector<int64_t>{0, 1, 0, 1});
  CHECK(has(refused({"NonZero", {f32({2, 2}, {1, 0, 0, 2})}}), "only on constants"));
}

TEST_CASE("Resize: nearest and linear under the coordinate modes exporters write") {
  auto x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  auto scales = [](std::vector<float> s) {
    auto n = static_cast<int64_t>(s.size());
    return constant(f32({n}, s));
  };
  auto no_roi = constant(f32({0}, {}));
  // torch's nearest upsampling: asymmetric, floor; each pixel becomes a 2x2 block.
  auto n = ok1({"Resize",
                {x, no_roi, scales({1, 1, 2, 2})},
                {{"coordinate_transformation_mode", string_attr("asymmetric")},
                 {"nearest_mode", string_attr("floor")}}});
  CHECK(n.shape == std::vector<int64_t>{1, 1, 4, 4});
  CHECK(n.values<float>()
        == std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  auto row = f32({1, 2}, {0, 10});
  // align_corners to 3: the ends stay, the middle is their mean.
  CHECK(ok1({"Resize",
             {row, no_roi, omitted(), constant(i64({2}, {1, 3}))},
             {{"mode", string_attr("linear")},
              {"coordinate_transformation_mode", string_attr("align_corners")}}})
          .values<float>() == std::vector<float>{0, 5, 10});
  // half_pixel at scale 2: sources (o + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25, clamped.
  CHECK(ok1({"Resize", {row, no_roi, scales({1, 2})}, {{"mode", string_attr("linear")}}})
          .values<float>() == std::vector<float>{0, 2.5f, 7.5f, 10});
  // The output size floors 2 * 1.7 = 3.4 to 3, but the sources use the scale 1.7:
  // asymmetric o / 1.7 = 0, 0.588, 1.176 -> 0, 5.88, 10 (clamped).
  auto odd = ok1({"Resize", {row, no_roi, scales({1, 1.7f})},
                  {{"mode", string_attr("linear")},
                   {"coordinate_transformation_mode", string_attr("asymmetric")}}});
  REQUIRE(odd.shape == std::vector<int64_t>{1, 3});
  CHECK(odd.values<float>()[1] == doctest::Approx(10.0f / 1.7f));
  CHECK(has(refused({"Resize", {x, no_roi, scales({1, 1, 2, 2})},
                     {{"mode", string_attr("cubic")}}}),
            "mode='cubic'"));
  CHECK(has(refused({"Resize", {x, no_roi, scales({1, 1, 2, 2})},
                     {{"mode", string_attr("linear")}, {"antialias", int_attr(1)}}, 18}),
            "antialias=1"));
  CHECK(has(refused({"Resize", {x, no_roi, scales({1, 1, 2, 2})},
                     {{"coordinate_transformation_mode", string_attr("tf_crop_and_resize")}}}),
            "coordinate_transformation_mode='tf_crop_and_resize'"));
  CHECK(has(refused({"Resize", {x, no_roi, f32({4}, {1, 1, 2, 2})}}),
            "must be known before the model runs"));
}

TEST_CASE("Einsum: explicit and implicit output, ellipsis, diagonal, errors") {
  auto a = f32({2, 2}, {1, 2, 3, 4});
  auto b = f32({2, 2}, {5, 6, 7, 8});
  auto eq = [](const char* e) {
    return std::map<std::string, attribute>{{"equation", string_attr(e)}};
  };
  // [1 2; 3 4] x [5 6; 7 8] = [19 22; 43 50].
  CHECK(ok1({"Einsum", {a, b}, eq("ij,jk->ik")}).values<float>()
        == std::vector<float>{19, 22, 43, 50});
  // Implicit: the labels used once, sorted (i, k): the same product.
  CHECK(ok1({"Einsum", {a, b}, eq("ij,jk")}).values<float>()
        == std::vector<float>{19, 22, 43, 50});
  // Implicit with "ba,ac": output "bc", the product again.
  CHECK(ok1({"Einsum", {a, b}, eq("ba, ac")}).values<float>()
        == std::vector<float>{19, 22, 43, 50});
  CHECK(ok1({"Einsum", {a}, eq("ii->i")}).values<float>() == std::vector<float>{1, 4});
  CHECK(ok1({"Einsum", {a}, eq("ij->ji")}).values<float>() == std::vector<float>{1, 3, 2, 4});
  CHECK(ok1({"Einsum", {a}, eq("ij->")}).values<float>() == std::vector<float>{10});
  // Ellipsis broadcasting [2, 1, 2] against [2, 2]: each batch row times b.
  auto batched = f32({2, 1, 2}, {1, 2, 3, 4});
  auto y = ok1({"Einsum", {batched, b}, eq("...ij,jk->...ik")});
  CHECK(y.shape == std::vector<int64_t>{2, 1, 2});
  CHECK(y.values<float>() == std::vector<float>{19, 22, 43, 50});
  CHECK(has(refused({"Einsum", {a, b}, eq("ij->ij")}), "names 1 operands"));
  CHECK(has(refused({"Einsum", {a, b}, eq("ijk,jk->i")}), "names 3 dimensions"));
  CHECK(has(refused({"Einsum", {a, f32({3, 2}, {1, 2, 3, 4, 5, 6})}, eq("ij,jk->ik")}),
            "same label"));
  CHECK(has(refused({"Einsum", {a, b}, eq("ij,jk->iz")}), "names 'z'"));
  CHECK(has(refused({"Einsum", {a}, eq("ij->ii")}), "names 'i' twice"));
}

TEST_CASE("Einsum's matrix-product patterns (OpenBLAS) equal the plain loops and MatMul") {
  // Small integers: FLOAT (the OpenBLAS path) and INT64 (the plain loops) must agree
  // exactly, and both with the engine's MatMul after a Transpose.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> small(-3, 3);
  auto ints = [&](std::vector<int64_t> shape) {
    std::vector<int64_t> v(element_count(shape));
    for (auto& e : v) e = small(rng);
    return v;
  };
  auto as_f32 = [](std::vector<int64_t> shape, const std::vector<int64_t>& v) {
    return f32(std::move(shape), std::vector<float>(v.begin(), v.end()));
  };
  auto eq = [](const char* e) {
    return std::map<std::string, attribute>{{"equation", string_attr(e)}};
  };
  struct pattern {
    const char* equation;
    std::vector<int64_t> a, b;
  };
  for (const auto& c : {pattern{"bhqd,bhkd->bhqk", {2, 3, 4, 5}, {2, 3, 6, 5}},
                        pattern{"bij,jk->bik", {2, 3, 4}, {4, 5}},
                        pattern{"bhqk,bhkd->bqhd", {2, 3, 4, 6}, {2, 3, 6, 5}},
                        pattern{"i,j->ij", {3}, {4}}, pattern{"ij,ij->", {3, 4}, {3, 4}},
                        pattern{"ik,jk", {3, 4}, {5, 4}}}) {
    CAPTURE(c.equation);
    auto a = ints(c.a), b = ints(c.b);
    auto fast = ok1({"Einsum", {as_f32(c.a, a), as_f32(c.b, b)}, eq(c.equation)});
    auto loops = ok1({"Einsum", {i64(c.a, a), i64(c.b, b)}, eq(c.equation)});
    CHECK(fast.shape == loops.shape);
    auto l = loops.values<int64_t>();
    CHECK(fast.values<float>() == std::vector<float>(l.begin(), l.end()));
  }
  auto q = as_f32({2, 3, 4, 5}, ints({2, 3, 4, 5})), k = as_f32({2, 3, 6, 5}, ints({2, 3, 6, 5}));
  auto kt = ok1({"Transpose", {k}, {{"perm", ints_attr({0, 1, 3, 2})}}});
  CHECK(ok1({"Einsum", {q, k}, eq("bhqd,bhkd->bhqk")}).values<float>()
        == ok1({"MatMul", {q, kt}}).values<float>());
}
