#include "onnx/ops_elementwise.hpp"

#include "core/half.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

// ------------------------------------------------------------------ binary operators

/// An element-wise binary operator, a template argument of its entry's kernel.
enum class binary_op { add, sub, mul, div, pow, equal, greater, greater_equal, less, less_equal,
                       and_, or_ };

/// Whether `op` is a comparison or a logical operator (a BOOL output).
constexpr bool compares(binary_op op) {
  return op >= binary_op::equal;
}

template <class T>
bool compare_apply(binary_op op, T a, T b) {
  switch (op) {
    case binary_op::equal: return a == b;
    case binary_op::greater: return a > b;
    case binary_op::greater_equal: return a >= b;
    case binary_op::less: return a < b;
    case binary_op::less_equal: return a <= b;
    case binary_op::and_: return a && b;
    default: return a || b; // or_
  }
}

template <class T>
T binary_apply(binary_op op, T a, T b) {
  switch (op) {
    case binary_op::add: return static_cast<T>(a + b);
    case binary_op::sub: return static_cast<T>(a - b);
    case binary_op::mul: return static_cast<T>(a * b);
    case binary_op::div:
      if constexpr (std::is_integral_v<T>)
        return b == 0 ? T{} : static_cast<T>(a / b);
      else
        return a / b;
    default: // pow
      if constexpr (std::is_floating_point_v<T>)
        return b == T(2) ? a * a : std::pow(a, b);
      else
        return static_cast<T>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
}

/// How an input of a binary operator is read when it is broadcast in one of
/// the two common ways: one value per row of `inner` output elements (SE
/// blocks' channel scale, [N,C,1,1] against [N,C,H,W]), or one vector of
/// `inner` values repeated in every row (a bias, [C] against [N,S,C]).
struct row_broadcast {
  bool per_row = false;
  int64_t inner = 1;
};

std::optional<row_broadcast> row_broadcast_of(const shape_t& in, const shape_t& out) {
  if (in.size() > out.size())
    return std::nullopt;
  if (in == out) // no broadcast: one row of every element (EfficientNet's x * sigmoid(x))
    return row_broadcast{false, element_count(out)};
  size_t r = out.size();
  shape_t p(r - in.size(), 1);
  p.insert(p.end(), in.begin(), in.end());
  size_t head = 0; // dims equal to the output's from the front
  while (head < r && p[head] == out[head]) ++head;
  bool ones_after = std::all_of(p.begin() + head, p.end(), [](int64_t d) { return d == 1; });
  if (ones_after)
    return row_broadcast{true, element_count(shape_t(out.begin() + head, out.end()))};
  size_t tail = r; // dims equal to the output's from the back start here
  while (tail > 0 && p[tail - 1] == out[tail - 1]) --tail;
  bool ones_before = std::all_of(p.begin(), p.begin() + tail, [](int64_t d) { return d == 1; });
  if (ones_before)
    return row_broadcast{false, element_count(shape_t(out.begin() + tail, out.end()))};
  return std::nullopt;
}

/// y = op(a, b) where one of a and b has y's shape and the other is broadcast
/// as row_broadcast_of() found; false (nothing written) for other shapes.
template <class T>
bool binary_rows(binary_op bop, const tensor_ref& ta, const tensor_ref& tb, const tensor_ref& y) {
  bool a_full = ta.shape == y.shape;
  if (!a_full && tb.shape != y.shape)
    return false;
  auto rb = row_broadcast_of(a_full ? tb.shape : ta.shape, y.shape);
  if (!rb || rb->inner == 0)
    return false;
  const T* full = (a_full ? ta : tb).as<T>();
  const T* part = (a_full ? tb : ta).as<T>();
  T* o = y.as<T>();
  int64_t m = rb->inner, rows = y.elements() / m;
  // The operator resolved outside the loops, so that they vectorize.
  auto run = [&](auto f) {
    for (int64_t row = 0; row < rows; ++row) {
      const T* x = full + row * m;
      T* out = o + row * m;
      if (rb->per_row) {
        T s = part[row];
        for (int64_t j = 0; j < m; ++j) out[j] = a_full ? f(x[j], s) : f(s, x[j]);
      } else {
        for (int64_t j = 0; j < m; ++j) out[j] = a_full ? f(x[j], part[j]) : f(part[j], x[j]);
      }
    }
  };
  switch (bop) {
    case binary_op::add: run([](T p, T q) { return static_cast<T>(p + q); }); break;
    case binary_op::sub: run([](T p, T q) { return static_cast<T>(p - q); }); break;
    case binary_op::mul: run([](T p, T q) { return static_cast<T>(p * q); }); break;
    default: run([bop](T p, T q) { return binary_apply<T>(bop, p, q); }); break;
  }
  return true;
}

/// The numpy broadcast of every input's shape.
std::variant<shape_t, std::string> broadcast_inputs(const graph& g, const node& n) {
  shape_t s = g.values[n.inputs[0]].shape;
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    const auto& other = g.values[n.inputs[i]].shape;
    auto b = broadcast_shapes(s, other);
    if (!b)
      return "input shapes " + shape_string(s) + " and " + shape_string(other)
             + " do not broadcast";
    s = *b;
  }
  return s;
}

/// The refusal of inputs `first` and `first + 1` of different types: ONNX's
/// binary operators (but Pow, whose exponent may differ from Pow-12 on) and
/// Where's branches take one type.
std::optional<std::string> one_type(const graph& g, const node& n, size_t first) {
  if (n.inputs.size() <= first + 1)
    return std::nullopt;
  const auto& a = g.values[n.inputs[first]];
  const auto& b = g.values[n.inputs[first + 1]];
  if (a.dtype == b.dtype)
    return std::nullopt;
  return "inputs '" + a.name + "' (" + std::string(to_string(a.dtype)) + ") and '" + b.name
         + "' (" + std::string(to_string(b.dtype)) + ") differ in type; ONNX's " + n.op
         + " takes one type (insert a Cast)";
}

/// Add, Sub, Mul, Div: the broadcast shape, of the inputs' one type.
infer_result infer_arithmetic(const graph& g, const node& n) {
  auto s = broadcast_inputs(g, n);
  if (auto* e = std::get_if<std::string>(&s))
    return *e;
  if (auto e = one_type(g, n, 0))
    return *e;
  return one(g.values[n.inputs[0]].dtype, std::get<shape_t>(s));
}

/// Pow: the broadcast shape, of the base's type (the exponent's may differ).
infer_result infer_pow(const graph& g, const node& n) {
  auto s = broadcast_inputs(g, n);
  if (auto* e = std::get_if<std::string>(&s))
    return *e;
  return one(g.values[n.inputs[0]].dtype, std::get<shape_t>(s));
}

/// The comparisons and And, Or: the broadcast shape, BOOL.
infer_result infer_comparison(const graph& g, const node& n) {
  auto s = broadcast_inputs(g, n);
  if (auto* e = std::get_if<std::string>(&s))
    return *e;
  if (auto e = one_type(g, n, 0))
    return *e;
  return one(datatype::bool_, std::get<shape_t>(s));
}

/// Where(C, X, Y): the broadcast shape of all three, of X's and Y's one type.
infer_result infer_where(const graph& g, const node& n) {
  auto s = broadcast_inputs(g, n);
  if (auto* e = std::get_if<std::string>(&s))
    return *e;
  if (auto e = one_type(g, n, 1))
    return *e;
  return one(g.values[n.inputs[1]].dtype, std::get<shape_t>(s));
}

/// y = bop(a, b) on inputs of one type, broadcast.
void binary_kernel(binary_op bop, const std::vector<tensor_ref>& in, const tensor_ref& y) {
  std::array<shape_t, 2> st{broadcast_strides(in[0].shape, y.shape),
                            broadcast_strides(in[1].shape, y.shape)};
  dispatch(in[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* a = in[0].as<T>();
      const T* b = in[1].as<T>();
      if (compares(bop)) {
        bool* o = y.as<bool>();
        broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
          o[i] = compare_apply<T>(bop, a[off[0]], b[off[1]]);
        });
      } else if (in[0].shape == y.shape && in[1].shape == y.shape && bop == binary_op::add) {
        T* o = y.as<T>(); // no broadcast: BERT's embedding sums
        for (int64_t i = 0, n = y.elements(); i < n; ++i)
          o[i] = static_cast<T>(a[i] + b[i]);
      } else if (binary_rows<T>(bop, in[0], in[1], y)) {
        // a scale per channel or a bias per column: rows, not the index walk below
      } else {
        T* o = y.as<T>();
        broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
          o[i] = binary_apply<T>(bop, a[off[0]], b[off[1]]);
        });
      }
    } else {
      const bool* a = in[0].as<bool>();
      const bool* b = in[1].as<bool>();
      bool* o = y.as<bool>();
      broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
        o[i] = bop == binary_op::mul   ? (a[off[0]] && b[off[1]])
               : bop == binary_op::add ? (a[off[0]] || b[off[1]])
                                       : compare_apply<bool>(bop, a[off[0]], b[off[1]]);
      });
    }
  });
}

template <binary_op B>
void run_binary(const node&, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  binary_kernel(B, in, out[0]);
}

void run_pow(const node&, const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  if (in[1].dtype == in[0].dtype) {
    binary_kernel(binary_op::pow, in, y);
    return;
  }
  // From Pow-12 on the exponent may have another type than the base
  // (x ** 2 with an INT64 2): computed in double, stored as the base's type.
  std::array<shape_t, 2> st{broadcast_strides(in[0].shape, y.shape),
                            broadcast_strides(in[1].shape, y.shape)};
  std::vector<double> e(in[1].elements());
  dispatch(in[1].dtype, [&](auto tag) {
    using E = decltype(tag);
    for (size_t i = 0; i < e.size(); ++i) e[i] = static_cast<double>(in[1].as<E>()[i]);
  });
  dispatch(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* a = in[0].as<T>();
      T* o = y.as<T>();
      broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
        o[i] = static_cast<T>(std::pow(static_cast<double>(a[off[0]]), e[off[1]]));
      });
    }
  });
}

void run_where(const node&, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  std::array<shape_t, 3> st{broadcast_strides(in[0].shape, y.shape),
                            broadcast_strides(in[1].shape, y.shape),
                            broadcast_strides(in[2].shape, y.shape)};
  dispatch(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool* c = in[0].as<bool>();
    const T* a = in[1].as<T>();
    const T* b = in[2].as<T>();
    T* o = y.as<T>();
    broadcast_loop<3>(y.shape, st, [&](int64_t i, const std::array<int64_t, 3>& off) {
      o[i] = c[off[0]] ? a[off[1]] : b[off[2]];
    });
  });
}

// ------------------------------------------------------------------ unary operators

/// The refusal of an input that is not FP32, for the unary kernels that run on FLOAT only.
std::optional<std::string> need_fp32(const graph& g, const node& n, const std::string& more = "") {
  const auto& x = g.values[n.inputs[0]];
  if (x.dtype == datatype::fp32)
    return std::nullopt;
  return "input '" + x.name + "' is " + std::string(to_string(x.dtype)) + "; the engine runs "
         + n.op + " on FP32" + more;
}

/// Sqrt, Erf, Tanh, Sigmoid, FusedGelu, FusedGeluTanh: X's shape, FLOAT.
infer_result infer_float_unary(const graph& g, const node& n) {
  if (auto e = need_fp32(g, n))
    return *e;
  return one(datatype::fp32, g.values[n.inputs[0]].shape);
}

/// Relu takes signed integers from Relu-14 on; the other unary kernels run on FLOAT.
infer_result infer_relu(const graph& g, const node& n) {
  auto t = g.values[n.inputs[0]].dtype;
  bool int_relu = (g.opset == 0 || g.opset >= 14)
                  && (t == datatype::int64 || t == datatype::int32 || t == datatype::int8);
  if (!int_relu)
    if (auto e = need_fp32(g, n, " (and on INT8, INT32, INT64 from Relu-14)"))
      return *e;
  return one(t, g.values[n.inputs[0]].shape);
}

/// Clip takes every number type; its min and max have the input's, and are constants.
infer_result infer_clip(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  auto has = [&](size_t i) { return n.inputs.size() > i && n.inputs[i] >= 0; };
  if (x.dtype != datatype::fp32) {
    if (x.dtype == datatype::bool_)
      return *need_fp32(g, n);
    for (size_t i = 1; i < 3; ++i)
      if (has(i) && g.values[n.inputs[i]].dtype != x.dtype)
        return "min or max '" + g.values[n.inputs[i]].name + "' is "
               + std::string(to_string(g.values[n.inputs[i]].dtype)) + ", not the input's "
               + std::string(to_string(x.dtype)) + "; ONNX's Clip takes one type";
  }
  for (size_t i = 1; i < 3; ++i)
    if (auto e = need_constant(g, n, i, "Clip's min and max"))
      return *e;
  return one(x.dtype, x.shape);
}

infer_result infer_identity(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  return one(x.dtype, x.shape);
}

infer_result infer_not(const graph& g, const node& n) {
  return one(datatype::bool_, g.values[n.inputs[0]].shape);
}

template <float (*F)(float)>
void run_float_unary(const node&, const std::vector<tensor_ref>& in,
                     const std::vector<tensor_ref>& out) {
  // The function is the entry's own, not chosen per element (a standalone
  // Sigmoid, as in EfficientNet's x * sigmoid(x), took 33 ns an element
  // comparing names).
  const float* x = in[0].as<float>();
  float* o = out[0].as<float>();
  for (int64_t i = 0, count = out[0].elements(); i < count; ++i) o[i] = F(x[i]);
}

float relu(float v) {
  return v > 0 ? v : 0.0f;
}
float square_root(float v) {
  return std::sqrt(v);
}
float error_function(float v) {
  return std::erf(v);
}
float hyperbolic_tangent(float v) {
  return std::tanh(v);
}
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}

void run_relu(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  if (y.dtype == datatype::fp32) {
    run_float_unary<relu>(n, in, out);
    return;
  }
  dispatch(y.dtype, [&](auto tag) { // Relu-14's integers
    using T = decltype(tag);
    if constexpr (std::is_signed_v<T>)
      for (int64_t i = 0; i < y.elements(); ++i)
        y.as<T>()[i] = in[0].as<T>()[i] > 0 ? in[0].as<T>()[i] : T{0};
  });
}

void run_clip(const node&, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  if (y.dtype != datatype::fp32) { // Clip-12 on: integers
    dispatch(y.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        T lo = has(1) ? *in[1].as<T>() : std::numeric_limits<T>::lowest();
        T hi = has(2) ? *in[2].as<T>() : std::numeric_limits<T>::max();
        for (int64_t i = 0; i < y.elements(); ++i)
          y.as<T>()[i] = std::min(std::max(in[0].as<T>()[i], lo), hi);
      }
    });
    return;
  }
  const float* x = in[0].as<float>();
  float* o = y.as<float>();
  float lo = has(1) ? *in[1].as<float>() : -std::numeric_limits<float>::infinity();
  float hi = has(2) ? *in[2].as<float>() : std::numeric_limits<float>::infinity();
  for (int64_t i = 0, cnt = y.elements(); i < cnt; ++i) o[i] = std::min(std::max(x[i], lo), hi);
}

void run_fused_gelu(const node&, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  const float* x = in[0].as<float>();
  float* o = out[0].as<float>();
  int64_t nb = in.size() > 1 && in[1].data ? in[1].elements() : 0;
  for (int64_t i = 0, cnt = out[0].elements(); i < cnt; ++i)
    o[i] = gelu_erf(x[i] + (nb ? in[1].as<float>()[i % nb] : 0.f));
}

void run_fused_gelu_tanh(const node&, const std::vector<tensor_ref>& in,
                         const std::vector<tensor_ref>& out) {
  const float* x = in[0].as<float>();
  float* o = out[0].as<float>();
  int64_t nb = in.size() > 1 && in[1].data ? in[1].elements() : 0;
  for (int64_t i = 0, cnt = out[0].elements(); i < cnt; ++i)
    o[i] = gelu_tanh(x[i] + (nb ? in[1].as<float>()[i % nb] : 0.f));
}

void run_identity(const node&, const std::vector<tensor_ref>& in,
                  const std::vector<tensor_ref>& out) {
  std::memcpy(out[0].data, in[0].data, out[0].elements() * element_size(out[0].dtype));
}

void run_not(const node&, const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out) {
  for (int64_t i = 0; i < out[0].elements(); ++i) out[0].as<bool>()[i] = !in[0].as<bool>()[i];
}

// ------------------------------------------------------------------ Cast, CastLike

/// The type Cast `n` computes. FLOAT16, BFLOAT16 and DOUBLE are held as fp32
/// inside the graph; only the importer's casts at the graph's edges
/// ("storage") write them as they are.
std::optional<datatype> cast_target(const node& n) {
  bool storage = n.get_i("storage", 0) != 0;
  switch (n.get_i("to", 1)) {
    case 1: return datatype::fp32;
    case 2: return datatype::uint8;
    case 3: return datatype::int8;
    case 4: return datatype::uint16;
    case 5: return datatype::int16;
    case 6: return datatype::int32;
    case 7: return datatype::int64;
    case 9: return datatype::bool_;
    case 10: return storage ? datatype::fp16 : datatype::fp32;
    case 11: return storage ? datatype::fp64 : datatype::fp32;
    case 12: return datatype::uint32;
    case 13: return datatype::uint64;
    case 16: return storage ? datatype::bf16 : datatype::fp32;
    default: return std::nullopt;
  }
}

/// The refusal of a cast from X's type to `to`; run_cast also reads and writes
/// the types held only at the graph's edges.
infer_result castable(const graph& g, const node& n, datatype to) {
  auto can = [](datatype d) {
    return dispatchable(d) || d == datatype::fp16 || d == datatype::bf16 || d == datatype::fp64;
  };
  const auto& x = g.values[n.inputs[0]];
  if (!can(x.dtype) || !can(to))
    return n.op + " from " + std::string(to_string(x.dtype)) + " to "
           + std::string(to_string(to)) + " is not supported (FLOAT, FLOAT16, BFLOAT16, DOUBLE, "
           "INT64, INT32, INT16, INT8, UINT64, UINT32, UINT16, UINT8 and BOOL are)";
  return one(to, x.shape);
}

infer_result infer_cast(const graph& g, const node& n) {
  auto to = cast_target(n);
  if (!to)
    return "Cast to ONNX type " + std::to_string(n.get_i("to", 0))
           + " is not supported (FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT64, INT32, INT16, "
             "INT8, UINT64, UINT32, UINT16, UINT8 and BOOL are; the engine does not "
             "compute on STRING)";
  return castable(g, n, *to);
}

/// Cast to the type of input 1.
infer_result infer_cast_like(const graph& g, const node& n) {
  if (n.inputs.size() < 2 || n.inputs[1] < 0)
    return std::string("CastLike needs its second input (target_type)");
  return castable(g, n, g.values[n.inputs[1]].dtype);
}

/// Cast `x` to `y`. Half bits and doubles are read (graph inputs) or written
/// (graph outputs) only at the edges; a Cast to FLOAT16 or BFLOAT16 inside the
/// graph rounds its fp32 result to the half's precision, so that what follows
/// sees the values a half tensor would hold. Rounding is to nearest, ties to
/// even.
void run_cast(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& x = in[0];
  const auto& y = out[0];
  int64_t count = y.elements();
  auto at_edge = [](datatype t) {
    return t == datatype::fp16 || t == datatype::bf16 || t == datatype::fp64;
  };
  if (at_edge(x.dtype)) {
    auto read = [&](int64_t i) {
      switch (x.dtype) {
        case datatype::fp16: return fp16_to_float(x.as<uint16_t>()[i]);
        case datatype::bf16: return bf16_to_float(x.as<uint16_t>()[i]);
        default: return static_cast<float>(x.as<double>()[i]);
      }
    };
    dispatch(y.dtype, [&](auto tag) {
      using B = decltype(tag);
      B* d = y.as<B>();
      for (int64_t i = 0; i < count; ++i) d[i] = static_cast<B>(read(i));
    });
    return;
  }
  if (at_edge(y.dtype)) {
    dispatch(x.dtype, [&](auto tag) {
      using A = decltype(tag);
      const A* s = x.as<A>();
      for (int64_t i = 0; i < count; ++i) {
        auto f = static_cast<float>(s[i]);
        switch (y.dtype) {
          case datatype::fp16: y.as<uint16_t>()[i] = fp16_from_float(f); break;
          case datatype::bf16: y.as<uint16_t>()[i] = bf16_from_float(f); break;
          default: y.as<double>()[i] = f;
        }
      }
    });
    return;
  }
  dispatch(x.dtype, [&](auto a) {
    using A = decltype(a);
    dispatch(y.dtype, [&](auto b) {
      using B = decltype(b);
      const A* s = x.as<A>();
      B* d = y.as<B>();
      for (int64_t i = 0; i < count; ++i) d[i] = static_cast<B>(s[i]);
    });
  });
  int64_t to = n.get_i("to", 1);
  if (y.dtype == datatype::fp32 && (to == 10 || to == 16)) {
    float* d = y.as<float>();
    for (int64_t i = 0; i < count; ++i)
      d[i] = to == 10 ? fp16_to_float(fp16_from_float(d[i])) : bf16_to_float(bf16_from_float(d[i]));
  }
}

} // namespace

const op_table& elementwise_operator_table() {
  // Every version ONNX 1.23.2 defines (onnx.defs.get_all_schemas_with_history()),
  // from the first up to opset 28. Where a version from 13 on changed what the
  // operator means, the comment says so and the kernel follows the version the
  // model selects. Every other version from 13 on changed only the spec's type
  // lists, which the engine checks by datatype when inference meets them:
  // bfloat16 (13 for most; Where, GreaterOrEqual, LessOrEqual 16), float8 (19,
  // 20), int4/uint4 (21), float4 (23), float8e8m0 (24), int2/uint2 (25), float6
  // (Cast-28), string (Equal-19), sequences and optionals (Identity-14, 16);
  // int8/uint8/int16/uint16 of Add, Sub, Mul, Div (14), bfloat16 exponents of
  // Pow (15).
  static const op_table ops{
    {"Add", {1, 6, 7, 13, 14}, &infer_arithmetic, &run_binary<binary_op::add>, nullptr, true},
    {"And", {1, 7}, &infer_comparison, &run_binary<binary_op::and_>},
    // 19: saturate, 24: round_mode; both only change casts to float8 types,
    // which the engine refuses by `to`.
    {"Cast", {1, 6, 9, 13, 19, 21, 23, 24, 25, 28}, &infer_cast, &run_cast},
    {"CastLike", {15, 19, 21, 23, 24, 25}, &infer_cast_like, &run_cast},
    {"Clip", {1, 6, 11, 12, 13}, &infer_clip, &run_clip}, // 11: min and max are inputs
    {"Div", {1, 6, 7, 13, 14}, &infer_arithmetic, &run_binary<binary_op::div>, nullptr, true},
    {"Equal", {1, 7, 11, 13, 19}, &infer_comparison, &run_binary<binary_op::equal>},
    {"Erf", {9, 13}, &infer_float_unary, &run_float_unary<error_function>, nullptr, true},
    {"Greater", {1, 7, 9, 13}, &infer_comparison, &run_binary<binary_op::greater>},
    {"GreaterOrEqual", {12, 16}, &infer_comparison, &run_binary<binary_op::greater_equal>},
    {"Identity", {1, 13, 14, 16, 19, 21, 23, 24, 25}, &infer_identity, &run_identity},
    {"Less", {1, 7, 9, 13}, &infer_comparison, &run_binary<binary_op::less>},
    {"LessOrEqual", {12, 16}, &infer_comparison, &run_binary<binary_op::less_equal>},
    {"Mul", {1, 6, 7, 13, 14}, &infer_arithmetic, &run_binary<binary_op::mul>, nullptr, true},
    {"Not", {1}, &infer_not, &run_not},
    {"Or", {1, 7}, &infer_comparison, &run_binary<binary_op::or_>},
    // 12: the exponent may have another type than the base
    {"Pow", {1, 7, 12, 13, 15}, &infer_pow, &run_pow, nullptr, true},
    {"Relu", {1, 6, 13, 14}, &infer_relu, &run_relu, nullptr, true}, // 14: signed integers
    {"Sigmoid", {1, 6, 13}, &infer_float_unary, &run_float_unary<sigmoid>, nullptr, true},
    {"Sqrt", {1, 6, 13}, &infer_float_unary, &run_float_unary<square_root>, nullptr, true},
    {"Sub", {1, 6, 7, 13, 14}, &infer_arithmetic, &run_binary<binary_op::sub>, nullptr, true},
    {"Tanh", {1, 6, 13}, &infer_float_unary, &run_float_unary<hyperbolic_tangent>, nullptr,
     true},
    {"Where", {9, 16}, &infer_where, &run_where},
  };
  return ops;
}

const op_table& elementwise_engine_table() {
  static const op_table ops{
    {"FusedGelu", {}, &infer_float_unary, &run_fused_gelu},
    {"FusedGeluTanh", {}, &infer_float_unary, &run_fused_gelu_tanh},
  };
  return ops;
}

} // namespace caf_serving::onnx
