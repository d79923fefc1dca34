// The element-wise launchers' argument checks, which throw before any CUDA call and
// so run without a device: operators a type does not have, bad layouts, missing
// buffers, and empty tensors (nothing to do, so nothing is touched).
#include "cuda/convert.hpp"
#include "cuda/elementwise.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace caf_serving::kernels;

namespace {

binary_args add_f32(std::vector<std::int64_t> out, std::vector<std::int64_t> a,
                    std::vector<std::int64_t> b) {
  binary_args args;
  args.op = binary_op::add;
  args.type = dtype::f32;
  args.layout = make_broadcast_layout<2>(out, {a, b});
  return args;
}

} // namespace

TEST_CASE("launch_binary names the operator and type it does not have") {
  auto args = add_f32({4}, {4}, {4});
  args.op = binary_op::logical_and;
  CHECK_THROWS_WITH_AS(launch_binary(args, nullptr),
                       doctest::Contains("And is not defined on f32"), std::invalid_argument);
  args.op = binary_op::pow;
  args.type = dtype::boolean;
  CHECK_THROWS_WITH_AS(launch_binary(args, nullptr),
                       doctest::Contains("Pow is not defined on bool"), std::invalid_argument);
  args.op = binary_op::add;
  args.type = dtype::u8; // only Cast and Where take i8/u8
  CHECK_THROWS_WITH_AS(launch_binary(args, nullptr), doctest::Contains("Add is not defined on u8"),
                       std::invalid_argument);
}

TEST_CASE("launch_binary rejects bad layouts and missing buffers") {
  auto args = add_f32({4}, {4}, {4});
  args.layout.rank = 7;
  CHECK_THROWS_WITH_AS(launch_binary(args, nullptr), doctest::Contains("rank 7"),
                       std::invalid_argument);
  args = add_f32({2, 3}, {2, 3}, {3});
  args.layout.strides[1][1] = -1;
  CHECK_THROWS_WITH_AS(launch_binary(args, nullptr), doctest::Contains("negative"),
                       std::invalid_argument);
  args = add_f32({2, 3}, {2, 3}, {3});
  CHECK_THROWS_WITH_AS(launch_binary(args, nullptr), doctest::Contains("device pointers"),
                       std::invalid_argument);
  // An empty output is nothing to do: no buffers needed, no launch.
  args = add_f32({2, 0, 3}, {2, 0, 3}, {3});
  CHECK_NOTHROW(launch_binary(args, nullptr));
}

TEST_CASE("launch_unary, launch_where and launch_cast check their arguments") {
  unary_args u;
  u.op = unary_op::exp;
  u.type = dtype::i64;
  CHECK_THROWS_WITH_AS(launch_unary(u, nullptr), doctest::Contains("Exp is not defined on i64"),
                       std::invalid_argument);
  u.op = unary_op::logical_not;
  u.type = dtype::f16;
  CHECK_THROWS_WITH_AS(launch_unary(u, nullptr), doctest::Contains("Not is not defined on f16"),
                       std::invalid_argument);
  u.op = unary_op::neg;
  u.count = 5;
  CHECK_THROWS_AS(launch_unary(u, nullptr), std::invalid_argument); // no buffers
  u.count = 0;
  CHECK_NOTHROW(launch_unary(u, nullptr));

  where_args w;
  w.layout = make_broadcast_layout<3>({2, 2}, {std::vector<std::int64_t>{2, 2}, {}, {2, 2}});
  CHECK_THROWS_WITH_AS(launch_where(w, nullptr), doctest::Contains("device pointers"),
                       std::invalid_argument);
  w.layout.rank = 0;
  CHECK_THROWS_AS(launch_where(w, nullptr), std::invalid_argument);

  cast_args c;
  c.from = dtype::i64;
  c.to = dtype::f16;
  c.count = 3;
  CHECK_THROWS_WITH_AS(launch_cast(c, nullptr), doctest::Contains("device pointers"),
                       std::invalid_argument);
  c.count = 0;
  CHECK_NOTHROW(launch_cast(c, nullptr));
}

TEST_CASE("convert still takes only f32 <-> f16/bf16 now that dtype has integer types") {
  convert_args c;
  c.from = dtype::f32;
  c.to = dtype::i64; // before dtype grew, every non-f32 target was taken as f16 or bf16
  CHECK_THROWS_WITH_AS(launch_convert(c, nullptr), doctest::Contains("launch_cast"),
                       std::invalid_argument);
  c.from = dtype::i32;
  c.to = dtype::f32;
  CHECK_THROWS_AS(launch_convert(c, nullptr), std::invalid_argument);
}
