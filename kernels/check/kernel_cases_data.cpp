#include "check/kernel_cases_data.hpp"

#include "check/kernel_cases.hpp"

namespace caf_serving::kernels {

const char* copy_pattern_name(copy_pattern p) {
  switch (p) {
    case copy_pattern::slice:
      return "slice";
    case copy_pattern::split:
      return "split";
    case copy_pattern::concat:
      return "concat";
    case copy_pattern::expand:
      return "expand";
    case copy_pattern::pad:
      return "pad";
  }
  return "?";
}

std::string describe_data(const case_size& s) {
  std::string out;
  for (auto d : s.shape)
    out += (out.empty() ? "" : "x") + std::to_string(d);
  out += " [";
  for (std::size_t i = 0; i < s.params.size(); ++i)
    out += (i ? "," : "") + std::to_string(s.params[i]);
  return out + "]";
}

namespace {

tensor_dims dims_of(const std::vector<std::int64_t>& v) {
  tensor_dims t;
  for (auto d : v)
    t.dims[t.rank++] = d;
  return t;
}

std::int64_t count_of(const tensor_dims& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d)
    n *= t.dims[d];
  return n;
}

} // namespace

copy_case_boxes plan_copy_case(const kernel_case& c, const case_size& s) {
  copy_case_boxes out;
  auto rank = static_cast<int>(s.shape.size());
  auto p = [&](std::size_t i) { return s.params.at(i); };
  switch (c.data.pattern) {
    case copy_pattern::slice: {
      tensor_dims in = dims_of(s.shape), sliced;
      std::vector<std::int64_t> starts(rank), steps(rank);
      sliced.rank = rank;
      for (int d = 0; d < rank; ++d) {
        starts[d] = p(d);
        steps[d] = p(rank + d);
        sliced.dims[d] = p(2 * rank + d);
      }
      out.boxes.push_back({0, 0, slice_box(in, starts.data(), steps.data(), sliced)});
      out.src_elements = count_of(in);
      out.dst_elements = count_of(sliced);
      break;
    }
    case copy_pattern::split:
    case copy_pattern::concat: {
      // Split: shape is the input, each part a slice into its own output.
      // Concat: shape is the output, each part an input placed at its offset.
      bool split = c.data.pattern == copy_pattern::split;
      tensor_dims whole = dims_of(s.shape);
      auto axis = static_cast<int>(p(0) < 0 ? p(0) + rank : p(0));
      std::int64_t at = 0, part_at = 0;
      for (std::size_t k = 1; k < s.params.size(); ++k) {
        tensor_dims part = whole;
        part.dims[axis] = p(k);
        std::vector<std::int64_t> starts(rank, 0), steps(rank, 1);
        starts[axis] = at;
        if (split)
          out.boxes.push_back({0, part_at, slice_box(whole, starts.data(), steps.data(), part)});
        else
          out.boxes.push_back({part_at, 0, place_box(part, whole, starts.data())});
        at += p(k);
        part_at += count_of(part);
      }
      out.src_elements = split ? count_of(whole) : part_at;
      out.dst_elements = split ? part_at : count_of(whole);
      break;
    }
    case copy_pattern::expand: {
      tensor_dims to = dims_of(s.shape), from = dims_of(s.params);
      out.boxes.push_back({0, 0, expand_box(from, to)});
      out.src_elements = count_of(from);
      out.dst_elements = count_of(to);
      break;
    }
    case copy_pattern::pad: {
      tensor_dims in = dims_of(s.shape), padded = in;
      std::vector<std::int64_t> before(rank);
      for (int d = 0; d < rank; ++d) {
        before[d] = p(d);
        padded.dims[d] += p(d) + p(rank + d);
      }
      out.boxes.push_back({0, 0, place_box(in, padded, before.data())});
      out.src_elements = count_of(in);
      out.dst_elements = count_of(padded);
      std::size_t size = c.data.element_bytes;
      out.pad_value = size == 1 ? 0x7f : size == 2 ? 0x3c00 : 0x3f800000;
      break;
    }
  }
  return out;
}

namespace {

case_size nd(std::vector<std::int64_t> shape, std::vector<std::int64_t> params) {
  case_size s;
  s.shape = std::move(shape);
  s.params = std::move(params);
  return s;
}

constexpr const char* exact_why = "exact: a copy of the bytes";

kernel_case data_op(std::string name, op o, std::size_t element_bytes) {
  kernel_case c;
  c.name = std::move(name);
  c.operation = o;
  c.data.element_bytes = element_bytes;
  c.tol = {0, 0};
  c.why = exact_why;
  return c;
}

void append_permutes(std::vector<kernel_case>& t) {
  // Plain (innermost dim stays): BERT's head split and merge, ragged dims, rank 6.
  // Tiled (innermost dim moves): K transposed for Q·Kᵀ, NCHW <-> NHWC, a 2-D matrix
  // that does not divide the 32x32 tile, 3-D with a batch, rank 5.
  std::vector<case_size> sweep = {
    nd({7}, {0}),
    nd({2, 128, 12, 64}, {0, 2, 1, 3}),   // [B,S,H,D] -> [B,H,S,D]
    nd({2, 12, 128, 64}, {0, 2, 1, 3}),   // and back
    nd({3, 5, 7, 9, 2, 3}, {5, 0, 2, 1, 4, 3}),
    nd({2, 12, 100, 64}, {0, 1, 3, 2}),   // Kᵀ with a ragged sequence
    nd({2, 3, 17, 33}, {0, 2, 3, 1}),     // NCHW -> NHWC
    nd({2, 17, 33, 3}, {0, 3, 1, 2}),     // NHWC -> NCHW
    nd({65, 1000}, {1, 0}),
    nd({1, 4, 1, 37, 5}, {3, 1, 4, 0, 2}),
  };
  for (std::size_t bytes : {1, 2, 4, 8}) {
    auto c = data_op("permute " + std::to_string(8 * bytes) + "-bit", op::permute, bytes);
    c.sweep = sweep;
    if (bytes == 2)
      c.bench = {nd({64, 512, 12, 64}, {0, 2, 1, 3}),  // plain, 50 MB
                 nd({64, 12, 512, 64}, {0, 1, 3, 2})}; // tiled Kᵀ
    if (bytes == 4)
      c.bench = {nd({8192, 4096}, {1, 0})}; // tiled, 128 MB
    t.push_back(c);
  }
}

void append_strided_copies(std::vector<kernel_case>& t) {
  auto slice = data_op("strided_copy slice 16-bit", op::strided_copy, 2);
  slice.data.pattern = copy_pattern::slice;
  // params: starts, steps, output dims.
  slice.sweep = {
    nd({5}, {1, 2, 2}),
    nd({9, 13}, {8, 12, -1, -1, 9, 13}),        // both axes reversed
    nd({4, 7, 30}, {1, 0, 29, 2, 3, -3, 2, 3, 10}), // steps 2, 3 and -3
    nd({1, 1, 1024, 1024}, {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 77, 77}), // GPT-2's causal mask
    nd({3, 128, 768}, {0, 0, 0, 1, 1, 1, 3, 1, 768}), // BERT's CLS token
  };
  slice.bench = {nd({64, 512, 2304}, {0, 0, 768, 1, 1, 1, 64, 512, 768})};
  t.push_back(slice);

  auto mask = data_op("strided_copy slice 8-bit mask", op::strided_copy, 1);
  mask.sweep = {nd({1, 1, 1024, 1024}, {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 128, 128}),
                nd({1, 1, 1024, 1024}, {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 33, 33})};
  t.push_back(mask);

  auto split = data_op("strided_copy split 32-bit", op::strided_copy, 4);
  split.data.pattern = copy_pattern::split;
  // ViT and GPT-2 split their fused QKV projection [B, S, 3E] on the last axis.
  split.sweep = {nd({3}, {0, 1, 1, 1}), nd({2, 197, 2304}, {2, 768, 768, 768}),
                 nd({2, 77, 2304}, {-1, 768, 768, 768}), nd({5, 7, 11}, {1, 2, 4, 1}),
                 nd({3, 21}, {1, 5, 9, 7})};
  split.bench = {nd({64, 512, 2304}, {2, 768, 768, 768})};
  t.push_back(split);

  auto concat = data_op("strided_copy concat 16-bit", op::strided_copy, 2);
  concat.data.pattern = copy_pattern::concat;
  concat.sweep = {nd({2, 3}, {1, 1, 2}), nd({2, 197, 768}, {1, 1, 196}), // ViT's class token
                  nd({2, 24, 7, 7}, {1, 8, 16}), nd({3, 5, 19}, {2, 3, 7, 9})};
  concat.bench = {nd({64, 512, 2304}, {2, 768, 768, 768})};
  t.push_back(concat);

  auto expand = data_op("strided_copy expand 32-bit", op::strided_copy, 4);
  expand.data.pattern = copy_pattern::expand;
  // params: the input's dims.
  expand.sweep = {nd({4}, {1}), nd({2, 3, 5}, {3, 1}), nd({8, 12, 128, 128}, {8, 1, 1, 128}),
                  nd({2, 7, 9}, {7, 9})};
  expand.bench = {nd({16, 12, 512, 512}, {16, 1, 1, 512})}; // an attention mask, 200 MB
  t.push_back(expand);

  auto pad = data_op("strided_copy pad 32-bit", op::strided_copy, 4);
  pad.data.pattern = copy_pattern::pad;
  // params: pads before, pads after.
  pad.sweep = {nd({3}, {1, 2}), nd({2, 3, 15, 15}, {0, 0, 1, 1, 0, 0, 1, 1}),
               nd({1, 3, 7, 9}, {0, 1, 2, 0, 0, 0, 1, 3})};
  pad.bench = {nd({32, 64, 112, 112}, {0, 0, 1, 1, 0, 0, 1, 1})};
  t.push_back(pad);

  auto pad8 = data_op("strided_copy pad 8-bit", op::strided_copy, 1);
  pad8.data.pattern = copy_pattern::pad;
  pad8.sweep = {nd({5, 33}, {2, 3, 1, 4})};
  t.push_back(pad8);
}

void append_gathers(std::vector<kernel_case>& t) {
  // params: axis, then the indices' dims.
  auto embed = data_op("gather_axis embeddings f32 i64", op::gather_axis, 4);
  embed.sweep = {nd({30522, 768}, {0, 2, 128}), nd({512, 768}, {0, 1, 77}),
                 nd({10, 3}, {0, 5}), nd({7}, {0, 1})};
  embed.bench = {nd({30522, 768}, {0, 256, 128})};
  t.push_back(embed);

  auto embed16 = data_op("gather_axis embeddings f16 i32", op::gather_axis, 2);
  embed16.data.indices = index_type::i32;
  embed16.sweep = {nd({30522, 768}, {0, 8, 128}), nd({50257, 768}, {0, 1, 33}),
                   nd({100, 13}, {0, 3, 3})};
  embed16.bench = {nd({30522, 768}, {0, 256, 128})};
  t.push_back(embed16);

  auto axes = data_op("gather_axis other axes 8-byte", op::gather_axis, 8);
  axes.sweep = {nd({3, 5, 7}, {1, 4}), nd({3, 5, 7}, {-1, 2, 2}), nd({4, 6}, {1}),
                nd({2, 197, 768}, {1, 1})}; // ViT's class token out of the sequence
  t.push_back(axes);

  auto bad = data_op("gather_axis out of range 16-bit i32", op::gather_axis, 2);
  bad.data.indices = index_type::i32;
  bad.data.out_of_range = true;
  bad.sweep = {nd({50, 64}, {0, 9}), nd({3, 50, 5}, {1, 17})};
  t.push_back(bad);
}

void append_reductions(std::vector<kernel_case>& t) {
  // params: axes. Paths: inner == 1 by warps (scalar and 16-byte loads), by blocks
  // (rows >= 4096), and inner > 1 by columns.
  std::vector<case_size> sweep = {
    nd({1}, {0}),
    nd({7, 33}, {1}),
    nd({2, 16, 7, 7}, {2, 3}),  // squeeze-excite / GlobalAveragePool: 49 per row
    nd({4, 64, 768}, {2}),      // LayerNorm-style mean over the hidden size
    nd({3, 5000}, {1}),         // a block per row, ragged
    nd({2, 8192}, {-1}),        // a block per row, 16-byte loads
    nd({2, 96, 5, 5}, {1}),     // over channels: 25 columns
    nd({3, 130, 40}, {0, 1}),   // outer 1, 390 reduced, 40 columns
    nd({5, 3, 1, 4}, {1, 2}),   // a reduced size-1 dim
  };
  struct variant {
    reduce_op op;
    dtype type;
    std::vector<case_size> bench;
  };
  std::vector<variant> variants = {
    {reduce_op::sum, dtype::f32, {}},
    {reduce_op::mean, dtype::f16,
     {nd({128, 960, 14, 14}, {2, 3}), nd({65536, 768}, {1}), nd({64, 768, 1024}, {1})}},
    {reduce_op::mean, dtype::bf16, {}},
    {reduce_op::max, dtype::f32, {}},
    {reduce_op::min, dtype::f16, {}},
    {reduce_op::prod, dtype::f32, {}},
    {reduce_op::sum_square, dtype::bf16, {}},
    {reduce_op::l2, dtype::f32, {}},
    {reduce_op::sum, dtype::f16, {}},
  };
  for (const auto& v : variants) {
    kernel_case c;
    c.name = std::string("reduce ") + reduce_op_name(v.op) + " " + dtype_name(v.type);
    c.operation = op::reduce;
    c.type = v.type;
    c.data.reduce = v.op;
    c.sweep = sweep;
    c.bench = v.bench;
    // Inputs in [-1, 1] ([0.9, 1.1] for prod), at most 8192 per output.
    if (v.op == reduce_op::prod) {
      c.tol = {1e-6, 1e-4};
      c.why = "fp32 product of up to 8192 factors near 1 in another order than the double "
              "reference: each multiply rounds by <= 6e-8 relative, ~5e-6 in all, with margin";
    } else if (v.type == dtype::f32) {
      c.tol = {5e-5, 1e-5};
      c.why = "fp32 accumulation of up to 8192 values in [-1, 1] in another order than the "
              "double reference: ~3e-6 absolute typical on sums of magnitude ~50";
    } else if (v.type == dtype::f16) {
      c.tol = {1e-3, 1e-3};
      c.why = "fp16 output: one rounding (<= 4.9e-4 relative) of an fp32 result; the "
              "absolute term covers sums near zero";
    } else {
      c.tol = {8e-3, 8e-3};
      c.why = "bf16 output: one rounding (<= 3.9e-3 relative) of an fp32 result; the "
              "absolute term covers sums near zero";
    }
    t.push_back(c);
  }
}

} // namespace

void append_data_cases(std::vector<kernel_case>& t) {
  append_permutes(t);
  append_strided_copies(t);
  append_gathers(t);
  append_reductions(t);
}

} // namespace caf_serving::kernels
