/// The data-movement and reduction device steps: Transpose, Concat, Split, Slice,
/// Gather, Expand, Pad (constant), Tile, the reductions (ReduceMean/Sum/Max/Min/
/// Prod/L2/SumSquare) and GlobalAveragePool/GlobalMaxPool where cuDNN's pool step
/// (steps_core.cpp) does not take them, over the kernels of kernels/cuda/{permute,
/// strided_copy,gather_axis,reduce}.
///
/// The movement steps work on the element size alone (1, 2, 4 or 8 bytes: any
/// dtype); the reductions on fp32, fp16 and bf16 (fp32 accumulation). Boxes,
/// offsets and strides come from the bucket's fixed shapes here, at plan time, and
/// are checked by the kernels' own planners before `b.dry()`, so that a dry run
/// chooses exactly as a real build does; a node they refuse stays a host step.

#include "cuda/steps.hpp"

#include "cuda/gather_axis.hpp"
#include "cuda/permute.hpp"
#include "cuda/reduce.hpp"
#include "cuda/strided_copy.hpp"

#include <cstring>
#include <numeric>
#include <stdexcept>

namespace caf_serving::cuda {

namespace {

namespace k = caf_serving::kernels;

auto in_of(const onnx::node& n) {
  return [&n](size_t i) { return step_builder::in(n, i); };
}

/// Movement steps copy elements of these sizes whatever their type.
bool movable(const onnx::value& v) {
  auto s = element_size(v.dtype);
  return s == 1 || s == 2 || s == 4 || s == 8;
}

/// Dims of a contiguous tensor for the kernels, if its rank fits.
std::optional<k::tensor_dims> dims_of(const dims_t& shape) {
  if (shape.size() > static_cast<size_t>(k::max_rank)) return std::nullopt;
  k::tensor_dims t;
  t.rank = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return std::nullopt;
    t.dims[i] = shape[i];
  }
  return t;
}

/// The integers of a constant int64/int32 value; nothing for a runtime value.
std::optional<std::vector<int64_t>> const_ints(const step_builder& b, int v) {
  if (v < 0) return std::nullopt;
  const auto& val = b.g.values[v];
  if (!val.constant) return std::nullopt;
  std::vector<int64_t> r;
  auto count = static_cast<size_t>(val.constant->elements());
  if (val.dtype == datatype::int64) {
    r.assign(val.constant->as<int64_t>(), val.constant->as<int64_t>() + count);
  } else if (val.dtype == datatype::int32) {
    r.assign(val.constant->as<int32_t>(), val.constant->as<int32_t>() + count);
  } else {
    return std::nullopt;
  }
  return r;
}

/// `a` counted from the front of `rank` dims; nothing when out of range.
std::optional<int> norm_axis(int64_t a, size_t rank) {
  auto r = static_cast<int64_t>(rank);
  if (a < -r || a >= r) return std::nullopt;
  return static_cast<int>(a < 0 ? a + r : a);
}

int64_t elements_of(const k::tensor_dims& t) {
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.dims[d];
  return n;
}

/// A box copy that the kernel's checks accept, or nothing.
std::optional<k::strided_copy_args> checked_copy(const k::strided_box& box, size_t element_size,
                                                 int64_t src_elements, int64_t dst_elements) {
  k::strided_copy_args a;
  a.box = box;
  if (a.box.rank > k::max_rank) return std::nullopt;
  a.element_size = element_size;
  a.src_elements = src_elements;
  a.dst_elements = dst_elements;
  try {
    k::check_box(a.box, element_size, src_elements, dst_elements, "data step");
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  return a;
}

/// The step that runs `copies` (each still without pointers) from the inputs'
/// to the output's addresses, one launch for up to max_boxes_per_launch boxes.
gpu_step copies_step(std::string kernel, std::vector<k::strided_copy_args> copies) {
  return gpu_step{std::move(kernel), false, [copies = std::move(copies)](cudaStream_t s) {
    if (!copies.empty()) k::launch_strided_copies(copies, s);
  }};
}

// ---- Transpose --------------------------------------------------------------------

std::optional<gpu_step> transpose_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  if (!movable(b.g.values[in(0)])) return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  if (!xd) return std::nullopt;
  auto perm = n.get_ints("perm", {});
  if (perm.empty()) {
    perm.resize(xd->rank);
    for (int i = 0; i < xd->rank; ++i) perm[i] = xd->rank - 1 - i;
  }
  if (static_cast<int>(perm.size()) != xd->rank) return std::nullopt;
  k::permute_args a;
  a.element_size = element_size(b.g.values[y].dtype);
  a.shape.rank = xd->rank;
  for (int i = 0; i < xd->rank; ++i) {
    a.shape.dims[i] = xd->dims[i];
    a.shape.perm[i] = static_cast<int>(perm[i]);
  }
  try {
    k::plan_permute(a.shape, a.element_size, 0, 0);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (b.dry()) return b.planned("permute");
  a.input = b.ptrs[in(0)];
  a.output = b.ptrs[y];
  bool empty = elements_of(*xd) == 0;
  return gpu_step{"permute", false, [a, empty](cudaStream_t s) {
    if (!empty) k::launch_permute(a, s);
  }};
}

// ---- Concat, Split, Slice, Expand, Tile, Pad ----------------------------------------

std::optional<gpu_step> concat_step(step_builder& b, const onnx::node& n) {
  const int y = step_builder::out(n, 0);
  if (!movable(b.g.values[y])) return std::nullopt;
  auto yd = dims_of(b.shape(y));
  if (!yd || yd->rank == 0) return std::nullopt;
  auto axis = norm_axis(n.get_i("axis", 0), yd->rank);
  if (!axis) return std::nullopt;
  size_t es = element_size(b.g.values[y].dtype);
  std::vector<k::strided_copy_args> copies;
  std::vector<int> sources;
  int64_t offsets[k::max_rank] = {};
  for (int v : n.inputs) {
    if (v < 0) return std::nullopt;
    auto xd = dims_of(b.shape(v));
    if (!xd || xd->rank != yd->rank) return std::nullopt;
    if (elements_of(*xd) > 0) {
      auto c = checked_copy(k::place_box(*xd, *yd, offsets), es, elements_of(*xd), elements_of(*yd));
      if (!c) return std::nullopt;
      copies.push_back(*c);
      sources.push_back(v);
    }
    offsets[*axis] += xd->dims[*axis];
  }
  if (offsets[*axis] != yd->dims[*axis]) return std::nullopt;
  if (b.dry()) return b.planned("concat");
  for (size_t i = 0; i < copies.size(); ++i) {
    copies[i].src = b.ptrs[sources[i]];
    copies[i].dst = b.ptrs[y];
  }
  return copies_step("concat", std::move(copies));
}

/// Every variant of Split (attribute, constant input, num_outputs, the uneven
/// last part): the outputs' fixed shapes say where each starts.
std::optional<gpu_step> split_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  if (!movable(b.g.values[in(0)])) return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  if (!xd || xd->rank == 0) return std::nullopt;
  auto axis = norm_axis(n.get_i("axis", 0), xd->rank);
  if (!axis) return std::nullopt;
  size_t es = element_size(b.g.values[in(0)].dtype);
  std::vector<k::strided_copy_args> copies;
  std::vector<int> targets;
  int64_t starts[k::max_rank] = {}, steps[k::max_rank];
  std::fill(std::begin(steps), std::end(steps), int64_t{1});
  for (int v : n.outputs) {
    if (v < 0) return std::nullopt;
    auto od = dims_of(b.shape(v));
    if (!od || od->rank != xd->rank) return std::nullopt;
    if (elements_of(*od) > 0) {
      auto c = checked_copy(k::slice_box(*xd, starts, steps, *od), es, elements_of(*xd),
                            elements_of(*od));
      if (!c) return std::nullopt;
      copies.push_back(*c);
      targets.push_back(v);
    }
    starts[*axis] += od->dims[*axis];
  }
  if (starts[*axis] != xd->dims[*axis]) return std::nullopt;
  if (b.dry()) return b.planned("split");
  for (size_t i = 0; i < copies.size(); ++i) {
    copies[i].src = b.ptrs[in(0)];
    copies[i].dst = b.ptrs[targets[i]];
  }
  return copies_step("split", std::move(copies));
}

/// Slice with constant starts/axes/steps (inputs from opset 10, attributes
/// before); the output's fixed shape gives each axis's length, so `ends` need not
/// be read.
std::optional<gpu_step> slice_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  if (!movable(b.g.values[in(0)])) return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  auto yd = dims_of(b.shape(y));
  if (!xd || !yd || xd->rank != yd->rank) return std::nullopt;
  std::vector<int64_t> starts, axes, steps;
  if (in(1) >= 0) {
    auto s = const_ints(b, in(1));
    if (!s || !const_ints(b, in(2))) return std::nullopt;
    starts = *s;
    if (in(3) >= 0) {
      auto a = const_ints(b, in(3));
      if (!a) return std::nullopt;
      axes = *a;
    }
    if (in(4) >= 0) {
      auto st = const_ints(b, in(4));
      if (!st) return std::nullopt;
      steps = *st;
    }
  } else {
    starts = n.get_ints("starts", {});
    axes = n.get_ints("axes", {});
  }
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) return std::nullopt;
  int64_t first[k::max_rank] = {}, step[k::max_rank];
  std::fill(std::begin(step), std::end(step), int64_t{1});
  for (size_t i = 0; i < axes.size(); ++i) {
    auto a = norm_axis(axes[i], xd->rank);
    if (!a || steps[i] == 0) return std::nullopt;
    int64_t dim = xd->dims[*a], s = starts[i];
    if (s < 0) s += dim;
    s = steps[i] > 0 ? std::clamp<int64_t>(s, 0, dim) : std::clamp<int64_t>(s, 0, dim - 1);
    first[*a] = s;
    step[*a] = steps[i];
  }
  bool empty = elements_of(*yd) == 0;
  std::optional<k::strided_copy_args> c;
  if (!empty) {
    c = checked_copy(k::slice_box(*xd, first, step, *yd), element_size(b.g.values[y].dtype),
                     elements_of(*xd), elements_of(*yd));
    if (!c) return std::nullopt;
  }
  if (b.dry()) return b.planned("slice");
  std::vector<k::strided_copy_args> copies;
  if (c) {
    c->src = b.ptrs[in(0)];
    c->dst = b.ptrs[y];
    copies.push_back(*c);
  }
  return copies_step("slice", std::move(copies));
}

std::optional<gpu_step> expand_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  if (!movable(b.g.values[y])) return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  auto yd = dims_of(b.shape(y));
  if (!xd || !yd || elements_of(*yd) == 0) return std::nullopt;
  std::optional<k::strided_copy_args> c;
  try {
    c = checked_copy(k::expand_box(*xd, *yd), element_size(b.g.values[y].dtype), elements_of(*xd),
                     elements_of(*yd));
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (!c) return std::nullopt;
  if (b.dry()) return b.planned("expand");
  c->src = b.ptrs[in(0)];
  c->dst = b.ptrs[y];
  return copies_step("expand", {*c});
}

/// Tile as one box: each repeated dim d becomes (repeat, dim) with source
/// strides (0, stride) and destination strides (dim * out_stride, out_stride).
std::optional<gpu_step> tile_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  if (!movable(b.g.values[y])) return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  auto yd = dims_of(b.shape(y));
  if (!xd || !yd || xd->rank != yd->rank || elements_of(*yd) == 0) return std::nullopt;
  auto xs = k::contiguous_strides(*xd);
  auto ys = k::contiguous_strides(*yd);
  k::strided_box box;
  int r = 0;
  for (int d = 0; d < xd->rank; ++d) {
    if (xd->dims[d] == 0 || yd->dims[d] % xd->dims[d] != 0) return std::nullopt;
    int64_t repeat = yd->dims[d] / xd->dims[d];
    if (repeat > 1) {
      if (r == k::max_rank) return std::nullopt;
      box.dims[r] = repeat;
      box.src_strides[r] = 0;
      box.dst_strides[r] = xd->dims[d] * ys[d];
      ++r;
    }
    if (r == k::max_rank) return std::nullopt;
    box.dims[r] = xd->dims[d];
    box.src_strides[r] = xs[d];
    box.dst_strides[r] = ys[d];
    ++r;
  }
  box.rank = r;
  auto c = checked_copy(k::collapse_box(box), element_size(b.g.values[y].dtype), elements_of(*xd),
                        elements_of(*yd));
  if (!c) return std::nullopt;
  if (b.dry()) return b.planned("tile");
  c->src = b.ptrs[in(0)];
  c->dst = b.ptrs[y];
  return copies_step("tile", {*c});
}

/// Constant Pad with non-negative constant pads (and axes): the output filled
/// with the pad value, then the input placed at the leading pads.
std::optional<gpu_step> pad_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  const auto& yv = b.g.values[y];
  if (!movable(yv) || n.get_s("mode", "constant") != "constant") return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  auto yd = dims_of(yv.shape);
  if (!xd || !yd || xd->rank != yd->rank) return std::nullopt;
  auto pads = const_ints(b, in(1));
  if (!pads) return std::nullopt;
  std::vector<int64_t> axes;
  if (in(3) >= 0) {
    auto a = const_ints(b, in(3));
    if (!a) return std::nullopt;
    axes = *a;
  } else {
    axes.resize(xd->rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (pads->size() != 2 * axes.size()) return std::nullopt;
  int64_t lead[k::max_rank] = {};
  for (size_t i = 0; i < axes.size(); ++i) {
    auto a = norm_axis(axes[i], xd->rank);
    if (!a || (*pads)[i] < 0 || (*pads)[i + axes.size()] < 0) return std::nullopt;
    lead[*a] = (*pads)[i];
  }
  size_t es = element_size(yv.dtype);
  uint64_t value = 0;
  if (in(2) >= 0) {
    const auto& cv = b.g.values[in(2)];
    if (!cv.constant || cv.dtype != yv.dtype || cv.constant->bytes.size() < es) return std::nullopt;
    std::memcpy(&value, cv.constant->bytes.data(), es); // little-endian: the low bytes
  }
  std::optional<k::strided_copy_args> c;
  if (elements_of(*xd) > 0) {
    c = checked_copy(k::place_box(*xd, *yd, lead), es, elements_of(*xd), elements_of(*yd));
    if (!c) return std::nullopt;
  }
  if (b.dry()) return b.planned("pad");
  k::fill_args f;
  f.dst = b.ptrs[y];
  f.element_size = es;
  f.count = elements_of(*yd);
  f.value = value;
  if (c) {
    c->src = b.ptrs[in(0)];
    c->dst = b.ptrs[y];
  }
  return gpu_step{"pad", false, [f, c](cudaStream_t s) {
    if (f.count > 0) k::launch_fill(f, s);
    if (c) k::launch_strided_copy(*c, s);
  }};
}

// ---- Gather -------------------------------------------------------------------------

/// Gather on any axis with int64 or int32 indices. Constant indices are checked
/// here; runtime ones (token ids) set a device flag (device_flags.hpp) that the
/// executor turns into an error for the batch after it completes.
std::optional<gpu_step> gather_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  const auto& data = b.g.values[in(0)];
  const auto& idx = b.g.values[in(1)];
  if (!movable(data)) return std::nullopt;
  if (idx.dtype != datatype::int64 && idx.dtype != datatype::int32) return std::nullopt;
  auto dd = dims_of(data.shape);
  if (!dd || dd->rank == 0) return std::nullopt;
  auto axis = norm_axis(n.get_i("axis", 0), dd->rank);
  if (!axis) return std::nullopt;
  int64_t count = onnx::element_count(idx.shape);
  if (count < 0) return std::nullopt;
  if (idx.constant) {
    auto ids = const_ints(b, in(1));
    if (!ids) return std::nullopt;
    for (int64_t i : *ids)
      if (k::resolve_index(i, dd->dims[*axis]) < 0) return std::nullopt; // the host says why
  }
  try {
    k::make_gather_shape(dd->rank, dd->dims, *axis, count);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (b.dry()) return b.planned("gather");
  k::gather_axis_args a;
  a.data = b.ptrs[in(0)];
  a.indices = b.ptrs[in(1)];
  a.output = b.ptrs[y];
  a.indices_type = idx.dtype == datatype::int64 ? k::index_type::i64 : k::index_type::i32;
  a.element_size = element_size(data.dtype);
  a.rank = dd->rank;
  std::copy(dd->dims, dd->dims + dd->rank, a.dims);
  a.axis = *axis;
  a.index_count = count;
  a.error_flag = b.ctx->flags.add(
    "Gather '" + n.name + "': an index in '" + idx.name + "' lies outside [-"
    + std::to_string(dd->dims[*axis]) + ", " + std::to_string(dd->dims[*axis]) + ") of axis "
    + std::to_string(*axis) + " of '" + data.name + "'; send indices within that range (token ids "
    "below the vocabulary size)");
  bool empty = count == 0 || onnx::element_count(b.shape(y)) == 0;
  return gpu_step{"gather", false, [a, empty](cudaStream_t s) {
    if (!empty) k::launch_gather_axis(a, s);
  }};
}

// ---- reductions -----------------------------------------------------------------------

std::optional<k::dtype> float_type(datatype t) {
  switch (t) {
    case datatype::fp32: return k::dtype::f32;
    case datatype::fp16: return k::dtype::f16;
    case datatype::bf16: return k::dtype::bf16;
    default: return std::nullopt;
  }
}

std::optional<k::reduce_op> reduce_op_of(const std::string& op) {
  if (op == "ReduceMean" || op == "GlobalAveragePool") return k::reduce_op::mean;
  if (op == "ReduceSum") return k::reduce_op::sum;
  if (op == "ReduceMax" || op == "GlobalMaxPool") return k::reduce_op::max;
  if (op == "ReduceMin") return k::reduce_op::min;
  if (op == "ReduceProd") return k::reduce_op::prod;
  if (op == "ReduceSumSquare") return k::reduce_op::sum_square;
  if (op == "ReduceL2") return k::reduce_op::l2;
  return std::nullopt;
}

/// The reductions with constant axes (attribute, or the input from ReduceSum-13
/// and the others' opset 18), keepdims either way (only a shape), and the global
/// pools as a mean or max over every axis after the channels.
std::optional<gpu_step> reduce_step(step_builder& b, const onnx::node& n) {
  auto in = in_of(n);
  const int y = step_builder::out(n, 0);
  auto type = float_type(b.g.values[in(0)].dtype);
  auto op = reduce_op_of(n.op);
  if (!type || !op || b.g.values[y].dtype != b.g.values[in(0)].dtype) return std::nullopt;
  auto xd = dims_of(b.shape(in(0)));
  if (!xd || xd->rank == 0) return std::nullopt;
  std::vector<int64_t> axes;
  bool global = n.op == "GlobalAveragePool" || n.op == "GlobalMaxPool";
  if (global) {
    if (xd->rank < 3) return std::nullopt;
    for (int d = 2; d < xd->rank; ++d) axes.push_back(d);
  } else if (in(1) >= 0) {
    auto a = const_ints(b, in(1));
    if (!a) return std::nullopt;
    axes = *a;
  } else {
    axes = n.get_ints("axes", {});
  }
  if (axes.empty() && !(n.get_i("noop_with_empty_axes", 0) && !global)) {
    axes.resize(xd->rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (axes.size() > static_cast<size_t>(k::max_rank)) return std::nullopt;
  k::reduce_args a;
  a.type = *type;
  a.op = *op;
  a.rank = xd->rank;
  std::copy(xd->dims, xd->dims + xd->rank, a.dims);
  a.axis_count = static_cast<int>(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) a.axes[i] = static_cast<int>(axes[i]);
  try {
    k::make_reduce_shape(a.rank, a.dims, a.axes, a.axis_count);
  } catch (const std::invalid_argument&) {
    return std::nullopt; // axes not adjacent: the host reduces them
  }
  if (b.dry()) return b.planned("reduce");
  a.input = b.ptrs[in(0)];
  a.output = b.ptrs[y];
  bool empty = onnx::element_count(b.shape(y)) == 0;
  return gpu_step{"reduce", false, [a, empty](cudaStream_t s) {
    if (!empty) k::launch_reduce(a, s);
  }};
}

/// A step function whose box or shape the kernels' planners (cpu/data_layout.hpp)
/// refuse with std::invalid_argument: the node stays a host step. Nothing before
/// those checks has side effects (the Gather's flag comes after them).
std::function<std::optional<gpu_step>(step_builder&, const onnx::graph&, const onnx::node&)>
refusable(step_function f) {
  return [f](step_builder& b, const onnx::graph&, const onnx::node& n) -> std::optional<gpu_step> {
    try {
      return f(b, n);
    } catch (const std::invalid_argument&) {
      return std::nullopt;
    }
  };
}

} // namespace

std::vector<device_kernel> data_steps() {
  std::vector<device_kernel> steps = {
    {"Transpose", {}, "permute", refusable(transpose_step)},
    {"Concat", {}, "concat", refusable(concat_step)},
    {"Split", {}, "split", refusable(split_step)},
    {"Slice", {}, "slice", refusable(slice_step)},
    {"Gather", {}, "gather", refusable(gather_step)},
    {"Expand", {}, "expand", refusable(expand_step)},
    {"Tile", {}, "tile", refusable(tile_step)},
    {"Pad", {}, "pad", refusable(pad_step)},
  };
  // ReduceL2, ReduceSumSquare and GlobalMaxPool join once the operator registry
  // (onnx/ops*.cpp) has them: until then the importer refuses such models.
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL2", "ReduceSumSquare", "GlobalAveragePool", "GlobalMaxPool"})
    if (onnx::find_operator(op)) steps.push_back({op, {}, "reduce", refusable(reduce_step)});
  return steps;
}

} // namespace caf_serving::cuda
