// Structural checks of the kernel table, which run without a GPU: every case is
// checked somewhere ragged, has a justified tolerance, and the table covers every op.
#include "check/kernel_cases.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>

using namespace caf_serving::kernels;

namespace {

bool is_elementwise(op o) {
  return o == op::binary || o == op::unary || o == op::where || o == op::cast;
}

std::int64_t element_count_of(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims)
    n *= d;
  return n;
}

} // namespace

TEST_CASE("every case has a unique name, sizes, and a tolerance with a reason") {
  std::set<std::string> names;
  for (const auto& c : kernel_cases()) {
    INFO(c.name);
    CHECK(names.insert(c.name).second);
    CHECK(!c.sweep.empty());
    CHECK(c.why.size() > 10);
    CHECK(c.tol.abs >= 0);
    CHECK(c.tol.rel >= 0);
    bool exact = c.operation == op::gather || c.operation == op::scatter
                 || c.operation == op::convert || c.operation == op::permute
                 || c.operation == op::strided_copy || c.operation == op::gather_axis;
    if (is_elementwise(c.operation)) // exact where the why says so (see kernel_cases_elementwise.cpp)
      exact = c.why.rfind("exact", 0) == 0;
    CHECK(exact == (c.tol.abs == 0 && c.tol.rel == 0));
  }
}

TEST_CASE("every case includes a size that does not divide the vector width or tile") {
  for (const auto& c : kernel_cases()) {
    INFO(c.name);
    bool ragged = false;
    for (const auto& s : c.sweep) {
      switch (c.operation) {
        case op::attention:
          ragged = ragged || s.seq % 64 != 0;
          break;
        case op::convert:
          ragged = ragged || s.rows % 8 != 0;
          break;
        case op::epilogue:
          ragged = ragged || (s.rows * s.cols * s.inner) % 8 != 0;
          break;
        case op::binary:
        case op::unary:
        case op::where:
        case op::cast:
          ragged = ragged || element_count_of(pattern_shapes(c, s).output) % 8 != 0;
          break;
        case op::permute:
        case op::strided_copy:
        case op::gather_axis:
        case op::reduce:
          ragged = ragged || s.shape.back() % 8 != 0 || s.params.back() % 8 != 0;
          break;
        default:
          ragged = ragged || s.cols % 8 != 0;
      }
    }
    CHECK(ragged);
  }
}

TEST_CASE("the table covers every op, datatype of the issue, and the benchmark targets") {
  std::set<op> ops;
  std::set<std::pair<op, dtype>> typed;
  bool attention_128 = false, attention_512 = false, padded = false;
  for (const auto& c : kernel_cases()) {
    ops.insert(c.operation);
    typed.insert({c.operation, c.type});
    if (c.operation == op::attention) {
      padded = padded || c.padded;
      for (const auto& s : c.bench) {
        attention_128 = attention_128 || s.seq == 128;
        attention_512 = attention_512 || s.seq == 512;
      }
    }
  }
  CHECK(ops.size() == 16);
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    CHECK(typed.count({op::epilogue, t}) == 1);
    CHECK(typed.count({op::add_layer_norm, t}) == 1);
    CHECK(typed.count({op::softmax, t}) == 1);
  }
  CHECK(typed.count({op::attention, dtype::f16}) == 1);
  CHECK(typed.count({op::attention, dtype::bf16}) == 1);
  CHECK(attention_128);
  CHECK(attention_512);
  CHECK(padded);
}

TEST_CASE("the fused attention cases cover the graphs' masks, head dimensions and layout") {
  // What the executor's FusedAttention step launches at half storage (issue 20):
  // each mask shape at f16 and bf16, MiniLM's head dimension 32, an f32 mask, the
  // [B, S, H*D] layout, and a fully masked row (batch row 1) in every masked case.
  std::set<std::pair<attention_mask_shape, dtype>> masks;
  std::set<int> head_dims;
  bool f32_mask = false;
  for (const auto& c : kernel_cases()) {
    if (c.operation != op::attention || c.attention_mask == attention_mask_shape::none)
      continue;
    INFO(c.name);
    masks.insert({c.attention_mask, c.type});
    head_dims.insert(c.head_dim);
    f32_mask = f32_mask || c.attention_mask_type == dtype::f32;
    CHECK((c.attention_mask_type == dtype::f32 || c.attention_mask_type == c.type));
    CHECK(c.heads_interleaved);
    bool fully_masked_row = false;
    for (const auto& s : c.sweep)
      fully_masked_row = fully_masked_row || s.batch >= 2;
    CHECK(fully_masked_row);
  }
  for (dtype t : {dtype::f16, dtype::bf16})
    for (auto m : {attention_mask_shape::padding, attention_mask_shape::padding_causal}) {
      CAPTURE(static_cast<int>(m));
      CHECK(masks.count({m, t}) == 1);
    }
  CHECK(masks.count({attention_mask_shape::causal, dtype::f16}) == 1);
  CHECK(head_dims == std::set<int>{32, 64, 128});
  CHECK(f32_mask);
}

TEST_CASE("the element-wise cases cover every operator, type, cast pair and broadcast") {
  std::set<std::pair<binary_op, dtype>> binary;
  std::set<binary_op> binary_ops;
  std::set<unary_op> unary_ops;
  std::set<std::pair<unary_op, dtype>> unary;
  std::set<dtype> where_types;
  std::set<std::pair<dtype, dtype>> casts;
  std::set<broadcast_pattern> patterns;
  for (const auto& c : kernel_cases()) {
    if (!is_elementwise(c.operation))
      continue;
    INFO(c.name);
    const auto& e = c.elementwise;
    if (c.operation == op::binary) {
      CHECK(binary_supported(e.binary, c.type));
      binary.insert({e.binary, c.type});
      binary_ops.insert(e.binary);
      patterns.insert(e.pattern);
    } else if (c.operation == op::unary) {
      CHECK(unary_supported(e.unary, c.type));
      if (e.unary == unary_op::clip) // finite bounds, or Clip is checked as Identity
        CHECK((std::isfinite(e.params.lo) && std::isfinite(e.params.hi)));
      if (e.unary == unary_op::leaky_relu || e.unary == unary_op::hard_sigmoid)
        CHECK(e.params.alpha != 0);
      unary.insert({e.unary, c.type});
      unary_ops.insert(e.unary);
    } else if (c.operation == op::where) {
      where_types.insert(c.type);
      patterns.insert(e.pattern);
    } else {
      casts.insert({c.type, c.convert_to});
    }
    for (const auto& s : c.sweep) { // every pattern's shapes broadcast to its output
      auto shapes = pattern_shapes(c, s);
      std::size_t operands = c.operation == op::binary ? 2 : c.operation == op::where ? 3 : 1;
      REQUIRE(shapes.operands.size() == operands);
      if (operands == 2)
        CHECK(broadcast_shape({shapes.operands[0], shapes.operands[1]}) == shapes.output);
      if (operands == 3)
        CHECK(broadcast_shape({shapes.operands[0], shapes.operands[1], shapes.operands[2]})
              == shapes.output);
    }
  }
  CHECK(binary_ops.size() == 15);
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    CHECK(binary.count({binary_op::add, t}) == 1);
    CHECK(binary.count({binary_op::mul, t}) == 1);
    CHECK(binary.count({binary_op::div, t}) == 1);
    CHECK(binary.count({binary_op::pow, t}) == 1);
  }
  for (dtype t : {dtype::i64, dtype::i32, dtype::boolean}) {
    bool any = false;
    for (const auto& [o, bt] : binary)
      any = any || bt == t;
    CHECK(any);
  }
  CHECK(unary_ops.size() == 26);
  for (const auto& [o, t] : unary)
    if (t == dtype::f32 && o != unary_op::identity)
      CHECK(unary.count({o, dtype::f16}) == 1);
  CHECK(where_types.size() >= 6);
  CHECK(casts.size() == 8 * 7);
  CHECK(patterns.size() == 10);
}

TEST_CASE("the epilogue is checked with every activation, and with the residual on both sides") {
  std::set<activation> acts;
  bool residual_after = false, residual_first = false;
  for (const auto& c : kernel_cases()) {
    if (c.operation != op::epilogue) continue;
    acts.insert(c.act);
    residual_after = residual_after || (c.residual && !c.residual_first);
    residual_first = residual_first || (c.residual && c.residual_first);
  }
  for (activation a : {activation::none, activation::relu, activation::gelu_erf,
                       activation::gelu_tanh, activation::tanh, activation::sigmoid,
                       activation::clip, activation::hard_swish, activation::hard_sigmoid,
                       activation::swish, activation::leaky_relu}) {
    INFO(static_cast<int>(a));
    CHECK(acts.count(a) == 1);
  }
  CHECK(residual_after);
  CHECK(residual_first);
}

TEST_CASE("the softmax is checked with additive masks stored in f16 and bf16") {
  std::set<std::pair<dtype, softmax_mask_shape>> half_masks;
  for (const auto& c : kernel_cases()) {
    if (c.mask_type == dtype::f32) continue;
    INFO(c.name);
    // The launcher takes an additive mask of f32 or the scores' own type only.
    CHECK(c.operation == op::softmax);
    CHECK(c.mask == mask_kind::additive);
    CHECK(c.mask_type == c.type);
    half_masks.insert({c.type, c.mask_shape});
  }
  for (dtype t : {dtype::f16, dtype::bf16}) {
    INFO(dtype_name(t));
    bool rows = false, scores = false; // a row mask, and one read through strides
    for (const auto& [type, shape] : half_masks)
      if (type == t) (shape == softmax_mask_shape::rows ? rows : scores) = true;
    CHECK(rows);
    CHECK(scores);
  }
}
