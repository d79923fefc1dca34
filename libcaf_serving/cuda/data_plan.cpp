#include "cuda/data_plan.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>

namespace caf_serving::cuda {

namespace {

namespace k = caf_serving::kernels;
using dims_t = std::vector<int64_t>;

int in(const onnx::node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }
int out(const onnx::node& n, size_t i) { return i < n.outputs.size() ? n.outputs[i] : -1; }

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

int64_t elements_of(const k::tensor_dims& t) {
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.dims[d];
  return n;
}

/// The integers of a constant int64/int32 value; nothing for a runtime value.
std::optional<std::vector<int64_t>> const_ints(const onnx::graph& g, int v) {
  if (v < 0) return std::nullopt;
  const auto& val = g.values[v];
  if (!val.constant) return std::nullopt;
  auto count = static_cast<size_t>(val.constant->elements());
  if (val.dtype == datatype::int64)
    return std::vector<int64_t>(val.constant->as<int64_t>(), val.constant->as<int64_t>() + count);
  if (val.dtype == datatype::int32)
    return std::vector<int64_t>(val.constant->as<int32_t>(), val.constant->as<int32_t>() + count);
  return std::nullopt;
}

/// `a` counted from the front of `rank` dims; nothing when out of range.
std::optional<int> norm_axis(int64_t a, int rank) {
  if (a < -rank || a >= rank) return std::nullopt;
  return static_cast<int>(a < 0 ? a + rank : a);
}

/// A copy of `box` from `src` (of `src_dims`) into `dst` (of `dst_dims`), checked
/// as the kernel will check it (throws std::invalid_argument otherwise).
planned_copy copy_of(int src, int dst, const k::strided_box& box, size_t element_size,
                     const k::tensor_dims& src_dims, const k::tensor_dims& dst_dims) {
  planned_copy c{src, dst, box, elements_of(src_dims), elements_of(dst_dims)};
  k::check_box(c.box, element_size, c.src_elements, c.dst_elements, "data step");
  return c;
}

std::optional<data_plan> transpose(const onnx::graph& g, const onnx::node& n) {
  const auto& x = g.values[in(n, 0)];
  auto xd = dims_of(x.shape);
  if (!movable(x) || !xd) return std::nullopt;
  auto perm = n.get_ints("perm", {});
  if (perm.empty())
    for (int i = xd->rank - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int>(perm.size()) != xd->rank) return std::nullopt;
  data_plan p;
  p.kernel = "permute";
  p.element_size = element_size(x.dtype);
  p.input = in(n, 0);
  p.output = out(n, 0);
  p.output_elements = elements_of(*xd);
  p.permute.rank = xd->rank;
  for (int i = 0; i < xd->rank; ++i) {
    p.permute.dims[i] = xd->dims[i];
    p.permute.perm[i] = static_cast<int>(perm[i]);
  }
  k::plan_permute(p.permute, p.element_size, 0, 0); // throws for what the kernel refuses
  return p;
}

std::optional<data_plan> concat(const onnx::graph& g, const onnx::node& n) {
  const int y = out(n, 0);
  auto yd = dims_of(g.values[y].shape);
  if (!movable(g.values[y]) || !yd || yd->rank == 0) return std::nullopt;
  auto axis = norm_axis(n.get_i("axis", 0), yd->rank);
  if (!axis) return std::nullopt;
  data_plan p;
  p.kernel = "concat";
  p.element_size = element_size(g.values[y].dtype);
  int64_t offsets[k::max_rank] = {};
  for (int v : n.inputs) {
    if (v < 0 || g.values[v].dtype != g.values[y].dtype) return std::nullopt;
    auto xd = dims_of(g.values[v].shape);
    if (!xd || xd->rank != yd->rank) return std::nullopt;
    if (elements_of(*xd) > 0)
      p.copies.push_back(copy_of(v, y, k::place_box(*xd, *yd, offsets), p.element_size, *xd, *yd));
    offsets[*axis] += xd->dims[*axis];
  }
  if (offsets[*axis] != yd->dims[*axis]) return std::nullopt;
  return p;
}

/// Every variant of Split (attribute, constant input, num_outputs, the uneven
/// last part): the outputs' fixed shapes say where each starts.
std::optional<data_plan> split(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0);
  auto xd = dims_of(g.values[x].shape);
  if (!movable(g.values[x]) || !xd || xd->rank == 0) return std::nullopt;
  auto axis = norm_axis(n.get_i("axis", 0), xd->rank);
  if (!axis) return std::nullopt;
  data_plan p;
  p.kernel = "split";
  p.element_size = element_size(g.values[x].dtype);
  int64_t starts[k::max_rank] = {}, steps[k::max_rank];
  std::fill(std::begin(steps), std::end(steps), int64_t{1});
  for (int v : n.outputs) {
    if (v < 0) return std::nullopt;
    auto od = dims_of(g.values[v].shape);
    if (!od || od->rank != xd->rank) return std::nullopt;
    if (elements_of(*od) > 0)
      p.copies.push_back(copy_of(x, v, k::slice_box(*xd, starts, steps, *od), p.element_size, *xd, *od));
    starts[*axis] += od->dims[*axis];
  }
  if (starts[*axis] != xd->dims[*axis]) return std::nullopt;
  return p;
}

/// Slice with constant starts/axes/steps (inputs from opset 10, attributes
/// before); the output's fixed shape gives each axis's length.
std::optional<data_plan> slice(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0), y = out(n, 0);
  auto xd = dims_of(g.values[x].shape);
  auto yd = dims_of(g.values[y].shape);
  if (!movable(g.values[x]) || !xd || !yd || xd->rank != yd->rank) return std::nullopt;
  std::vector<int64_t> starts, axes, steps;
  if (in(n, 1) >= 0) {
    auto s = const_ints(g, in(n, 1));
    if (!s || !const_ints(g, in(n, 2))) return std::nullopt;
    starts = *s;
    for (auto [i, into] : {std::pair{size_t{3}, &axes}, std::pair{size_t{4}, &steps}})
      if (in(n, i) >= 0) {
        auto v = const_ints(g, in(n, i));
        if (!v) return std::nullopt;
        *into = *v;
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
  data_plan p;
  p.kernel = "slice";
  p.element_size = element_size(g.values[y].dtype);
  if (elements_of(*yd) > 0)
    p.copies.push_back(copy_of(x, y, k::slice_box(*xd, first, step, *yd), p.element_size, *xd, *yd));
  return p;
}

std::optional<data_plan> expand(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0), y = out(n, 0);
  auto xd = dims_of(g.values[x].shape);
  auto yd = dims_of(g.values[y].shape);
  if (!movable(g.values[y]) || !xd || !yd) return std::nullopt;
  data_plan p;
  p.kernel = "expand";
  p.element_size = element_size(g.values[y].dtype);
  if (elements_of(*yd) > 0)
    p.copies.push_back(copy_of(x, y, k::expand_box(*xd, *yd), p.element_size, *xd, *yd));
  return p;
}

/// Tile as one box: each repeated dim d becomes (repeat, dim) with source
/// strides (0, stride) and destination strides (dim * out_stride, out_stride).
std::optional<data_plan> tile(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0), y = out(n, 0);
  auto xd = dims_of(g.values[x].shape);
  auto yd = dims_of(g.values[y].shape);
  if (!movable(g.values[y]) || !xd || !yd || xd->rank != yd->rank) return std::nullopt;
  data_plan p;
  p.kernel = "tile";
  p.element_size = element_size(g.values[y].dtype);
  if (elements_of(*yd) == 0) return p;
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
  p.copies.push_back(copy_of(x, y, k::collapse_box(box), p.element_size, *xd, *yd));
  return p;
}

/// Constant Pad with non-negative constant pads (and axes): the output filled
/// with the pad value, then the input placed at the leading pads.
std::optional<data_plan> pad(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0), y = out(n, 0);
  const auto& yv = g.values[y];
  if (!movable(yv) || n.get_s("mode", "constant") != "constant") return std::nullopt;
  auto xd = dims_of(g.values[x].shape);
  auto yd = dims_of(yv.shape);
  if (!xd || !yd || xd->rank != yd->rank) return std::nullopt;
  auto pads = const_ints(g, in(n, 1));
  if (!pads) return std::nullopt;
  std::vector<int64_t> axes;
  if (in(n, 3) >= 0) {
    auto a = const_ints(g, in(n, 3));
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
  data_plan p;
  p.kernel = "pad";
  p.element_size = element_size(yv.dtype);
  if (in(n, 2) >= 0) {
    const auto& cv = g.values[in(n, 2)];
    if (!cv.constant || cv.dtype != yv.dtype || cv.constant->bytes.size() < p.element_size)
      return std::nullopt;
    std::memcpy(&p.fill_value, cv.constant->bytes.data(), p.element_size); // little-endian
  }
  p.fill = true;
  p.output = y;
  p.output_elements = elements_of(*yd);
  if (elements_of(*xd) > 0)
    p.copies.push_back(copy_of(x, y, k::place_box(*xd, *yd, lead), p.element_size, *xd, *yd));
  return p;
}

/// Gather on any axis with int64 or int32 indices; constant ones checked here.
std::optional<data_plan> gather(const onnx::graph& g, const onnx::node& n) {
  const auto& data = g.values[in(n, 0)];
  const auto& idx = g.values[in(n, 1)];
  if (!movable(data)) return std::nullopt;
  if (idx.dtype != datatype::int64 && idx.dtype != datatype::int32) return std::nullopt;
  auto dd = dims_of(data.shape);
  if (!dd || dd->rank == 0) return std::nullopt;
  auto axis = norm_axis(n.get_i("axis", 0), dd->rank);
  if (!axis) return std::nullopt;
  int64_t count = onnx::element_count(idx.shape);
  if (count < 0) return std::nullopt;
  if (idx.constant) {
    auto ids = const_ints(g, in(n, 1));
    if (!ids) return std::nullopt;
    for (int64_t i : *ids)
      if (k::resolve_index(i, dd->dims[*axis]) < 0) return std::nullopt; // the host says why
  }
  k::make_gather_shape(dd->rank, dd->dims, *axis, count);
  data_plan p;
  p.kernel = "gather";
  p.element_size = element_size(data.dtype);
  p.input = in(n, 0);
  p.indices = in(n, 1);
  p.output = out(n, 0);
  p.output_elements = onnx::element_count(g.values[p.output].shape);
  p.indices_type = idx.dtype == datatype::int64 ? k::index_type::i64 : k::index_type::i32;
  p.gather_rank = dd->rank;
  std::copy(dd->dims, dd->dims + dd->rank, p.gather_dims);
  p.gather_axis = *axis;
  p.index_count = count;
  return p;
}

std::optional<k::dtype> float_type(datatype t) {
  switch (t) {
    case datatype::fp32: return k::dtype::f32;
    case datatype::fp16: return k::dtype::f16;
    case datatype::bf16: return k::dtype::bf16;
    default: return std::nullopt;
  }
}

std::optional<k::reduce_op> reduce_op_of(const std::string& op) {
  static const std::map<std::string, k::reduce_op> ops{
    {"GlobalAveragePool", k::reduce_op::mean}, {"GlobalMaxPool", k::reduce_op::max},
    {"ReduceL2", k::reduce_op::l2},            {"ReduceMax", k::reduce_op::max},
    {"ReduceMean", k::reduce_op::mean},        {"ReduceMin", k::reduce_op::min},
    {"ReduceProd", k::reduce_op::prod},        {"ReduceSum", k::reduce_op::sum},
    {"ReduceSumSquare", k::reduce_op::sum_square},
  };
  auto it = ops.find(op);
  if (it == ops.end()) return std::nullopt;
  return it->second;
}

/// The reductions with constant axes (attribute, or the input from ReduceSum-13
/// and the others' opset 18), keepdims either way (only a shape), and the global
/// pools as a mean or max over every axis after the channels.
std::optional<data_plan> reduce(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0), y = out(n, 0);
  auto type = float_type(g.values[x].dtype);
  auto op = reduce_op_of(n.op);
  if (!type || !op || g.values[y].dtype != g.values[x].dtype) return std::nullopt;
  auto xd = dims_of(g.values[x].shape);
  if (!xd || xd->rank == 0) return std::nullopt;
  std::vector<int64_t> axes;
  bool global = n.op == "GlobalAveragePool" || n.op == "GlobalMaxPool";
  if (global) {
    if (xd->rank < 3) return std::nullopt;
    for (int d = 2; d < xd->rank; ++d) axes.push_back(d);
  } else if (in(n, 1) >= 0) {
    auto a = const_ints(g, in(n, 1));
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
  data_plan p;
  p.kernel = "reduce";
  p.input = x;
  p.output = y;
  p.output_elements = onnx::element_count(g.values[y].shape);
  p.reduce_type = *type;
  p.reduce_op = *op;
  p.reduce_rank = xd->rank;
  std::copy(xd->dims, xd->dims + xd->rank, p.reduce_dims);
  p.reduce_axis_count = static_cast<int>(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) p.reduce_axes[i] = static_cast<int>(axes[i]);
  // Throws where the reduced axes are not adjacent: the host reduces them.
  k::make_reduce_shape(p.reduce_rank, p.reduce_dims, p.reduce_axes, p.reduce_axis_count);
  return p;
}

} // namespace

std::optional<data_plan> plan_data_step(const onnx::graph& g, const onnx::node& n) {
  using planner = std::optional<data_plan> (*)(const onnx::graph&, const onnx::node&);
  static const std::map<std::string, planner> movements{
    {"Concat", &concat}, {"Expand", &expand}, {"Gather", &gather}, {"Pad", &pad},
    {"Slice", &slice},   {"Split", &split},   {"Tile", &tile},     {"Transpose", &transpose},
  };
  try {
    if (auto it = movements.find(n.op); it != movements.end()) return it->second(g, n);
    if (reduce_op_of(n.op)) return reduce(g, n);
  } catch (const std::invalid_argument&) {
    // The kernels' planners refuse the box, permutation, gather or reduction.
  }
  return std::nullopt;
}

} // namespace caf_serving::cuda
