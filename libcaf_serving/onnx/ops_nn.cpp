#include "onnx/ops_nn.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

const value& input(const graph& g, const node& n, size_t i) {
  return g.values[n.inputs[i]];
}

bool has_input(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

bool has_data(const std::vector<tensor_ref>& in, size_t i) {
  return in.size() > i && in[i].data != nullptr;
}

/// The refusal of an input 0 that is not FP32: MaxPool-12 takes INT8 and UINT8
/// too, but the engine's kernels pool and convolve FP32.
std::optional<std::string> need_fp32(const graph& g, const node& n) {
  const auto& x = input(g, n, 0);
  if (x.dtype == datatype::fp32)
    return std::nullopt;
  return "input '" + x.name + "' is " + std::string(to_string(x.dtype)) + "; the engine runs "
         + n.op + " on FP32 (Cast it to FLOAT first)";
}

// ------------------------------------------------------------------ conv, pooling

struct conv_geometry {
  int64_t n, c, h, w, k, oh, ow, kh, kw, sh, sw, ph0, pw0, dh, dw, group;
  int64_t ph1, pw1; ///< bottom and right padding
};

/// The pads ONNX's auto_pad gives a 2-D Conv or pool over NCHW input `x`
/// with kernel `ks` (SAME_*: output ceil(in / stride), the odd pad at the end
/// for SAME_UPPER, at the beginning for SAME_LOWER; VALID: none); the `pads`
/// attribute for NOTSET; nothing for another auto_pad value.
std::optional<shape_t> effective_pads(const node& nd, const shape_t& x, const shape_t& ks) {
  auto mode = nd.get_s("auto_pad", "NOTSET");
  if (mode == "NOTSET")
    return nd.get_ints("pads", {0, 0, 0, 0});
  if (mode == "VALID")
    return shape_t{0, 0, 0, 0};
  if (mode != "SAME_UPPER" && mode != "SAME_LOWER")
    return std::nullopt;
  auto st = nd.get_ints("strides", {1, 1});
  auto dl = nd.get_ints("dilations", {1, 1});
  if (x.size() != 4 || ks.size() != 2 || st.size() != 2 || dl.size() != 2 || st[0] < 1
      || st[1] < 1)
    return nd.get_ints("pads", {0, 0, 0, 0}); // conv_geom() names what is wrong
  shape_t pads(4);
  for (int i = 0; i < 2; ++i) {
    int64_t in = x[2 + i], out = (in + st[i] - 1) / st[i];
    int64_t total = std::max<int64_t>(0, (out - 1) * st[i] + (ks[i] - 1) * dl[i] + 1 - in);
    int64_t small = total / 2, large = total - small;
    pads[i] = mode == "SAME_UPPER" ? small : large;
    pads[2 + i] = mode == "SAME_UPPER" ? large : small;
  }
  return pads;
}

std::variant<conv_geometry, std::string> conv_geom(const node& nd, const shape_t& x,
                                                   const shape_t& wshape, bool pool) {
  if (x.size() != 4)
    return std::string("expects a 4-D NCHW input, got ") + shape_string(x);
  if (!pool && wshape.size() != 4)
    return "expects 4-D weights, got " + shape_string(wshape);
  conv_geometry g{};
  g.n = x[0]; g.c = x[1]; g.h = x[2]; g.w = x[3];
  auto ks = pool ? nd.get_ints("kernel_shape") : shape_t{wshape[2], wshape[3]};
  if (ks.size() != 2)
    return std::string("only 2-D kernels are supported");
  g.kh = ks[0]; g.kw = ks[1];
  auto st = nd.get_ints("strides", {1, 1});
  auto pads = effective_pads(nd, x, ks);
  if (!pads)
    return "auto_pad " + nd.get_s("auto_pad", "") + " is not one of NOTSET, SAME_UPPER, "
           "SAME_LOWER and VALID; re-export the model";
  auto pd = *pads;
  auto dl = nd.get_ints("dilations", {1, 1});
  if (st.size() != 2 || pd.size() != 4 || dl.size() != 2)
    return std::string("strides, pads and dilations of a 2-D ") + (pool ? "pool" : "convolution")
           + " need 2, 4 and 2 values";
  for (int i = 0; i < 2; ++i)
    if (ks[i] < 1 || st[i] < 1 || dl[i] < 1 || pd[i] < 0 || pd[2 + i] < 0)
      return "kernel " + shape_string(ks) + ", strides " + shape_string(st) + ", dilations "
             + shape_string(dl) + " must be positive and pads " + shape_string(pd)
             + " not negative";
  g.sh = st[0]; g.sw = st[1]; g.ph0 = pd[0]; g.pw0 = pd[1];
  g.ph1 = pd[2]; g.pw1 = pd[3]; g.dh = dl[0]; g.dw = dl[1];
  g.group = pool ? 1 : nd.get_i("group", 1);
  g.k = pool ? g.c : wshape[0];
  if (!pool && wshape[1] * g.group != g.c)
    return "weights " + shape_string(wshape) + " with group " + std::to_string(g.group)
           + " do not fit input channels " + std::to_string(g.c);
  auto out_dim = [&](int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1, int64_t d) {
    int64_t span = in + p0 + p1 - (d * (k - 1) + 1);
    bool ceil = pool && nd.get_i("ceil_mode", 0) != 0;
    int64_t out = (ceil ? (span + s - 1) / s : span / s) + 1;
    // ceil_mode: "sliding windows that would start in the right padded region
    // are ignored" (the pools' spec since MaxPool-10; torch and ONNX Runtime agree).
    if (ceil && out > 1 && (out - 1) * s >= in + p0)
      --out;
    return out;
  };
  bool oversized = g.h + pd[0] + pd[2] < g.dh * (g.kh - 1) + 1
                   || g.w + pd[1] + pd[3] < g.dw * (g.kw - 1) + 1;
  g.oh = out_dim(g.h, g.kh, g.sh, pd[0], pd[2], g.dh);
  g.ow = out_dim(g.w, g.kw, g.sw, pd[1], pd[3], g.dw);
  // A pool's window may overhang a small input (torchvision's ceil_mode pools
  // on 32x32 images; ONNX Runtime computes the output size with C++'s truncating
  // division, and so does out_dim): that serves one window over what there is.
  // Only an empty output, or a convolution's oversized kernel, is refused.
  if (oversized && (!pool || g.oh < 1 || g.ow < 1))
    return "the (dilated) kernel " + shape_string(ks) + " is larger than the padded input "
           + shape_string(x);
  return g;
}

void conv_reference(const conv_geometry& g, const float* x, const float* w, float* y) {
  int64_t cpg = g.c / g.group, kpg = g.k / g.group;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k) {
      int64_t grp = k / kpg;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          double acc = 0;
          for (int64_t c = 0; c < cpg; ++c)
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              int64_t iy = oy * g.sh - g.ph0 + ky * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                int64_t ix = ox * g.sw - g.pw0 + kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                acc += static_cast<double>(x[((n * g.c + grp * cpg + c) * g.h + iy) * g.w + ix])
                       * w[((k * cpg + c) * g.kh + ky) * g.kw + kx];
              }
            }
          y[((n * g.k + k) * g.oh + oy) * g.ow + ox] = static_cast<float>(acc);
        }
    }
}

/// The window's maximum (`is_max`), else its mean.
void pool_reference(const node& nd, bool is_max, const conv_geometry& g, const float* x,
                    float* y) {
  bool include_pad = nd.get_i("count_include_pad", 0) != 0;
  for (int64_t nc = 0; nc < g.n * g.c; ++nc)
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        float best = -std::numeric_limits<float>::infinity();
        double sum = 0;
        int64_t count = 0;
        for (int64_t ky = 0; ky < g.kh; ++ky)
          for (int64_t kx = 0; kx < g.kw; ++kx) {
            int64_t iy = oy * g.sh - g.ph0 + ky * g.dh, ix = ox * g.sw - g.pw0 + kx * g.dw;
            bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
            if (!inside) {
              // Padding counts for count_include_pad, but not past the padded edge.
              if (include_pad && iy < g.h + g.ph1 && ix < g.w + g.pw1)
                ++count;
              continue;
            }
            float v = x[(nc * g.h + iy) * g.w + ix];
            best = std::max(best, v);
            sum += v;
            ++count;
          }
        y[(nc * g.oh + oy) * g.ow + ox] = is_max ? best : static_cast<float>(sum / count);
      }
}

/// Conv and FusedConv: [N, K, OH, OW].
infer_result infer_conv(const graph& g, const node& n) {
  if (auto e = need_fp32(g, n))
    return *e;
  auto geo = conv_geom(n, input(g, n, 0).shape, input(g, n, 1).shape, false);
  if (auto* e = std::get_if<std::string>(&geo)) return *e;
  auto c = std::get<conv_geometry>(geo);
  return one(datatype::fp32, {c.n, c.k, c.oh, c.ow});
}

/// Conv, and FusedConv's bias, residual and activation (none on a Conv).
void run_conv(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  auto geo = std::get<conv_geometry>(conv_geom(n, in[0].shape, in[1].shape, false));
  conv_reference(geo, in[0].as<float>(), in[1].as<float>(), y.as<float>());
  int64_t plane = geo.oh * geo.ow;
  auto act = n.get_s("activation", "");
  float* o = y.as<float>();
  for (int64_t b = 0; b < geo.n; ++b)
    for (int64_t k = 0; k < geo.k; ++k)
      for (int64_t i = 0; i < plane; ++i) {
        int64_t at = (b * geo.k + k) * plane + i;
        float v = o[at] + (has_data(in, 2) ? in[2].as<float>()[k] : 0.f);
        if (has_data(in, 3)) v += in[3].as<float>()[at];
        o[at] = apply_activation(act, v, n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
      }
}

/// MaxPool and AveragePool: [N, C, OH, OW].
infer_result infer_pool(const graph& g, const node& n) {
  if (auto e = need_fp32(g, n))
    return *e;
  if (n.outputs.size() > 1 && n.outputs[1] >= 0)
    return std::string("MaxPool's Indices output is not supported");
  auto geo = conv_geom(n, input(g, n, 0).shape, shape_t{}, true);
  if (auto* e = std::get_if<std::string>(&geo)) return *e;
  auto c = std::get<conv_geometry>(geo);
  return one(datatype::fp32, {c.n, c.k, c.oh, c.ow});
}

template <bool IsMax>
void run_pool(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  auto geo = std::get<conv_geometry>(conv_geom(n, in[0].shape, {}, true));
  pool_reference(n, IsMax, geo, in[0].as<float>(), out[0].as<float>());
}

std::optional<std::string> check_average_pool(const graph& g, const node& n, int64_t version) {
  return attribute_from(g, n, version, "dilations", 19);
}

std::optional<std::string> check_max_pool(const graph& g, const node& n, int64_t version) {
  if (n.get_i("storage_order", 0) != 0 && n.outputs.size() > 1 && n.outputs[1] >= 0)
    return "attribute 'storage_order' is 1 with the Indices output"
           + selected_version(g, n, version)
           + ", which the engine does not compute; use only the first output";
  return std::nullopt;
}

infer_result infer_global_average_pool(const graph& g, const node& n) {
  if (auto e = need_fp32(g, n))
    return *e;
  shape_t s = input(g, n, 0).shape;
  for (size_t i = 2; i < s.size(); ++i) s[i] = 1;
  return one(datatype::fp32, s);
}

void run_global_average_pool(const node&, const std::vector<tensor_ref>& in,
                             const std::vector<tensor_ref>& out) {
  int64_t nc = in[0].shape[0] * in[0].shape[1];
  int64_t plane = in[0].elements() / nc;
  for (int64_t i = 0; i < nc; ++i) {
    double s = 0;
    for (int64_t j = 0; j < plane; ++j) s += in[0].as<float>()[i * plane + j];
    out[0].as<float>()[i] = static_cast<float>(s / plane);
  }
}

// ------------------------------------------------------------------ MatMul, Gemm

/// C[M,N] = A[M,K] x B[K,N] (row-major), optionally transposed operands.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), beta, c,
              static_cast<int>(n));
}

std::variant<shape_t, std::string> matmul_shape(shape_t a, shape_t b) {
  if (a.empty() || b.empty())
    return std::string("MatMul of a scalar");
  bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  if (a.back() != b[b.size() - 2])
    return "inner dimensions differ: " + shape_string(a) + " x " + shape_string(b);
  shape_t ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  auto batch = broadcast_shapes(ab, bb);
  if (!batch)
    return "batch dimensions do not broadcast: " + shape_string(a) + " x " + shape_string(b);
  shape_t out = *batch;
  if (!a1) out.push_back(a[a.size() - 2]);
  if (!b1) out.push_back(b.back());
  return out;
}

void matmul_reference(const tensor_ref& A, const tensor_ref& B, const tensor_ref& Y) {
  shape_t a = A.shape, b = B.shape;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  shape_t ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  shape_t batch = *broadcast_shapes(ab, bb);
  auto sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch);
  if (batch.empty()) {
    gemm(false, false, m, n, k, 1, A.as<float>(), B.as<float>(), 0, Y.as<float>());
    return;
  }
  std::array<shape_t, 2> st{sa, sb};
  broadcast_loop<2>(batch, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
    gemm(false, false, m, n, k, 1, A.as<float>() + off[0] * m * k,
         B.as<float>() + off[1] * k * n, 0, Y.as<float>() + i * m * n);
  });
}

/// MatMul and FusedMatMul.
infer_result infer_matmul(const graph& g, const node& n) {
  auto s = matmul_shape(input(g, n, 0).shape, input(g, n, 1).shape);
  if (auto* e = std::get_if<std::string>(&s)) return *e;
  return one(datatype::fp32, std::get<shape_t>(s));
}

void run_matmul(const node&, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  matmul_reference(in[0], in[1], out[0]);
}

void run_fused_matmul(const node& n, const std::vector<tensor_ref>& in,
                      const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  matmul_reference(in[0], in[1], y);
  auto act = n.get_s("activation", "");
  int64_t cnt = y.elements();
  int64_t nb = has_data(in, 2) ? in[2].elements() : 0;
  float* o = y.as<float>();
  for (int64_t i = 0; i < cnt; ++i) {
    float v = o[i] + (nb ? in[2].as<float>()[i % nb] : 0.f);
    o[i] = apply_activation(act, v, n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
    if (has_data(in, 3)) o[i] += in[3].as<float>()[i];
  }
}

/// Gemm and FusedGemm.
infer_result infer_gemm(const graph& g, const node& n) {
  const auto& a = input(g, n, 0).shape;
  const auto& b = input(g, n, 1).shape;
  if (a.size() != 2 || b.size() != 2) return std::string("Gemm needs 2-D inputs");
  int64_t m = n.get_i("transA", 0) ? a[1] : a[0], ka = n.get_i("transA", 0) ? a[0] : a[1];
  int64_t nn = n.get_i("transB", 0) ? b[0] : b[1], kb = n.get_i("transB", 0) ? b[1] : b[0];
  if (ka != kb)
    return "inner dimensions differ: " + shape_string(a) + " x " + shape_string(b);
  return one(datatype::fp32, {m, nn});
}

/// Gemm, and FusedGemm's activation (none on a Gemm).
void run_gemm(const node& n, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  bool ta = n.get_i("transA", 0) != 0, tb = n.get_i("transB", 0) != 0;
  int64_t m = y.shape[0], nn = y.shape[1], k = ta ? in[0].shape[0] : in[0].shape[1];
  float alpha = n.get_f("alpha", 1.0f), beta = n.get_f("beta", 1.0f);
  float* o = y.as<float>();
  if (has_data(in, 2)) {
    std::array<shape_t, 1> st{broadcast_strides(in[2].shape, y.shape)};
    broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
      o[i] = in[2].as<float>()[off[0]];
    });
  } else {
    beta = 0;
  }
  gemm(ta, tb, m, nn, k, alpha, in[0].as<float>(), in[1].as<float>(), beta, o);
  auto act = n.get_s("activation", "");
  if (!act.empty())
    for (int64_t i = 0; i < y.elements(); ++i)
      o[i] = apply_activation(act, o[i], n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
}

// ------------------------------------------------------------------ normalizations

void softmax_rows(float* x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* p = x + r * n;
    float mx = *std::max_element(p, p + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::exp(p[i] - mx);
      sum += p[i];
    }
    float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i)
      p[i] *= inv;
  }
}

void layernorm_rows(const float* x, const float* gamma, const float* beta, float eps, int64_t rows,
                    int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = x + r * n;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += p[i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (p[i] - mean) * (p[i] - mean);
    var /= n;
    float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    for (int64_t i = 0; i < n; ++i)
      y[r * n + i] = static_cast<float>((p[i] - mean) * inv) * gamma[i] + (beta ? beta[i] : 0.f);
  }
}

/// Softmax, BatchNormalization, FusedLayerNorm: X's shape and type.
infer_result infer_like_input(const graph& g, const node& n) {
  return one(input(g, n, 0).dtype, input(g, n, 0).shape);
}

void run_softmax(const node& n, const std::vector<tensor_ref>& in,
                 const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  int64_t axis = norm_axis(n.get_i("axis", -1), in[0].shape.size());
  int64_t inner = 1;
  for (size_t i = axis + 1; i < in[0].shape.size(); ++i) inner *= in[0].shape[i];
  int64_t d = in[0].shape[axis];
  int64_t outer = in[0].elements() / (d * inner);
  if (inner == 1) {
    std::memcpy(y.data, in[0].data, y.elements() * 4);
    softmax_rows(y.as<float>(), outer, d);
    return;
  }
  std::vector<float> tmp(d);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      for (int64_t k = 0; k < d; ++k) tmp[k] = in[0].as<float>()[(o * d + k) * inner + j];
      softmax_rows(tmp.data(), 1, d);
      for (int64_t k = 0; k < d; ++k) y.as<float>()[(o * d + k) * inner + j] = tmp[k];
    }
}

/// LayerNormalization: Y, and the optional Mean and InvStdDev (X's shape with
/// the normalized axes 1; FLOAT, stash_type 1).
infer_result infer_layer_norm(const graph& g, const node& n) {
  const auto& x = input(g, n, 0);
  if (n.outputs.size() <= 1)
    return one(x.dtype, x.shape);
  const auto& s = x.shape;
  int64_t axis = norm_axis(n.get_i("axis", -1), s.size());
  if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
    return "axis " + std::to_string(n.get_i("axis", -1)) + " is out of range for "
           + shape_string(s);
  shape_t stat = s;
  for (size_t i = axis; i < s.size(); ++i) stat[i] = 1;
  std::vector<inferred> out{{x.dtype, s}};
  for (size_t i = 1; i < n.outputs.size(); ++i) out.push_back({datatype::fp32, stat});
  return out;
}

/// LayerNormalization and FusedLayerNorm (whose axis is the last).
void run_layer_norm(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& s = in[0].shape;
  int64_t axis = norm_axis(n.get_i("axis", -1), s.size());
  int64_t inner = 1;
  for (size_t i = axis; i < s.size(); ++i) inner *= s[i];
  std::vector<float> gamma(inner), beta(inner);
  // Scale and bias broadcast to the normalised dimensions.
  for (int64_t i = 0; i < inner; ++i) {
    gamma[i] = in[1].as<float>()[i % in[1].elements()];
    beta[i] = has_data(in, 2) ? in[2].as<float>()[i % in[2].elements()] : 0.f;
  }
  float eps = n.get_f("epsilon", 1e-5f);
  int64_t rows = in[0].elements() / inner;
  layernorm_rows(in[0].as<float>(), gamma.data(), beta.data(), eps, rows, inner, y.as<float>());
  // The optional Mean and InvStdDev outputs, computed as layernorm_rows does.
  bool mean_out = out.size() > 1 && out[1].data, inv_out = out.size() > 2 && out[2].data;
  if (mean_out || inv_out)
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = in[0].as<float>() + r * inner;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < inner; ++i) mean += p[i];
      mean /= inner;
      for (int64_t i = 0; i < inner; ++i) var += (p[i] - mean) * (p[i] - mean);
      var /= inner;
      if (mean_out) out[1].as<float>()[r] = static_cast<float>(mean);
      if (inv_out) out[2].as<float>()[r] = static_cast<float>(1.0 / std::sqrt(var + eps));
    }
}

void run_batch_norm(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& s = in[0].shape;
  int64_t c = s[1], inner = in[0].elements() / (s[0] * c);
  float eps = n.get_f("epsilon", 1e-5f);
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t k = 0; k < c; ++k) {
      float scale = in[1].as<float>()[k] / std::sqrt(in[4].as<float>()[k] + eps);
      float shift = in[2].as<float>()[k] - in[3].as<float>()[k] * scale;
      const float* x = in[0].as<float>() + (b * c + k) * inner;
      float* o = y.as<float>() + (b * c + k) * inner;
      for (int64_t i = 0; i < inner; ++i) o[i] = x[i] * scale + shift;
    }
}

/// training_mode (from BatchNormalization-14) and the running statistics' outputs.
std::optional<std::string> check_batch_norm(const graph& g, const node& n, int64_t version) {
  const std::string at = selected_version(g, n, version);
  if (n.get_i("training_mode", 0) != 0)
    return "attribute 'training_mode' is " + std::to_string(n.get_i("training_mode", 0)) + at
           + ": the engine runs inference only (the running mean and variance); export the "
             "model in eval mode (model.eval()) or set training_mode=0";
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (n.outputs[i] >= 0)
      return "output " + std::to_string(i) + " (running mean or variance) is used" + at
             + ", which exists only in training mode; export the model in eval mode";
  return std::nullopt;
}

// ------------------------------------------------------------------ FusedAttention

infer_result infer_fused_attention(const graph& g, const node& n) {
  return one(datatype::fp32, input(g, n, 0).shape);
}

void run_fused_attention(const node& n, const std::vector<tensor_ref>& in,
                         const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  // [B, S, H*D] per head: scores = Q K^T * scale + M, softmax, x V.
  int64_t b = in[0].shape[0], s = in[0].shape[1], hd = in[0].shape[2];
  int64_t h = n.get_i("num_heads", 1), d = hd / h;
  float scale = n.get_f("scale", 1.0f);
  std::vector<float> scores(s * s);
  shape_t mask_full{b, h, s, s};
  bool masked = has_data(in, 3);
  shape_t mst = masked ? broadcast_strides(in[3].shape, mask_full) : shape_t{0, 0, 0, 0};
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi) {
      const float* q = in[0].as<float>() + bi * s * hd + hi * d;
      const float* k = in[1].as<float>() + bi * s * hd + hi * d;
      const float* v = in[2].as<float>() + bi * s * hd + hi * d;
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < s; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e) acc += q[i * hd + e] * k[j * hd + e];
          float m = masked ? in[3].as<float>()[bi * mst[0] + hi * mst[1] + i * mst[2]
                                               + j * mst[3]] : 0.f;
          scores[i * s + j] = static_cast<float>(acc) * scale + m;
        }
      softmax_rows(scores.data(), s, s);
      if (n.get_i("nan_to_zero", 0))
        for (auto& p : scores)
          if (std::isnan(p)) p = 0.0f;
      float* o = y.as<float>() + bi * s * hd + hi * d;
      for (int64_t i = 0; i < s; ++i)
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < s; ++j) acc += scores[i * s + j] * v[j * hd + e];
          o[i * hd + e] = static_cast<float>(acc);
        }
    }
}

// ------------------------------------------------------------------ ReduceMean, ReduceSum

/// The axes of a ReduceMean or ReduceSum node: its second input from
/// ReduceSum-13 and ReduceMean-18 on, its attribute before (the importer
/// refuses the other form for the version the opset selects). Empty axes reduce
/// every axis, unless noop_with_empty_axes (from the same versions) makes the
/// node a copy.
std::vector<int64_t> reduce_axes(const node& n, const graph* g, const tensor_ref* axes_in,
                                 size_t rank) {
  std::vector<int64_t> axes;
  if (n.inputs.size() > 1 && n.inputs[1] >= 0) {
    if (g)
      axes = const_ints(*g, n.inputs[1]);
    else if (axes_in)
      axes = ref_ints(*axes_in);
  } else {
    axes = n.get_ints("axes");
  }
  for (auto& a : axes)
    a = norm_axis(a, rank);
  if (axes.empty() && !n.get_i("noop_with_empty_axes", 0)) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  return axes;
}

infer_result infer_reduce(const graph& g, const node& n) {
  if (auto e = need_constant(g, n, 1, "the axes")) return *e;
  const auto& x = input(g, n, 0);
  const auto& s = x.shape;
  if (x.dtype == datatype::bool_)
    return "input '" + x.name + "' is BOOL; the engine reduces numbers (Cast it first)";
  auto axes = reduce_axes(n, &g, nullptr, s.size());
  for (auto a : axes)
    if (a < 0 || a >= static_cast<int64_t>(s.size()))
      return "axis out of range for input shape " + shape_string(s);
  bool keep = n.get_i("keepdims", 1) != 0;
  shape_t o;
  for (size_t i = 0; i < s.size(); ++i) {
    bool red = std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) != axes.end();
    if (!red) o.push_back(s[i]);
    else if (keep) o.push_back(1);
  }
  return one(x.dtype, o);
}

/// ReduceSum, or ReduceMean (`Mean`).
template <bool Mean>
void run_reduce(const node& n, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& s = in[0].shape;
  auto axes = reduce_axes(n, nullptr, has_data(in, 1) ? &in[1] : nullptr, s.size());
  // Output index of each input element: strides of the kept-dims output, 0 on reduced axes.
  shape_t keep_shape = s;
  for (auto a : axes) keep_shape[a] = 1;
  auto ost = strides_of(keep_shape);
  for (auto a : axes) ost[a] = 0;
  int64_t count = 1;
  for (auto a : axes) count *= s[a];
  std::array<shape_t, 1> st{ost};
  dispatch(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      // Integers sum exactly in int64 (a mean truncates, as ONNX Runtime's).
      using A = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
      std::vector<A> acc(y.elements(), A{0});
      const T* x = in[0].as<T>();
      broadcast_loop<1>(s, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
        acc[off[0]] += x[i];
      });
      // An empty reduction's mean is NaN for floats (0 / 0), 0 for integers.
      A div = std::is_integral_v<T> && count == 0 ? A{1} : static_cast<A>(count);
      for (int64_t i = 0; i < y.elements(); ++i)
        y.as<T>()[i] = static_cast<T>(Mean ? acc[i] / div : acc[i]);
    }
  });
}

/// ReduceMean's axes became an input at version 18.
std::optional<std::string> check_reduce_mean(const graph& g, const node& n, int64_t version) {
  return check_axes_input(g, n, version, 18);
}

/// ReduceSum's axes became an input at version 13.
std::optional<std::string> check_reduce_sum(const graph& g, const node& n, int64_t version) {
  return check_axes_input(g, n, version, 13);
}

} // namespace

void explicit_pads(const graph& g, node& n) {
  // Conv's kernel size is its weights' where it has no kernel_shape; the pools'
  // is their kernel_shape.
  static const std::map<std::string, bool> kernel_of_weights{
    {"AveragePool", false}, {"Conv", true}, {"MaxPool", false}};
  auto padded = kernel_of_weights.find(n.op);
  if (padded == kernel_of_weights.end())
    return;
  if (n.get_s("auto_pad", "NOTSET") == "NOTSET" || n.inputs.empty() || n.inputs[0] < 0)
    return;
  shape_t ks = n.get_ints("kernel_shape");
  if (padded->second && ks.empty() && has_input(n, 1) && input(g, n, 1).shape.size() == 4)
    ks = {input(g, n, 1).shape[2], input(g, n, 1).shape[3]};
  auto pads = effective_pads(n, input(g, n, 0).shape, ks);
  if (!pads)
    return;
  n.set_ints("pads", *pads);
  n.set_s("auto_pad", "NOTSET");
}

const op_table& nn_operator_table() {
  // Every version ONNX 1.23.2 defines, from the first up to opset 28; where a
  // version from 13 on changed what the operator means, the comment says so
  // and the entry's check or kernel follows the version the model selects. The
  // other versions changed only the spec's type lists (bfloat16 from 13; Conv's
  // and the pools' from 22).
  static const op_table ops{
    // 10: ceil_mode; 19: dilations
    {"AveragePool", {1, 7, 10, 11, 19, 22}, &infer_pool, &run_pool<false>,
     &check_average_pool},
    // 14: training_mode (refused unless 0)
    {"BatchNormalization", {1, 6, 7, 9, 14, 15}, &infer_like_input, &run_batch_norm,
     &check_batch_norm},
    {"Conv", {1, 11, 22}, &infer_conv, &run_conv},
    {"Gemm", {1, 6, 7, 9, 11, 13}, &infer_gemm, &run_gemm},
    {"GlobalAveragePool", {1, 22}, &infer_global_average_pool, &run_global_average_pool},
    // 1: onnxruntime's own LayerNormalization in the default domain (ONNX defines it from
    // 17 on, alike), which its transformer optimizer writes into models of opsets below 17.
    {"LayerNormalization", {1, 17}, &infer_layer_norm, &run_layer_norm},
    {"MatMul", {1, 9, 13}, &infer_matmul, &run_matmul},
    // 10: ceil_mode, dilations
    {"MaxPool", {1, 8, 10, 11, 12, 22}, &infer_pool, &run_pool<true>, &check_max_pool},
    // 18: axes is an input; noop_with_empty_axes
    {"ReduceMean", {1, 11, 13, 18}, &infer_reduce, &run_reduce<true>, &check_reduce_mean},
    // 13: axes is an input; noop_with_empty_axes
    {"ReduceSum", {1, 11, 13}, &infer_reduce, &run_reduce<false>, &check_reduce_sum},
    {"Softmax", {1, 11, 13}, &infer_like_input, &run_softmax}, // 13: one axis, not the tail
  };
  return ops;
}

const op_table& nn_engine_table() {
  static const op_table ops{
    {"FusedAttention", {}, &infer_fused_attention, &run_fused_attention},
    {"FusedConv", {}, &infer_conv, &run_conv},
    {"FusedGemm", {}, &infer_gemm, &run_gemm},
    {"FusedLayerNorm", {}, &infer_like_input, &run_layer_norm},
    {"FusedMatMul", {}, &infer_matmul, &run_fused_matmul},
  };
  return ops;
}

} // namespace caf_serving::onnx
