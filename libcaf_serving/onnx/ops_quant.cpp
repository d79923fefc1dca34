#include "onnx/ops_quant.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;
bool has_input(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

std::string type_name(datatype t) {
  return std::string(to_string(t));
}

bool is_int8(datatype t) {
  return t == datatype::int8 || t == datatype::uint8;
}

/// Element `i` of an integer tensor (INT8, UINT8 or INT32) as int32.
int32_t int_at(const tensor_ref& t, int64_t i) {
  switch (t.dtype) {
    case datatype::int8: return t.as<int8_t>()[i];
    case datatype::uint8: return t.as<uint8_t>()[i];
    default: return t.as<int32_t>()[i];
  }
}

/// A zero point: absent (0), one value, or one per channel.
int32_t zero_at(const std::vector<tensor_ref>& in, size_t i, int64_t k) {
  if (in.size() <= i || !in[i].data)
    return 0;
  return int_at(in[i], in[i].elements() == 1 ? 0 : k);
}

float scale_at(const tensor_ref& t, int64_t k) {
  return t.as<float>()[t.elements() == 1 ? 0 : k];
}

/// Checks that input `i` of `n`, when given, is a 8-bit integer tensor of the
/// type `of` (the quantized tensor it belongs to) with 1 or `channels` values.
std::optional<std::string> check_zero(const graph& g, const node& n, size_t i, datatype of,
                                      int64_t channels, const char* what) {
  if (!has_input(n, i))
    return std::nullopt;
  const auto& z = g.values[n.inputs[i]];
  if (z.dtype != of)
    return "zero point '" + z.name + "' is " + type_name(z.dtype) + " but " + what + " is "
           + type_name(of) + "; they must have one type";
  int64_t c = element_count(z.shape);
  if (c != 1 && c != channels)
    return "zero point '" + z.name + "' " + shape_string(z.shape) + " must have one value, or "
           + std::to_string(channels) + " (one per channel) for " + what
           + "; the engine quantizes per tensor and per output channel";
  if (z.shape.size() > 1 && c != 1)
    return "zero point '" + z.name + "' " + shape_string(z.shape) + " must be a scalar or 1-D";
  return std::nullopt;
}

std::optional<std::string> check_scale(const graph& g, const node& n, size_t i,
                                       int64_t channels, const char* what) {
  const auto& s = g.values[n.inputs[i]];
  if (s.dtype != datatype::fp32)
    return "scale '" + s.name + "' is " + type_name(s.dtype) + "; scales must be FLOAT";
  int64_t c = element_count(s.shape);
  if (c != 1 && c != channels)
    return "scale '" + s.name + "' " + shape_string(s.shape) + " must have one value, or "
           + std::to_string(channels) + " (one per channel) for " + what;
  if (s.shape.size() > 1 && c != 1)
    return "scale '" + s.name + "' " + shape_string(s.shape) + " must be a scalar or 1-D";
  return std::nullopt;
}

std::optional<std::string> check_int8(const value& v, const char* what) {
  if (is_int8(v.dtype))
    return std::nullopt;
  return std::string(what) + " '" + v.name + "' is " + type_name(v.dtype)
         + "; it must be UINT8 or INT8";
}

// ------------------------------------------------------------------ matmul

/// Sizes of an ONNX MatMul of A [..., M, K] by B [..., K, N] (numpy rules:
/// 1-D operands gain a dimension that the output drops).
struct matmul_dims {
  int64_t m = 0, k = 0, n = 0;
  shape_t a_batch, b_batch, batch, out;
};

std::variant<matmul_dims, std::string> matmul_dims_of(const shape_t& a0, const shape_t& b0) {
  if (a0.empty() || b0.empty())
    return "MatMul needs operands of rank 1 or more, got " + shape_string(a0) + " and "
           + shape_string(b0);
  shape_t a = a0.size() == 1 ? shape_t{1, a0[0]} : a0;
  shape_t b = b0.size() == 1 ? shape_t{b0[0], 1} : b0;
  matmul_dims d;
  d.m = a[a.size() - 2];
  d.k = a.back();
  d.n = b.back();
  if (b[b.size() - 2] != d.k)
    return "inner dimensions differ: " + shape_string(a0) + " x " + shape_string(b0);
  d.a_batch.assign(a.begin(), a.end() - 2);
  d.b_batch.assign(b.begin(), b.end() - 2);
  auto batch = broadcast_shapes(d.a_batch, d.b_batch);
  if (!batch)
    return "batch dimensions of " + shape_string(a0) + " and " + shape_string(b0)
           + " do not broadcast";
  d.batch = *batch;
  d.out = d.batch;
  if (a0.size() > 1)
    d.out.push_back(d.m);
  if (b0.size() > 1)
    d.out.push_back(d.n);
  return d;
}

/// acc[i] = sum_k (A - a_zero) * (B - b_zero[column]) over every output element.
std::vector<int32_t> matmul_acc(const matmul_dims& d, const std::vector<tensor_ref>& in,
                                size_t a, size_t a_zero, size_t b, size_t b_zero) {
  std::vector<int32_t> acc(static_cast<size_t>(element_count(d.out)));
  int32_t az = zero_at(in, a_zero, 0);
  std::vector<int32_t> bz(d.n);
  for (int64_t j = 0; j < d.n; ++j)
    bz[j] = zero_at(in, b_zero, j);
  int64_t a_mat = d.m * d.k, b_mat = d.k * d.n, o_mat = d.m * d.n;
  std::array<shape_t, 2> st{broadcast_strides(d.a_batch, d.batch),
                            broadcast_strides(d.b_batch, d.batch)};
  broadcast_loop<2>(d.batch, st, [&](int64_t bi, const std::array<int64_t, 2>& off) {
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        int32_t s = 0;
        for (int64_t k = 0; k < d.k; ++k)
          s += (int_at(in[a], off[0] * a_mat + i * d.k + k) - az)
               * (int_at(in[b], off[1] * b_mat + k * d.n + j) - bz[j]);
        acc[bi * o_mat + i * d.n + j] = s;
      }
  });
  return acc;
}

// ------------------------------------------------------------------ conv

using qconv_geometry = quant_conv_geometry;

std::variant<qconv_geometry, std::string> qconv_geom(const node& nd, const shape_t& x,
                                                     const shape_t& ws) {
  if (x.size() != 4 || ws.size() != 4)
    return "the engine runs 2-D " + nd.op + " (4-D NCHW input and weights), got input "
           + shape_string(x) + " and weights " + shape_string(ws);
  qconv_geometry g{};
  g.n = x[0]; g.c = x[1]; g.h = x[2]; g.w = x[3];
  g.k = ws[0]; g.kh = ws[2]; g.kw = ws[3];
  auto st = nd.get_ints("strides", {1, 1});
  auto dl = nd.get_ints("dilations", {1, 1});
  auto pd = nd.get_ints("pads", {0, 0, 0, 0});
  auto mode = nd.get_s("auto_pad", "NOTSET");
  if (st.size() != 2 || dl.size() != 2 || pd.size() != 4)
    return std::string("strides, pads and dilations of a 2-D convolution need 2, 4 and 2 values");
  if (st[0] < 1 || st[1] < 1 || dl[0] < 1 || dl[1] < 1)
    return "strides " + shape_string(st) + " and dilations " + shape_string(dl)
           + " must be positive";
  if (mode == "VALID") {
    pd = {0, 0, 0, 0};
  } else if (mode == "SAME_UPPER" || mode == "SAME_LOWER") {
    int64_t in_sz[2] = {g.h, g.w}, ks[2] = {g.kh, g.kw};
    for (int i = 0; i < 2; ++i) {
      int64_t out = (in_sz[i] + st[i] - 1) / st[i];
      int64_t total = std::max<int64_t>(0, (out - 1) * st[i] + (ks[i] - 1) * dl[i] + 1 - in_sz[i]);
      int64_t small = total / 2, large = total - small;
      pd[i] = mode == "SAME_UPPER" ? small : large;
      pd[2 + i] = mode == "SAME_UPPER" ? large : small;
    }
  } else if (mode != "NOTSET") {
    return "auto_pad " + mode + " is not one of NOTSET, SAME_UPPER, SAME_LOWER and VALID";
  }
  for (auto p : pd)
    if (p < 0)
      return "pads " + shape_string(pd) + " must not be negative";
  g.sh = st[0]; g.sw = st[1]; g.dh = dl[0]; g.dw = dl[1]; g.ph = pd[0]; g.pw = pd[1];
  g.ph1 = pd[2]; g.pw1 = pd[3];
  g.group = nd.get_i("group", 1);
  if (g.group < 1 || g.c % g.group != 0 || g.k % g.group != 0 || ws[1] * g.group != g.c)
    return "weights " + shape_string(ws) + " with group " + std::to_string(g.group)
           + " do not fit input channels " + std::to_string(g.c);
  int64_t span_h = g.h + pd[0] + pd[2] - (g.dh * (g.kh - 1) + 1);
  int64_t span_w = g.w + pd[1] + pd[3] - (g.dw * (g.kw - 1) + 1);
  if (span_h < 0 || span_w < 0)
    return "the (dilated) kernel " + shape_string({g.kh, g.kw})
           + " is larger than the padded input " + shape_string(x);
  g.oh = span_h / g.sh + 1;
  g.ow = span_w / g.sw + 1;
  return g;
}

/// acc[n, k, oy, ox] = sum (X - x_zero) * (W - w_zero[k]) (+ bias[k]); the
/// padding holds x_zero, so it adds nothing.
std::vector<int32_t> conv_acc(const qconv_geometry& g, const std::vector<tensor_ref>& in,
                              size_t x_zero, size_t wi, size_t w_zero, const tensor_ref* bias) {
  const auto& x = in[0];
  const auto& w = in[wi];
  std::vector<int32_t> acc(static_cast<size_t>(g.n * g.k * g.oh * g.ow));
  int32_t xz = zero_at(in, x_zero, 0);
  int64_t cpg = g.c / g.group, kpg = g.k / g.group;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k) {
      int64_t grp = k / kpg;
      int32_t wz = zero_at(in, w_zero, k);
      int32_t b0 = bias ? bias->as<int32_t>()[k] : 0;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          int32_t s = b0;
          for (int64_t c = 0; c < cpg; ++c)
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              int64_t iy = oy * g.sh - g.ph + ky * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                int64_t ix = ox * g.sw - g.pw + kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                s += (int_at(x, ((n * g.c + grp * cpg + c) * g.h + iy) * g.w + ix) - xz)
                     * (int_at(w, ((k * cpg + c) * g.kh + ky) * g.kw + kx) - wz);
              }
            }
          acc[((n * g.k + k) * g.oh + oy) * g.ow + ox] = s;
        }
    }
  return acc;
}

/// y = saturate(round_half_even(acc * multiplier[channel]) + y_zero), the
/// multiplier x_scale * w_scale[channel] / y_scale in float as onnxruntime's
/// requantisation computes it.
template <class Q>
void requantize(const std::vector<int32_t>& acc, const std::vector<float>& multiplier,
                int64_t inner, int32_t zero, Q* y) {
  constexpr float lo = std::numeric_limits<Q>::lowest(), hi = std::numeric_limits<Q>::max();
  int64_t extent = static_cast<int64_t>(multiplier.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    float m = multiplier[extent == 1 ? 0 : (static_cast<int64_t>(i) / inner) % extent];
    float v = std::clamp(static_cast<float>(acc[i]) * m, lo - zero, hi - zero);
    y[i] = static_cast<Q>(std::nearbyint(v) + zero);
  }
}

std::vector<float> multipliers(const tensor_ref& x_scale, const tensor_ref& w_scale,
                               const tensor_ref& y_scale) {
  std::vector<float> m(static_cast<size_t>(w_scale.elements()));
  for (size_t i = 0; i < m.size(); ++i)
    m[i] = x_scale.as<float>()[0] * w_scale.as<float>()[i] / y_scale.as<float>()[0];
  return m;
}

void write_requantized(const std::vector<int32_t>& acc, const std::vector<float>& m,
                       int64_t inner, const tensor_ref& y_zero, const tensor_ref& y) {
  int32_t z = int_at(y_zero, 0);
  if (y.dtype == datatype::int8)
    requantize<int8_t>(acc, m, inner, z, y.as<int8_t>());
  else
    requantize<uint8_t>(acc, m, inner, z, y.as<uint8_t>());
}

// ------------------------------------------------------------------ inference

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

/// MatMulInteger, or QLinearMatMul (`QLinear`).
template <bool QLinear>
infer_result infer_matmul_integer(const graph& g, const node& n) {
  constexpr bool qlinear = QLinear;
  size_t b = qlinear ? 3 : 1;
  if (!has_input(n, b))
    return "input B is missing";
  const auto& av = g.values[n.inputs[0]];
  const auto& bv = g.values[n.inputs[b]];
  if (auto e = check_int8(av, "A")) return *e;
  if (auto e = check_int8(bv, "B")) return *e;
  auto dims = matmul_dims_of(av.shape, bv.shape);
  if (auto* e = std::get_if<std::string>(&dims)) return *e;
  auto d = std::get<matmul_dims>(dims);
  if (!qlinear) {
    if (auto e = check_zero(g, n, 2, av.dtype, 1, "A (per tensor)")) return *e;
    if (auto e = check_zero(g, n, 3, bv.dtype, d.n, "B's columns")) return *e;
    return one(datatype::int32, d.out);
  }
  for (size_t i : {1, 2, 4, 5, 6, 7})
    if (!has_input(n, i))
      return "input " + std::to_string(i) + " (a scale or zero point) is missing; QLinearMatMul "
             "needs all eight";
  if (auto e = check_scale(g, n, 1, 1, "A (per tensor)")) return *e;
  if (auto e = check_zero(g, n, 2, av.dtype, 1, "A (per tensor)")) return *e;
  if (auto e = check_scale(g, n, 4, d.n, "B's columns")) return *e;
  if (auto e = check_zero(g, n, 5, bv.dtype, d.n, "B's columns")) return *e;
  if (auto e = check_scale(g, n, 6, 1, "Y (per tensor)")) return *e;
  const auto& yz = g.values[n.inputs[7]];
  if (auto e = check_int8(yz, "y_zero_point")) return *e;
  if (auto e = check_zero(g, n, 7, yz.dtype, 1, "Y (per tensor)")) return *e;
  if (has_input(n, 8)) { // an engine extension: quant_passes.cpp's bias
    const auto& bv = g.values[n.inputs[8]];
    if (bv.dtype != datatype::int32 || element_count(bv.shape) != d.n || bv.shape.size() != 1)
      return "bias '" + bv.name + "' must be INT32 with one value per column (" +
             std::to_string(d.n) + ")";
  }
  return one(yz.dtype, d.out);
}

/// ConvInteger, or QLinearConv (`QLinear`).
template <bool QLinear>
infer_result infer_conv_integer(const graph& g, const node& n) {
  constexpr bool qlinear = QLinear;
  size_t w = qlinear ? 3 : 1;
  if (!has_input(n, w))
    return "input W is missing";
  const auto& xv = g.values[n.inputs[0]];
  const auto& wv = g.values[n.inputs[w]];
  if (auto e = check_int8(xv, "x")) return *e;
  if (auto e = check_int8(wv, "w")) return *e;
  auto geo = qconv_geom(n, xv.shape, wv.shape);
  if (auto* e = std::get_if<std::string>(&geo)) return *e;
  auto c = std::get<qconv_geometry>(geo);
  shape_t out{c.n, c.k, c.oh, c.ow};
  if (!qlinear) {
    if (auto e = check_zero(g, n, 2, xv.dtype, 1, "x (per tensor)")) return *e;
    if (auto e = check_zero(g, n, 3, wv.dtype, c.k, "w's output channels")) return *e;
    return one(datatype::int32, out);
  }
  for (size_t i : {1, 2, 4, 5, 6, 7})
    if (!has_input(n, i))
      return "input " + std::to_string(i) + " (a scale or zero point) is missing; QLinearConv "
             "needs all eight";
  if (auto e = check_scale(g, n, 1, 1, "x (per tensor)")) return *e;
  if (auto e = check_zero(g, n, 2, xv.dtype, 1, "x (per tensor)")) return *e;
  if (auto e = check_scale(g, n, 4, c.k, "w's output channels")) return *e;
  if (auto e = check_zero(g, n, 5, wv.dtype, c.k, "w's output channels")) return *e;
  if (auto e = check_scale(g, n, 6, 1, "y (per tensor)")) return *e;
  const auto& yz = g.values[n.inputs[7]];
  if (auto e = check_int8(yz, "y_zero_point")) return *e;
  if (auto e = check_zero(g, n, 7, yz.dtype, 1, "y (per tensor)")) return *e;
  if (has_input(n, 8)) {
    const auto& bv = g.values[n.inputs[8]];
    if (bv.dtype != datatype::int32 || element_count(bv.shape) != c.k || bv.shape.size() != 1)
      return "bias '" + bv.name + "' is " + type_name(bv.dtype) + " " + shape_string(bv.shape)
             + "; it must be INT32 with one value per output channel (" + std::to_string(c.k)
             + ")";
  }
  return one(yz.dtype, out);
}

infer_result infer_dynamic_quantize(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (x.dtype != datatype::fp32)
    return "input '" + x.name + "' is " + type_name(x.dtype) + "; DynamicQuantizeLinear "
           "quantizes FLOAT";
  return std::vector<inferred>{{datatype::uint8, x.shape}, {datatype::fp32, {}},
                               {datatype::uint8, {}}};
}

// ------------------------------------------------------------------ kernels

/// DynamicQuantizeLinear as onnxruntime computes it: the range [min(0, min x),
/// max(0, max x)] over 255 steps (scale 1 for an all-zero input, where the
/// spec would divide by 0), the zero point -min / scale rounded half to even
/// and saturated, y = saturate(round(x / scale) + zero point).
void run_dynamic_quantize(const node&, const std::vector<tensor_ref>& inputs,
                          const std::vector<tensor_ref>& out) {
  const auto& x = inputs[0];
  const float* in = x.as<float>();
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < x.elements(); ++i) {
    lo = std::min(lo, in[i]);
    hi = std::max(hi, in[i]);
  }
  float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  float zero = std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f));
  auto* y = out[0].as<uint8_t>();
  for (int64_t i = 0; i < x.elements(); ++i)
    y[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(in[i] / scale) + zero, 0.0f, 255.0f));
  if (out.size() > 1 && out[1].data)
    *out[1].as<float>() = scale;
  if (out.size() > 2 && out[2].data)
    *out[2].as<uint8_t>() = static_cast<uint8_t>(zero);
}

/// QLinearConv's and QLinearAdd's `activation` "Relu" (quant_passes.cpp
/// folds a Relu between the operator and its QuantizeLinear into it): the
/// quantized max(0, v) is the output clamped below at its zero point.
void clamp_at_zero_point(const node& n, const tensor_ref& y_zero, const tensor_ref& y) {
  if (n.get_s("activation", "") != "Relu")
    return;
  int32_t z = int_at(y_zero, 0);
  dispatch(y.dtype, [&](auto tag) {
    using Q = decltype(tag);
    if constexpr (std::is_same_v<Q, int8_t> || std::is_same_v<Q, uint8_t>) {
      Q* p = y.as<Q>();
      for (int64_t i = 0; i < y.elements(); ++i)
        p[i] = std::max(p[i], static_cast<Q>(z));
    }
  });
}

infer_result infer_qlinear_add(const graph& g, const node& n) {
  for (size_t i = 0; i < 8; ++i)
    if (!has_input(n, i))
      return "input " + std::to_string(i) + " is missing; QLinearAdd needs A, its scale and "
             "zero point, B, its scale and zero point, and C's scale and zero point";
  const auto& av = g.values[n.inputs[0]];
  const auto& bv = g.values[n.inputs[3]];
  const auto& cz = g.values[n.inputs[7]];
  if (auto e = check_int8(av, "A")) return *e;
  if (auto e = check_int8(bv, "B")) return *e;
  if (auto e = check_int8(cz, "C's zero point")) return *e;
  if (auto e = check_scale(g, n, 1, 1, "A (per tensor)")) return *e;
  if (auto e = check_zero(g, n, 2, av.dtype, 1, "A (per tensor)")) return *e;
  if (auto e = check_scale(g, n, 4, 1, "B (per tensor)")) return *e;
  if (auto e = check_zero(g, n, 5, bv.dtype, 1, "B (per tensor)")) return *e;
  if (auto e = check_scale(g, n, 6, 1, "C (per tensor)")) return *e;
  auto s = broadcast_shapes(av.shape, bv.shape);
  if (!s)
    return "input shapes " + shape_string(av.shape) + " and " + shape_string(bv.shape)
           + " do not broadcast";
  return one(cz.dtype, *s);
}

/// QMaxPool's output size and its geometry (kernel, strides, pads, dilations).
struct max_pool_geometry {
  int64_t kh, kw, sh, sw, pt, pl, dh, dw, oh, ow;
};

std::variant<max_pool_geometry, std::string> max_pool_geom(const node& n, const shape_t& x) {
  auto k = n.get_ints("kernel_shape");
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  if (x.size() != 4 || k.size() != 2 || st.size() != 2 || pd.size() != 4 || dl.size() != 2)
    return "the engine runs a 2-D QMaxPool (4-D input, 2 kernel dimensions), got input "
           + shape_string(x);
  max_pool_geometry g{k[0], k[1], st[0], st[1], pd[0], pd[1], dl[0], dl[1], 0, 0};
  int64_t span_h = x[2] + pd[0] + pd[2] - ((k[0] - 1) * dl[0] + 1);
  int64_t span_w = x[3] + pd[1] + pd[3] - ((k[1] - 1) * dl[1] + 1);
  if (span_h < 0 || span_w < 0 || st[0] < 1 || st[1] < 1)
    return "the pooling window does not fit input " + shape_string(x);
  g.oh = span_h / st[0] + 1;
  g.ow = span_w / st[1] + 1;
  return g;
}

infer_result infer_max_pool(const graph& g, const node& n) {
  const auto& xv = g.values[n.inputs[0]];
  if (auto e = check_int8(xv, "X")) return *e;
  auto geo = max_pool_geom(n, xv.shape);
  if (auto* e = std::get_if<std::string>(&geo)) return *e;
  auto p = std::get<max_pool_geometry>(geo);
  return one(xv.dtype, {xv.shape[0], xv.shape[1], p.oh, p.ow});
}

/// The max over each window of an NCHW 8-bit tensor; padding takes no part.
void run_max_pool(const node& n, const std::vector<tensor_ref>& in,
                  const std::vector<tensor_ref>& out) {
  const auto& x = in[0];
  const auto& y = out[0];
  auto p = std::get<max_pool_geometry>(max_pool_geom(n, x.shape));
  int64_t h = x.shape[2], w = x.shape[3];
  dispatch(x.dtype, [&](auto tag) {
    using Q = decltype(tag);
    if constexpr (std::is_same_v<Q, int8_t> || std::is_same_v<Q, uint8_t>) {
      const Q* in = x.as<Q>();
      Q* out = y.as<Q>();
      for (int64_t nc = 0; nc < x.shape[0] * x.shape[1]; ++nc)
        for (int64_t oy = 0; oy < p.oh; ++oy)
          for (int64_t ox = 0; ox < p.ow; ++ox) {
            Q best = std::numeric_limits<Q>::lowest();
            for (int64_t ky = 0; ky < p.kh; ++ky)
              for (int64_t kx = 0; kx < p.kw; ++kx) {
                int64_t iy = oy * p.sh - p.pt + ky * p.dh, ix = ox * p.sw - p.pl + kx * p.dw;
                if (iy >= 0 && iy < h && ix >= 0 && ix < w)
                  best = std::max(best, in[(nc * h + iy) * w + ix]);
              }
            out[(nc * p.oh + oy) * p.ow + ox] = best;
          }
    }
  });
}

} // namespace

quant_add_params quant_add_params_of(const std::vector<tensor_ref>& in) {
  quant_add_params p;
  float c_scale = scale_at(in[6], 0);
  p.a_ratio = scale_at(in[1], 0) / c_scale;
  p.b_ratio = scale_at(in[4], 0) / c_scale;
  p.a_zero = zero_at(in, 2, 0);
  p.b_zero = zero_at(in, 5, 0);
  p.c_zero = zero_at(in, 7, 0);
  return p;
}

namespace {

/// QLinearAdd with broadcasting, element by element as quant_add_span.
void run_qlinear_add(const node& n, const std::vector<tensor_ref>& in,
                     const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  auto p = quant_add_params_of(in);
  std::array<shape_t, 2> st{broadcast_strides(in[0].shape, y.shape),
                            broadcast_strides(in[3].shape, y.shape)};
  auto one_value = [&](auto a_tag, auto b_tag, auto c_tag) {
    using A = decltype(a_tag);
    using B = decltype(b_tag);
    using C = decltype(c_tag);
    const A* a = in[0].as<A>();
    const B* b = in[3].as<B>();
    C* c = y.as<C>();
    broadcast_loop<2>(y.shape, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
      quant_add_span(p, a + off[0], b + off[1], c + i, 1);
    });
  };
  auto with_c = [&](auto a_tag, auto b_tag) {
    if (y.dtype == datatype::int8)
      one_value(a_tag, b_tag, int8_t{});
    else
      one_value(a_tag, b_tag, uint8_t{});
  };
  auto with_b = [&](auto a_tag) {
    if (in[3].dtype == datatype::int8)
      with_c(a_tag, int8_t{});
    else
      with_c(a_tag, uint8_t{});
  };
  if (in[0].dtype == datatype::int8)
    with_b(int8_t{});
  else
    with_b(uint8_t{});
  clamp_at_zero_point(n, in[7], y);
}

} // namespace

std::variant<quant_conv_geometry, std::string>
quant_conv_geometry_of(const node& nd, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  return qconv_geom(nd, x, w);
}

namespace {

/// What every ONNX operator of this file refuses alike, before its own
/// inference: an opset before its first version, no first input.
std::optional<std::string> refused_input(const graph& g, const node& n) {
  static const auto first = first_versions(quant_operator_table());
  return refused_opset_or_input(g, n, first.at(n.op));
}

template <infer_function Infer>
infer_result checked(const graph& g, const node& n) {
  return refuse_then<refused_input, Infer>(g, n);
}

/// MatMulInteger, or QLinearMatMul (`QLinear`).
template <bool QLinear>
void run_matmul_integer(const node&, const std::vector<tensor_ref>& in,
                        const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  constexpr bool q = QLinear;
  size_t b = q ? 3 : 1;
  auto d = std::get<matmul_dims>(matmul_dims_of(in[0].shape, in[b].shape));
  auto acc = matmul_acc(d, in, 0, 2, b, q ? 5 : 3);
  if (!q) {
    std::copy(acc.begin(), acc.end(), y.as<int32_t>());
    return;
  }
  if (in.size() > 8 && in[8].data) // quant_passes.cpp's bias: one INT32 per column
    for (size_t i = 0; i < acc.size(); ++i)
      acc[i] += in[8].as<int32_t>()[static_cast<int64_t>(i) % d.n];
  write_requantized(acc, multipliers(in[1], in[4], in[6]), 1, in[7], y);
}

/// ConvInteger, or QLinearConv (`QLinear`).
template <bool QLinear>
void run_conv_integer(const node& n, const std::vector<tensor_ref>& in,
                      const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  constexpr bool q = QLinear;
  auto g = std::get<qconv_geometry>(qconv_geom(n, in[0].shape, in[q ? 3 : 1].shape));
  const tensor_ref* bias = q && in.size() > 8 && in[8].data ? &in[8] : nullptr;
  auto acc = conv_acc(g, in, 2, q ? 3 : 1, q ? 5 : 3, bias);
  if (!q) {
    std::copy(acc.begin(), acc.end(), y.as<int32_t>());
    return;
  }
  write_requantized(acc, multipliers(in[1], in[4], in[6]), g.oh * g.ow, in[7], y);
  clamp_at_zero_point(n, in[7], y);
}

} // namespace

const op_table& quant_operator_table() {
  // Every ONNX version (onnx 1.23.2's opset 28 included); QLinearMatMul-21 only
  // adds FLOAT16/BFLOAT16 scales, which the engine holds as FP32.
  static const op_table ops{
    {"ConvInteger", {10}, &checked<infer_conv_integer<false>>, &run_conv_integer<false>},
    {"DynamicQuantizeLinear", {11}, &checked<infer_dynamic_quantize>, &run_dynamic_quantize},
    {"MatMulInteger", {10}, &checked<infer_matmul_integer<false>>, &run_matmul_integer<false>},
    {"QLinearConv", {10}, &checked<infer_conv_integer<true>>, &run_conv_integer<true>},
    {"QLinearMatMul", {10, 21}, &checked<infer_matmul_integer<true>>,
     &run_matmul_integer<true>},
  };
  return ops;
}

const op_table& quant_engine_table() {
  static const op_table ops{
    {quant_add_op, {}, &infer_qlinear_add, &run_qlinear_add},
    {quant_max_pool_op, {}, &infer_max_pool, &run_max_pool},
  };
  return ops;
}

} // namespace caf_serving::onnx
