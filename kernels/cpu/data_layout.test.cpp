// Tests of the data-movement and reduction plans and references (cpu/data_layout.hpp,
// cpu/data_reference.hpp) against naive loops over the original, uncollapsed shapes:
// the references run the same plans and index functions as the CUDA kernels, so these
// tests check the GPU's index arithmetic where there is no GPU.
#include "cpu/data_layout.hpp"
#include "cpu/data_reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

using namespace caf_serving::kernels;

namespace {

using bytes = std::vector<std::uint8_t>;

bytes random_bytes(std::size_t n, std::mt19937_64& rng) {
  bytes b(n);
  for (auto& x : b)
    x = static_cast<std::uint8_t>(rng());
  return b;
}

tensor_dims dims_of(std::initializer_list<std::int64_t> d) {
  tensor_dims t;
  for (auto x : d)
    t.dims[t.rank++] = x;
  return t;
}

std::int64_t count_of(const tensor_dims& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d)
    n *= t.dims[d];
  return n;
}

/// Row-major multi-index of `linear` in `t`.
std::vector<std::int64_t> unravel(std::int64_t linear, const tensor_dims& t) {
  std::vector<std::int64_t> idx(t.rank);
  for (int d = t.rank - 1; d >= 0; --d) {
    idx[d] = linear % t.dims[d];
    linear /= t.dims[d];
  }
  return idx;
}

std::int64_t ravel(const std::vector<std::int64_t>& idx, const tensor_dims& t) {
  std::int64_t linear = 0;
  for (int d = 0; d < t.rank; ++d)
    linear = linear * t.dims[d] + idx[d];
  return linear;
}

void copy_element(bytes& dst, std::int64_t to, const bytes& src, std::int64_t from,
                  std::size_t size) {
  std::memcpy(dst.data() + to * size, src.data() + from * size, size);
}

bytes naive_permute(const bytes& in, std::size_t size, const permute_shape& s) {
  tensor_dims in_t, out_t;
  in_t.rank = out_t.rank = s.rank;
  for (int d = 0; d < s.rank; ++d) {
    in_t.dims[d] = s.dims[d];
    out_t.dims[d] = s.dims[s.perm[d]];
  }
  bytes out(in.size());
  for (std::int64_t o = 0; o < count_of(out_t); ++o) {
    auto oi = unravel(o, out_t);
    std::vector<std::int64_t> ii(s.rank);
    for (int d = 0; d < s.rank; ++d)
      ii[s.perm[d]] = oi[d];
    copy_element(out, o, in, ravel(ii, in_t), size);
  }
  return out;
}

permute_shape make_permute(std::initializer_list<std::int64_t> dims,
                           std::initializer_list<int> perm) {
  permute_shape s;
  for (auto d : dims)
    s.dims[s.rank++] = d;
  int i = 0;
  for (auto p : perm)
    s.perm[i++] = p;
  return s;
}

} // namespace

TEST_CASE("permute plans: plain where the innermost dim stays, tiled where it moves") {
  // BERT's head split [B,S,12,64] -> [B,12,S,64]: D stays innermost; 64 f16 = 128 bytes
  // widen to 16-byte vectors.
  auto heads = make_permute({2, 128, 12, 64}, {0, 2, 1, 3});
  auto p = plan_permute(heads, 2, 0, 0);
  CHECK_FALSE(p.tiled);
  CHECK(p.plain.element_size == 16);
  CHECK(p.plain.box.rank == 4); // nothing merges: B, S, H all move relative to each other
  CHECK(p.plain.box.dims[3] == 8);
  // Less aligned pointers take narrower vectors, down to the element itself.
  CHECK(plan_permute(heads, 2, 4, 0).plain.element_size == 4);
  CHECK(plan_permute(heads, 2, 0, 2).plain.element_size == 2);
  // [.., M, N] -> [.., N, M] moves the innermost dim: tiled over M and N, batch = B.
  auto t = plan_permute(make_permute({3, 5, 7}, {0, 2, 1}), 4, 0, 0);
  REQUIRE(t.tiled);
  CHECK(t.tile.a_size == 7);
  CHECK(t.tile.b_size == 5);
  CHECK(t.tile.src_stride_b == 7);
  CHECK(t.tile.dst_stride_a == 5);
  CHECK(t.tile.batch.rank == 1);
  // Dims that stay adjacent merge: [2,3,4,5] -> [2,4,5,3] is [2,3,20] -> [2,20,3].
  auto m = plan_permute(make_permute({2, 3, 4, 5}, {0, 2, 3, 1}), 4, 0, 0);
  REQUIRE(m.tiled);
  CHECK(m.tile.a_size == 20);
  CHECK(m.tile.b_size == 3);
  // Size-1 dims vanish: [1,5,1,7] -> [5,1,7,1] is a plain contiguous copy.
  auto one = plan_permute(make_permute({1, 5, 1, 7}, {1, 0, 3, 2}), 4, 0, 0);
  CHECK_FALSE(one.tiled);
  CHECK(one.plain.box.rank == 1);
}

TEST_CASE("permute reference equals the naive transpose for random shapes and perms") {
  std::mt19937_64 rng(7);
  int tiled = 0, plain = 0;
  for (int trial = 0; trial < 400; ++trial) {
    permute_shape s;
    s.rank = 1 + static_cast<int>(rng() % max_rank);
    for (int d = 0; d < s.rank; ++d)
      s.dims[d] = 1 + static_cast<std::int64_t>(rng() % 5);
    if (trial % 10 == 0)
      s.dims[s.rank - 1] = 37; // a ragged innermost dim bigger than a tile
    std::iota(s.perm, s.perm + s.rank, 0);
    std::shuffle(s.perm, s.perm + s.rank, rng);
    std::size_t size = std::size_t{1} << (rng() % 4);
    std::int64_t n = 1;
    for (int d = 0; d < s.rank; ++d)
      n *= s.dims[d];
    auto in = random_bytes(static_cast<std::size_t>(n) * size, rng);
    auto plan = plan_permute(s, size, 0, 0);
    (plan.tiled ? tiled : plain)++;
    INFO("trial ", trial, " rank ", s.rank, " element size ", size);
    REQUIRE(ref::permute(in, size, s) == naive_permute(in, size, s));
  }
  CHECK(tiled > 50);
  CHECK(plain > 50);
}

TEST_CASE("permute refuses what it cannot do, saying what was wrong") {
  auto s = make_permute({2, 3}, {0, 0});
  CHECK_THROWS_WITH_AS(plan_permute(s, 4, 0, 0), doctest::Contains("not a permutation"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan_permute(make_permute({2, 3}, {1, 0}), 3, 0, 0),
                       doctest::Contains("element size 3"), std::invalid_argument);
  permute_shape big;
  big.rank = 7;
  CHECK_THROWS_WITH_AS(plan_permute(big, 4, 0, 0), doctest::Contains("rank 7"),
                       std::invalid_argument);
}

TEST_CASE("collapse merges adjacent dims and widen needs every stride to divide") {
  strided_box b;
  b.rank = 3;
  std::int64_t dims[] = {4, 1, 6}, src[] = {6, 99, 1}, dst[] = {12, 5, 1};
  std::copy(dims, dims + 3, b.dims);
  std::copy(src, src + 3, b.src_strides);
  std::copy(dst, dst + 3, b.dst_strides);
  auto c = collapse_box(b); // the size-1 dim goes; dst rows of 12 keep two dims
  CHECK(c.rank == 2);
  auto w = widen_box(c, 4, 0, 0); // rows of 6 f32 = 24 bytes: 8-byte vectors
  CHECK(w.element_size == 8);
  CHECK(w.box.dims[1] == 3);
  CHECK(w.box.dst_strides[0] == 6);
  CHECK(widen_box(c, 4, 4, 0).element_size == 4); // a 4-byte-aligned source
  b.dst_strides[0] = 6; // now contiguous on both sides: one dim
  CHECK(collapse_box(b).rank == 1);
}

namespace {

/// Naive ONNX Slice (resolved starts, nonzero steps) of a contiguous tensor.
bytes naive_slice(const bytes& in, std::size_t size, const tensor_dims& in_t,
                  const std::vector<std::int64_t>& starts,
                  const std::vector<std::int64_t>& steps, const tensor_dims& out_t) {
  bytes out(static_cast<std::size_t>(count_of(out_t)) * size);
  for (std::int64_t o = 0; o < count_of(out_t); ++o) {
    auto idx = unravel(o, out_t);
    for (int d = 0; d < in_t.rank; ++d)
      idx[d] = starts[d] + idx[d] * steps[d];
    copy_element(out, o, in, ravel(idx, in_t), size);
  }
  return out;
}

} // namespace

TEST_CASE("slice boxes (steps, negative steps) equal the naive slice") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    tensor_dims in_t, out_t;
    in_t.rank = out_t.rank = 1 + static_cast<int>(rng() % 4);
    std::vector<std::int64_t> starts(in_t.rank), steps(in_t.rank);
    for (int d = 0; d < in_t.rank; ++d) {
      in_t.dims[d] = 1 + static_cast<std::int64_t>(rng() % 9);
      std::int64_t step = static_cast<std::int64_t>(rng() % 3) + 1;
      if (rng() % 2)
        step = -step;
      std::int64_t start = static_cast<std::int64_t>(rng() % in_t.dims[d]);
      // Elements from start in direction step that stay inside the dim.
      std::int64_t room = step > 0 ? (in_t.dims[d] - 1 - start) / step : start / -step;
      starts[d] = start;
      steps[d] = step;
      out_t.dims[d] = 1 + static_cast<std::int64_t>(rng() % (room + 1));
    }
    std::size_t size = std::size_t{1} << (rng() % 4);
    auto in = random_bytes(static_cast<std::size_t>(count_of(in_t)) * size, rng);
    auto box = slice_box(in_t, starts.data(), steps.data(), out_t);
    bytes out(static_cast<std::size_t>(count_of(out_t)) * size, 0xee);
    INFO("trial ", trial);
    REQUIRE(ref::strided_copy(in, out, size, box)
            == naive_slice(in, size, in_t, starts, steps, out_t));
  }
}

TEST_CASE("concat, split, pad and expand boxes equal the naive results") {
  std::mt19937_64 rng(5);
  // GPT-2 / ViT split of a fused QKV projection [B, S, 3E] into three [B, S, E].
  auto qkv = dims_of({2, 5, 3 * 12});
  auto part = dims_of({2, 5, 12});
  auto in = random_bytes(static_cast<std::size_t>(count_of(qkv)) * 2, rng);
  bytes joined(in.size(), 0xee);
  for (std::int64_t k = 0; k < 3; ++k) {
    std::vector<std::int64_t> starts = {0, 0, k * 12}, steps = {1, 1, 1};
    auto split = ref::strided_copy(in, bytes(static_cast<std::size_t>(count_of(part)) * 2), 2,
                                   slice_box(qkv, starts.data(), steps.data(), part));
    REQUIRE(split == naive_slice(in, 2, qkv, starts, steps, part));
    // Concat the parts back in place: the round trip is the identity.
    joined = ref::strided_copy(split, std::move(joined), 2, place_box(part, qkv, starts.data()));
  }
  CHECK(joined == in);

  // Constant pad of [3, 4] by (1, 2) before and (2, 0) after: [6, 6]; 0xee stands for
  // the pad value the output was filled with first.
  auto small = dims_of({3, 4}), padded = dims_of({6, 6});
  auto src = random_bytes(12 * 4, rng);
  std::int64_t before[] = {1, 2};
  auto got = ref::strided_copy(src, bytes(36 * 4, 0xee), 4, place_box(small, padded, before));
  for (std::int64_t r = 0; r < 6; ++r)
    for (std::int64_t c = 0; c < 6; ++c) {
      bool inside = r >= 1 && r < 4 && c >= 2 && c < 6;
      for (std::size_t b = 0; b < 4; ++b) {
        std::uint8_t want = inside ? src[((r - 1) * 4 + (c - 2)) * 4 + b] : 0xee;
        REQUIRE(got[(r * 6 + c) * 4 + b] == want);
      }
    }

  // Expand [3, 1] -> [2, 3, 5] (numpy broadcasting): source strides 0.
  auto e_in = dims_of({3, 1}), e_out = dims_of({2, 3, 5});
  auto e_src = random_bytes(3 * 8, rng);
  auto e_box = expand_box(e_in, e_out);
  CHECK(e_box.src_strides[0] == 0);
  CHECK(e_box.src_strides[2] == 0);
  auto expanded = ref::strided_copy(e_src, bytes(30 * 8), 8, e_box);
  for (std::int64_t i = 0; i < 30; ++i) {
    auto idx = unravel(i, e_out);
    REQUIRE(std::memcmp(expanded.data() + i * 8, e_src.data() + idx[1] * 8, 8) == 0);
  }
  CHECK_THROWS_WITH_AS(expand_box(dims_of({3}), dims_of({2, 4})),
                       doctest::Contains("does not broadcast"), std::invalid_argument);
}

TEST_CASE("strided copy refuses boxes that leave their buffers or write twice") {
  strided_box b;
  b.rank = 1;
  b.dims[0] = 4;
  b.src_strides[0] = -1;
  b.dst_strides[0] = 1;
  b.src_offset = 2; // reaches element -1
  CHECK_THROWS_WITH_AS(check_box(b, 4, 0, 0, "strided_copy"),
                       doctest::Contains("before the buffer's start"), std::invalid_argument);
  b.src_offset = 3;
  CHECK_NOTHROW(check_box(b, 4, 4, 4, "strided_copy"));
  CHECK_THROWS_WITH_AS(check_box(b, 4, 4, 3, "strided_copy"),
                       doctest::Contains("past the 3 elements"), std::invalid_argument);
  b.dst_strides[0] = 0;
  CHECK_THROWS_WITH_AS(check_box(b, 4, 0, 0, "strided_copy"),
                       doctest::Contains("destination stride 0"), std::invalid_argument);
}

TEST_CASE("gather along any axis, negative indices, zeros and a flag out of range") {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    tensor_dims data_t;
    data_t.rank = 1 + static_cast<int>(rng() % 4);
    for (int d = 0; d < data_t.rank; ++d)
      data_t.dims[d] = 1 + static_cast<std::int64_t>(rng() % 6);
    int axis = static_cast<int>(rng() % data_t.rank);
    int onnx_axis = rng() % 2 ? axis - data_t.rank : axis; // negative axes too
    std::int64_t count = static_cast<std::int64_t>(rng() % 7);
    std::int64_t dim = data_t.dims[axis];
    bool with_bad = trial % 4 == 0;
    std::vector<std::int64_t> indices(count);
    for (auto& i : indices)
      i = static_cast<std::int64_t>(rng() % (2 * dim)) - dim; // [-dim, dim)
    if (with_bad && count > 0)
      indices[rng() % count] = rng() % 2 ? dim : -dim - 1;
    std::size_t size = std::size_t{1} << (rng() % 4);
    auto data = random_bytes(static_cast<std::size_t>(count_of(data_t)) * size, rng);
    auto g = make_gather_shape(data_t.rank, data_t.dims, onnx_axis, count);
    auto got = ref::gather_axis(data, size, g, indices);
    // Naive: output dims data[:axis] + [count] + data[axis+1:].
    tensor_dims out_t = data_t;
    out_t.dims[axis] = count;
    bytes want(static_cast<std::size_t>(count_of(out_t)) * size, 0);
    bool bad = false;
    for (std::int64_t o = 0; o < count_of(out_t); ++o) {
      auto idx = unravel(o, out_t);
      std::int64_t i = indices[idx[axis]];
      if (i < -dim || i >= dim) {
        bad = true;
        continue;
      }
      idx[axis] = i < 0 ? i + dim : i;
      copy_element(want, o, data, ravel(idx, data_t), size);
    }
    INFO("trial ", trial, " axis ", onnx_axis, " count ", count);
    REQUIRE(got.output == want);
    CHECK(got.out_of_range == bad);
  }
  CHECK(resolve_index(-1, 5) == 4);
  CHECK(resolve_index(5, 5) == -1);
  CHECK(resolve_index(-6, 5) == -1);
  std::int64_t d[] = {4, 5};
  CHECK_THROWS_WITH_AS(make_gather_shape(2, d, 2, 1), doctest::Contains("axis 2 is outside"),
                       std::invalid_argument);
}

TEST_CASE("reduce shapes: adjacent axes normalise to [outer, reduced, inner]") {
  std::int64_t nchw[] = {2, 16, 7, 7};
  int hw[] = {2, 3};
  auto se = make_reduce_shape(4, nchw, hw, 2); // SE block / GlobalAveragePool
  CHECK(se.outer == 32);
  CHECK(se.reduced == 49);
  CHECK(se.inner == 1);
  int c[] = {-3};
  auto channel = make_reduce_shape(4, nchw, c, 1);
  CHECK(channel.outer == 2);
  CHECK(channel.reduced == 16);
  CHECK(channel.inner == 49);
  std::int64_t with_ones[] = {3, 1, 4, 1, 5};
  int skip_one[] = {0, 2}; // adjacent once the size-1 dim is ignored
  auto s = make_reduce_shape(5, with_ones, skip_one, 2);
  CHECK(s.outer == 1);
  CHECK(s.reduced == 12);
  CHECK(s.inner == 5);
  auto none = make_reduce_shape(4, nchw, nullptr, 0);
  CHECK(none.reduced == 1);
  CHECK(none.outer == 2 * 16 * 49);
  int apart[] = {1, 3};
  CHECK_THROWS_WITH_AS(make_reduce_shape(4, nchw, apart, 2),
                       doctest::Contains("must be adjacent"), std::invalid_argument);
  int twice[] = {1, -3};
  CHECK_THROWS_WITH_AS(make_reduce_shape(4, nchw, twice, 2), doctest::Contains("twice"),
                       std::invalid_argument);
}

TEST_CASE("reduce reference equals the naive reduction of every op") {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::int64_t dims[] = {3, 4, 5, 2};
  int axes[] = {1, 2};
  auto s = make_reduce_shape(4, dims, axes, 2);
  REQUIRE(s.outer == 3);
  REQUIRE(s.reduced == 20);
  REQUIRE(s.inner == 2);
  std::vector<float> x(120);
  for (auto& v : x)
    v = dist(rng);
  for (auto op : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min,
                  reduce_op::prod, reduce_op::sum_square, reduce_op::l2}) {
    auto got = ref::reduce(x, s, op);
    INFO(reduce_op_name(op));
    for (int a = 0; a < 3; ++a)
      for (int w = 0; w < 2; ++w) {
        double sum = 0, sq = 0, prod = 1, mx = -1e30, mn = 1e30;
        for (int b = 0; b < 4; ++b)
          for (int c = 0; c < 5; ++c) {
            double v = x[((a * 4 + b) * 5 + c) * 2 + w];
            sum += v;
            sq += v * v;
            prod *= v;
            mx = std::max(mx, v);
            mn = std::min(mn, v);
          }
        double want = op == reduce_op::sum          ? sum
                      : op == reduce_op::mean       ? sum / 20
                      : op == reduce_op::max        ? mx
                      : op == reduce_op::min        ? mn
                      : op == reduce_op::prod       ? prod
                      : op == reduce_op::sum_square ? sq
                                                    : std::sqrt(sq);
        CHECK(got[a * 2 + w] == doctest::Approx(want).epsilon(1e-6));
      }
  }
  // NaN propagates through max and min, as in numpy and ONNX Runtime.
  std::vector<float> with_nan = {1.0f, NAN, 3.0f};
  CHECK(std::isnan(ref::reduce(with_nan, {1, 3, 1}, reduce_op::max)[0]));
  CHECK(std::isnan(ref::reduce(with_nan, {1, 3, 1}, reduce_op::min)[0]));
  // An empty reduction gives the identity.
  CHECK(ref::reduce({}, {2, 0, 1}, reduce_op::prod) == std::vector<float>{1.0f, 1.0f});
}
