// Structural checks of the kernel table, which run without a GPU: every case is
// checked somewhere ragged, has a justified tolerance, and the table covers every op.
#include "check/kernel_cases.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace caf_serving::kernels;

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
  CHECK(ops.size() == 12);
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
