/// Element-wise operators, shared by the CUDA kernels (`cuda/elementwise.cu`) and
/// their CPU references (`cpu/reference_elementwise.cpp`).
///
/// Everything here that decides a result -- which operand element an output element
/// reads (the broadcast layout and its cursor), the arithmetic of every operator, and
/// the value conversions of Cast -- is written once, `__host__ __device__`, so the CPU
/// tests run the very index and value code the device runs. Only the storage
/// conversions of f16/bf16 differ (CUDA's intrinsics on the device, `cpu/half.hpp` on
/// the host); both round to nearest even, bit for bit (the `convert` checks).
///
///   auto layout = make_broadcast_layout<2>(out_dims, {a_dims, b_dims});  // host
///   auto plan = collapse(layout);         // fewer, longer dims; same element order
///   broadcast_cursor<2, std::uint32_t> c; c.seek(narrow<std::uint32_t>(plan), i);
///   ... a[c.offsets[0]], b[c.offsets[1]] ...; c.next(plan, i + 1);
///
/// Semantics beyond ONNX's text (all documented at the operator):
/// integer Div by zero gives 0; integer overflow wraps (two's complement); float
/// Max/Min propagate NaN; float -> integer Cast truncates toward zero and saturates,
/// NaN giving 0; integer -> narrower integer wraps; integers reach f16/bf16 through
/// f32 (as ONNX Runtime does).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/types.hpp"

// (Defined alike by every shared host/device header of kernels/cpu.)
#ifndef CAF_KERNELS_HD
#if defined(__CUDACC__)
#define CAF_KERNELS_HD __host__ __device__ __forceinline__
#else
#define CAF_KERNELS_HD inline
#endif
#endif

// Loops over the (at most 6) dims unroll in the device pass, so that every index into
// a layout is a constant: a kernel-parameter array indexed at run time is copied to
// local memory first. Host compilers warn about the pragma, so they do not see it.
#ifndef CAF_KERNELS_UNROLL
#if defined(__CUDA_ARCH__)
#define CAF_KERNELS_UNROLL _Pragma("unroll")
#else
#define CAF_KERNELS_UNROLL
#endif
#endif

namespace caf_serving::kernels {

// ---- operators ---------------------------------------------------------------------

/// Two-input operators, with NumPy/ONNX multidirectional broadcasting.
enum class binary_op {
  add,
  sub,
  mul,
  div, ///< integers: truncates toward zero; x / 0 = 0; INT_MIN / -1 = INT_MIN (wraps)
  pow, ///< both operands of one type; integers: by squaring, wrapping, x^-n = 1/x^n truncated
  max, ///< floats: NaN if either is NaN
  min, ///< floats: NaN if either is NaN
  logical_and, ///< boolean only
  logical_or,  ///< boolean only
  logical_xor, ///< boolean only
  equal,       ///< output boolean
  less,        ///< output boolean
  less_or_equal,
  greater,
  greater_or_equal,
};

/// One-input operators. Floating-point ones compute in f32.
enum class unary_op {
  neg,        ///< also i64, i32
  abs,        ///< also i64, i32 (|INT_MIN| wraps to INT_MIN)
  sqrt,
  reciprocal,
  exp,
  log,
  erf,
  tanh,
  sigmoid,
  relu,
  leaky_relu,   ///< x < 0 ? alpha x : x
  elu,          ///< x < 0 ? alpha (e^x - 1) : x
  gelu_erf,     ///< x/2 (1 + erf(x / sqrt 2))
  gelu_tanh,    ///< x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  silu,         ///< x sigmoid(x) (Swish)
  hard_sigmoid, ///< max(0, min(1, alpha x + beta))
  hard_swish,   ///< x max(0, min(1, x/6 + 1/2))
  clip,         ///< min(max(x, lo), hi)
  softplus,     ///< ln(1 + e^x)
  floor,
  ceil,
  round, ///< half to even, as ONNX Round
  sin,
  cos,
  logical_not, ///< boolean only
  identity,    ///< every type: a copy
};

/// The attributes of the unary operators that have any; `default_params` gives ONNX's
/// defaults.
struct unary_params {
  float alpha = 0; ///< leaky_relu, elu, hard_sigmoid
  float beta = 0;  ///< hard_sigmoid
  float lo = -INFINITY; ///< clip
  float hi = INFINITY;  ///< clip
};

inline unary_params default_params(unary_op op) {
  unary_params p;
  if (op == unary_op::leaky_relu)
    p.alpha = 0.01f;
  else if (op == unary_op::elu)
    p.alpha = 1.0f;
  else if (op == unary_op::hard_sigmoid)
    p.alpha = 0.2f, p.beta = 0.5f;
  return p;
}

const char* binary_op_name(binary_op op);
const char* unary_op_name(unary_op op);

constexpr bool is_comparison(binary_op op) {
  return op == binary_op::equal || op == binary_op::less || op == binary_op::less_or_equal
         || op == binary_op::greater || op == binary_op::greater_or_equal;
}

constexpr bool is_logical(binary_op op) {
  return op == binary_op::logical_and || op == binary_op::logical_or
         || op == binary_op::logical_xor;
}

/// Whether `op` is defined on operands of type `t`: arithmetic and comparisons on
/// f32, f16, bf16, i64, i32; And/Or/Xor and Equal on boolean.
constexpr bool binary_supported(binary_op op, dtype t) {
  if (t == dtype::boolean)
    return is_logical(op) || op == binary_op::equal;
  if (is_logical(op))
    return false;
  return is_floating(t) || t == dtype::i64 || t == dtype::i32;
}

/// The output type of `op` on inputs of type `t`.
constexpr dtype binary_output_type(binary_op op, dtype t) {
  return is_comparison(op) ? dtype::boolean : t;
}

constexpr bool unary_supported(unary_op op, dtype t) {
  if (op == unary_op::identity)
    return true;
  if (op == unary_op::logical_not)
    return t == dtype::boolean;
  if (op == unary_op::neg || op == unary_op::abs)
    return is_floating(t) || t == dtype::i64 || t == dtype::i32;
  return is_floating(t);
}

/// Throws `std::invalid_argument` saying what is wrong when `op` is not defined on
/// operands of type `t` (the launchers and the references both call these).
void require_binary_supported(binary_op op, dtype t);
void require_unary_supported(unary_op op, dtype t);

// ---- broadcast layout ----------------------------------------------------------------

inline constexpr int max_elementwise_dims = 6;

/// The iteration space of an element-wise operation over `N` operands: the output's
/// shape (row-major, contiguous) and, per operand, the element stride of each output
/// dimension (0 where the operand is broadcast). Dims past `rank` are unused.
template <int N, class Index = std::int64_t>
struct broadcast_layout {
  int rank = 1;
  Index shape[max_elementwise_dims] = {1, 1, 1, 1, 1, 1};
  Index strides[N][max_elementwise_dims] = {};
};

/// The element strides of an input of ONNX shape `in` broadcast to output shape `out`
/// (right-aligned; each input dim equals the output's or is 1).
inline std::array<std::int64_t, max_elementwise_dims>
broadcast_strides(const std::vector<std::int64_t>& out, const std::vector<std::int64_t>& in) {
  std::array<std::int64_t, max_elementwise_dims> strides{};
  if (in.size() > out.size())
    throw std::invalid_argument("broadcast: an input has rank " + std::to_string(in.size())
                                + ", more than the output's " + std::to_string(out.size()));
  std::int64_t stride = 1;
  std::size_t shift = out.size() - in.size();
  for (std::size_t d = in.size(); d-- > 0;) {
    if (in[d] != out[d + shift] && in[d] != 1)
      throw std::invalid_argument("broadcast: input dim " + std::to_string(d) + " is "
                                  + std::to_string(in[d]) + ", which is neither 1 nor the "
                                  + "output's " + std::to_string(out[d + shift]));
    strides[d + shift] = in[d] == 1 ? 0 : stride;
    stride *= in[d];
  }
  return strides;
}

/// The output shape of NumPy/ONNX multidirectional broadcasting of `shapes`.
inline std::vector<std::int64_t>
broadcast_shape(std::initializer_list<std::vector<std::int64_t>> shapes) {
  std::size_t rank = 0;
  for (const auto& s : shapes)
    rank = s.size() > rank ? s.size() : rank;
  std::vector<std::int64_t> out(rank, 1);
  for (const auto& s : shapes)
    for (std::size_t d = 0; d < s.size(); ++d) {
      std::int64_t& o = out[rank - s.size() + d];
      if (s[d] == o || s[d] == 1)
        continue;
      if (o != 1)
        throw std::invalid_argument("broadcast: dims " + std::to_string(o) + " and "
                                    + std::to_string(s[d]) + " do not broadcast; each "
                                    + "must equal the other or be 1");
      o = s[d];
    }
  return out;
}

/// The layout of `N` inputs of ONNX shapes `inputs` broadcast to `out`, which has at
/// most `max_elementwise_dims` dims (rank 0, a scalar, is one element).
template <int N>
broadcast_layout<N> make_broadcast_layout(const std::vector<std::int64_t>& out,
                                          const std::array<std::vector<std::int64_t>, N>& inputs) {
  if (out.size() > static_cast<std::size_t>(max_elementwise_dims))
    throw std::invalid_argument("element-wise: the output has rank " + std::to_string(out.size())
                                + "; at most " + std::to_string(max_elementwise_dims)
                                + " dims are supported");
  broadcast_layout<N> l;
  l.rank = out.empty() ? 1 : static_cast<int>(out.size());
  for (std::size_t d = 0; d < out.size(); ++d)
    l.shape[d] = out[d];
  for (int k = 0; k < N; ++k) {
    auto s = broadcast_strides(out, inputs[k]);
    for (std::size_t d = 0; d < out.size(); ++d)
      l.strides[k][d] = s[d];
  }
  return l;
}

/// Elements of the output.
template <int N, class Index>
CAF_KERNELS_HD Index element_count(const broadcast_layout<N, Index>& l) {
  Index n = 1;
  for (int d = 0; d < l.rank; ++d)
    n *= l.shape[d];
  return n;
}

/// The same iteration in the fewest dims: size-1 dims are dropped, and a dim merges
/// into the next one (inner) when every operand steps through both as through one
/// (stride[d] == stride[d + 1] * shape[d + 1], which includes two broadcast dims).
/// The output element order is unchanged. Always at least one dim.
template <int N>
broadcast_layout<N> collapse(const broadcast_layout<N>& in) {
  broadcast_layout<N> out;
  out.rank = 0;
  for (int d = 0; d < in.rank; ++d) {
    if (in.shape[d] == 1)
      continue;
    if (in.shape[d] == 0) { // no elements at all: one empty dim
      out = broadcast_layout<N>{};
      out.shape[0] = 0;
      return out;
    }
    int last = out.rank - 1;
    bool merges = last >= 0;
    for (int k = 0; k < N && merges; ++k)
      merges = out.strides[k][last] == in.strides[k][d] * in.shape[d];
    if (merges) {
      out.shape[last] *= in.shape[d];
      for (int k = 0; k < N; ++k)
        out.strides[k][last] = in.strides[k][d];
    } else {
      out.shape[out.rank] = in.shape[d];
      for (int k = 0; k < N; ++k)
        out.strides[k][out.rank] = in.strides[k][d];
      ++out.rank;
    }
  }
  if (out.rank == 0) { // a single element
    out.rank = 1;
    out.shape[0] = 1;
    for (int k = 0; k < N; ++k)
      out.strides[k][0] = 0;
  }
  return out;
}

/// The largest element offset any operand reaches, plus one (0 for no elements).
template <int N>
std::int64_t operand_extent(const broadcast_layout<N>& l, int k) {
  if (element_count(l) == 0)
    return 0;
  std::int64_t last = 0;
  for (int d = 0; d < l.rank; ++d)
    last += (l.shape[d] - 1) * l.strides[k][d];
  return last + 1;
}

/// The layout with another index type (the kernels use 32-bit indices where every
/// count and offset fits, since 64-bit division is several times slower).
template <class Index, int N>
broadcast_layout<N, Index> narrow(const broadcast_layout<N>& l) {
  broadcast_layout<N, Index> out;
  out.rank = l.rank;
  for (int d = 0; d < max_elementwise_dims; ++d) {
    out.shape[d] = static_cast<Index>(l.shape[d]);
    for (int k = 0; k < N; ++k)
      out.strides[k][d] = static_cast<Index>(l.strides[k][d]);
  }
  return out;
}

/// Throws `std::invalid_argument` for a rank outside 1..6 or a negative dim or stride.
template <int N>
void require_valid_layout(const broadcast_layout<N>& l, const char* who) {
  if (l.rank < 1 || l.rank > max_elementwise_dims)
    throw std::invalid_argument(std::string(who) + ": rank " + std::to_string(l.rank)
                                + " is not supported; give 1 to "
                                + std::to_string(max_elementwise_dims)
                                + " dims (a scalar is rank 1 of size 1)");
  for (int d = 0; d < l.rank; ++d) {
    bool bad = l.shape[d] < 0;
    for (int k = 0; k < N; ++k)
      bad = bad || l.strides[k][d] < 0;
    if (bad)
      throw std::invalid_argument(std::string(who) + ": dim " + std::to_string(d)
                                  + " has a negative size or stride; sizes and strides "
                                  + "must be >= 0 (0 on broadcast dims)");
  }
}

/// Walks the output in order, keeping each operand's element offset: `seek` divides
/// once per dim; `next` steps the innermost dim and seeks again only when it wraps.
/// Within one row of the innermost dim (`inner + k < inner_shape`), operand `k`'s
/// elements are `inner_step[k]` apart.
template <int N, class Index>
struct broadcast_cursor {
  Index inner = 0;       ///< coordinate in the innermost dim
  Index inner_shape = 1; ///< size of the innermost dim
  Index offsets[N] = {};
  Index inner_step[N] = {}; ///< each operand's stride in the innermost dim

  CAF_KERNELS_HD void seek(const broadcast_layout<N, Index>& l, Index i) {
    for (int k = 0; k < N; ++k)
      offsets[k] = 0;
    bool innermost = true; // (not `d == rank - 1`: the compiler turns that back into
                           // a run-time index, and the layout into local memory)
    CAF_KERNELS_UNROLL
    for (int d = max_elementwise_dims - 1; d >= 0; --d) {
      if (d >= l.rank)
        continue;
      Index c = i % l.shape[d];
      i /= l.shape[d];
      if (innermost) {
        inner = c;
        inner_shape = l.shape[d];
        for (int k = 0; k < N; ++k)
          inner_step[k] = l.strides[k][d];
        innermost = false;
      }
      for (int k = 0; k < N; ++k)
        offsets[k] += c * l.strides[k][d];
    }
  }

  /// Moves to output element `i_next`, which must follow the current one.
  CAF_KERNELS_HD void next(const broadcast_layout<N, Index>& l, Index i_next) {
    if (++inner == inner_shape) {
      seek(l, i_next);
      return;
    }
    for (int k = 0; k < N; ++k)
      offsets[k] += inner_step[k];
  }
};

// ---- arithmetic ----------------------------------------------------------------------
// Compute types: float for f32/f16/bf16, std::int64_t, std::int32_t, bool.

namespace detail_ew {

template <class C>
using unsigned_of = std::make_unsigned_t<C>;

template <class C>
CAF_KERNELS_HD C wrap_add(C a, C b) {
  return static_cast<C>(static_cast<unsigned_of<C>>(a) + static_cast<unsigned_of<C>>(b));
}
template <class C>
CAF_KERNELS_HD C wrap_sub(C a, C b) {
  return static_cast<C>(static_cast<unsigned_of<C>>(a) - static_cast<unsigned_of<C>>(b));
}
template <class C>
CAF_KERNELS_HD C wrap_mul(C a, C b) {
  return static_cast<C>(static_cast<unsigned_of<C>>(a) * static_cast<unsigned_of<C>>(b));
}

template <class C>
CAF_KERNELS_HD C int_div(C a, C b) {
  if (b == 0)
    return 0; // defined here: the device must not trap, and no value is right
  if (b == -1)
    return wrap_sub<C>(0, a); // INT_MIN / -1 wraps to INT_MIN instead of overflowing
  return a / b;              // C++ truncates toward zero, as ONNX
}

template <class C>
CAF_KERNELS_HD C int_pow(C base, C exponent) {
  if (exponent < 0) { // 1 / base^n, truncated: only |base| == 1 survives
    if (base == 1)
      return 1;
    if (base == -1)
      return (exponent & 1) ? -1 : 1;
    return 0; // including 0^-n, like integer division by zero
  }
  C result = 1;
  while (exponent > 0) {
    if (exponent & 1)
      result = wrap_mul(result, base);
    base = wrap_mul(base, base);
    exponent >>= 1;
  }
  return result;
}

} // namespace detail_ew

/// `op(a, b)` for the non-comparison operators, in compute type `C`.
template <class C>
CAF_KERNELS_HD C apply_binary(binary_op op, C a, C b) {
  if constexpr (std::is_same_v<C, bool>) {
    switch (op) {
      case binary_op::logical_and:
        return a && b;
      case binary_op::logical_or:
        return a || b;
      case binary_op::logical_xor:
        return a != b;
      default:
        return false;
    }
  } else if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case binary_op::add:
        return detail_ew::wrap_add(a, b);
      case binary_op::sub:
        return detail_ew::wrap_sub(a, b);
      case binary_op::mul:
        return detail_ew::wrap_mul(a, b);
      case binary_op::div:
        return detail_ew::int_div(a, b);
      case binary_op::pow:
        return detail_ew::int_pow(a, b);
      case binary_op::max:
        return a > b ? a : b;
      case binary_op::min:
        return a < b ? a : b;
      default:
        return 0;
    }
  } else {
    switch (op) {
      case binary_op::add:
        return a + b;
      case binary_op::sub:
        return a - b;
      case binary_op::mul:
        return a * b;
      case binary_op::div:
        return a / b;
      case binary_op::pow:
        return powf(a, b);
      case binary_op::max: // NaN in either gives NaN (a NaN `a` fails every test)
        return (a != a || a > b) ? a : b;
      case binary_op::min:
        return (a != a || a < b) ? a : b;
      default:
        return 0;
    }
  }
}

/// `op(a, b)` for the comparison operators; false for NaN except in nothing.
template <class C>
CAF_KERNELS_HD bool apply_compare(binary_op op, C a, C b) {
  switch (op) {
    case binary_op::equal:
      return a == b;
    case binary_op::less:
      return a < b;
    case binary_op::less_or_equal:
      return a <= b;
    case binary_op::greater:
      return a > b;
    case binary_op::greater_or_equal:
      return a >= b;
    default:
      return false;
  }
}

CAF_KERNELS_HD float sigmoid_f32(float x) {
  return 1.0f / (1.0f + expf(-x));
}

/// `op(x)` for f32/f16/bf16 inputs, computed in f32.
CAF_KERNELS_HD float apply_unary(unary_op op, float x, const unary_params& p) {
  switch (op) {
    case unary_op::neg:
      return -x;
    case unary_op::abs:
      return fabsf(x);
    case unary_op::sqrt:
      return sqrtf(x);
    case unary_op::reciprocal:
      return 1.0f / x;
    case unary_op::exp:
      return expf(x);
    case unary_op::log:
      return logf(x);
    case unary_op::erf:
      return erff(x);
    case unary_op::tanh:
      return tanhf(x);
    case unary_op::sigmoid:
      return sigmoid_f32(x);
    case unary_op::relu:
      return x < 0.0f ? 0.0f : x; // NaN stays NaN
    case unary_op::leaky_relu:
      return x < 0.0f ? p.alpha * x : x;
    case unary_op::elu:
      return x < 0.0f ? p.alpha * expm1f(x) : x;
    case unary_op::gelu_erf:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case unary_op::gelu_tanh:
      return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case unary_op::silu:
      return x * sigmoid_f32(x);
    case unary_op::hard_sigmoid:
      return fminf(1.0f, fmaxf(0.0f, p.alpha * x + p.beta));
    case unary_op::hard_swish:
      return x * fminf(1.0f, fmaxf(0.0f, x * (1.0f / 6.0f) + 0.5f));
    case unary_op::clip:
      return fminf(fmaxf(x, p.lo), p.hi);
    case unary_op::softplus: // ln(1 + e^x) without overflow for large x
      return x > 20.0f ? x : log1pf(expf(x));
    case unary_op::floor:
      return floorf(x);
    case unary_op::ceil:
      return ceilf(x);
    case unary_op::round:
      return rintf(x); // the default rounding mode: half to even
    case unary_op::sin:
      return sinf(x);
    case unary_op::cos:
      return cosf(x);
    case unary_op::logical_not:
    case unary_op::identity:
      return x;
  }
  return x;
}

/// `op(x)` for i64/i32 inputs (neg, abs, identity).
template <class C>
CAF_KERNELS_HD C apply_unary_int(unary_op op, C x) {
  switch (op) {
    case unary_op::neg:
      return detail_ew::wrap_sub<C>(0, x);
    case unary_op::abs:
      return x < 0 ? detail_ew::wrap_sub<C>(0, x) : x;
    default:
      return x;
  }
}

// ---- Cast value conversions ----------------------------------------------------------

/// float -> integer type `I`: truncates toward zero; saturates at the range's ends
/// (ONNX leaves out-of-range values undefined); NaN gives 0.
template <class I>
CAF_KERNELS_HD I float_to_int(float x) {
  if (x != x)
    return 0;
  // 2^bits (unsigned) or 2^(bits-1) (signed): exact in f32; below it, truncation fits.
  constexpr float limit = std::is_signed_v<I> ? static_cast<float>(std::uint64_t{1} << (8 * sizeof(I) - 1))
                                              : static_cast<float>(std::uint64_t{1} << (8 * sizeof(I) - 1)) * 2.0f;
  constexpr I lo = std::is_signed_v<I> ? static_cast<I>(std::uint64_t{1} << (8 * sizeof(I) - 1)) : I{0};
  constexpr I hi = static_cast<I>(~static_cast<std::make_unsigned_t<I>>(lo));
  if (x >= limit)
    return hi;
  if (x <= static_cast<float>(lo))
    return lo;
  return static_cast<I>(x);
}

/// integer -> integer type `I`: keeps the low bits (two's complement wrap).
template <class I>
CAF_KERNELS_HD I int_to_int(std::int64_t x) {
  return static_cast<I>(static_cast<std::make_unsigned_t<I>>(static_cast<std::uint64_t>(x)));
}

} // namespace caf_serving::kernels
