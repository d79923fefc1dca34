// Structural checks of the data-movement and reduction cases, without a GPU: every
// sweep and bench size is one the launchers accept, the strided-copy cases' boxes stay
// inside their buffers and cover their outputs, the reductions stay within what their
// tolerances assume, and the target models' shapes are in the table.
#include "check/kernel_cases.hpp"
#include "cpu/data_reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace caf_serving::kernels;

namespace {

bool has(const std::vector<case_size>& sizes, std::vector<std::int64_t> shape,
         std::vector<std::int64_t> params) {
  return std::any_of(sizes.begin(), sizes.end(), [&](const case_size& s) {
    return s.shape == shape && s.params == params;
  });
}

std::vector<case_size> all_sizes(const kernel_case& c) {
  auto sizes = c.sweep;
  sizes.insert(sizes.end(), c.bench.begin(), c.bench.end());
  return sizes;
}

} // namespace

TEST_CASE("every data case size is accepted by the plans the launchers run") {
  int checked = 0;
  for (const auto& c : kernel_cases()) {
    for (const auto& s : all_sizes(c)) {
      INFO(c.name, " at ", describe_data(s));
      auto rank = static_cast<int>(s.shape.size());
      switch (c.operation) {
        case op::permute: {
          REQUIRE(s.params.size() == s.shape.size());
          permute_shape p;
          p.rank = rank;
          for (int d = 0; d < rank; ++d) {
            p.dims[d] = s.shape[d];
            p.perm[d] = static_cast<int>(s.params[d]);
          }
          CHECK_NOTHROW(plan_permute(p, c.data.element_bytes, 0, 0));
          break;
        }
        case op::strided_copy: {
          auto plan = plan_copy_case(c, s);
          std::int64_t covered = 0;
          for (const auto& b : plan.boxes) {
            strided_box whole = b.box;
            whole.src_offset += b.src_at;
            whole.dst_offset += b.dst_at;
            CHECK_NOTHROW(check_box(whole, c.data.element_bytes, plan.src_elements,
                                    plan.dst_elements, "case"));
            covered += box_count(b.box);
          }
          if (c.data.pattern == copy_pattern::pad)
            CHECK(covered < plan.dst_elements);
          else
            CHECK(covered == plan.dst_elements); // every output element written
          break;
        }
        case op::gather_axis: {
          std::int64_t count = 1;
          for (std::size_t k = 1; k < s.params.size(); ++k)
            count *= s.params[k];
          CHECK_NOTHROW(make_gather_shape(rank, s.shape.data(), static_cast<int>(s.params[0]),
                                          count));
          break;
        }
        case op::reduce: {
          std::vector<int> axes(s.params.begin(), s.params.end());
          auto r = make_reduce_shape(rank, s.shape.data(), axes.data(),
                                     static_cast<int>(axes.size()));
          CHECK(r.reduced <= 8192); // what the tolerances were worked out for
          break;
        }
        default:
          continue;
      }
      ++checked;
    }
  }
  CHECK(checked > 100);
}

TEST_CASE("the strided-copy cases' references move what the patterns say") {
  // Concat then Split of the same parts is the identity: the two patterns' boxes and
  // the reference agree with each other on the QKV shapes.
  kernel_case concat, split;
  concat.data.pattern = copy_pattern::concat;
  split.data.pattern = copy_pattern::split;
  concat.data.element_bytes = split.data.element_bytes = 2;
  case_size s;
  s.shape = {2, 7, 36};
  s.params = {2, 12, 12, 12};
  auto joined_plan = plan_copy_case(concat, s);
  auto split_plan = plan_copy_case(split, s);
  std::vector<std::uint8_t> parts(static_cast<std::size_t>(joined_plan.src_elements) * 2);
  for (std::size_t i = 0; i < parts.size(); ++i)
    parts[i] = static_cast<std::uint8_t>(i * 7 + 3);
  std::vector<std::uint8_t> joined(parts.size(), 0xff);
  for (const auto& b : joined_plan.boxes) {
    strided_box whole = b.box;
    whole.src_offset += b.src_at;
    whole.dst_offset += b.dst_at;
    joined = ref::strided_copy(parts, std::move(joined), 2, whole);
  }
  std::vector<std::uint8_t> again(parts.size(), 0xff);
  for (const auto& b : split_plan.boxes) {
    strided_box whole = b.box;
    whole.src_offset += b.src_at;
    whole.dst_offset += b.dst_at;
    again = ref::strided_copy(joined, std::move(again), 2, whole);
  }
  CHECK(again == parts);
  CHECK(joined != parts); // the concat interleaves the parts per row
}

TEST_CASE("the table holds the target models' data-movement shapes") {
  bool head_split = false, k_transpose = false, qkv_split = false, causal_mask = false,
       embeddings = false, se_mean = false, layer_norm_mean = false, out_of_range = false;
  for (const auto& c : kernel_cases()) {
    auto sizes = all_sizes(c);
    head_split = head_split || (c.operation == op::permute
                                && has(sizes, {2, 128, 12, 64}, {0, 2, 1, 3}));
    k_transpose = k_transpose || (c.operation == op::permute
                                  && has(sizes, {2, 12, 100, 64}, {0, 1, 3, 2}));
    qkv_split = qkv_split || (c.operation == op::strided_copy
                              && c.data.pattern == copy_pattern::split
                              && has(sizes, {2, 197, 2304}, {2, 768, 768, 768}));
    causal_mask = causal_mask || (c.operation == op::strided_copy && c.data.element_bytes == 1
                                  && c.data.pattern == copy_pattern::slice);
    embeddings = embeddings || (c.operation == op::gather_axis
                                && has(sizes, {30522, 768}, {0, 2, 128}));
    se_mean = se_mean || (c.operation == op::reduce && c.data.reduce == reduce_op::mean
                          && has(sizes, {2, 16, 7, 7}, {2, 3}));
    layer_norm_mean = layer_norm_mean || (c.operation == op::reduce
                                          && has(sizes, {4, 64, 768}, {2}));
    out_of_range = out_of_range || (c.operation == op::gather_axis && c.data.out_of_range);
  }
  CHECK(head_split);
  CHECK(k_transpose);
  CHECK(qkv_split);
  CHECK(causal_mask);
  CHECK(embeddings);
  CHECK(se_mean);
  CHECK(layer_norm_mean);
  CHECK(out_of_range);
}
