#include "onnx/ops_more.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;
/// One operator of this file: every ONNX version of it (since_version), from
/// its first up to onnx 1.23's opset 28; the datatypes its first input may
/// have, which the shared part of inference checks; its entry's functions;
/// whether it is element-wise (op_entry::elementwise). Between the versions
/// listed only the spec's type lists changed (fp16/bf16/fp8/int4 added, which
/// the engine does not run), except as the comment says.
struct more_op {
  std::vector<int64_t> versions;
  std::vector<datatype> types;
  infer_function infer;
  reference_function run;
  check_function check = nullptr;
  bool elementwise = false;
};

const std::map<std::string, more_op>& table();

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

bool has_input(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

std::string type_name(datatype t) {
  return std::string(to_string(t));
}

std::string unsupported_attr(const node& n, const std::string& attr, const std::string& value,
                             const std::string& supported) {
  return "attribute " + attr + "=" + value + " of " + n.op + " is not supported by the engine ("
         + supported + ")";
}

/// What every operator of this file refuses alike, before its own inference:
/// an opset before its first version, no first input, a first input of a type
/// its kernel does not take.
std::optional<std::string> refused_input(const graph& g, const node& n) {
  const auto& e = table().at(n.op);
  if (auto refused = refused_opset_or_input(g, n, e.versions.front()))
    return refused;
  return refused_input_type(g, n, e.types);
}

template <infer_function Infer>
infer_result checked(const graph& g, const node& n) {
  return refuse_then<refused_input, Infer>(g, n);
}

// ------------------------------------------------------------------ element-wise

infer_result infer_unary(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  return one(x.dtype, x.shape);
}

infer_result infer_gelu(const graph& g, const node& n) {
  auto approx = n.get_s("approximate", "none");
  if (approx != "none" && approx != "tanh")
    return unsupported_attr(n, "approximate", "'" + approx + "'", "none, tanh");
  return infer_unary(g, n);
}

float softplus(float x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

/// y[i] = f(x[i]) on FLOAT, the only type inference gives these kernels.
template <class F>
void each_float(const std::vector<tensor_ref>& in, const std::vector<tensor_ref>& out, F f) {
  const float* x = in[0].as<float>();
  float* y = out[0].as<float>();
  for (int64_t i = 0, count = out[0].elements(); i < count; ++i) y[i] = f(x[i]);
}

template <float (*F)(float)>
void run_float(const node&, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  each_float(in, out, F);
}

float sine(float x) {
  return std::sin(x);
}
float cosine(float x) {
  return std::cos(x);
}
float floor_of(float x) {
  return std::floor(x);
}
float ceil_of(float x) {
  return std::ceil(x);
}
float round_half_even(float x) {
  return std::nearbyint(x);
}
float softsign(float x) {
  return x / (1.0f + std::fabs(x));
}
float mish(float x) {
  return x * std::tanh(softplus(x));
}

void run_gelu(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  each_float(in, out, n.get_s("approximate", "none") == "tanh" ? gelu_tanh : gelu_erf);
}

void run_elu(const node& n, const std::vector<tensor_ref>& in,
             const std::vector<tensor_ref>& out) {
  float a = n.get_f("alpha", 1.0f);
  each_float(in, out, [a](float x) { return x >= 0 ? x : a * (std::exp(x) - 1.0f); });
}

void run_selu(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  float a = n.get_f("alpha", 1.67326319217681884765625f);
  float gamma = n.get_f("gamma", 1.05070102214813232421875f);
  each_float(in, out,
             [a, gamma](float x) { return x > 0 ? gamma * x : gamma * (a * std::exp(x) - a); });
}

void run_leaky_relu(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  float a = n.get_f("alpha", 0.01f);
  each_float(in, out, [a](float x) { return x < 0 ? a * x : x; });
}

void run_thresholded_relu(const node& n, const std::vector<tensor_ref>& in,
                          const std::vector<tensor_ref>& out) {
  float a = n.get_f("alpha", 1.0f);
  each_float(in, out, [a](float x) { return x > a ? x : 0.0f; });
}

template <class T>
T sign_of(T v) {
  if constexpr (std::is_unsigned_v<T>)
    return v > 0 ? T(1) : T(0);
  else
    return v > 0 ? T(1) : (v < 0 ? T(-1) : T(0));
}

void run_sign(const node&, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& x = in[0];
  const auto& y = out[0];
  int64_t count = y.elements();
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>)
      for (int64_t i = 0; i < count; ++i) y.as<T>()[i] = sign_of(x.as<T>()[i]);
  });
}

infer_result infer_prelu(const graph& g, const node& n) {
  if (!has_input(n, 1))
    return std::string("PRelu takes X and slope");
  const auto& x = g.values[n.inputs[0]];
  const auto& s = g.values[n.inputs[1]];
  if (s.dtype != x.dtype)
    return "slope '" + s.name + "' is " + type_name(s.dtype) + " but X is " + type_name(x.dtype);
  auto b = broadcast_shapes(x.shape, s.shape);
  if (!b || *b != x.shape)
    return "slope " + shape_string(s.shape) + " does not broadcast to X "
           + shape_string(x.shape);
  return one(x.dtype, x.shape);
}

void run_prelu(const node&, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& x = in[0];
  const auto& slope = in[1];
  const auto& y = out[0];
  std::array<shape_t, 1> st{broadcast_strides(slope.shape, y.shape)};
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, int64_t>
                  || std::is_same_v<T, int32_t>) {
      const T* a = x.as<T>();
      const T* s = slope.as<T>();
      T* o = y.as<T>();
      broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
        o[i] = a[i] < 0 ? static_cast<T>(s[off[0]] * a[i]) : a[i];
      });
    }
  });
}

// ------------------------------------------------------------------ normalization

infer_result infer_rms_norm(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (!has_input(n, 1))
    return std::string("RMSNormalization takes X and scale");
  const auto& s = g.values[n.inputs[1]];
  int64_t rank = static_cast<int64_t>(x.shape.size()), axis = n.get_i("axis", -1);
  if (rank == 0 || axis < -rank || axis >= rank)
    return "axis " + std::to_string(axis) + " is out of range for " + shape_string(x.shape);
  axis = norm_axis(axis, rank);
  if (s.dtype != datatype::fp32)
    return "scale '" + s.name + "' is " + type_name(s.dtype) + "; the engine takes FLOAT";
  int64_t stash = n.get_i("stash_type", 1);
  if (stash != 1)
    return unsupported_attr(n, "stash_type", std::to_string(stash), "1, FLOAT");
  shape_t normalized(x.shape.begin() + axis, x.shape.end());
  auto b = broadcast_shapes(normalized, s.shape);
  if (!b || *b != normalized)
    return "scale " + shape_string(s.shape) + " does not broadcast to the normalized shape "
           + shape_string(normalized) + " of X " + shape_string(x.shape);
  return one(x.dtype, x.shape);
}

/// Y = X / sqrt(mean(X^2 over the axes from `axis` on) + epsilon) * scale, the
/// mean accumulated in double.
void run_rms_norm(const node& n, const std::vector<tensor_ref>& inputs,
                  const std::vector<tensor_ref>& outputs) {
  const auto& x = inputs[0];
  const auto& scale = inputs[1];
  const auto& y = outputs[0];
  size_t axis = static_cast<size_t>(norm_axis(n.get_i("axis", -1), x.shape.size()));
  float eps = n.get_f("epsilon", 1e-5f);
  int64_t inner = 1;
  for (size_t d = axis; d < x.shape.size(); ++d) inner *= x.shape[d];
  int64_t rows = inner == 0 ? 0 : x.elements() / inner;
  shape_t normalized(x.shape.begin() + axis, x.shape.end());
  std::vector<float> s(inner);
  std::array<shape_t, 1> st{broadcast_strides(scale.shape, normalized)};
  broadcast_loop<1>(normalized, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
    s[i] = scale.as<float>()[off[0]];
  });
  const float* in = x.as<float>();
  float* out = y.as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = in + r * inner;
    double sum = 0;
    for (int64_t i = 0; i < inner; ++i) sum += double(p[i]) * p[i];
    float inv = static_cast<float>(1.0 / std::sqrt(sum / double(inner) + eps));
    for (int64_t i = 0; i < inner; ++i) out[r * inner + i] = p[i] * inv * s[i];
  }
}

infer_result infer_lrn(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (x.shape.size() < 3)
    return "LRN's input " + shape_string(x.shape) + " must be [N, C, D1, ...]";
  if (!n.has("size") || n.get_i("size", 0) < 1)
    return std::string("LRN needs a positive size attribute");
  return one(x.dtype, x.shape);
}

/// y = x / (bias + alpha / size * sum of x^2 over the channels c - floor((size - 1) / 2)
/// to c + ceil((size - 1) / 2))^beta.
void run_lrn(const node& n, const std::vector<tensor_ref>& inputs,
             const std::vector<tensor_ref>& outputs) {
  const auto& x = inputs[0];
  const auto& y = outputs[0];
  int64_t size = n.get_i("size", 1);
  float alpha = n.get_f("alpha", 1e-4f), beta = n.get_f("beta", 0.75f);
  float bias = n.get_f("bias", 1.0f);
  int64_t channels = x.shape[1], inner = 1;
  for (size_t d = 2; d < x.shape.size(); ++d) inner *= x.shape[d];
  int64_t batches = x.shape[0];
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  const float* in = x.as<float>();
  float* out = y.as<float>();
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        float sum = 0;
        for (int64_t k = std::max<int64_t>(0, c - before);
             k <= std::min<int64_t>(channels - 1, c + after); ++k) {
          float v = in[(b * channels + k) * inner + i];
          sum += v * v;
        }
        int64_t at = (b * channels + c) * inner + i;
        out[at] = in[at] / std::pow(bias + alpha / static_cast<float>(size) * sum, beta);
      }
}

// ------------------------------------------------------------------ reductions

/// The reduced axes of a reduction of this file, sorted; `noop` when the model
/// asks for no reduction at all (each output element is then the reduction of
/// one input element).
struct reduction {
  std::vector<int64_t> axes;
  bool noop = false;
};

std::variant<reduction, std::string> reduction_of(const node& n,
                                                  const std::vector<int64_t>* axes_input,
                                                  size_t rank) {
  reduction r;
  std::vector<int64_t> axes = axes_input ? *axes_input : n.get_ints("axes");
  if (axes.empty() && n.get_i("noop_with_empty_axes", 0) != 0) {
    r.noop = true;
    return r;
  }
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (auto a : axes) {
    if (a < -static_cast<int64_t>(rank) || a >= static_cast<int64_t>(rank))
      return "axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank);
    r.axes.push_back(norm_axis(a, rank));
  }
  std::sort(r.axes.begin(), r.axes.end());
  r.axes.erase(std::unique(r.axes.begin(), r.axes.end()), r.axes.end());
  return r;
}

shape_t reduced_shape(const shape_t& in, const reduction& r, bool keepdims) {
  if (r.noop)
    return in;
  shape_t s;
  for (size_t d = 0; d < in.size(); ++d) {
    bool reduced = std::binary_search(r.axes.begin(), r.axes.end(), static_cast<int64_t>(d));
    if (!reduced)
      s.push_back(in[d]);
    else if (keepdims)
      s.push_back(1);
  }
  return s;
}

/// What sets some reductions apart in inference.
struct reduce_rules {
  bool floats_from_28 = false;        ///< ReduceLogSum, ReduceLogSumExp: floats only from 28 on
  bool empty_undefined_to_18 = false; ///< ReduceMax, ReduceMin: of nothing, before 18
};

infer_result infer_reduce_as(const graph& g, const node& n, reduce_rules rules) {
  const auto& x = g.values[n.inputs[0]];
  if (x.dtype == datatype::bool_ && g.opset != 0 && g.opset < 20)
    return n.op + " of BOOL exists from opset 20, but the model imports opset "
           + std::to_string(g.opset);
  if (rules.floats_from_28 && x.dtype != datatype::fp32 && g.opset >= 28)
    return "input '" + x.name + "' is " + type_name(x.dtype) + "; " + n.op
           + "-28 (opset " + std::to_string(g.opset)
           + ") takes floating-point tensors only: Cast it to FLOAT first";
  std::vector<int64_t> axes;
  bool from_input = has_input(n, 1);
  if (from_input) {
    if (g.opset != 0 && g.opset < 18)
      return n.op + "'s axes input exists from opset 18; before it axes is an attribute";
    if (!g.values[n.inputs[1]].constant)
      return n.op + "'s axes ('" + g.values[n.inputs[1]].name
             + "') must be known before the model runs; export them as a constant";
    axes = const_ints(g, n.inputs[1]);
  }
  auto r = reduction_of(n, from_input ? &axes : nullptr, x.shape.size());
  if (auto* e = std::get_if<std::string>(&r))
    return *e;
  const auto& red = std::get<reduction>(r);
  // Only the maximum and minimum of nothing were undefined before opset 18;
  // products and sums have their identity (1, 0, log 0) at every version.
  if (rules.empty_undefined_to_18 && !red.noop)
    for (auto a : red.axes)
      if (x.shape[a] == 0 && g.opset != 0 && g.opset < 18)
        return n.op + " of an empty axis " + std::to_string(a) + " of " + shape_string(x.shape)
               + " is undefined before opset 18";
  return one(x.dtype, reduced_shape(x.shape, red, n.get_i("keepdims", 1) != 0));
}

/// ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare.
infer_result infer_reduce(const graph& g, const node& n) {
  return infer_reduce_as(g, n, {});
}

/// ReduceLogSum, ReduceLogSumExp.
infer_result infer_log_reduce(const graph& g, const node& n) {
  return infer_reduce_as(g, n, {true, false});
}

/// ReduceMax, ReduceMin.
infer_result infer_extreme_reduce(const graph& g, const node& n) {
  return infer_reduce_as(g, n, {false, true});
}

/// The reductions whose axes became an input at version 18 and that inference
/// leaves to the registry's check (ReduceMax, ReduceMin and ReduceProd refuse the
/// axes input before 18 in their inference).
std::optional<std::string> check_axes_input_18(const graph& g, const node& n, int64_t version) {
  return check_axes_input(g, n, version, 18);
}

/// The reduced axes of a reduction node at run time: from its axes input when
/// it has one (checked at load), else from its attribute.
reduction reduction_at_run(const node& n, const std::vector<tensor_ref>& in) {
  std::vector<int64_t> axes;
  bool from_input = in.size() > 1 && in[1].data;
  if (from_input)
    axes = ref_ints(in[1]);
  return std::get<reduction>(reduction_of(n, from_input ? &axes : nullptr, in[0].shape.size()));
}

/// How ReduceMax, ReduceMin and ReduceProd fold an element into their output.
enum class fold { max, min, prod };

/// Every input element folds into its output element; output strides are 0 on
/// the reduced axes. An empty reduction gives ReduceMax's lowest value (minus
/// infinity for floats), ReduceMin's highest, ReduceProd's 1, as ONNX 18 says.
template <fold K, class T>
void fold_reduce(const node& n, const std::vector<tensor_ref>& in, const tensor_ref& y) {
  const auto& x = in[0];
  auto red = reduction_at_run(n, in);
  T init;
  if constexpr (std::is_same_v<T, bool>)
    init = K == fold::min; // any for ReduceMax, all for ReduceMin
  else if constexpr (K == fold::prod)
    init = T(1);
  else if constexpr (std::is_floating_point_v<T>)
    init = K == fold::max ? -std::numeric_limits<T>::infinity()
                          : std::numeric_limits<T>::infinity();
  else
    init = K == fold::max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  T* out = y.as<T>();
  std::fill(out, out + y.elements(), init);
  // The output's strides over the input's dimensions, 0 where reduced.
  shape_t kept = reduced_shape(x.shape, red, true);
  std::array<shape_t, 1> st{broadcast_strides(kept, x.shape)};
  const T* a = x.as<T>();
  int kind = K == fold::max ? 0 : (K == fold::min ? 1 : 2);
  broadcast_loop<1>(x.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
    T& o = out[off[0]];
    T v = a[i];
    if constexpr (std::is_same_v<T, bool>) {
      o = kind == 0 ? (o || v) : (o && v);
    } else if (kind == 2) {
      o = static_cast<T>(o * v);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(v) || std::isnan(o))
        o = std::numeric_limits<T>::quiet_NaN();
      else
        o = kind == 0 ? std::max(o, v) : std::min(o, v);
    } else {
      o = kind == 0 ? std::max(o, v) : std::min(o, v);
    }
  });
}

template <fold K>
void run_fold(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  dispatch(in[0].dtype, [&](auto tag) { fold_reduce<K, decltype(tag)>(n, in, out[0]); });
}

/// The reductions that sum a function of each element, then perhaps transform
/// the sum: |x| (ReduceL1), x squared (ReduceSumSquare; ReduceL2 then takes the
/// square root), x (ReduceLogSum, then the log), e^x (ReduceLogSumExp, then the log).
enum class sum_kind { l1, l2, sum_square, log_sum, log_sum_exp };

/// `v` in integer type T, truncated toward zero as a cast does; NaN, infinities
/// and values out of T's range (the log of 0, or of a negative sum) saturate
/// instead of being undefined behaviour.
template <class T>
T saturated(double v) {
  if (std::isnan(v))
    return T(0);
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest()))
    return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max()))
    return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

/// ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp (`K`). Floats
/// sum in double. Integers of ReduceL1 and ReduceSumSquare sum exactly,
/// wrapping as a sum in the integer type does; the others are computed in
/// double and truncated. ReduceLogSumExp subtracts each
/// output's largest finite input before exp, so that large inputs do not
/// overflow. An empty reduction gives the empty sum's value: 0, and log 0 =
/// minus infinity for the logs (the lowest integer for integer types).
template <sum_kind K, class T>
void sum_reduce(const node& n, const std::vector<tensor_ref>& in, const tensor_ref& y) {
  const auto& x = in[0];
  auto red = reduction_at_run(n, in);
  // The output's strides over the input's dimensions, 0 where reduced.
  std::array<shape_t, 1> st{broadcast_strides(reduced_shape(x.shape, red, true), x.shape)};
  const T* a = x.as<T>();
  T* out = y.as<T>();
  int64_t count = y.elements();
  constexpr sum_kind kind = K;
  if constexpr (std::is_integral_v<T>) {
    if (kind == sum_kind::l1 || kind == sum_kind::sum_square) {
      // Unsigned arithmetic wraps modulo 2^64, which the cast to T keeps.
      std::vector<uint64_t> acc(count, 0);
      broadcast_loop<1>(x.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
        auto v = static_cast<uint64_t>(a[i]);
        if constexpr (std::is_signed_v<T>)
          if (kind == sum_kind::l1 && a[i] < 0)
            v = 0 - v;
        acc[off[0]] += kind == sum_kind::l1 ? v : v * v;
      });
      for (int64_t o = 0; o < count; ++o) out[o] = static_cast<T>(acc[o]);
      return;
    }
  }
  // e^(x - shift): the largest finite input, 0 where there is none (all of
  // them infinite or NaN, or none at all), as ONNX's reference does.
  std::vector<double> shift(count, 0.0);
  if (kind == sum_kind::log_sum_exp) {
    std::vector<double> largest(count, -std::numeric_limits<double>::infinity());
    broadcast_loop<1>(x.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
      double v = static_cast<double>(a[i]);
      if (std::isfinite(v) && v > largest[off[0]])
        largest[off[0]] = v;
    });
    for (int64_t o = 0; o < count; ++o)
      if (std::isfinite(largest[o]))
        shift[o] = largest[o];
  }
  std::vector<double> acc(count, 0.0);
  broadcast_loop<1>(x.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
    double v = static_cast<double>(a[i]);
    switch (kind) {
      case sum_kind::l1: acc[off[0]] += std::fabs(v); break;
      case sum_kind::l2:
      case sum_kind::sum_square: acc[off[0]] += v * v; break;
      case sum_kind::log_sum: acc[off[0]] += v; break;
      case sum_kind::log_sum_exp: acc[off[0]] += std::exp(v - shift[off[0]]); break;
    }
  });
  for (int64_t o = 0; o < count; ++o) {
    double r = acc[o];
    if (kind == sum_kind::l2)
      r = std::sqrt(r);
    else if (kind == sum_kind::log_sum)
      r = std::log(r);
    else if (kind == sum_kind::log_sum_exp)
      r = std::log(r) + shift[o];
    if constexpr (std::is_integral_v<T>)
      out[o] = saturated<T>(r);
    else
      out[o] = static_cast<T>(r);
  }
}

// ------------------------------------------------------------------ GlobalMaxPool

/// [N, C, d1..dk] -> [N, C, 1..1]: the maximum of each channel's plane.
infer_result infer_global_max_pool(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (x.shape.size() < 2)
    return "GlobalMaxPool needs an input of rank 2 or more ([N, C, d1, ...]); '" + x.name
           + "' is " + shape_string(x.shape);
  shape_t s = x.shape;
  for (size_t d = 2; d < s.size(); ++d) s[d] = 1;
  return one(x.dtype, s);
}

/// The maximum of each [N, C] plane; NaN wins, as in ReduceMax; an empty plane
/// (a zero spatial dimension) gives minus infinity.
void run_global_max_pool(const node&, const std::vector<tensor_ref>& inputs,
                         const std::vector<tensor_ref>& outputs) {
  const auto& x = inputs[0];
  const auto& y = outputs[0];
  int64_t planes = x.shape[0] * x.shape[1];
  int64_t plane = 1;
  for (size_t d = 2; d < x.shape.size(); ++d) plane *= x.shape[d];
  const float* in = x.as<float>();
  float* out = y.as<float>();
  for (int64_t p = 0; p < planes; ++p) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < plane; ++i) {
      float v = in[p * plane + i];
      if (std::isnan(v)) {
        m = v;
        break;
      }
      m = std::max(m, v);
    }
    out[p] = m;
  }
}

// ------------------------------------------------------------------ quantization

/// Per tensor (scale a scalar or [1]) or per axis (scale 1-D along `axis`);
/// the zero point, if given, has the scale's shape.
std::optional<std::string> check_scale(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (!has_input(n, 1))
    return n.op + " needs its scale input";
  const auto& s = g.values[n.inputs[1]];
  if (s.dtype != datatype::fp32)
    return "scale '" + s.name + "' is " + type_name(s.dtype) + "; the engine takes FLOAT";
  int64_t block = n.get_i("block_size", 0);
  if (block != 0)
    return unsupported_attr(n, "block_size", std::to_string(block),
                            "0: per-tensor and per-axis quantization");
  if (s.shape.size() > 1)
    return "scale " + shape_string(s.shape)
           + " must be a scalar or 1-D: the engine does not run blocked quantization";
  if (element_count(s.shape) != 1) {
    int64_t rank = static_cast<int64_t>(x.shape.size()), axis = n.get_i("axis", 1);
    if (axis < -rank || axis >= rank)
      return "axis " + std::to_string(axis) + " is out of range for " + shape_string(x.shape);
    axis = norm_axis(axis, rank);
    if (s.shape[0] != x.shape[axis])
      return "scale " + shape_string(s.shape) + " must have one value per element of axis "
             + std::to_string(axis) + " of " + shape_string(x.shape);
  }
  if (has_input(n, 2)) {
    const auto& z = g.values[n.inputs[2]];
    if (element_count(z.shape) != element_count(s.shape))
      return "zero point " + shape_string(z.shape) + " must have the scale's shape "
             + shape_string(s.shape);
  }
  return std::nullopt;
}

infer_result infer_quantize(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = check_scale(g, n))
    return *e;
  datatype out = datatype::uint8;
  int64_t od = n.get_i("output_dtype", 0);
  if (od != 0 && od != 2 && od != 3)
    return unsupported_attr(n, "output_dtype", std::to_string(od), "2 UINT8, 3 INT8");
  if (od == 3)
    out = datatype::int8;
  if (has_input(n, 2)) {
    const auto& z = g.values[n.inputs[2]];
    if (z.dtype != datatype::uint8 && z.dtype != datatype::int8)
      return "zero point '" + z.name + "' is " + type_name(z.dtype)
             + "; the engine quantizes to UINT8 and INT8";
    if (od != 0 && z.dtype != out)
      return "output_dtype " + std::to_string(od) + " differs from the zero point's type "
             + type_name(z.dtype);
    out = z.dtype;
  }
  int64_t precision = n.get_i("precision", 0);
  if (precision != 0 && precision != 1)
    return unsupported_attr(n, "precision", std::to_string(precision), "0 or 1, FLOAT");
  return one(out, x.shape);
}

infer_result infer_dequantize(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = check_scale(g, n))
    return *e;
  if (has_input(n, 2) && g.values[n.inputs[2]].dtype != x.dtype)
    return "zero point '" + g.values[n.inputs[2]].name + "' is "
           + type_name(g.values[n.inputs[2]].dtype) + " but x is " + type_name(x.dtype);
  int64_t od = n.get_i("output_dtype", 0);
  if (od != 0 && od != 1)
    return unsupported_attr(n, "output_dtype", std::to_string(od), "1, FLOAT");
  return one(datatype::fp32, x.shape);
}

/// The scale index of each element: 0 per tensor, the axis coordinate per axis.
struct scale_walk {
  int64_t inner = 1, extent = 1;
  bool per_axis = false;
  int64_t at(int64_t i) const { return per_axis ? (i / inner) % extent : 0; }
};

scale_walk walk_of(const node& n, const tensor_ref& x, const tensor_ref& scale) {
  scale_walk w;
  if (scale.elements() == 1 || x.shape.empty())
    return w;
  auto axis = static_cast<size_t>(norm_axis(n.get_i("axis", 1), x.shape.size()));
  w.per_axis = true;
  w.extent = x.shape[axis];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) w.inner *= x.shape[d];
  return w;
}

template <class Q>
void quantize(const tensor_ref& x, const tensor_ref& scale, const Q* zero, const scale_walk& w,
              Q* out) {
  const float* in = x.as<float>();
  constexpr float lo = std::numeric_limits<Q>::lowest(), hi = std::numeric_limits<Q>::max();
  for (int64_t i = 0; i < x.elements(); ++i) {
    int64_t k = w.at(i);
    float v = std::nearbyint(in[i] / scale.as<float>()[k]) + (zero ? float(zero[k]) : 0.0f);
    out[i] = static_cast<Q>(std::clamp(v, lo, hi)); // NaN gives lo's type's 0 at worst
  }
}

template <class Q>
void dequantize(const tensor_ref& x, const tensor_ref& scale, const Q* zero, const scale_walk& w,
                float* out) {
  const Q* in = x.as<Q>();
  for (int64_t i = 0; i < x.elements(); ++i) {
    int64_t k = w.at(i);
    out[i] = static_cast<float>(static_cast<int64_t>(in[i]) - (zero ? zero[k] : 0))
             * scale.as<float>()[k];
  }
}

void run_quantize(const node& n, const std::vector<tensor_ref>& in,
                  const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  auto w = walk_of(n, in[0], in[1]);
  bool zp = in.size() > 2 && in[2].data;
  if (y.dtype == datatype::int8)
    quantize<int8_t>(in[0], in[1], zp ? in[2].as<int8_t>() : nullptr, w, y.as<int8_t>());
  else
    quantize<uint8_t>(in[0], in[1], zp ? in[2].as<uint8_t>() : nullptr, w, y.as<uint8_t>());
}

void run_dequantize(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  auto w = walk_of(n, in[0], in[1]);
  bool zp = in.size() > 2 && in[2].data;
  if (in[0].dtype == datatype::int8)
    dequantize<int8_t>(in[0], in[1], zp ? in[2].as<int8_t>() : nullptr, w, y.as<float>());
  else if (in[0].dtype == datatype::uint8)
    dequantize<uint8_t>(in[0], in[1], zp ? in[2].as<uint8_t>() : nullptr, w, y.as<float>());
  else
    dequantize<int32_t>(in[0], in[1], zp ? in[2].as<int32_t>() : nullptr, w, y.as<float>());
}

// ------------------------------------------------------------------ Attention

/// Attention's sizes, the same for 3-D ([B, S, H*D]) and 4-D ([B, H, S, D]) inputs.
struct attention_dims {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head = 0, v_head = 0;
  bool four_d = false;
};

std::variant<attention_dims, std::string> attention_dims_of(const node& n, const shape_t& q,
                                                             const shape_t& k, const shape_t& v) {
  attention_dims a;
  if (q.size() != k.size() || q.size() != v.size() || (q.size() != 3 && q.size() != 4))
    return "Q " + shape_string(q) + ", K " + shape_string(k) + " and V " + shape_string(v)
           + " must all be 3-D [batch, sequence, heads * head_size] or all 4-D [batch, heads, "
             "sequence, head_size]";
  a.four_d = q.size() == 4;
  a.batch = q[0];
  if (a.four_d) {
    a.q_heads = q[1];
    a.kv_heads = k[1];
    a.q_len = q[2];
    a.kv_len = k[2];
    a.head = q[3];
    a.v_head = v[3];
    if (k[3] != a.head || v[1] != a.kv_heads || v[2] != a.kv_len)
      return "K " + shape_string(k) + " and V " + shape_string(v) + " do not fit Q "
             + shape_string(q) + ": K needs Q's head size, V K's heads and sequence";
  } else {
    a.q_heads = n.get_i("q_num_heads", 0);
    a.kv_heads = n.get_i("kv_num_heads", 0);
    if (a.q_heads < 1 || a.kv_heads < 1)
      return std::string("3-D Attention needs the q_num_heads and kv_num_heads attributes");
    a.q_len = q[1];
    a.kv_len = k[1];
    if (q[2] % a.q_heads != 0 || k[2] % a.kv_heads != 0 || v[2] % a.kv_heads != 0)
      return "the last dimensions of Q " + shape_string(q) + ", K " + shape_string(k) + " and V "
             + shape_string(v) + " must divide by q_num_heads " + std::to_string(a.q_heads)
             + " and kv_num_heads " + std::to_string(a.kv_heads);
    a.head = q[2] / a.q_heads;
    a.v_head = v[2] / a.kv_heads;
    if (k[2] / a.kv_heads != a.head || v[1] != a.kv_len)
      return "K " + shape_string(k) + " and V " + shape_string(v) + " do not fit Q "
             + shape_string(q) + ": K needs Q's head size, V K's sequence";
  }
  if (k[0] != a.batch || v[0] != a.batch)
    return "Q, K and V differ in batch size";
  if (a.kv_heads < 1 || a.q_heads % a.kv_heads != 0)
    return "q_num_heads " + std::to_string(a.q_heads) + " must be a multiple of kv_num_heads "
           + std::to_string(a.kv_heads);
  return a;
}

infer_result infer_attention(const graph& g, const node& n) {
  for (size_t i : {1, 2})
    if (!has_input(n, i))
      return std::string("Attention takes Q, K and V");
  const auto& q = g.values[n.inputs[0]];
  const auto& k = g.values[n.inputs[1]];
  const auto& v = g.values[n.inputs[2]];
  if (k.dtype != datatype::fp32 || v.dtype != datatype::fp32)
    return std::string("the engine runs Attention on FLOAT Q, K and V");
  if (has_input(n, 4) || has_input(n, 5))
    return "Attention with past_key/past_value (a KV cache) is not supported by the engine; "
           "export the model without the cache (use_cache=False)";
  if (has_input(n, 6))
    return std::string("Attention's nonpad_kv_seqlen input (an external KV cache) is not "
                       "supported by the engine");
  if (n.get_f("softcap", 0.0f) != 0.0f)
    return unsupported_attr(n, "softcap", std::to_string(n.get_f("softcap", 0.0f)), "0");
  for (const char* w : {"left_window_size", "right_window_size"})
    if (n.get_i(w, -1) != -1)
      return unsupported_attr(n, w, std::to_string(n.get_i(w, -1)), "-1, no window");
  if (n.outputs.size() > 3 && n.outputs[3] >= 0)
    return "Attention's qk_matmul_output (output 3) is not supported by the engine; export "
           "the model without it";
  auto dims = attention_dims_of(n, q.shape, k.shape, v.shape);
  if (auto* e = std::get_if<std::string>(&dims))
    return *e;
  const auto& a = std::get<attention_dims>(dims);
  if (has_input(n, 3)) {
    const auto& m = g.values[n.inputs[3]];
    if (m.dtype != datatype::bool_ && m.dtype != datatype::fp32)
      return "attn_mask '" + m.name + "' is " + type_name(m.dtype) + "; it must be BOOL or FLOAT";
    shape_t full{a.batch, a.q_heads, a.q_len, a.kv_len};
    auto b = broadcast_shapes(full, m.shape);
    if (!b || *b != full)
      return "attn_mask " + shape_string(m.shape) + " does not broadcast to [batch, q_num_heads, "
             "q_sequence, kv_sequence] " + shape_string(full);
  }
  std::vector<inferred> out;
  if (a.four_d)
    out.push_back({datatype::fp32, {a.batch, a.q_heads, a.q_len, a.v_head}});
  else
    out.push_back({datatype::fp32, {a.batch, a.q_len, a.q_heads * a.v_head}});
  // Without a cache, present_key and present_value are K and V as 4-D.
  out.push_back({datatype::fp32, {a.batch, a.kv_heads, a.kv_len, a.head}});
  out.push_back({datatype::fp32, {a.batch, a.kv_heads, a.kv_len, a.v_head}});
  out.resize(std::min<size_t>(out.size(), std::max<size_t>(1, n.outputs.size())));
  return out;
}

/// softmax(Q K^T * scale + bias) V per batch and query head, where the bias is
/// the float mask, or minus infinity where a BOOL mask is false or a key lies
/// after the query (is_causal, the upper-left aligned lower triangle). A query
/// that sees no key gives zeros, as ONNX says.
void run_attention(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  auto a = std::get<attention_dims>(attention_dims_of(n, in[0].shape, in[1].shape, in[2].shape));
  float scale = n.get_f("scale", 1.0f / std::sqrt(static_cast<float>(a.head)));
  bool causal = n.get_i("is_causal", 0) != 0;
  const tensor_ref* mask = in.size() > 3 && in[3].data ? &in[3] : nullptr;
  shape_t full{a.batch, a.q_heads, a.q_len, a.kv_len};
  shape_t mask_st = mask ? broadcast_strides(mask->shape, full) : shape_t(4, 0);
  // Element offsets of (batch, head, position) in each layout.
  auto offset = [&](int64_t b, int64_t h, int64_t s, int64_t heads, int64_t len, int64_t size) {
    return a.four_d ? ((b * heads + h) * len + s) * size : ((b * len + s) * heads + h) * size;
  };
  const float* q = in[0].as<float>();
  const float* k = in[1].as<float>();
  const float* v = in[2].as<float>();
  float* y = out[0].as<float>();
  int64_t group = a.q_heads / a.kv_heads;
  std::vector<float> p(a.kv_len);
  std::vector<double> acc(a.v_head);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.q_heads; ++h) {
      int64_t kh = h / group;
      for (int64_t i = 0; i < a.q_len; ++i) {
        const float* qi = q + offset(b, h, i, a.q_heads, a.q_len, a.head);
        float best = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < a.kv_len; ++j) {
          float bias = 0;
          if (causal && j > i)
            bias = -std::numeric_limits<float>::infinity();
          if (mask) {
            int64_t mo = b * mask_st[0] + h * mask_st[1] + i * mask_st[2] + j * mask_st[3];
            if (mask->dtype == datatype::bool_)
              bias = mask->as<bool>()[mo] ? bias : -std::numeric_limits<float>::infinity();
            else
              bias += mask->as<float>()[mo];
          }
          const float* kj = k + offset(b, kh, j, a.kv_heads, a.kv_len, a.head);
          float dot = 0;
          for (int64_t d = 0; d < a.head; ++d) dot += qi[d] * kj[d];
          p[j] = dot * scale + bias;
          best = std::max(best, p[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        float* yi = y + offset(b, h, i, a.q_heads, a.q_len, a.v_head);
        if (best == -std::numeric_limits<float>::infinity()) {
          std::fill(yi, yi + a.v_head, 0.0f);
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < a.kv_len; ++j) {
          p[j] = std::exp(p[j] - best);
          sum += p[j];
        }
        for (int64_t j = 0; j < a.kv_len; ++j) {
          const float* vj = v + offset(b, kh, j, a.kv_heads, a.kv_len, a.v_head);
          for (int64_t d = 0; d < a.v_head; ++d) acc[d] += double(p[j]) * vj[d];
        }
        for (int64_t d = 0; d < a.v_head; ++d) yi[d] = static_cast<float>(acc[d] / sum);
      }
    }
  // present_key, present_value: K and V in [B, kv_heads, L, D].
  for (size_t o = 1; o < 3 && o < out.size(); ++o) {
    if (!out[o].data)
      continue;
    const float* src = in[o].as<float>();
    int64_t size = o == 1 ? a.head : a.v_head;
    for (int64_t b = 0; b < a.batch; ++b)
      for (int64_t h = 0; h < a.kv_heads; ++h)
        for (int64_t j = 0; j < a.kv_len; ++j)
          std::memcpy(out[o].as<float>() + ((b * a.kv_heads + h) * a.kv_len + j) * size,
                      src + offset(b, h, j, a.kv_heads, a.kv_len, size), size * sizeof(float));
  }
}

template <sum_kind K>
void run_sum(const node& n, const std::vector<tensor_ref>& in,
             const std::vector<tensor_ref>& out) {
  dispatch(in[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) // refused by type at inference
      sum_reduce<K, T>(n, in, out[0]);
  });
}

const std::vector<datatype> float_only{datatype::fp32};
const std::vector<datatype> numbers{datatype::fp32, datatype::int64, datatype::int32,
                                    datatype::int8, datatype::uint8};
const std::vector<datatype> numbers_and_bool{datatype::fp32, datatype::int64, datatype::int32,
                                             datatype::int8, datatype::uint8, datatype::bool_};
const std::vector<datatype> quantized{datatype::int8, datatype::uint8, datatype::int32};
/// ONNX's "high-precision numeric" types of ReduceL1/L2/SumSquare/LogSum/LogSumExp:
/// no 8- or 16-bit integers (float16, bfloat16 and double arrive as FP32).
const std::vector<datatype> wide_numbers{datatype::fp32, datatype::int64, datatype::int32,
                                         datatype::uint64, datatype::uint32};

const std::map<std::string, more_op>& table() {
  constexpr bool elementwise = true;
  static const std::map<std::string, more_op> ops{
    // 24: nonpad_kv_seqlen; 25: left_window_size, right_window_size (both refused)
    {"Attention", {{23, 24, 25}, float_only, &checked<infer_attention>, &run_attention}},
    {"Ceil", {{1, 6, 13}, float_only, &checked<infer_unary>, &run_float<ceil_of>, nullptr,
              elementwise}},
    {"Cos", {{7, 22}, float_only, &checked<infer_unary>, &run_float<cosine>, nullptr,
             elementwise}},
    // 19: saturate (float8); 21: block_size, output_dtype; 23+: types only
    {"DequantizeLinear", {{10, 13, 19, 21, 23, 24, 25, 28}, quantized,
                          &checked<infer_dequantize>, &run_dequantize}},
    {"Elu", {{1, 6, 22}, float_only, &checked<infer_unary>, &run_elu, nullptr, elementwise}},
    {"Floor", {{1, 6, 13}, float_only, &checked<infer_unary>, &run_float<floor_of>, nullptr,
               elementwise}},
    {"Gelu", {{20}, float_only, &checked<infer_gelu>, &run_gelu, nullptr, elementwise}},
    // 22: bfloat16
    {"GlobalMaxPool", {{1, 22}, float_only, &checked<infer_global_max_pool>,
                       &run_global_max_pool}},
    {"LeakyRelu", {{1, 6, 16}, float_only, &checked<infer_unary>, &run_leaky_relu, nullptr,
                   elementwise}},
    {"LRN", {{1, 13}, float_only, &checked<infer_lrn>, &run_lrn}},
    {"Mish", {{18, 22}, float_only, &checked<infer_unary>, &run_float<mish>, nullptr,
              elementwise}},
    // 7: broadcasting
    {"PRelu", {{1, 6, 7, 9, 16}, {datatype::fp32, datatype::int64, datatype::int32},
               &checked<infer_prelu>, &run_prelu, nullptr, elementwise}},
    {"QuantizeLinear", {{10, 13, 19, 21, 23, 24, 25, 28}, float_only,
                        &checked<infer_quantize>, &run_quantize}},
    // 18: axes as an input, noop_with_empty_axes; 20: BOOL
    {"ReduceMax", {{1, 11, 12, 13, 18, 20}, numbers_and_bool, &checked<infer_extreme_reduce>,
                   &run_fold<fold::max>}},
    {"ReduceMin", {{1, 11, 12, 13, 18, 20}, numbers_and_bool, &checked<infer_extreme_reduce>,
                   &run_fold<fold::min>}},
    {"ReduceProd", {{1, 11, 13, 18}, numbers, &checked<infer_reduce>, &run_fold<fold::prod>}},
    // 18: axes as an input, noop_with_empty_axes (which still applies the
    // element-wise part: |x|, x squared, log x); 28: floats only (ReduceLogSum
    // and ReduceLogSumExp of integers are refused from opset 28 on).
    {"ReduceL1", {{1, 11, 13, 18}, wide_numbers, &checked<infer_reduce>,
                  &run_sum<sum_kind::l1>, &check_axes_input_18}},
    {"ReduceL2", {{1, 11, 13, 18}, wide_numbers, &checked<infer_reduce>,
                  &run_sum<sum_kind::l2>, &check_axes_input_18}},
    {"ReduceLogSum", {{1, 11, 13, 18, 28}, wide_numbers, &checked<infer_log_reduce>,
                      &run_sum<sum_kind::log_sum>, &check_axes_input_18}},
    {"ReduceLogSumExp", {{1, 11, 13, 18, 28}, wide_numbers, &checked<infer_log_reduce>,
                         &run_sum<sum_kind::log_sum_exp>, &check_axes_input_18}},
    {"ReduceSumSquare", {{1, 11, 13, 18}, wide_numbers, &checked<infer_reduce>,
                         &run_sum<sum_kind::sum_square>, &check_axes_input_18}},
    {"RMSNormalization", {{23}, float_only, &checked<infer_rms_norm>, &run_rms_norm}},
    {"Round", {{11, 22}, float_only, &checked<infer_unary>, &run_float<round_half_even>,
               nullptr, elementwise}},
    {"Selu", {{1, 6, 22}, float_only, &checked<infer_unary>, &run_selu, nullptr, elementwise}},
    {"Sign", {{9, 13}, numbers, &checked<infer_unary>, &run_sign, nullptr, elementwise}},
    {"Sin", {{7, 22}, float_only, &checked<infer_unary>, &run_float<sine>, nullptr,
             elementwise}},
    {"Softplus", {{1, 22}, float_only, &checked<infer_unary>, &run_float<softplus>, nullptr,
                  elementwise}},
    {"Softsign", {{1, 22}, float_only, &checked<infer_unary>, &run_float<softsign>, nullptr,
                  elementwise}},
    {"ThresholdedRelu", {{10, 22}, float_only, &checked<infer_unary>, &run_thresholded_relu,
                         nullptr, elementwise}},
  };
  return ops;
}

} // namespace

const op_table& more_operator_table() {
  static const op_table ops = [] {
    op_table t;
    for (const auto& [name, e] : table())
      t.push_back({name, e.versions, e.infer, e.run, e.check, e.elementwise});
    return t;
  }();
  return ops;
}

} // namespace caf_serving::onnx
