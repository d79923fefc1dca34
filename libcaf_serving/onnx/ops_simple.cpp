#include "onnx/ops_simple.hpp"

#include "onnx/op_registry.hpp"
#include "onnx/ops_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;
using infer_result = std::variant<std::vector<inferred>, std::string>;

/// How an operator's inputs and outputs relate, which picks its shape inference.
enum class op_kind {
  unary,          ///< Y has X's shape and type
  unary_to_bool,  ///< Y has X's shape, BOOL
  variadic,       ///< Y is the broadcast of all inputs, of their common type
  binary,         ///< Y is the broadcast of A and B, of their common type
  gather_elements,
  cumsum,
  arg_reduce,
};

/// One operator: every ONNX version of it (since_version), from its first, up to
/// the newest onnx release; the datatypes its kernel takes. Between the versions
/// listed only the type lists of the spec changed (fp16/bf16/fp8 added, which the
/// engine does not run), except as the comment says.
struct op_entry {
  op_kind kind;
  std::vector<int64_t> versions;
  std::vector<datatype> types;
};

const std::vector<datatype> float_only{datatype::fp32};
const std::vector<datatype> signed_numbers{datatype::fp32, datatype::int64, datatype::int32,
                                           datatype::int8};
const std::vector<datatype> numbers{datatype::fp32, datatype::int64, datatype::int32,
                                    datatype::int8, datatype::uint8};

const std::map<std::string, op_entry>& table() {
  static const std::map<std::string, op_entry> ops{
    {"Abs", {op_kind::unary, {1, 6, 13}, numbers}},
    {"ArgMax", {op_kind::arg_reduce, {1, 11, 12, 13}, numbers}}, // 12: select_last_index
    {"CumSum", {op_kind::cumsum, {11, 14}, {datatype::fp32, datatype::int64, datatype::int32}}},
    {"Exp", {op_kind::unary, {1, 6, 13}, float_only}},
    {"GatherElements",
     {op_kind::gather_elements, {11, 13},
      {datatype::fp32, datatype::int64, datatype::int32, datatype::int8, datatype::uint8,
       datatype::bool_}}},
    {"HardSigmoid", {op_kind::unary, {1, 6, 22}, float_only}},
    {"HardSwish", {op_kind::unary, {14, 22}, float_only}},
    {"IsInf", {op_kind::unary_to_bool, {10, 20}, float_only}},
    {"IsNaN", {op_kind::unary_to_bool, {9, 13, 20}, float_only}},
    {"Log", {op_kind::unary, {1, 6, 13}, float_only}},
    {"Max", {op_kind::variadic, {1, 6, 8, 12, 13}, numbers}}, // 8: broadcasting; 12: integers
    {"Min", {op_kind::variadic, {1, 6, 8, 12, 13}, numbers}},
    {"Mod", {op_kind::binary, {10, 13, 28}, numbers}}, // 28: fmod=0 on floats
    {"Neg", {op_kind::unary, {1, 6, 13}, signed_numbers}},
    {"Reciprocal", {op_kind::unary, {1, 6, 13}, float_only}},
  };
  return ops;
}

std::string type_list(const std::vector<datatype>& types) {
  std::string s;
  for (auto t : types)
    s += (s.empty() ? "" : ", ") + std::string(to_string(t));
  return s;
}

// ------------------------------------------------------------------ element-wise

template <class T>
T abs_of(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return std::fabs(v); // -0 becomes +0, NaN stays NaN
  else if constexpr (std::is_unsigned_v<T>)
    return v;
  else
    return v < 0 ? static_cast<T>(-v) : v; // the most negative value stays itself, as in C
}

template <class T>
void unary_kernel(const std::string& op, const node& n, const T* x, T* y, int64_t count) {
  if (op == "Abs") {
    for (int64_t i = 0; i < count; ++i) y[i] = abs_of(x[i]);
  } else if (op == "Neg") {
    if constexpr (!std::is_unsigned_v<T>)
      for (int64_t i = 0; i < count; ++i) y[i] = static_cast<T>(-x[i]);
  } else if constexpr (std::is_same_v<T, float>) {
    if (op == "Log") {
      for (int64_t i = 0; i < count; ++i) y[i] = std::log(x[i]);
    } else if (op == "Exp") {
      for (int64_t i = 0; i < count; ++i) y[i] = std::exp(x[i]);
    } else if (op == "Reciprocal") {
      for (int64_t i = 0; i < count; ++i) y[i] = 1.0f / x[i];
    } else if (op == "HardSigmoid") {
      float alpha = n.get_f("alpha", 0.2f), beta = n.get_f("beta", 0.5f);
      for (int64_t i = 0; i < count; ++i)
        y[i] = std::max(0.0f, std::min(1.0f, alpha * x[i] + beta));
    } else { // HardSwish: x * HardSigmoid(x) with alpha 1/6, beta 1/2
      for (int64_t i = 0; i < count; ++i)
        y[i] = x[i] * std::max(0.0f, std::min(1.0f, x[i] / 6.0f + 0.5f));
    }
  }
}

/// numpy's maximum and minimum: NaN wins, as in ONNX Runtime since 1.13.
template <class T>
T max_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b))
      return std::numeric_limits<T>::quiet_NaN();
  return a < b ? b : a;
}

template <class T>
T min_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b))
      return std::numeric_limits<T>::quiet_NaN();
  return b < a ? b : a;
}

/// ONNX's Mod. fmod 1: C's fmod / %, the result has the dividend's sign. fmod 0:
/// Python's % (numpy.mod), the result has the divisor's sign; for floats only
/// from Mod-28 on, which inference checks. An integer zero divisor, which ONNX
/// leaves undefined (ONNX Runtime's kernel traps), gives 0, as the engine's
/// integer Div does.
template <class T>
T mod_of(T a, T b, bool fmod) {
  if constexpr (std::is_floating_point_v<T>) {
    T r = std::fmod(a, b);
    if (fmod)
      return r;
    // Mod-28's special cases: a zero takes the divisor's sign, a finite x with
    // an infinite y of the other sign gives y (x + y).
    if (r == 0)
      return std::copysign(T(0), b);
    return std::signbit(r) != std::signbit(b) ? r + b : r;
  } else {
    if (b == 0)
      return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1)
        return 0; // also keeps the most negative value % -1 from trapping
      T r = static_cast<T>(a % b);
      if (!fmod && r != 0 && ((r < 0) != (b < 0)))
        r = static_cast<T>(r + b);
      return r;
    } else {
      return static_cast<T>(a % b);
    }
  }
}

// ------------------------------------------------------------------ shape inference

infer_result infer_gather_elements(const graph& g, const node& n) {
  const auto& data = g.values[n.inputs[0]];
  const auto& idx = g.values[n.inputs[1]];
  if (idx.dtype != datatype::int64 && idx.dtype != datatype::int32)
    return "indices '" + idx.name + "' are " + std::string(to_string(idx.dtype))
           + "; GatherElements takes INT64 or INT32 indices";
  if (data.shape.empty() || data.shape.size() != idx.shape.size())
    return "data " + shape_string(data.shape) + " and indices " + shape_string(idx.shape)
           + " must have the same rank, at least 1";
  int64_t rank = static_cast<int64_t>(data.shape.size());
  int64_t axis = n.get_i("axis", 0);
  if (axis < -rank || axis >= rank)
    return "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank);
  axis = norm_axis(axis, rank);
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && idx.shape[d] > data.shape[d])
      return "indices " + shape_string(idx.shape) + " are larger than data "
             + shape_string(data.shape) + " in dimension " + std::to_string(d)
             + ", which is not the axis";
  return std::vector<inferred>{{data.dtype, idx.shape}};
}

infer_result infer_cumsum(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (n.inputs.size() < 2 || n.inputs[1] < 0)
    return std::string("CumSum needs its axis input");
  const auto& axis = g.values[n.inputs[1]];
  if ((axis.dtype != datatype::int64 && axis.dtype != datatype::int32)
      || element_count(axis.shape) != 1 || axis.shape.size() > 1)
    return "axis '" + axis.name + "' must be one INT64 or INT32 (a scalar or [1]), got "
           + std::string(to_string(axis.dtype)) + " " + shape_string(axis.shape);
  if (x.shape.empty())
    return std::string("CumSum of a scalar");
  if (axis.constant) {
    int64_t a = const_ints(g, n.inputs[1]).at(0), rank = static_cast<int64_t>(x.shape.size());
    if (a < -rank || a >= rank)
      return "axis " + std::to_string(a) + " is out of range for " + shape_string(x.shape);
  }
  return std::vector<inferred>{{x.dtype, x.shape}};
}

infer_result infer_arg_reduce(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  int64_t rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = n.get_i("axis", 0);
  if (rank == 0 || axis < -rank || axis >= rank)
    return "axis " + std::to_string(axis) + " is out of range for " + shape_string(x.shape);
  axis = norm_axis(axis, rank);
  if (x.shape[axis] == 0)
    return "axis " + std::to_string(axis) + " of " + shape_string(x.shape)
           + " is empty: there is no largest element";
  shape_t s;
  for (int64_t d = 0; d < rank; ++d) {
    if (d != axis)
      s.push_back(x.shape[d]);
    else if (n.get_i("keepdims", 1) != 0)
      s.push_back(1);
  }
  return std::vector<inferred>{{datatype::int64, s}};
}

// ------------------------------------------------------------------ kernels

void run_gather_elements(const node& n, const tensor_ref& data, const tensor_ref& idx,
                         const tensor_ref& y) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  int64_t axis = norm_axis(n.get_i("axis", 0), rank);
  auto dst = strides_of(data.shape);
  int64_t axis_stride = dst[axis], axis_dim = data.shape[axis];
  // The data offset of every output element but the axis term.
  std::array<shape_t, 1> st{dst};
  st[0][axis] = 0;
  auto indices = ref_ints(idx);
  size_t es = element_size(data.dtype);
  auto* src = static_cast<const uint8_t*>(data.data);
  auto* out = static_cast<uint8_t*>(y.data);
  broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
    int64_t k = indices[i] < 0 ? indices[i] + axis_dim : indices[i];
    // ONNX Runtime refuses an index outside [-d, d-1]; a kernel cannot fail here,
    // so it reads the nearest row, as the engine's Gather does.
    k = std::clamp<int64_t>(k, 0, axis_dim - 1);
    std::memcpy(out + i * es, src + (off[0] + k * axis_stride) * es, es);
  });
}

template <class T>
void run_cumsum(const node& n, const tensor_ref& x, int64_t axis, const tensor_ref& y) {
  const auto& s = x.shape;
  int64_t inner = 1, d = s[axis];
  for (size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
  int64_t outer = d * inner == 0 ? 0 : x.elements() / (d * inner);
  bool exclusive = n.get_i("exclusive", 0) != 0, reverse = n.get_i("reverse", 0) != 0;
  const T* in = x.as<T>();
  T* o = y.as<T>();
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t j = 0; j < inner; ++j) {
      T acc{};
      for (int64_t step = 0; step < d; ++step) {
        int64_t k = reverse ? d - 1 - step : step;
        int64_t at = (a * d + k) * inner + j;
        if (exclusive) {
          o[at] = acc;
          acc = static_cast<T>(acc + in[at]);
        } else {
          acc = static_cast<T>(acc + in[at]);
          o[at] = acc;
        }
      }
    }
}

/// ArgMax. A NaN compares false, so it is chosen only where it comes first, as
/// in ONNX Runtime (numpy and torch would choose the first NaN).
template <class T>
void run_argmax(const node& n, const tensor_ref& x, const tensor_ref& y) {
  const auto& s = x.shape;
  int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
  bool last = n.get_i("select_last_index", 0) != 0;
  int64_t inner = 1, d = s[axis];
  for (size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
  int64_t outer = d * inner == 0 ? 0 : x.elements() / (d * inner);
  const T* in = x.as<T>();
  int64_t* o = y.as<int64_t>();
  auto better = [last](T v, T best) { return last ? v >= best : v > best; };
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t j = 0; j < inner; ++j) {
      const T* p = in + a * d * inner + j;
      int64_t best = 0;
      for (int64_t k = 1; k < d; ++k)
        if (better(p[k * inner], p[best * inner]))
          best = k;
      o[a * inner + j] = best;
    }
}

} // namespace

const std::vector<std::string>& simple_operators() {
  static const std::vector<std::string> names = table_names(table());
  return names;
}

const op_table& simple_operator_table() {
  static const op_table versions = table_versions(table());
  return versions;
}

bool is_simple_op(const std::string& op) {
  return table().count(op) > 0;
}

bool is_elementwise_simple_op(const std::string& op) {
  auto it = table().find(op);
  if (it == table().end())
    return false;
  auto k = it->second.kind;
  return k == op_kind::unary || k == op_kind::unary_to_bool || k == op_kind::variadic
         || k == op_kind::binary;
}

infer_result infer_simple_op(const graph& g, const node& n) {
  const auto& e = table().at(n.op);
  if (g.opset != 0 && g.opset < e.versions.front())
    return n.op + " exists from opset " + std::to_string(e.versions.front())
           + ", but the model imports opset " + std::to_string(g.opset)
           + "; re-export it with a newer opset";
  if (n.inputs.empty() || n.inputs[0] < 0)
    return n.op + " needs at least one input";
  const auto& x = g.values[n.inputs[0]];
  if (std::find(e.types.begin(), e.types.end(), x.dtype) == e.types.end())
    return "input '" + x.name + "' is " + std::string(to_string(x.dtype)) + "; the engine runs "
           + n.op + " on " + type_list(e.types);
  auto one = [](datatype t, shape_t s) { return std::vector<inferred>{{t, std::move(s)}}; };
  switch (e.kind) {
    case op_kind::unary:
      return one(x.dtype, x.shape);
    case op_kind::unary_to_bool:
      return one(datatype::bool_, x.shape);
    case op_kind::variadic:
    case op_kind::binary: {
      if (e.kind == op_kind::binary && n.inputs.size() != 2)
        return n.op + " takes two inputs, not " + std::to_string(n.inputs.size());
      shape_t s = x.shape;
      for (size_t i = 1; i < n.inputs.size(); ++i) {
        if (n.inputs[i] < 0)
          return "input " + std::to_string(i) + " is omitted";
        const auto& v = g.values[n.inputs[i]];
        if (v.dtype != x.dtype)
          return "inputs '" + x.name + "' (" + std::string(to_string(x.dtype)) + ") and '"
                 + v.name + "' (" + std::string(to_string(v.dtype)) + ") differ in type";
        auto b = broadcast_shapes(s, v.shape);
        if (!b)
          return "input shapes " + shape_string(s) + " and " + shape_string(v.shape)
                 + " do not broadcast";
        s = *b;
      }
      if (n.op == "Mod" && x.dtype == datatype::fp32 && n.get_i("fmod", 0) == 0
          && g.opset != 0 && g.opset < 28)
        return "Mod of FLOAT needs fmod=1 before opset 28 (ONNX defines fmod=0 on floating "
               "point from Mod-28 on, as ONNX Runtime does); re-export with fmod=1, or compute "
               "a - floor(a / b) * b for Python's %";
      return one(x.dtype, s);
    }
    case op_kind::gather_elements: return infer_gather_elements(g, n);
    case op_kind::cumsum: return infer_cumsum(g, n);
    case op_kind::arg_reduce: return infer_arg_reduce(g, n);
  }
  return "no shape inference for operator '" + n.op + "'";
}

void run_simple_op(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  const auto& op = n.op;
  const auto& y = out[0];
  const auto kind = table().at(op).kind;
  if (kind == op_kind::unary_to_bool) {
    const float* x = in[0].as<float>();
    bool* o = y.as<bool>();
    int64_t count = y.elements();
    if (op == "IsNaN") {
      for (int64_t i = 0; i < count; ++i) o[i] = std::isnan(x[i]);
    } else {
      bool neg = n.get_i("detect_negative", 1) != 0, pos = n.get_i("detect_positive", 1) != 0;
      for (int64_t i = 0; i < count; ++i)
        o[i] = std::isinf(x[i]) && (x[i] > 0 ? pos : neg);
    }
    return;
  }
  if (kind == op_kind::gather_elements) {
    run_gather_elements(n, in[0], in[1], y);
    return;
  }
  dispatch(in[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      switch (kind) {
        case op_kind::unary:
          unary_kernel<T>(op, n, in[0].as<T>(), y.as<T>(), y.elements());
          break;
        case op_kind::variadic: {
          bool is_max = op == "Max";
          T* o = y.as<T>();
          std::array<shape_t, 1> first{broadcast_strides(in[0].shape, y.shape)};
          const T* a = in[0].as<T>();
          broadcast_loop<1>(y.shape, first, [&](int64_t i, const std::array<int64_t, 1>& off) {
            o[i] = a[off[0]];
          });
          for (size_t k = 1; k < in.size(); ++k) {
            std::array<shape_t, 1> st{broadcast_strides(in[k].shape, y.shape)};
            const T* b = in[k].as<T>();
            broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
              o[i] = is_max ? max_of(o[i], b[off[0]]) : min_of(o[i], b[off[0]]);
            });
          }
          break;
        }
        case op_kind::binary: { // Mod
          bool fmod = n.get_i("fmod", 0) != 0;
          std::array<shape_t, 2> st{broadcast_strides(in[0].shape, y.shape),
                                    broadcast_strides(in[1].shape, y.shape)};
          const T* a = in[0].as<T>();
          const T* b = in[1].as<T>();
          T* o = y.as<T>();
          broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
            o[i] = mod_of<T>(a[off[0]], b[off[1]], fmod);
          });
          break;
        }
        case op_kind::cumsum:
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, int64_t>
                        || std::is_same_v<T, int32_t>) {
            int64_t rank = static_cast<int64_t>(in[0].shape.size());
            int64_t axis = norm_axis(ref_ints(in[1]).at(0), rank);
            // Inference checks a constant axis (exporters write one); one computed
            // while the model runs and out of range gives zeros, as a kernel cannot fail.
            if (axis < 0 || axis >= rank)
              std::memset(y.data, 0, y.elements() * sizeof(T));
            else
              run_cumsum<T>(n, in[0], axis, y);
          }
          break;
        case op_kind::arg_reduce:
          run_argmax<T>(n, in[0], y);
          break;
        default:
          break;
      }
    }
  });
}

} // namespace caf_serving::onnx
