#include "onnx/ops_nd.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;

/// What every operator of this file refuses alike, before its own inference:
/// an opset before its first version, no first input.
std::optional<std::string> refused_input(const graph& g, const node& n) {
  static const auto first = first_versions(nd_operator_table());
  return refused_opset_or_input(g, n, first.at(n.op));
}

template <infer_function Infer>
infer_result checked(const graph& g, const node& n) {
  return refuse_then<refused_input, Infer>(g, n);
}

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

bool has_input(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

bool is_index_type(datatype t) {
  return t == datatype::int64 || t == datatype::int32;
}

std::string type_name(datatype t) {
  return std::string(to_string(t));
}

/// The error for a shape-determining input that is computed while the model runs.
std::string not_constant(const graph& g, const node& n, size_t i, const std::string& what) {
  return n.op + "'s " + what + " ('" + g.values[n.inputs[i]].name
         + "') must be known before the model runs: it is computed from the inputs in a way "
           "the engine cannot fold; export it as a constant";
}

std::string unsupported_attr(const node& n, const std::string& attr, const std::string& value,
                             const std::string& supported) {
  return "attribute " + attr + "=" + value + " of " + n.op + " is not supported by the engine ("
         + supported + ")";
}

/// Whether every element-wise reference kernel here takes `t`.
bool plain_type(datatype t) {
  return t == datatype::fp32 || t == datatype::int64 || t == datatype::int32
         || t == datatype::int8 || t == datatype::uint8 || t == datatype::bool_;
}

std::string check_plain(const graph& g, const node& n, size_t i) {
  const auto& v = g.values[n.inputs[i]];
  if (plain_type(v.dtype))
    return {};
  return "input '" + v.name + "' is " + type_name(v.dtype) + "; the engine runs " + n.op
         + " on FP32, INT64, INT32, INT8, UINT8 and BOOL";
}

/// The offset of an index tuple into `data` (dimensions `first` onwards), with
/// negative indices counted from the end. An index outside the dimension reads
/// the nearest row: a kernel cannot fail, and ONNX Runtime refuses it.
int64_t tuple_offset(const int64_t* idx, int64_t k, const shape_t& dims, const shape_t& strides,
                     size_t first) {
  int64_t off = 0;
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = dims[first + j], v = idx[j] < 0 ? idx[j] + d : idx[j];
    off += std::clamp<int64_t>(v, 0, d - 1) * strides[first + j];
  }
  return off;
}

// ------------------------------------------------------------------ GatherND, ScatterND

infer_result infer_gather_nd(const graph& g, const node& n) {
  if (n.inputs.size() != 2 || !has_input(n, 1))
    return std::string("GatherND takes data and indices");
  const auto& data = g.values[n.inputs[0]];
  const auto& idx = g.values[n.inputs[1]];
  if (auto e = check_plain(g, n, 0); !e.empty())
    return e;
  if (idx.dtype != datatype::int64)
    return "indices '" + idx.name + "' are " + type_name(idx.dtype)
           + "; GatherND takes INT64 indices";
  int64_t r = static_cast<int64_t>(data.shape.size()), q = static_cast<int64_t>(idx.shape.size());
  int64_t b = n.get_i("batch_dims", 0);
  if (r < 1 || q < 1)
    return "data " + shape_string(data.shape) + " and indices " + shape_string(idx.shape)
           + " must both have a rank of at least 1";
  if (b < 0 || b >= std::min(r, q))
    return "batch_dims " + std::to_string(b) + " must be in [0, " + std::to_string(std::min(r, q))
           + ") for data " + shape_string(data.shape) + " and indices " + shape_string(idx.shape);
  for (int64_t d = 0; d < b; ++d)
    if (data.shape[d] != idx.shape[d])
      return "data " + shape_string(data.shape) + " and indices " + shape_string(idx.shape)
             + " differ in batch dimension " + std::to_string(d);
  int64_t k = idx.shape.back();
  if (k < 1 || k > r - b)
    return "the last dimension of indices " + shape_string(idx.shape) + " must be in [1, "
           + std::to_string(r - b) + "] for data " + shape_string(data.shape) + " and batch_dims "
           + std::to_string(b);
  if (element_count(idx.shape) > 0)
    for (int64_t d = b; d < b + k; ++d)
      if (data.shape[d] == 0)
        return "indices " + shape_string(idx.shape) + " index dimension " + std::to_string(d)
               + " of data " + shape_string(data.shape) + ", which is empty";
  shape_t s(idx.shape.begin(), idx.shape.end() - 1);
  s.insert(s.end(), data.shape.begin() + b + k, data.shape.end());
  return one(data.dtype, s);
}

void run_gather_nd(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  const auto& data = in[0];
  const auto& idx = in[1];
  const auto& y = out[0];
  size_t b = static_cast<size_t>(n.get_i("batch_dims", 0));
  int64_t k = idx.shape.back();
  int64_t batches = 1;
  for (size_t d = 0; d < b; ++d) batches *= data.shape[d];
  int64_t tuples = batches == 0 ? 0 : idx.elements() / k / batches;
  int64_t slice = 1;
  for (size_t d = b + k; d < data.shape.size(); ++d) slice *= data.shape[d];
  auto st = strides_of(data.shape);
  int64_t batch_stride = b == 0 ? data.elements() : st[b - 1];
  size_t es = element_size(data.dtype);
  const auto* src = static_cast<const uint8_t*>(data.data);
  auto* dst = static_cast<uint8_t*>(y.data);
  const int64_t* ix = idx.as<int64_t>();
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t at = bi * tuples + t;
      int64_t off = bi * batch_stride + tuple_offset(ix + at * k, k, data.shape, st, b);
      std::memcpy(dst + at * slice * es, src + off * es, slice * es);
    }
}

const std::vector<std::string> scatter_reductions{"none", "add", "mul", "max", "min"};

infer_result infer_scatter_nd(const graph& g, const node& n) {
  if (n.inputs.size() != 3 || !has_input(n, 1) || !has_input(n, 2))
    return std::string("ScatterND takes data, indices and updates");
  const auto& data = g.values[n.inputs[0]];
  const auto& idx = g.values[n.inputs[1]];
  const auto& upd = g.values[n.inputs[2]];
  if (auto e = check_plain(g, n, 0); !e.empty())
    return e;
  if (idx.dtype != datatype::int64)
    return "indices '" + idx.name + "' are " + type_name(idx.dtype)
           + "; ScatterND takes INT64 indices";
  if (upd.dtype != data.dtype)
    return "updates '" + upd.name + "' are " + type_name(upd.dtype) + " but data is "
           + type_name(data.dtype);
  auto red = n.get_s("reduction", "none");
  auto it = std::find(scatter_reductions.begin(), scatter_reductions.end(), red);
  if (it == scatter_reductions.end())
    return unsupported_attr(n, "reduction", "'" + red + "'", "none, add, mul, max, min");
  int64_t first = it - scatter_reductions.begin() <= 2 ? 16 : 18;
  if (red != "none" && g.opset != 0 && g.opset < first)
    return "ScatterND's reduction '" + red + "' exists from opset " + std::to_string(first)
           + ", but the model imports opset " + std::to_string(g.opset);
  if (red != "none" && data.dtype == datatype::bool_)
    return "ScatterND's reduction '" + red + "' does not take BOOL data";
  int64_t r = static_cast<int64_t>(data.shape.size());
  if (r < 1 || idx.shape.empty())
    return "data " + shape_string(data.shape) + " and indices " + shape_string(idx.shape)
           + " must both have a rank of at least 1";
  int64_t k = idx.shape.back();
  if (k < 1 || k > r)
    return "the last dimension of indices " + shape_string(idx.shape) + " must be in [1, "
           + std::to_string(r) + "] for data " + shape_string(data.shape);
  if (element_count(idx.shape) > 0)
    for (int64_t d = 0; d < k; ++d)
      if (data.shape[d] == 0)
        return "indices " + shape_string(idx.shape) + " index dimension " + std::to_string(d)
               + " of data " + shape_string(data.shape) + ", which is empty";
  shape_t want(idx.shape.begin(), idx.shape.end() - 1);
  want.insert(want.end(), data.shape.begin() + k, data.shape.end());
  if (upd.shape != want)
    return "updates " + shape_string(upd.shape) + " must have the shape " + shape_string(want)
           + " (indices' leading dimensions, then data's after the indexed ones)";
  return one(data.dtype, data.shape);
}

template <class T>
void scatter_apply(const std::string& red, T* dst, const T* src, int64_t count) {
  if (red == "add")
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(dst[i] + src[i]);
  else if (red == "mul")
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(dst[i] * src[i]);
  else if (red == "max")
    for (int64_t i = 0; i < count; ++i) dst[i] = std::max(dst[i], src[i]);
  else if (red == "min")
    for (int64_t i = 0; i < count; ++i) dst[i] = std::min(dst[i], src[i]);
  else
    std::memcpy(dst, src, count * sizeof(T));
}

/// Updates apply in the order of the indices, so a repeated index with
/// reduction "none" keeps the last one (ONNX leaves it undefined).
void run_scatter_nd(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& data = in[0];
  const auto& idx = in[1];
  const auto& upd = in[2];
  size_t es = element_size(data.dtype);
  if (y.data != data.data)
    std::memmove(y.data, data.data, data.elements() * es);
  int64_t k = idx.shape.back();
  int64_t tuples = idx.elements() / k;
  int64_t slice = 1;
  for (size_t d = k; d < data.shape.size(); ++d) slice *= data.shape[d];
  auto st = strides_of(data.shape);
  auto red = n.get_s("reduction", "none");
  const int64_t* ix = idx.as<int64_t>();
  dispatch(data.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t off = tuple_offset(ix + t * k, k, data.shape, st, 0);
      if constexpr (std::is_same_v<T, bool>)
        scatter_apply<uint8_t>("none", y.as<uint8_t>() + off, upd.as<uint8_t>() + t * slice,
                               slice);
      else
        scatter_apply<T>(red, y.as<T>() + off, upd.as<T>() + t * slice, slice);
    }
  });
}

// ------------------------------------------------------------------ Pad

const std::vector<std::string> pad_modes{"constant", "reflect", "edge", "wrap"};

/// Pad's begin and end amounts per dimension of `rank`, from its constant pads
/// and axes inputs; the error says what is wrong.
std::variant<std::pair<shape_t, shape_t>, std::string> pad_amounts(const graph& g, const node& n,
                                                                    size_t rank) {
  if (!has_input(n, 1))
    return std::string("Pad needs its pads input");
  const auto& pads_v = g.values[n.inputs[1]];
  if (pads_v.dtype != datatype::int64)
    return "pads '" + pads_v.name + "' are " + type_name(pads_v.dtype) + "; Pad takes INT64";
  if (!pads_v.constant)
    return not_constant(g, n, 1, "pads");
  auto pads = const_ints(g, n.inputs[1]);
  std::vector<int64_t> axes;
  if (has_input(n, 3)) {
    if (!g.values[n.inputs[3]].constant)
      return not_constant(g, n, 3, "axes");
    axes = const_ints(g, n.inputs[3]);
  } else {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (pads.size() != 2 * axes.size())
    return "pads has " + std::to_string(pads.size()) + " values; Pad needs 2 per padded axis ("
           + std::to_string(2 * axes.size()) + ")";
  shape_t begin(rank, 0), end(rank, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i];
    if (a < -static_cast<int64_t>(rank) || a >= static_cast<int64_t>(rank))
      return "axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank);
    a = norm_axis(a, rank);
    begin[a] = pads[i];
    end[a] = pads[i + axes.size()];
  }
  return std::pair{begin, end};
}

infer_result infer_pad(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = check_plain(g, n, 0); !e.empty())
    return e;
  auto mode = n.get_s("mode", "constant");
  auto it = std::find(pad_modes.begin(), pad_modes.end(), mode);
  if (it == pad_modes.end())
    return unsupported_attr(n, "mode", "'" + mode + "'", "constant, reflect, edge, wrap");
  if (mode == "wrap" && g.opset != 0 && g.opset < 19)
    return "Pad's mode 'wrap' exists from opset 19, but the model imports opset "
           + std::to_string(g.opset);
  if (has_input(n, 3) && g.opset != 0 && g.opset < 18)
    return "Pad's axes input exists from opset 18, but the model imports opset "
           + std::to_string(g.opset);
  if (has_input(n, 2)) {
    const auto& c = g.values[n.inputs[2]];
    if (c.dtype != x.dtype || element_count(c.shape) != 1)
      return "constant_value '" + c.name + "' must be one " + type_name(x.dtype)
             + " like the data, got " + type_name(c.dtype) + " " + shape_string(c.shape);
  }
  auto amounts = pad_amounts(g, n, x.shape.size());
  if (auto* e = std::get_if<std::string>(&amounts))
    return *e;
  const auto& [begin, end] = std::get<0>(amounts);
  shape_t s = x.shape;
  for (size_t d = 0; d < s.size(); ++d) {
    int64_t kept = x.shape[d] - std::max<int64_t>(0, -begin[d]) - std::max<int64_t>(0, -end[d]);
    s[d] = x.shape[d] + begin[d] + end[d];
    if (s[d] < 0 || kept < 0)
      return "pads " + std::to_string(begin[d]) + " and " + std::to_string(end[d])
             + " remove more than dimension " + std::to_string(d) + " of "
             + shape_string(x.shape) + " holds";
    if (mode != "constant" && kept == 0 && s[d] > 0)
      return "Pad's mode '" + mode + "' cannot pad dimension " + std::to_string(d) + " of "
             + shape_string(x.shape) + ": no element is left to repeat";
    if (mode == "reflect" && kept > 0 && (begin[d] >= kept || end[d] >= kept))
      return "Pad's mode 'reflect' pads at most " + std::to_string(kept - 1)
             + " elements on each side of dimension " + std::to_string(d) + " of "
             + shape_string(x.shape) + ", not " + std::to_string(std::max(begin[d], end[d]));
  }
  return one(x.dtype, s);
}

/// The source index along a dimension of `len` kept elements for position `p`
/// relative to the first kept one; -1 where the constant goes.
int64_t pad_source(const std::string& mode, int64_t p, int64_t len) {
  if (p >= 0 && p < len)
    return p;
  if (mode == "constant")
    return -1;
  if (mode == "edge")
    return std::clamp<int64_t>(p, 0, len - 1);
  if (mode == "wrap")
    return ((p % len) + len) % len;
  if (len == 1) // reflect
    return 0;
  int64_t period = 2 * (len - 1);
  int64_t m = ((p % period) + period) % period;
  return m < len ? m : period - m;
}

void run_pad(const node& n, const std::vector<tensor_ref>& in,
             const std::vector<tensor_ref>& outputs) {
  const auto& y = outputs[0];
  const auto& x = in[0];
  size_t rank = x.shape.size();
  auto pads = ref_ints(in[1]);
  std::vector<int64_t> axes;
  if (in.size() > 3 && in[3].data)
    axes = ref_ints(in[3]);
  else {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  shape_t begin(rank, 0), end(rank, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    auto a = norm_axis(axes[i], rank);
    begin[a] = pads[i];
    end[a] = pads[i + axes.size()];
  }
  auto mode = n.get_s("mode", "constant");
  size_t es = element_size(x.dtype);
  std::vector<uint8_t> fill(es, 0);
  if (in.size() > 2 && in[2].data)
    std::memcpy(fill.data(), in[2].data, es);
  // Per dimension, the source index of every output position (-1: the constant).
  auto st = strides_of(x.shape);
  std::vector<std::vector<int64_t>> src(rank);
  for (size_t d = 0; d < rank; ++d) {
    int64_t lo = std::max<int64_t>(0, -begin[d]);
    int64_t len = x.shape[d] - lo - std::max<int64_t>(0, -end[d]);
    int64_t pb = std::max<int64_t>(0, begin[d]);
    for (int64_t o = 0; o < y.shape[d]; ++o) {
      int64_t s = pad_source(mode, o - pb, len);
      src[d].push_back(s < 0 ? -1 : (s + lo) * st[d]);
    }
  }
  const auto* xs = static_cast<const uint8_t*>(x.data);
  auto* out = static_cast<uint8_t*>(y.data);
  int64_t total = y.elements();
  shape_t idx(rank, 0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    bool constant = false;
    for (size_t d = 0; d < rank; ++d) {
      int64_t s = src[d][idx[d]];
      constant = constant || s < 0;
      off += s;
    }
    std::memcpy(out + i * es, constant ? fill.data() : xs + off * es, es);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < y.shape[d])
        break;
      idx[d] = 0;
    }
  }
}

// ------------------------------------------------------------------ Trilu, Tile

infer_result infer_trilu(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = check_plain(g, n, 0); !e.empty())
    return e;
  if (x.shape.size() < 2)
    return "Trilu's input " + shape_string(x.shape) + " must have a rank of at least 2";
  if (has_input(n, 1)) {
    const auto& k = g.values[n.inputs[1]];
    if (k.dtype != datatype::int64 || element_count(k.shape) != 1)
      return "k '" + k.name + "' must be one INT64, got " + type_name(k.dtype) + " "
             + shape_string(k.shape);
  }
  return one(x.dtype, x.shape);
}

void run_trilu(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& outputs) {
  const auto& y = outputs[0];
  const auto& x = in[0];
  int64_t k = in.size() > 1 && in[1].data ? in[1].as<int64_t>()[0] : 0;
  bool upper = n.get_i("upper", 1) != 0;
  int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
  int64_t mats = rows * cols == 0 ? 0 : x.elements() / (rows * cols);
  size_t es = element_size(x.dtype);
  const auto* xs = static_cast<const uint8_t*>(x.data);
  auto* out = static_cast<uint8_t*>(y.data);
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        int64_t at = ((m * rows + i) * cols + j) * static_cast<int64_t>(es);
        bool keep = upper ? j - i >= k : j - i <= k;
        if (keep)
          std::memcpy(out + at, xs + at, es);
        else
          std::memset(out + at, 0, es);
      }
}

infer_result infer_tile(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = check_plain(g, n, 0); !e.empty())
    return e;
  if (!has_input(n, 1))
    return std::string("Tile needs its repeats input");
  if (!g.values[n.inputs[1]].constant)
    return not_constant(g, n, 1, "repeats");
  auto reps = const_ints(g, n.inputs[1]);
  if (reps.size() != x.shape.size())
    return "repeats has " + std::to_string(reps.size()) + " values for input "
           + shape_string(x.shape) + "; Tile needs one per dimension";
  shape_t s = x.shape;
  for (size_t d = 0; d < s.size(); ++d) {
    if (reps[d] < 0)
      return "repeats " + std::to_string(reps[d]) + " is negative";
    s[d] *= reps[d];
  }
  return one(x.dtype, s);
}

void run_tile(const node&, const std::vector<tensor_ref>& inputs,
              const std::vector<tensor_ref>& outputs) {
  const auto& x = inputs[0];
  const auto& y = outputs[0];
  size_t rank = x.shape.size(), es = element_size(x.dtype);
  auto st = strides_of(x.shape);
  const auto* xs = static_cast<const uint8_t*>(x.data);
  auto* out = static_cast<uint8_t*>(y.data);
  int64_t total = y.elements();
  shape_t idx(rank, 0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < rank; ++d) off += (idx[d] % x.shape[d]) * st[d];
    std::memcpy(out + i * es, xs + off * es, es);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < y.shape[d])
        break;
      idx[d] = 0;
    }
  }
}

// ------------------------------------------------------------------ TopK, NonZero

infer_result infer_topk(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (x.dtype != datatype::fp32 && x.dtype != datatype::int64 && x.dtype != datatype::int32)
    return "input '" + x.name + "' is " + type_name(x.dtype)
           + "; the engine runs TopK on FP32, INT64 and INT32";
  if (!has_input(n, 1))
    return std::string("TopK needs its K input");
  if (!g.values[n.inputs[1]].constant)
    return not_constant(g, n, 1, "K");
  auto ks = const_ints(g, n.inputs[1]);
  int64_t rank = static_cast<int64_t>(x.shape.size()), axis = n.get_i("axis", -1);
  if (rank == 0 || axis < -rank || axis >= rank)
    return "axis " + std::to_string(axis) + " is out of range for " + shape_string(x.shape);
  axis = norm_axis(axis, rank);
  if (ks.size() != 1 || ks[0] < 0 || ks[0] > x.shape[axis])
    return "K must be one value in [0, " + std::to_string(x.shape[axis]) + "] for axis "
           + std::to_string(axis) + " of " + shape_string(x.shape);
  shape_t s = x.shape;
  s[axis] = ks[0];
  return std::vector<inferred>{{x.dtype, s}, {datatype::int64, s}};
}

/// Sorted by value (NaN above every number, as ONNX Runtime orders it), equal
/// values by lower index first.
template <class T>
void topk_kernel(const node& n, const tensor_ref& x, int64_t k,
                 const std::vector<tensor_ref>& out) {
  int64_t axis = norm_axis(n.get_i("axis", -1), x.shape.size());
  bool largest = n.get_i("largest", 1) != 0;
  int64_t d = x.shape[axis], inner = 1;
  for (size_t i = axis + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
  int64_t outer = d * inner == 0 ? 0 : x.elements() / (d * inner);
  const T* in = x.as<T>();
  auto key = [](T v) {
    if constexpr (std::is_floating_point_v<T>)
      return std::isnan(v) ? std::numeric_limits<double>::infinity() : double(v);
    else
      return v;
  };
  std::vector<int64_t> order(d);
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t j = 0; j < inner; ++j) {
      const T* p = in + a * d * inner + j;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t l, int64_t r) {
        return largest ? key(p[l * inner]) > key(p[r * inner])
                       : key(p[l * inner]) < key(p[r * inner]);
      });
      for (int64_t t = 0; t < k; ++t) {
        int64_t at = (a * k + t) * inner + j;
        out[0].as<T>()[at] = p[order[t] * inner];
        if (out.size() > 1 && out[1].data)
          out[1].as<int64_t>()[at] = order[t];
      }
    }
}

int64_t count_nonzero(const uint8_t* bytes, int64_t elements, size_t es) {
  int64_t count = 0;
  std::vector<uint8_t> zero(es, 0);
  for (int64_t i = 0; i < elements; ++i)
    if (std::memcmp(bytes + i * es, zero.data(), es) != 0)
      ++count;
  return count;
}

infer_result infer_nonzero(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = check_plain(g, n, 0); !e.empty())
    return e;
  if (!x.constant)
    return "NonZero's output shape depends on the values of '" + x.name
           + "', which are computed while the model runs; the engine plans every shape before "
             "it runs, so it takes NonZero only on constants. Replace it in the model (e.g. "
             "with a mask and Where)";
  int64_t count = count_nonzero(x.constant->bytes.data(), x.constant->elements(),
                                element_size(x.dtype));
  if (x.dtype == datatype::fp32) { // -0.0 is zero
    count = 0;
    for (int64_t i = 0; i < x.constant->elements(); ++i)
      count += x.constant->as<float>()[i] != 0.0f;
  }
  return one(datatype::int64, {static_cast<int64_t>(x.shape.size()), count});
}

void run_nonzero(const node&, const std::vector<tensor_ref>& inputs,
                 const std::vector<tensor_ref>& outputs) {
  const auto& x = inputs[0];
  const auto& y = outputs[0];
  size_t rank = x.shape.size(), es = element_size(x.dtype);
  int64_t count = y.shape[1];
  auto st = strides_of(x.shape);
  const auto* xs = static_cast<const uint8_t*>(x.data);
  int64_t found = 0;
  for (int64_t i = 0; i < x.elements() && found < count; ++i) {
    bool nz = x.dtype == datatype::fp32 ? x.as<float>()[i] != 0.0f
                                        : count_nonzero(xs + i * es, 1, es) != 0;
    if (!nz)
      continue;
    int64_t rest = i;
    for (size_t d = 0; d < rank; ++d) {
      y.as<int64_t>()[d * count + found] = rest / st[d];
      rest %= st[d];
    }
    ++found;
  }
}

// ------------------------------------------------------------------ Resize

const std::vector<std::string> coordinate_modes{
  "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
  "tf_half_pixel_for_nn"};
const std::vector<std::string> nearest_modes{"round_prefer_floor", "round_prefer_ceil", "floor",
                                             "ceil"};

/// Resize's output shape and the scale of each dimension, from its constant
/// scales or sizes input.
struct resize_geometry {
  shape_t out;
  std::vector<float> scales;
};

std::variant<resize_geometry, std::string> resize_geometry_of(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  size_t rank = x.shape.size();
  // Resize-10 reads scales from input 1; from 11 on, input 1 is roi.
  bool v10 = g.opset != 0 && g.opset < 11;
  size_t scales_at = v10 ? 1 : 2, sizes_at = 3;
  auto given = [&](size_t i) {
    return has_input(n, i) && element_count(g.values[n.inputs[i]].shape) > 0;
  };
  std::vector<int64_t> axes = n.get_ints("axes");
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (auto& a : axes) {
    if (a < -static_cast<int64_t>(rank) || a >= static_cast<int64_t>(rank))
      return "axis " + std::to_string(a) + " is out of range for " + shape_string(x.shape);
    a = norm_axis(a, rank);
  }
  resize_geometry geo{x.shape, std::vector<float>(rank, 1.0f)};
  if (given(scales_at)) {
    if (given(sizes_at))
      return std::string("Resize takes scales or sizes, not both");
    if (!g.values[n.inputs[scales_at]].constant)
      return not_constant(g, n, scales_at, "scales");
    const auto& c = *g.values[n.inputs[scales_at]].constant;
    if (c.dtype != datatype::fp32 || c.elements() != static_cast<int64_t>(axes.size()))
      return "scales must be " + std::to_string(axes.size()) + " FLOAT values, got "
             + std::to_string(c.elements()) + " " + type_name(c.dtype);
    for (size_t i = 0; i < axes.size(); ++i) {
      float s = c.as<float>()[i];
      if (!(s > 0))
        return "scale " + std::to_string(s) + " must be positive";
      geo.scales[axes[i]] = s;
      geo.out[axes[i]] = static_cast<int64_t>(s * static_cast<float>(x.shape[axes[i]]));
    }
    return geo;
  }
  if (!given(sizes_at))
    return std::string("Resize needs scales or sizes");
  if (!g.values[n.inputs[sizes_at]].constant)
    return not_constant(g, n, sizes_at, "sizes");
  auto sizes = const_ints(g, n.inputs[sizes_at]);
  if (sizes.size() != axes.size())
    return "sizes has " + std::to_string(sizes.size()) + " values for "
           + std::to_string(axes.size()) + " resized axes";
  auto policy = n.get_s("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    return unsupported_attr(n, "keep_aspect_ratio_policy", "'" + policy + "'",
                            "stretch, not_larger, not_smaller");
  float common = policy == "not_larger" ? std::numeric_limits<float>::max() : 0.0f;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (sizes[i] < 0 || x.shape[axes[i]] == 0)
      return "size " + std::to_string(sizes[i]) + " for dimension " + std::to_string(axes[i])
             + " of " + shape_string(x.shape) + " cannot be reached";
    float s = static_cast<float>(sizes[i]) / static_cast<float>(x.shape[axes[i]]);
    common = policy == "not_larger" ? std::min(common, s) : std::max(common, s);
    geo.scales[axes[i]] = s;
    geo.out[axes[i]] = sizes[i];
  }
  if (policy != "stretch")
    for (auto a : axes) {
      geo.scales[a] = common;
      geo.out[a] = static_cast<int64_t>(std::round(common * static_cast<float>(x.shape[a])));
    }
  return geo;
}

infer_result infer_resize(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  auto mode = n.get_s("mode", "nearest");
  if (mode != "nearest" && mode != "linear")
    return unsupported_attr(n, "mode", "'" + mode + "'", "nearest, linear");
  auto ct = n.get_s("coordinate_transformation_mode", "half_pixel");
  if (std::find(coordinate_modes.begin(), coordinate_modes.end(), ct) == coordinate_modes.end())
    return unsupported_attr(n, "coordinate_transformation_mode", "'" + ct + "'",
                            "half_pixel, half_pixel_symmetric, pytorch_half_pixel, "
                            "align_corners, asymmetric, tf_half_pixel_for_nn");
  auto nm = n.get_s("nearest_mode", "round_prefer_floor");
  if (std::find(nearest_modes.begin(), nearest_modes.end(), nm) == nearest_modes.end())
    return unsupported_attr(n, "nearest_mode", "'" + nm + "'",
                            "round_prefer_floor, round_prefer_ceil, floor, ceil");
  if (n.get_i("antialias", 0) != 0 && mode == "linear")
    return unsupported_attr(n, "antialias", std::to_string(n.get_i("antialias", 0)),
                            "0; torch's interpolate(antialias=True) exports it");
  if (n.get_i("exclude_outside", 0) != 0)
    return unsupported_attr(n, "exclude_outside", "1", "0; it concerns cubic mode only");
  if (x.dtype != datatype::fp32 && !(mode == "nearest" && plain_type(x.dtype)))
    return "input '" + x.name + "' is " + type_name(x.dtype)
           + "; the engine runs Resize on FP32 (and nearest on any of its datatypes)";
  auto geo = resize_geometry_of(g, n);
  if (auto* e = std::get_if<std::string>(&geo))
    return *e;
  return one(x.dtype, std::get<resize_geometry>(geo).out);
}

/// Where output coordinate `o` of a dimension of `in` elements resized to `out`
/// by `scale` lies in the input, for coordinate_transformation_mode `ct`.
float source_coordinate(const std::string& ct, int64_t o, int64_t in, int64_t out, float scale) {
  float x = static_cast<float>(o);
  if (ct == "asymmetric")
    return x / scale;
  if (ct == "align_corners")
    return out == 1 ? 0.0f : x * static_cast<float>(in - 1) / static_cast<float>(out - 1);
  if (ct == "pytorch_half_pixel")
    return out > 1 ? (x + 0.5f) / scale - 0.5f : 0.0f;
  if (ct == "tf_half_pixel_for_nn")
    return (x + 0.5f) / scale;
  if (ct == "half_pixel_symmetric") {
    float adjustment = static_cast<float>(out) / (scale * static_cast<float>(in));
    float center = static_cast<float>(in) / 2.0f;
    float offset = center * (1.0f - adjustment);
    return offset + (x + 0.5f) / scale - 0.5f;
  }
  return (x + 0.5f) / scale - 0.5f; // half_pixel
}

int64_t nearest_index(const std::string& nm, float x, int64_t in) {
  float f = std::floor(x);
  int64_t i;
  if (nm == "floor")
    i = static_cast<int64_t>(f);
  else if (nm == "ceil")
    i = static_cast<int64_t>(std::ceil(x));
  else if (x - f == 0.5f)
    i = static_cast<int64_t>(nm == "round_prefer_ceil" ? f + 1 : f);
  else
    i = static_cast<int64_t>(std::round(x));
  return std::clamp<int64_t>(i, 0, in - 1);
}

/// The scale of each dimension as the kernel sees it: the scales input where
/// the model gives one (output sizes are floored, so out/in may differ from
/// it), else out/in, or the common scale that keep_aspect_ratio_policy chose.
std::vector<float> kernel_scales(const node& n, const std::vector<tensor_ref>& in,
                                 const tensor_ref& x, const tensor_ref& y) {
  size_t rank = x.shape.size();
  std::vector<float> scales(rank);
  for (size_t d = 0; d < rank; ++d)
    scales[d] = static_cast<float>(y.shape[d]) / static_cast<float>(x.shape[d]);
  std::vector<int64_t> axes = n.get_ints("axes");
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  size_t scales_at = in.size() == 2 ? 1 : 2; // Resize-10: X, scales
  if (in.size() > scales_at && in[scales_at].data && in[scales_at].elements() > 0) {
    for (size_t i = 0; i < axes.size(); ++i)
      scales[norm_axis(axes[i], rank)] = in[scales_at].as<float>()[i];
    return scales;
  }
  auto policy = n.get_s("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && in.size() > 3 && in[3].data) {
    auto sizes = ref_ints(in[3]);
    float common = policy == "not_larger" ? std::numeric_limits<float>::max() : 0.0f;
    for (size_t i = 0; i < axes.size(); ++i) {
      auto a = norm_axis(axes[i], rank);
      float s = static_cast<float>(sizes[i]) / static_cast<float>(x.shape[a]);
      common = policy == "not_larger" ? std::min(common, s) : std::max(common, s);
    }
    for (auto a : axes) scales[norm_axis(a, rank)] = common;
  }
  return scales;
}

/// Each output position of each dimension reads one (nearest) or two (linear)
/// input positions with weights: nearest gathers, linear interpolates one
/// dimension after the other.
void run_resize(const node& n, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& outputs) {
  const auto& y = outputs[0];
  const auto& x = in[0];
  size_t rank = x.shape.size();
  auto mode = n.get_s("mode", "nearest");
  auto ct = n.get_s("coordinate_transformation_mode", "half_pixel");
  auto nm = n.get_s("nearest_mode", "round_prefer_floor");
  struct tap {
    int64_t offset[2];
    float weight[2];
    int count;
  };
  auto st = strides_of(x.shape);
  auto scales = kernel_scales(n, in, x, y);
  std::vector<std::vector<tap>> taps(rank);
  for (size_t d = 0; d < rank; ++d) {
    int64_t extent = x.shape[d], out = y.shape[d];
    for (int64_t o = 0; o < out; ++o) {
      float c = source_coordinate(ct, o, extent, out, scales[d]);
      tap t{};
      if (mode == "nearest") {
        t = {{nearest_index(nm, c, extent) * st[d], 0}, {1.0f, 0.0f}, 1};
      } else {
        c = std::clamp(c, 0.0f, static_cast<float>(extent - 1));
        int64_t lo = std::min<int64_t>(static_cast<int64_t>(c), extent - 1);
        int64_t hi = std::min<int64_t>(lo + 1, extent - 1);
        float w = c - static_cast<float>(lo);
        t = {{lo * st[d], hi * st[d]}, {1.0f - w, w}, 2};
      }
      taps[d].push_back(t);
    }
  }
  int64_t total = y.elements();
  if (total == 0)
    return;
  if (mode == "linear") {
    // Linear interpolation is separable: one pass per resized dimension, each
    // output row the weighted sum of two input rows of the dimensions after it.
    std::vector<float> cur(x.as<float>(), x.as<float>() + x.elements()), next;
    shape_t shape = x.shape;
    for (size_t d = 0; d < rank; ++d) {
      bool identity = shape[d] == y.shape[d];
      for (int64_t o = 0; identity && o < y.shape[d]; ++o)
        identity = taps[d][o].offset[0] == o * st[d] && taps[d][o].weight[1] == 0.0f;
      if (identity)
        continue;
      int64_t outer = 1, inner = 1;
      for (size_t k = 0; k < d; ++k) outer *= shape[k];
      for (size_t k = d + 1; k < rank; ++k) inner *= shape[k];
      next.assign(static_cast<size_t>(outer * y.shape[d] * inner), 0.0f);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < y.shape[d]; ++j) {
          const auto& t = taps[d][j];
          const float* lo = cur.data() + (o * shape[d] + t.offset[0] / st[d]) * inner;
          const float* hi = cur.data() + (o * shape[d] + t.offset[1] / st[d]) * inner;
          float* dst = next.data() + (o * y.shape[d] + j) * inner;
          float w0 = t.weight[0], w1 = t.weight[1];
          for (int64_t i = 0; i < inner; ++i) dst[i] = w0 * lo[i] + w1 * hi[i];
        }
      shape[d] = y.shape[d];
      cur.swap(next);
    }
    std::memcpy(y.data, cur.data(), static_cast<size_t>(total) * sizeof(float));
    return;
  }
  shape_t idx(rank, 0);
  size_t es = element_size(x.dtype);
  const auto* xs = static_cast<const uint8_t*>(x.data);
  auto* out = static_cast<uint8_t*>(y.data);
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < rank; ++d) off += taps[d][idx[d]].offset[0];
    std::memcpy(out + i * es, xs + off * es, es);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < y.shape[d])
        break;
      idx[d] = 0;
    }
  }
}

// ------------------------------------------------------------------ Einsum

/// An Einsum equation resolved against its operands' ranks: every label (an
/// ellipsis stands for its dimensions, numbered) becomes a loop variable.
struct einsum_plan {
  std::vector<std::vector<int>> operand_vars; ///< per operand, the variable of each dimension
  std::vector<int> output_vars;
  int vars = 0;
};

std::variant<einsum_plan, std::string> plan_einsum(const std::string& equation,
                                                   const std::vector<size_t>& ranks) {
  std::string eq;
  for (char c : equation)
    if (c != ' ')
      eq += c;
  auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    auto comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma - start));
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  if (terms.size() != ranks.size())
    return "equation '" + equation + "' names " + std::to_string(terms.size())
           + " operands, the node has " + std::to_string(ranks.size());
  einsum_plan p;
  std::map<char, int> var_of;
  std::map<char, int> uses;
  int ellipsis_rank = -1;
  std::vector<int> ellipsis_vars;
  auto labels_of = [](const std::string& term) {
    std::string labels;
    for (size_t i = 0; i < term.size(); ++i) {
      if (term.compare(i, 3, "...") == 0) {
        labels += '.';
        i += 2;
      } else {
        labels += term[i];
      }
    }
    return labels;
  };
  for (size_t t = 0; t < terms.size(); ++t) {
    auto labels = labels_of(terms[t]);
    size_t named = labels.size() - std::count(labels.begin(), labels.end(), '.');
    if (std::count(labels.begin(), labels.end(), '.') > 1)
      return "operand " + std::to_string(t) + " of '" + equation + "' has two ellipses";
    bool has_ellipsis = labels.find('.') != std::string::npos;
    if (named > ranks[t] || (!has_ellipsis && named != ranks[t]))
      return "operand " + std::to_string(t) + " of '" + equation + "' names "
             + std::to_string(named) + " dimensions, its input has " + std::to_string(ranks[t]);
    std::vector<int> vars;
    for (char c : labels) {
      if (c == '.') {
        int er = static_cast<int>(ranks[t] - named);
        if (ellipsis_rank < 0) {
          ellipsis_rank = er;
          for (int k = 0; k < er; ++k) ellipsis_vars.push_back(p.vars++);
        }
        // Broadcast: a shorter ellipsis takes the trailing ellipsis dimensions.
        if (er > static_cast<int>(ellipsis_vars.size())) {
          std::vector<int> more;
          for (int k = 0; k < er - static_cast<int>(ellipsis_vars.size()); ++k)
            more.push_back(p.vars++);
          ellipsis_vars.insert(ellipsis_vars.begin(), more.begin(), more.end());
        }
        vars.insert(vars.end(), ellipsis_vars.end() - er, ellipsis_vars.end());
        continue;
      }
      if (!std::isalpha(static_cast<unsigned char>(c)))
        return "equation '" + equation + "' has the character '" + std::string(1, c)
               + "', which is not a letter";
      if (!var_of.count(c))
        var_of[c] = p.vars++;
      ++uses[c];
      vars.push_back(var_of[c]);
    }
    p.operand_vars.push_back(vars);
  }
  if (arrow != std::string::npos) {
    auto labels = labels_of(eq.substr(arrow + 2));
    for (char c : labels) {
      if (std::count(labels.begin(), labels.end(), c) > 1)
        return "the output of '" + equation + "' names '" + std::string(1, c) + "' twice";
      if (c == '.') {
        p.output_vars.insert(p.output_vars.end(), ellipsis_vars.begin(), ellipsis_vars.end());
        continue;
      }
      if (!var_of.count(c))
        return "the output of '" + equation + "' names '" + std::string(1, c)
               + "', which no operand has";
      p.output_vars.push_back(var_of[c]);
    }
  } else {
    p.output_vars = ellipsis_vars;
    for (const auto& [c, count] : uses) // std::map: ASCII order, upper case first
      if (count == 1)
        p.output_vars.push_back(var_of[c]);
  }
  return p;
}

/// Each variable's extent; an error where operands disagree.
std::variant<shape_t, std::string> einsum_extents(const einsum_plan& p,
                                                  const std::vector<shape_t>& shapes) {
  shape_t ext(p.vars, 1);
  for (size_t t = 0; t < shapes.size(); ++t)
    for (size_t d = 0; d < shapes[t].size(); ++d) {
      int v = p.operand_vars[t][d];
      int64_t s = shapes[t][d];
      if (s == 1 || s == ext[v])
        continue;
      if (ext[v] != 1)
        return "dimension " + std::to_string(d) + " of operand " + std::to_string(t) + " "
               + shape_string(shapes[t]) + " is " + std::to_string(s) + " where another "
               "dimension of the same label is " + std::to_string(ext[v]);
      ext[v] = s;
    }
  return ext;
}

infer_result infer_einsum(const graph& g, const node& n) {
  std::vector<size_t> ranks;
  std::vector<shape_t> shapes;
  datatype t = g.values[n.inputs[0]].dtype;
  if (t != datatype::fp32 && t != datatype::int64 && t != datatype::int32)
    return "input '" + g.values[n.inputs[0]].name + "' is " + type_name(t)
           + "; the engine runs Einsum on FP32, INT64 and INT32";
  for (int v : n.inputs) {
    if (v < 0 || g.values[v].dtype != t)
      return std::string("Einsum's operands must all be given and of one datatype");
    ranks.push_back(g.values[v].shape.size());
    shapes.push_back(g.values[v].shape);
  }
  if (!n.has("equation"))
    return std::string("Einsum needs its equation attribute");
  auto plan = plan_einsum(n.get_s("equation", ""), ranks);
  if (auto* e = std::get_if<std::string>(&plan))
    return *e;
  const auto& p = std::get<einsum_plan>(plan);
  auto ext = einsum_extents(p, shapes);
  if (auto* e = std::get_if<std::string>(&ext))
    return *e;
  shape_t s;
  for (int v : p.output_vars) s.push_back(std::get<shape_t>(ext)[v]);
  return one(t, s);
}

/// Copies `src` (dimensions labelled `src_vars`) into the order `dst_vars`, each
/// variable of extent `ext`: a transpose.
void permute_copy(const float* src, const std::vector<int>& src_vars, const shape_t& src_shape,
                  const std::vector<int>& dst_vars, const shape_t& ext, float* dst) {
  auto src_st = strides_of(src_shape);
  shape_t dst_shape, st;
  for (int v : dst_vars) {
    dst_shape.push_back(ext[v]);
    auto d = std::find(src_vars.begin(), src_vars.end(), v) - src_vars.begin();
    st.push_back(src_st[d]);
  }
  std::array<shape_t, 1> strides{st};
  broadcast_loop<1>(dst_shape, strides, [&](int64_t i, const std::array<int64_t, 1>& off) {
    dst[i] = src[off[0]];
  });
}

/// Two FLOAT operands whose labels each appear once per operand and with the
/// operand's own extent (no diagonal, no broadcast, no label summed in one
/// operand alone), as exporters write a batched matrix product
/// ("bhqd,bhkd->bhqk", "bij,jk->bik"): transposed into [batch, M, K] and
/// [batch, K, N], multiplied by OpenBLAS per batch, transposed into the output.
/// False (nothing written) for any other equation.
bool einsum_as_gemm(const einsum_plan& p, const shape_t& ext, const std::vector<tensor_ref>& in,
                    const tensor_ref& y) {
  if (in.size() != 2 || in[0].dtype != datatype::fp32 || y.elements() == 0)
    return false;
  const auto& a = p.operand_vars[0];
  const auto& b = p.operand_vars[1];
  auto in_list = [](const std::vector<int>& l, int v) {
    return std::find(l.begin(), l.end(), v) != l.end();
  };
  for (size_t k = 0; k < 2; ++k) {
    const auto& vars = p.operand_vars[k];
    for (size_t d = 0; d < vars.size(); ++d)
      if (std::count(vars.begin(), vars.end(), vars[d]) > 1 || in[k].shape[d] != ext[vars[d]])
        return false;
  }
  std::vector<int> batch, m, nn, kk;
  for (int v = 0; v < p.vars; ++v) {
    bool ia = in_list(a, v), ib = in_list(b, v), io = in_list(p.output_vars, v);
    if (ia && ib && io)
      batch.push_back(v);
    else if (ia && ib)
      kk.push_back(v);
    else if (ia && io)
      m.push_back(v);
    else if (ib && io)
      nn.push_back(v);
    else
      return false;
  }
  auto product = [&](const std::vector<int>& vars) {
    int64_t r = 1;
    for (int v : vars) r *= ext[v];
    return r;
  };
  int64_t nb = product(batch), rows = product(m), cols = product(nn), inner = product(kk);
  auto concat = [](std::vector<int> x, const std::vector<int>& more) {
    x.insert(x.end(), more.begin(), more.end());
    return x;
  };
  auto a_order = concat(concat(batch, m), kk);
  auto b_order = concat(concat(batch, kk), nn);
  auto c_order = concat(concat(batch, m), nn);
  std::vector<float> at(nb * rows * inner), bt(nb * inner * cols), ct(nb * rows * cols);
  permute_copy(in[0].as<float>(), a, in[0].shape, a_order, ext, at.data());
  permute_copy(in[1].as<float>(), b, in[1].shape, b_order, ext, bt.data());
  for (int64_t i = 0; i < nb; ++i)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(cols), static_cast<int>(inner), 1.0f,
                at.data() + i * rows * inner, static_cast<int>(inner),
                bt.data() + i * inner * cols, static_cast<int>(cols), 0.0f,
                ct.data() + i * rows * cols, static_cast<int>(cols));
  shape_t c_shape;
  for (int v : c_order) c_shape.push_back(ext[v]);
  permute_copy(ct.data(), c_order, c_shape, p.output_vars, ext, y.as<float>());
  return true;
}

/// Plain loops over every variable: the output ones outside, the summed ones
/// inside; each operand's offset moves by its strides (0 where it broadcasts).
/// Two FLOAT operands in a matrix-product pattern go to einsum_as_gemm().
template <class T>
void einsum_kernel(const node& n, const std::vector<tensor_ref>& in, const tensor_ref& y) {
  std::vector<size_t> ranks;
  std::vector<shape_t> shapes;
  for (const auto& t : in) {
    ranks.push_back(t.shape.size());
    shapes.push_back(t.shape);
  }
  auto p = std::get<einsum_plan>(plan_einsum(n.get_s("equation", ""), ranks));
  auto ext = std::get<shape_t>(einsum_extents(p, shapes));
  if constexpr (std::is_same_v<T, float>)
    if (einsum_as_gemm(p, ext, in, y))
      return;
  std::vector<bool> is_out(p.vars, false);
  for (int v : p.output_vars) is_out[v] = true;
  std::vector<int> order = p.output_vars;
  for (int v = 0; v < p.vars; ++v)
    if (!is_out[v])
      order.push_back(v);
  size_t ops = in.size();
  // stride[k][j]: operand k's step for loop j (the output is operand `ops`).
  std::vector<shape_t> stride(ops + 1, shape_t(order.size(), 0));
  for (size_t k = 0; k <= ops; ++k) {
    const auto& shape = k < ops ? in[k].shape : y.shape;
    const auto& vars = k < ops ? p.operand_vars[k] : p.output_vars;
    auto st = strides_of(shape);
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1)
        continue;
      auto j = std::find(order.begin(), order.end(), vars[d]) - order.begin();
      stride[k][j] += st[d];
    }
  }
  T* out = y.as<T>();
  std::fill(out, out + y.elements(), T{});
  int64_t total = 1;
  for (int v : order) total *= ext[v];
  if (total == 0)
    return;
  shape_t idx(order.size(), 0), off(ops + 1, 0);
  for (int64_t i = 0; i < total; ++i) {
    T prod = T(1);
    for (size_t k = 0; k < ops; ++k) prod = static_cast<T>(prod * in[k].as<T>()[off[k]]);
    out[off[ops]] = static_cast<T>(out[off[ops]] + prod);
    for (int j = static_cast<int>(order.size()) - 1; j >= 0; --j) {
      ++idx[j];
      for (size_t k = 0; k <= ops; ++k) off[k] += stride[k][j];
      if (idx[j] < ext[order[j]])
        break;
      for (size_t k = 0; k <= ops; ++k) off[k] -= stride[k][j] * ext[order[j]];
      idx[j] = 0;
    }
  }
}

void run_topk(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  int64_t k = y.shape[norm_axis(n.get_i("axis", -1), y.shape.size())];
  dispatch(in[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, int64_t>
                  || std::is_same_v<T, int32_t>)
      topk_kernel<T>(n, in[0], k, out);
  });
}

void run_einsum(const node& n, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  dispatch(in[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, int64_t>
                  || std::is_same_v<T, int32_t>)
      einsum_kernel<T>(n, in, out[0]);
  });
}

} // namespace

const op_table& nd_operator_table() {
  // Every version (since_version) from the first up to onnx 1.23's opset 28.
  // Between the versions listed only the spec's type lists changed
  // (fp16/bf16/fp8/int4 added, which the engine does not run), except as the
  // comment says.
  static const op_table ops{
    {"Einsum", {12, 28}, &checked<infer_einsum>, &run_einsum},
    {"GatherND", {11, 12, 13}, &checked<infer_gather_nd>, &run_gather_nd}, // 12: batch_dims
    {"NonZero", {9, 13}, &checked<infer_nonzero>, &run_nonzero},
    // 11: pads and constant_value as inputs; 18: axes; 19: wrap mode
    {"Pad", {2, 11, 13, 18, 19, 21, 23, 24, 25}, &checked<infer_pad>, &run_pad},
    // 11: roi, sizes, coordinate modes; 18: axes, antialias, keep_aspect_ratio_policy;
    // 19: half_pixel_symmetric
    {"Resize", {10, 11, 13, 18, 19}, &checked<infer_resize>, &run_resize},
    // 16: add, mul; 18: max, min
    {"ScatterND", {11, 13, 16, 18}, &checked<infer_scatter_nd>, &run_scatter_nd},
    {"Tile", {1, 6, 13}, &checked<infer_tile>, &run_tile},
    // 10: K as input; 11: largest, sorted
    {"TopK", {1, 10, 11, 24}, &checked<infer_topk>, &run_topk},
    {"Trilu", {14}, &checked<infer_trilu>, &run_trilu},
  };
  return ops;
}

} // namespace caf_serving::onnx
