#include "cpu/data_layout.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

[[noreturn]] void refuse(const char* who, const std::string& what) {
  throw std::invalid_argument(std::string(who) + ": " + what);
}

void check_element_size(std::size_t element_size, const char* who) {
  if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8)
    refuse(who, "element size " + std::to_string(element_size)
                  + " bytes is not supported; use 1, 2, 4 or 8 (move larger elements as "
                    "several of these by adding an innermost dim)");
}

void check_rank(int rank, const char* who) {
  if (rank < 0 || rank > max_rank)
    refuse(who, "rank " + std::to_string(rank) + " is not supported; at most "
                  + std::to_string(max_rank) + " dims (merge adjacent dims first)");
}

void check_dims(int rank, const std::int64_t* dims, const char* who) {
  for (int d = 0; d < rank; ++d)
    if (dims[d] < 0)
      refuse(who, "dim " + std::to_string(d) + " has negative size " + std::to_string(dims[d]));
}

std::int64_t product(const std::int64_t* dims, int from, int to) {
  std::int64_t p = 1;
  for (int d = from; d < to; ++d)
    p *= dims[d];
  return p;
}

/// The lowest and highest element one side of a box touches.
struct extent {
  std::int64_t lowest = 0;
  std::int64_t highest = 0;
};

extent box_extent(const strided_box& b, const std::int64_t* strides, std::int64_t offset) {
  extent e{offset, offset};
  for (int d = 0; d < b.rank; ++d) {
    std::int64_t reach = (b.dims[d] - 1) * strides[d];
    (reach < 0 ? e.lowest : e.highest) += reach;
  }
  return e;
}

void check_extent(extent e, std::int64_t elements, const char* side, const char* who) {
  if (e.lowest < 0)
    refuse(who, std::string("the box reaches ") + side + " element " + std::to_string(e.lowest)
                  + ", before the buffer's start; raise the " + side + " offset");
  if (elements > 0 && e.highest >= elements)
    refuse(who, std::string("the box reaches ") + side + " element " + std::to_string(e.highest)
                  + ", past the " + std::to_string(elements) + " elements of the buffer");
}

} // namespace

std::int64_t box_count(const strided_box& b) {
  return product(b.dims, 0, b.rank);
}

void check_box(const strided_box& b, std::size_t element_size, std::int64_t src_elements,
               std::int64_t dst_elements, const char* who) {
  check_element_size(element_size, who);
  check_rank(b.rank, who);
  check_dims(b.rank, b.dims, who);
  for (int d = 0; d < b.rank; ++d)
    if (b.dims[d] > 1 && b.dst_strides[d] == 0)
      refuse(who, "destination stride 0 on dim " + std::to_string(d) + " of size "
                    + std::to_string(b.dims[d])
                    + " writes one element several times; only source strides may be 0");
  if (box_count(b) == 0)
    return;
  check_extent(box_extent(b, b.src_strides, b.src_offset), src_elements, "source", who);
  check_extent(box_extent(b, b.dst_strides, b.dst_offset), dst_elements, "destination", who);
}

strided_box collapse_box(const strided_box& b) {
  strided_box out;
  out.src_offset = b.src_offset;
  out.dst_offset = b.dst_offset;
  if (box_count(b) == 0) {
    out.rank = 1;
    out.dims[0] = 0;
    out.src_strides[0] = out.dst_strides[0] = 1;
    return out;
  }
  for (int d = 0; d < b.rank; ++d) {
    if (b.dims[d] == 1)
      continue;
    int last = out.rank - 1;
    if (last >= 0 && out.src_strides[last] == b.dims[d] * b.src_strides[d]
        && out.dst_strides[last] == b.dims[d] * b.dst_strides[d]) {
      out.dims[last] *= b.dims[d];
      out.src_strides[last] = b.src_strides[d];
      out.dst_strides[last] = b.dst_strides[d];
      continue;
    }
    out.dims[out.rank] = b.dims[d];
    out.src_strides[out.rank] = b.src_strides[d];
    out.dst_strides[out.rank] = b.dst_strides[d];
    ++out.rank;
  }
  return out;
}

copy_plan widen_box(const strided_box& b, std::size_t element_size, std::uintptr_t src,
                    std::uintptr_t dst) {
  int last = b.rank - 1;
  if (last < 0 || b.src_strides[last] != 1 || b.dst_strides[last] != 1)
    return {b, element_size};
  for (std::size_t wide : {16, 8, 4, 2}) {
    if (wide <= element_size)
      break;
    auto f = static_cast<std::int64_t>(wide / element_size);
    bool fits = b.dims[last] % f == 0 && b.src_offset % f == 0 && b.dst_offset % f == 0
                && src % wide == 0 && dst % wide == 0;
    for (int d = 0; d < last && fits; ++d)
      fits = b.src_strides[d] % f == 0 && b.dst_strides[d] % f == 0;
    if (!fits)
      continue;
    strided_box w = b;
    w.dims[last] /= f;
    for (int d = 0; d < last; ++d) {
      w.src_strides[d] /= f;
      w.dst_strides[d] /= f;
    }
    w.src_offset /= f;
    w.dst_offset /= f;
    return {w, wide};
  }
  return {b, element_size};
}

std::array<std::int64_t, max_rank> contiguous_strides(const tensor_dims& t) {
  std::array<std::int64_t, max_rank> strides{};
  std::int64_t s = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    strides[d] = s;
    s *= t.dims[d];
  }
  return strides;
}

strided_box slice_box(const tensor_dims& input, const std::int64_t* starts,
                      const std::int64_t* steps, const tensor_dims& output) {
  if (input.rank != output.rank)
    refuse("slice", "input rank " + std::to_string(input.rank) + " differs from output rank "
                      + std::to_string(output.rank));
  check_rank(input.rank, "slice");
  strided_box b;
  b.rank = output.rank;
  auto in_strides = contiguous_strides(input);
  auto out_strides = contiguous_strides(output);
  for (int d = 0; d < b.rank; ++d) {
    if (steps[d] == 0)
      refuse("slice", "step 0 on axis " + std::to_string(d) + "; ONNX Slice steps are nonzero");
    b.dims[d] = output.dims[d];
    b.src_strides[d] = in_strides[d] * steps[d];
    b.dst_strides[d] = out_strides[d];
    if (output.dims[d] > 0)
      b.src_offset += starts[d] * in_strides[d];
  }
  return b;
}

strided_box place_box(const tensor_dims& input, const tensor_dims& output,
                      const std::int64_t* offsets) {
  if (input.rank != output.rank)
    refuse("place", "input rank " + std::to_string(input.rank) + " differs from output rank "
                      + std::to_string(output.rank));
  check_rank(input.rank, "place");
  strided_box b;
  b.rank = input.rank;
  auto in_strides = contiguous_strides(input);
  auto out_strides = contiguous_strides(output);
  for (int d = 0; d < b.rank; ++d) {
    b.dims[d] = input.dims[d];
    b.src_strides[d] = in_strides[d];
    b.dst_strides[d] = out_strides[d];
    b.dst_offset += offsets[d] * out_strides[d];
  }
  return b;
}

strided_box expand_box(const tensor_dims& input, const tensor_dims& output) {
  check_rank(output.rank, "expand");
  if (input.rank > output.rank)
    refuse("expand", "input rank " + std::to_string(input.rank) + " exceeds output rank "
                       + std::to_string(output.rank));
  strided_box b;
  b.rank = output.rank;
  auto in_strides = contiguous_strides(input);
  auto out_strides = contiguous_strides(output);
  int shift = output.rank - input.rank;
  for (int d = 0; d < b.rank; ++d) {
    b.dims[d] = output.dims[d];
    b.dst_strides[d] = out_strides[d];
    int i = d - shift;
    if (i < 0 || input.dims[i] == 1) {
      b.src_strides[d] = 0;
    } else if (input.dims[i] == output.dims[d]) {
      b.src_strides[d] = in_strides[i];
    } else {
      refuse("expand", "input dim " + std::to_string(i) + " of size "
                         + std::to_string(input.dims[i]) + " does not broadcast to "
                         + std::to_string(output.dims[d]) + "; it must be 1 or equal");
    }
  }
  return b;
}

permute_plan plan_permute(const permute_shape& s, std::size_t element_size, std::uintptr_t src,
                          std::uintptr_t dst) {
  const char* who = "permute";
  check_element_size(element_size, who);
  check_rank(s.rank, who);
  check_dims(s.rank, s.dims, who);
  bool seen[max_rank] = {};
  for (int i = 0; i < s.rank; ++i) {
    int p = s.perm[i];
    if (p < 0 || p >= s.rank || seen[p])
      refuse(who, "perm is not a permutation of 0.." + std::to_string(s.rank - 1)
                    + " (entry " + std::to_string(i) + " is " + std::to_string(p) + ")");
    seen[p] = true;
  }
  strided_box box;
  box.rank = s.rank;
  std::int64_t out_stride = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    box.dims[i] = s.dims[s.perm[i]];
    box.src_strides[i] = product(s.dims, s.perm[i] + 1, s.rank);
    box.dst_strides[i] = out_stride;
    out_stride *= box.dims[i];
  }
  box = collapse_box(box);
  permute_plan plan;
  int last = box.rank - 1;
  if (box.rank < 2 || box.src_strides[last] == 1) {
    plan.plain = widen_box(box, element_size, src, dst);
    return plan;
  }
  // The innermost source dim moved: dim a (source stride 1) and the innermost output
  // dim b go through the tile; the other dims index tiles.
  plan.tiled = true;
  plan.plain = {box, element_size};
  int a = 0;
  while (box.src_strides[a] != 1)
    ++a; // exists: the input's innermost dim of size > 1 has stride 1
  tile_plan& t = plan.tile;
  t.a_size = box.dims[a];
  t.b_size = box.dims[last];
  t.src_stride_b = box.src_strides[last];
  t.dst_stride_a = box.dst_strides[a];
  t.batch.src_offset = box.src_offset;
  t.batch.dst_offset = box.dst_offset;
  for (int d = 0; d < last; ++d) {
    if (d == a)
      continue;
    t.batch.dims[t.batch.rank] = box.dims[d];
    t.batch.src_strides[t.batch.rank] = box.src_strides[d];
    t.batch.dst_strides[t.batch.rank] = box.dst_strides[d];
    ++t.batch.rank;
  }
  return plan;
}

gather_shape make_gather_shape(int rank, const std::int64_t* dims, int axis,
                               std::int64_t index_count) {
  const char* who = "gather_axis";
  check_rank(rank, who);
  if (rank == 0)
    refuse(who, "data is a scalar; Gather needs data of rank >= 1");
  check_dims(rank, dims, who);
  if (axis < -rank || axis >= rank)
    refuse(who, "axis " + std::to_string(axis) + " is outside [" + std::to_string(-rank) + ", "
                  + std::to_string(rank) + ") for data of rank " + std::to_string(rank));
  if (index_count < 0)
    refuse(who, "negative index count " + std::to_string(index_count));
  if (axis < 0)
    axis += rank;
  gather_shape g;
  g.outer = product(dims, 0, axis);
  g.axis_dim = dims[axis];
  g.inner = product(dims, axis + 1, rank);
  g.index_count = index_count;
  return g;
}

const char* reduce_op_name(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::mean:
      return "mean";
    case reduce_op::max:
      return "max";
    case reduce_op::min:
      return "min";
    case reduce_op::prod:
      return "prod";
    case reduce_op::sum_square:
      return "sum_square";
    case reduce_op::l2:
      return "l2";
  }
  return "?";
}

reduce_shape make_reduce_shape(int rank, const std::int64_t* dims, const int* axes,
                               int axis_count) {
  const char* who = "reduce";
  check_rank(rank, who);
  check_dims(rank, dims, who);
  bool reduced[max_rank] = {};
  for (int i = 0; i < axis_count; ++i) {
    int a = axes[i];
    if (a < -rank || a >= rank)
      refuse(who, "axis " + std::to_string(a) + " is outside [" + std::to_string(-rank) + ", "
                    + std::to_string(rank) + ") for a tensor of rank " + std::to_string(rank));
    if (a < 0)
      a += rank;
    if (reduced[a])
      refuse(who, "axis " + std::to_string(axes[i]) + " is listed twice");
    reduced[a] = true;
  }
  // Dims of size 1 change nothing whether reduced or not; the others must form one
  // block of adjacent reduced dims.
  int first = -1, last = -1;
  for (int d = 0; d < rank; ++d)
    if (reduced[d] && dims[d] != 1) {
      first = first < 0 ? d : first;
      last = d;
    }
  reduce_shape r;
  if (first < 0) { // nothing of size > 1 reduced: every element is its own output
    r.outer = product(dims, 0, rank);
    return r;
  }
  for (int d = first; d <= last; ++d)
    if (!reduced[d] && dims[d] != 1)
      refuse(who, "reduced axes must be adjacent (ignoring dims of size 1), but dim "
                    + std::to_string(d) + " of size " + std::to_string(dims[d])
                    + " lies between reduced dims " + std::to_string(first) + " and "
                    + std::to_string(last) + "; transpose them together first or reduce "
                    "in two steps");
  r.outer = product(dims, 0, first);
  r.reduced = product(dims, first, last + 1);
  r.inner = product(dims, last + 1, rank);
  return r;
}

} // namespace caf_serving::kernels
