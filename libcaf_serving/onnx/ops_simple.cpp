#include "onnx/ops_simple.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;

/// One operator of this file: its ONNX versions (since_version), from its first
/// up to the newest onnx release, and the datatypes its kernel takes, which the
/// shared part of inference checks; its entry's functions; whether it is
/// element-wise (op_entry::elementwise). Between the versions listed only the
/// type lists of the spec changed (fp16/bf16/fp8 added, which the engine does
/// not run), except as the comment says.
struct simple_op {
  std::vector<int64_t> versions;
  std::vector<datatype> types;
  infer_function infer;
  reference_function run;
  bool elementwise = false;
};

const std::map<std::string, simple_op>& table();

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

/// What every operator of this file refuses alike: an opset before its first
/// version, no first input, a first input of a type its kernel does not take.
std::optional<std::string> refused_input(const graph& g, const node& n) {
  const auto& e = table().at(n.op);
  if (auto refused = refused_opset_or_input(g, n, e.versions.front(), " needs at least one input"))
    return refused;
  return refused_input_type(g, n, e.types);
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

/// f(x, y, count) on x's and y's elements as a C++ type: every type but BOOL
/// (which inference refuses); `f` writes nothing for a type it does not take.
template <class F>
void each_type(const tensor_ref& x, const tensor_ref& y, F f) {
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>)
      f(x.as<T>(), y.as<T>(), y.elements());
  });
}

/// y[i] = f(x[i]) on FLOAT, the only type inference gives these kernels.
template <class F>
void each_float(const tensor_ref& x, const tensor_ref& y, F f) {
  each_type(x, y, [&](const auto* a, auto* b, int64_t count) {
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(b)>, float>)
      for (int64_t i = 0; i < count; ++i) b[i] = f(a[i]);
  });
}

void run_abs(const node&, const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out) {
  each_type(in[0], out[0], [](const auto* x, auto* y, int64_t count) {
    for (int64_t i = 0; i < count; ++i) y[i] = abs_of(x[i]);
  });
}

void run_neg(const node&, const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out) {
  each_type(in[0], out[0], [](const auto* x, auto* y, int64_t count) {
    using T = std::remove_pointer_t<decltype(y)>;
    if constexpr (!std::is_unsigned_v<T>)
      for (int64_t i = 0; i < count; ++i) y[i] = static_cast<T>(-x[i]);
  });
}

void run_log(const node&, const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out) {
  each_float(in[0], out[0], [](float v) { return std::log(v); });
}

void run_exp(const node&, const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out) {
  each_float(in[0], out[0], [](float v) { return std::exp(v); });
}

void run_reciprocal(const node&, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  each_float(in[0], out[0], [](float v) { return 1.0f / v; });
}

void run_hard_sigmoid(const node& n, const std::vector<tensor_ref>& in,
                      const std::vector<tensor_ref>& out) {
  float alpha = n.get_f("alpha", 0.2f), beta = n.get_f("beta", 0.5f);
  each_float(in[0], out[0],
             [=](float v) { return std::max(0.0f, std::min(1.0f, alpha * v + beta)); });
}

/// x * HardSigmoid(x) with alpha 1/6, beta 1/2.
void run_hard_swish(const node&, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  each_float(in[0], out[0],
             [](float v) { return v * std::max(0.0f, std::min(1.0f, v / 6.0f + 0.5f)); });
}

void run_is_nan(const node&, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  const float* x = in[0].as<float>();
  bool* o = out[0].as<bool>();
  for (int64_t i = 0, count = out[0].elements(); i < count; ++i) o[i] = std::isnan(x[i]);
}

void run_is_inf(const node& n, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  const float* x = in[0].as<float>();
  bool* o = out[0].as<bool>();
  bool neg = n.get_i("detect_negative", 1) != 0, pos = n.get_i("detect_positive", 1) != 0;
  for (int64_t i = 0, count = out[0].elements(); i < count; ++i)
    o[i] = std::isinf(x[i]) && (x[i] > 0 ? pos : neg);
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

infer_result infer_unary(const graph& g, const node& n) {
  if (auto e = refused_input(g, n))
    return *e;
  const auto& x = g.values[n.inputs[0]];
  return one(x.dtype, x.shape);
}

infer_result infer_unary_to_bool(const graph& g, const node& n) {
  if (auto e = refused_input(g, n))
    return *e;
  return one(datatype::bool_, g.values[n.inputs[0]].shape);
}

/// The broadcast of every input's shape, all of input 0's type.
std::variant<shape_t, std::string> broadcast_of(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
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
  return s;
}

/// Max and Min: the broadcast of any number of inputs.
infer_result infer_variadic(const graph& g, const node& n) {
  if (auto e = refused_input(g, n))
    return *e;
  auto s = broadcast_of(g, n);
  if (auto* e = std::get_if<std::string>(&s))
    return *e;
  return one(g.values[n.inputs[0]].dtype, std::get<shape_t>(s));
}

infer_result infer_mod(const graph& g, const node& n) {
  if (auto e = refused_input(g, n))
    return *e;
  if (n.inputs.size() != 2)
    return n.op + " takes two inputs, not " + std::to_string(n.inputs.size());
  auto s = broadcast_of(g, n);
  if (auto* e = std::get_if<std::string>(&s))
    return *e;
  const auto& x = g.values[n.inputs[0]];
  if (x.dtype == datatype::fp32 && n.get_i("fmod", 0) == 0 && g.opset != 0 && g.opset < 28)
    return "Mod of FLOAT needs fmod=1 before opset 28 (ONNX defines fmod=0 on floating "
           "point from Mod-28 on, as ONNX Runtime does); re-export with fmod=1, or compute "
           "a - floor(a / b) * b for Python's %";
  return one(x.dtype, std::get<shape_t>(s));
}

infer_result infer_gather_elements(const graph& g, const node& n) {
  if (auto e = refused_input(g, n))
    return *e;
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
  if (auto e = refused_input(g, n))
    return *e;
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
  if (auto e = refused_input(g, n))
    return *e;
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

void run_gather_elements(const node& n, const std::vector<tensor_ref>& in,
                         const std::vector<tensor_ref>& out) {
  const auto& data = in[0];
  const auto& idx = in[1];
  const auto& y = out[0];
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
  auto* dst_bytes = static_cast<uint8_t*>(y.data);
  broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
    int64_t k = indices[i] < 0 ? indices[i] + axis_dim : indices[i];
    // ONNX Runtime refuses an index outside [-d, d-1]; a kernel cannot fail here,
    // so it reads the nearest row, as the engine's Gather does.
    k = std::clamp<int64_t>(k, 0, axis_dim - 1);
    std::memcpy(dst_bytes + i * es, src + (off[0] + k * axis_stride) * es, es);
  });
}

template <class T>
void cumsum_kernel(const node& n, const tensor_ref& x, int64_t axis, const tensor_ref& y) {
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
void argmax_kernel(const node& n, const tensor_ref& x, const tensor_ref& y) {
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

/// Max (`IsMax`) or Min of any number of broadcast inputs.
template <bool IsMax>
void run_extreme(const node&, const std::vector<tensor_ref>& in,
                 const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  each_type(in[0], y, [&](const auto* a, auto* o, int64_t) {
    using T = std::remove_pointer_t<decltype(o)>;
    std::array<shape_t, 1> first{broadcast_strides(in[0].shape, y.shape)};
    broadcast_loop<1>(y.shape, first, [&](int64_t i, const std::array<int64_t, 1>& off) {
      o[i] = a[off[0]];
    });
    for (size_t k = 1; k < in.size(); ++k) {
      std::array<shape_t, 1> st{broadcast_strides(in[k].shape, y.shape)};
      const T* b = in[k].as<T>();
      broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
        o[i] = IsMax ? max_of(o[i], b[off[0]]) : min_of(o[i], b[off[0]]);
      });
    }
  });
}

void run_mod(const node& n, const std::vector<tensor_ref>& in,
             const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  bool fmod = n.get_i("fmod", 0) != 0;
  std::array<shape_t, 2> st{broadcast_strides(in[0].shape, y.shape),
                            broadcast_strides(in[1].shape, y.shape)};
  each_type(in[0], y, [&](const auto* a, auto* o, int64_t) {
    using T = std::remove_pointer_t<decltype(o)>;
    const T* b = in[1].as<T>();
    broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
      o[i] = mod_of<T>(a[off[0]], b[off[1]], fmod);
    });
  });
}

void run_cumsum(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  each_type(in[0], y, [&](const auto*, auto* o, int64_t) {
    using T = std::remove_pointer_t<decltype(o)>;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, int64_t>
                  || std::is_same_v<T, int32_t>) {
      int64_t rank = static_cast<int64_t>(in[0].shape.size());
      int64_t axis = norm_axis(ref_ints(in[1]).at(0), rank);
      // Inference checks a constant axis (exporters write one); one computed
      // while the model runs and out of range gives zeros, as a kernel cannot fail.
      if (axis < 0 || axis >= rank)
        std::memset(y.data, 0, y.elements() * sizeof(T));
      else
        cumsum_kernel<T>(n, in[0], axis, y);
    }
  });
}

void run_argmax(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  each_type(in[0], out[0], [&](const auto* a, auto*, int64_t) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(a)>>;
    argmax_kernel<T>(n, in[0], out[0]);
  });
}

const std::vector<datatype> float_only{datatype::fp32};
const std::vector<datatype> signed_numbers{datatype::fp32, datatype::int64, datatype::int32,
                                           datatype::int8};
const std::vector<datatype> numbers{datatype::fp32, datatype::int64, datatype::int32,
                                    datatype::int8, datatype::uint8};

const std::map<std::string, simple_op>& table() {
  static const std::map<std::string, simple_op> ops{
    {"Abs", {{1, 6, 13}, numbers, &infer_unary, &run_abs, true}},
    // 12: select_last_index
    {"ArgMax", {{1, 11, 12, 13}, numbers, &infer_arg_reduce, &run_argmax}},
    {"CumSum",
     {{11, 14}, {datatype::fp32, datatype::int64, datatype::int32}, &infer_cumsum,
      &run_cumsum}},
    {"Exp", {{1, 6, 13}, float_only, &infer_unary, &run_exp, true}},
    {"GatherElements",
     {{11, 13},
      {datatype::fp32, datatype::int64, datatype::int32, datatype::int8, datatype::uint8,
       datatype::bool_},
      &infer_gather_elements, &run_gather_elements}},
    {"HardSigmoid", {{1, 6, 22}, float_only, &infer_unary, &run_hard_sigmoid, true}},
    {"HardSwish", {{14, 22}, float_only, &infer_unary, &run_hard_swish, true}},
    {"IsInf", {{10, 20}, float_only, &infer_unary_to_bool, &run_is_inf, true}},
    {"IsNaN", {{9, 13, 20}, float_only, &infer_unary_to_bool, &run_is_nan, true}},
    {"Log", {{1, 6, 13}, float_only, &infer_unary, &run_log, true}},
    // 8: broadcasting; 12: integers
    {"Max", {{1, 6, 8, 12, 13}, numbers, &infer_variadic, &run_extreme<true>, true}},
    {"Min", {{1, 6, 8, 12, 13}, numbers, &infer_variadic, &run_extreme<false>, true}},
    {"Mod", {{10, 13, 28}, numbers, &infer_mod, &run_mod, true}}, // 28: fmod=0 on floats
    {"Neg", {{1, 6, 13}, signed_numbers, &infer_unary, &run_neg, true}},
    {"Reciprocal", {{1, 6, 13}, float_only, &infer_unary, &run_reciprocal, true}},
  };
  return ops;
}

} // namespace

const op_table& simple_operator_table() {
  static const op_table ops = [] {
    op_table t;
    for (const auto& [name, e] : table())
      t.push_back({name, e.versions, e.infer, e.run, nullptr, e.elementwise});
    return t;
  }();
  return ops;
}

} // namespace caf_serving::onnx
