#include "onnx/ops.hpp"

#include "core/half.hpp"
#include "onnx/ops_internal.hpp"
#include "onnx/ops_contrib.hpp"
#include "onnx/ops_more.hpp"
#include "onnx/ops_nd.hpp"
#include "onnx/ops_quant.hpp"
#include "onnx/ops_simple.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;
using infer_result = std::variant<std::vector<inferred>, std::string>;

bool is_compare(const std::string& op) {
  return op == "Equal" || op == "Greater" || op == "GreaterOrEqual" || op == "Less"
         || op == "LessOrEqual" || op == "And" || op == "Or";
}

bool is_binary(const std::string& op) {
  return op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow"
         || is_compare(op);
}

/// An element-wise binary operator, resolved once per node rather than per element.
enum class binary_op { add, sub, mul, div, pow, equal, greater, greater_equal, less, less_equal,
                       and_, or_ };

binary_op binary_op_of(const std::string& op) {
  static const std::map<std::string, binary_op> ops{
    {"Add", binary_op::add},       {"Sub", binary_op::sub},
    {"Mul", binary_op::mul},       {"Div", binary_op::div},
    {"Pow", binary_op::pow},       {"Equal", binary_op::equal},
    {"Greater", binary_op::greater}, {"GreaterOrEqual", binary_op::greater_equal},
    {"Less", binary_op::less},     {"LessOrEqual", binary_op::less_equal},
    {"And", binary_op::and_},      {"Or", binary_op::or_}};
  return ops.at(op);
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

bool is_unary(const std::string& op) {
  return op == "Relu" || op == "Sqrt" || op == "Erf" || op == "Tanh" || op == "Sigmoid"
         || op == "Identity" || op == "Cast" || op == "CastLike" || op == "Clip"
         || op == "FusedGelu";
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

float gelu(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
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

void pool_reference(const node& nd, const conv_geometry& g, const float* x, float* y) {
  bool is_max = nd.op == "MaxPool";
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

// ------------------------------------------------------------------ matmul

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
  int64_t nb = element_count(batch);
  if (batch.empty()) {
    gemm(false, false, m, n, k, 1, A.as<float>(), B.as<float>(), 0, Y.as<float>());
    return;
  }
  std::array<shape_t, 2> st{sa, sb};
  broadcast_loop<2>(batch, st, [&](int64_t i, const std::array<int64_t, 2>& off) {
    gemm(false, false, m, n, k, 1, A.as<float>() + off[0] * m * k,
         B.as<float>() + off[1] * k * n, 0, Y.as<float>() + i * m * n);
  });
  (void)nb;
}

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

/// The axes of a Reduce* node: its second input from ReduceSum-13 and
/// ReduceMean-18 on, its attribute before (the importer refuses the other
/// form for the version the opset selects). Empty axes reduce every axis,
/// unless noop_with_empty_axes (from the same versions) makes the node a copy.
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

shape_t slice_params(const shape_t& in, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                     std::vector<int64_t> steps, shape_t& begin, shape_t& step) {
  size_t r = in.size();
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty())
    steps.assign(starts.size(), 1);
  shape_t out = in;
  begin.assign(r, 0);
  step.assign(r, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = norm_axis(axes[i], r), d = in[a], s = steps[i];
    int64_t b = starts[i], e = ends[i];
    if (b < 0) b += d;
    if (e < 0) e += d;
    if (s > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      out[a] = e > b ? (e - b + s - 1) / s : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      out[a] = b > e ? (b - e - s - 1) / (-s) : 0;
    }
    begin[a] = b;
    step[a] = s;
  }
  return out;
}

/// Copies a strided view: out[i] = in[base + sum(idx_d * st_d)] for byte elements of `esize`.
void strided_copy(const uint8_t* in, int64_t base, const shape_t& out_shape, const shape_t& st,
                  size_t esize, uint8_t* out) {
  std::array<shape_t, 1> s{st};
  broadcast_loop<1>(out_shape, s, [&](int64_t i, const std::array<int64_t, 1>& off) {
    std::memcpy(out + i * esize, in + (base + off[0]) * esize, esize);
  });
}

} // namespace

std::optional<shape_t> broadcast_shapes(const shape_t& a, const shape_t& b) {
  size_t r = std::max(a.size(), b.size());
  shape_t out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

float apply_activation(const std::string& act, float x, float alpha, float beta) {
  if (act.empty()) return x;
  if (act == "Relu") return x > 0 ? x : 0;
  if (act == "Gelu") return gelu(x);
  if (act == "Tanh") return std::tanh(x);
  if (act == "Sigmoid") return 1.0f / (1.0f + std::exp(-x));
  if (act == "Clip") return std::min(std::max(x, alpha), beta);
  if (act == "HardSwish") return x * std::min(std::max(alpha * x + beta, 0.0f), 1.0f);
  if (act == "Swish") return x / (1.0f + std::exp(-alpha * x));
  assert(!"unknown activation");
  return x;
}

std::vector<std::vector<uint8_t>> run_reference_graph(const graph& g,
                                                      const std::vector<std::string>& inputs) {
  std::vector<std::vector<uint8_t>> buf(g.values.size());
  std::vector<void*> ptr(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (g.values[v].constant) {
      ptr[v] = const_cast<uint8_t*>(g.values[v].constant->bytes.data());
    } else {
      buf[v].resize(element_count(g.values[v].shape) * element_size(g.values[v].dtype) + 1);
      ptr[v] = buf[v].data();
    }
  }
  for (size_t i = 0; i < g.inputs.size() && i < inputs.size(); ++i)
    std::memcpy(ptr[g.inputs[i]], inputs[i].data(),
                std::min(inputs[i].size(), buf[g.inputs[i]].size()));
  for (const auto& n : g.nodes) {
    std::vector<tensor_ref> in, out;
    for (int i : n.inputs)
      in.push_back(i >= 0 ? tensor_ref{g.values[i].dtype, g.values[i].shape, ptr[i]} : tensor_ref{});
    for (int o : n.outputs)
      out.push_back(o >= 0 ? tensor_ref{g.values[o].dtype, g.values[o].shape, ptr[o]}
                           : tensor_ref{});
    run_reference(n, in, out);
  }
  std::vector<std::vector<uint8_t>> outs;
  for (int o : g.outputs) {
    auto* b = static_cast<const uint8_t*>(ptr[o]);
    outs.emplace_back(b, b + element_count(g.values[o].shape) * element_size(g.values[o].dtype));
  }
  return outs;
}

void explicit_pads(const graph& g, node& n) {
  if (n.op != "Conv" && n.op != "MaxPool" && n.op != "AveragePool")
    return;
  if (n.get_s("auto_pad", "NOTSET") == "NOTSET" || n.inputs.empty() || n.inputs[0] < 0)
    return;
  // Conv's kernel size is its weights'.
  shape_t ks = n.get_ints("kernel_shape");
  if (n.op == "Conv" && ks.empty() && n.inputs.size() > 1 && n.inputs[1] >= 0
      && g.values[n.inputs[1]].shape.size() == 4)
    ks = {g.values[n.inputs[1]].shape[2], g.values[n.inputs[1]].shape[3]};
  auto pads = effective_pads(n, g.values[n.inputs[0]].shape, ks);
  if (!pads)
    return;
  n.set_ints("pads", *pads);
  n.set_s("auto_pad", "NOTSET");
}

bool foldable(const std::string& op) {
  // Shape arithmetic runs through ConstantOfShape and Expand too, so every
  // operator folds; outputs stay as small as the graph's own tensors.
  return !op.empty();
}

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

/// Cast `x` to `y`. Half bits and doubles are read (graph inputs) or written
/// (graph outputs) only at the edges; a Cast to FLOAT16 or BFLOAT16 inside the
/// graph rounds its fp32 result to the half's precision, so that what follows
/// sees the values a half tensor would hold. Rounding is to nearest, ties to
/// even.
void run_cast(const node& n, const tensor_ref& x, const tensor_ref& y) {
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

infer_result infer_shapes(const graph& g, const node& n) {
  auto in = [&](size_t i) -> const value& { return g.values[n.inputs[i]]; };
  auto has = [&](size_t i) { return n.inputs.size() > i && n.inputs[i] >= 0; };
  auto need_const = [&](size_t i, const char* what) -> std::optional<std::string> {
    if (!has(i) || in(i).constant)
      return std::nullopt;
    return std::string(what) + " must be known before the model runs (it depends on '"
           + in(i).name + "', which is computed from the inputs in a way the engine cannot "
           "fold)";
  };
  const auto& op = n.op;
  auto one = [](datatype t, shape_t s) { return std::vector<inferred>{{t, std::move(s)}}; };
  if (is_simple_op(op))
    return infer_simple_op(g, n);
  if (is_nd_op(op))
    return infer_nd_op(g, n);
  if (is_more_op(op))
    return infer_more_op(g, n);
  if (is_contrib_op(op))
    return infer_contrib_op(g, n);
  if (is_quant_op(op))
    return infer_quant_op(g, n);

  if (is_binary(op) || op == "Where") {
    shape_t s = in(0).shape;
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      auto b = broadcast_shapes(s, in(i).shape);
      if (!b)
        return "input shapes " + shape_string(s) + " and " + shape_string(in(i).shape)
               + " do not broadcast";
      s = *b;
    }
    // Pow's exponent may differ in type (T1, from Pow-12); ONNX's other binary
    // operators and Where's branches take one type.
    size_t first = op == "Where" ? 1 : 0;
    if (op != "Pow" && n.inputs.size() > first + 1 && in(first).dtype != in(first + 1).dtype)
      return "inputs '" + in(first).name + "' (" + std::string(to_string(in(first).dtype))
             + ") and '" + in(first + 1).name + "' (" + std::string(to_string(in(first + 1).dtype))
             + ") differ in type; ONNX's " + op + " takes one type (insert a Cast)";
    datatype t = is_compare(op) ? datatype::bool_ : op == "Where" ? in(1).dtype : in(0).dtype;
    return one(t, s);
  }
  if (is_unary(op)) {
    datatype t = in(0).dtype;
    if (op == "Cast") {
      auto to = cast_target(n);
      if (!to)
        return "Cast to ONNX type " + std::to_string(n.get_i("to", 0))
               + " is not supported (FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT64, INT32, INT16, "
                 "INT8, UINT64, UINT32, UINT16, UINT8 and BOOL are; the engine does not "
                 "compute on STRING)";
      t = *to;
    } else if (op == "CastLike") {
      if (!has(1))
        return std::string("CastLike needs its second input (target_type)");
      t = in(1).dtype;
    }
    bool cast = op == "Cast" || op == "CastLike";
    // run_cast also reads and writes the types held only at the graph's edges.
    auto castable = [](datatype d) {
      return dispatchable(d) || d == datatype::fp16 || d == datatype::bf16 || d == datatype::fp64;
    };
    if (cast && (!castable(in(0).dtype) || !castable(t)))
      return op + " from " + std::string(to_string(in(0).dtype)) + " to "
             + std::string(to_string(t)) + " is not supported (FLOAT, FLOAT16, BFLOAT16, DOUBLE, "
             "INT64, INT32, INT16, INT8, UINT64, UINT32, UINT16, UINT8 and BOOL are)";
    if (!cast && op != "Identity" && t != datatype::fp32) {
      // Relu takes signed integers from Relu-14 on; the other kernels run on FLOAT.
      bool int_relu = op == "Relu" && (g.opset == 0 || g.opset >= 14)
                      && (t == datatype::int64 || t == datatype::int32 || t == datatype::int8);
      // Clip takes every number type; its min and max have the input's.
      bool int_clip = op == "Clip" && t != datatype::bool_;
      if (int_clip)
        for (size_t i = 1; i < 3; ++i)
          if (has(i) && in(i).dtype != t)
            return "min or max '" + in(i).name + "' is " + std::string(to_string(in(i).dtype))
                   + ", not the input's " + std::string(to_string(t)) + "; ONNX's Clip takes one type";
      if (!int_relu && !int_clip)
        return "input '" + in(0).name + "' is " + std::string(to_string(t)) + "; the engine runs "
               + op + " on FP32" + (op == "Relu" ? " (and on INT8, INT32, INT64 from Relu-14)" : "");
    }
    if (op == "Clip")
      for (size_t i = 1; i < 3; ++i)
        if (auto e = need_const(i, "Clip's min and max"))
          return *e;
    return one(t, in(0).shape);
  }
  if (op == "Not")
    return one(datatype::bool_, in(0).shape);
  if (op == "Range") {
    for (size_t i = 0; i < 3; ++i)
      if (auto e = need_const(i, "Range's start, limit and delta")) return *e;
    auto num = [&](int v) {
      const auto& t = *g.values[v].constant;
      return t.dtype == datatype::fp32 ? static_cast<double>(t.as<float>()[0])
             : t.dtype == datatype::int32 ? static_cast<double>(t.as<int32_t>()[0])
                                          : static_cast<double>(t.as<int64_t>()[0]);
    };
    double start = num(n.inputs[0]), limit = num(n.inputs[1]), delta = num(n.inputs[2]);
    int64_t count = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((limit - start) / delta)));
    return one(in(0).dtype, {count});
  }
  if (op == "Constant") {
    if (n.has("value")) {
      auto t = n.attrs.at("value").t;
      return one(t->dtype, t->shape);
    }
    if (n.has("value_float")) return one(datatype::fp32, {});
    if (n.has("value_int")) return one(datatype::int64, {});
    if (n.has("value_ints"))
      return one(datatype::int64, {static_cast<int64_t>(n.get_ints("value_ints").size())});
    if (n.has("value_floats"))
      return one(datatype::fp32,
                 {static_cast<int64_t>(n.attrs.at("value_floats").floats.size())});
    return std::string("Constant without a value attribute the engine reads");
  }
  if (op == "ConstantOfShape") {
    if (auto e = need_const(0, "the shape")) return *e;
    datatype t = n.has("value") ? n.attrs.at("value").t->dtype : datatype::fp32;
    return one(t, const_ints(g, n.inputs[0]));
  }
  if (op == "Shape") {
    int64_t r = static_cast<int64_t>(in(0).shape.size());
    int64_t s = n.get_i("start", 0), e = n.get_i("end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = std::clamp<int64_t>(s, 0, r);
    e = std::clamp<int64_t>(e, 0, r);
    return one(datatype::int64, {std::max<int64_t>(0, e - s)});
  }
  if (op == "Gather") {
    const auto& d = in(0).shape;
    int64_t axis = norm_axis(n.get_i("axis", 0), d.size());
    if (axis < 0 || axis >= static_cast<int64_t>(d.size()))
      return "axis " + std::to_string(n.get_i("axis", 0)) + " is out of range for "
             + shape_string(d);
    shape_t s(d.begin(), d.begin() + axis);
    s.insert(s.end(), in(1).shape.begin(), in(1).shape.end());
    s.insert(s.end(), d.begin() + axis + 1, d.end());
    return one(in(0).dtype, s);
  }
  if (op == "Slice") {
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (auto e = need_const(i, "Slice's starts, ends, axes and steps")) return *e;
    shape_t b, st;
    return one(in(0).dtype,
               slice_params(in(0).shape, const_ints(g, n.inputs[1]), const_ints(g, n.inputs[2]),
                            has(3) ? const_ints(g, n.inputs[3]) : shape_t{},
                            has(4) ? const_ints(g, n.inputs[4]) : shape_t{}, b, st));
  }
  if (op == "Concat") {
    shape_t s = in(0).shape;
    int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      const auto& o = in(i).shape;
      if (o.size() != s.size())
        return "inputs of different ranks: " + shape_string(s) + " and " + shape_string(o);
      s[axis] += o[axis];
    }
    return one(in(0).dtype, s);
  }
  if (op == "Reshape") {
    if (auto e = need_const(1, "the target shape")) return *e;
    auto target = const_ints(g, n.inputs[1]);
    const auto& s = in(0).shape;
    int64_t known = 1, minus = -1;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i] == 0 && !n.get_i("allowzero", 0)) target[i] = s.at(i);
      if (target[i] == -1) minus = static_cast<int64_t>(i);
      else known *= target[i];
    }
    if (minus >= 0) target[minus] = known ? element_count(s) / known : 0;
    if (element_count(target) != element_count(s))
      return "cannot reshape " + shape_string(s) + " to " + shape_string(target);
    return one(in(0).dtype, target);
  }
  if (op == "Flatten") {
    const auto& s = in(0).shape;
    int64_t axis = norm_axis(n.get_i("axis", 1), s.size());
    int64_t a = 1, b = 1;
    for (size_t i = 0; i < s.size(); ++i) (static_cast<int64_t>(i) < axis ? a : b) *= s[i];
    return one(in(0).dtype, {a, b});
  }
  if (op == "Squeeze" || op == "Unsqueeze") {
    if (auto e = need_const(1, "the axes")) return *e;
    auto axes = has(1) ? const_ints(g, n.inputs[1]) : n.get_ints("axes");
    shape_t s = in(0).shape;
    if (op == "Squeeze") {
      if (axes.empty())
        for (size_t i = 0; i < s.size(); ++i) if (s[i] == 1) axes.push_back(i);
      for (auto& a : axes) a = norm_axis(a, s.size());
      shape_t out;
      for (size_t i = 0; i < s.size(); ++i)
        if (std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) == axes.end())
          out.push_back(s[i]);
      return one(in(0).dtype, out);
    }
    size_t r = s.size() + axes.size();
    for (auto& a : axes) a = norm_axis(a, r);
    std::sort(axes.begin(), axes.end());
    for (auto a : axes) s.insert(s.begin() + a, 1);
    return one(in(0).dtype, s);
  }
  if (op == "Expand") {
    if (auto e = need_const(1, "the target shape")) return *e;
    auto b = broadcast_shapes(in(0).shape, const_ints(g, n.inputs[1]));
    if (!b) return "cannot expand " + shape_string(in(0).shape);
    return one(in(0).dtype, *b);
  }
  if (op == "Split") {
    if (auto e = need_const(1, "the split sizes")) return *e;
    const auto& s = in(0).shape;
    int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
    auto sizes = has(1) ? const_ints(g, n.inputs[1]) : shape_t{};
    if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
      return "axis " + std::to_string(n.get_i("axis", 0)) + " is out of range for "
             + shape_string(s);
    if (sizes.empty()) {
      // Equal parts, one per output (num_outputs, which the importer checked
      // against the outputs, from Split-18). Split-18 makes the last part
      // smaller when they do not divide evenly; Split-13 must divide evenly.
      int64_t k = static_cast<int64_t>(n.outputs.size()), d = s[axis];
      if (d % k != 0 && g.opset != 0 && g.opset < 18)
        return "Split-13 divides axis " + std::to_string(axis) + " of " + shape_string(s)
               + " into " + std::to_string(k) + " equal parts, which it cannot; give the sizes "
               "as the 'split' input, or re-export at opset 18 or newer (num_outputs)";
      sizes.assign(k, (d + k - 1) / k);
      sizes.back() = d - sizes[0] * (k - 1);
      if (sizes.back() < 0)
        return "axis " + std::to_string(axis) + " of " + shape_string(s) + " cannot be split "
               "into " + std::to_string(k) + " parts of " + std::to_string(sizes[0])
               + " with a smaller last one (ONNX's rule); give the sizes as the 'split' input";
    }
    if (sizes.size() != n.outputs.size())
      return std::to_string(sizes.size()) + " split sizes for " + std::to_string(n.outputs.size())
             + " outputs";
    int64_t total = 0;
    for (auto sz : sizes) total += sz;
    if (total != s[axis])
      return "split sizes add up to " + std::to_string(total) + ", not to axis "
             + std::to_string(axis) + " of " + shape_string(s);
    std::vector<inferred> out;
    for (auto sz : sizes) {
      shape_t o = s;
      o[axis] = sz;
      out.push_back({in(0).dtype, o});
    }
    return out;
  }
  if (op == "Transpose") {
    const auto& s = in(0).shape;
    auto perm = n.get_ints("perm");
    if (perm.empty())
      for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) perm.push_back(i);
    shape_t o;
    for (auto p : perm) o.push_back(s.at(p));
    return one(in(0).dtype, o);
  }
  if (op == "ReduceMean" || op == "ReduceSum") {
    if (auto e = need_const(1, "the axes")) return *e;
    const auto& s = in(0).shape;
    if (in(0).dtype == datatype::bool_)
      return "input '" + in(0).name + "' is BOOL; the engine reduces numbers (Cast it first)";
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
    return one(in(0).dtype, o);
  }
  if (op == "Softmax" || op == "LayerNormalization" || op == "FusedLayerNorm"
      || op == "BatchNormalization") {
    if (op == "LayerNormalization" && n.outputs.size() > 1) {
      // Mean and InvStdDev: X's shape with the normalized axes 1 (FLOAT, stash_type 1).
      const auto& s = in(0).shape;
      int64_t axis = norm_axis(n.get_i("axis", -1), s.size());
      if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
        return "axis " + std::to_string(n.get_i("axis", -1)) + " is out of range for "
               + shape_string(s);
      shape_t stat = s;
      for (size_t i = axis; i < s.size(); ++i) stat[i] = 1;
      std::vector<inferred> out{{in(0).dtype, s}};
      for (size_t i = 1; i < n.outputs.size(); ++i) out.push_back({datatype::fp32, stat});
      return out;
    }
    return one(in(0).dtype, in(0).shape);
  }
  if (op == "MatMul" || op == "FusedMatMul") {
    auto s = matmul_shape(in(0).shape, in(1).shape);
    if (auto* e = std::get_if<std::string>(&s)) return *e;
    return one(datatype::fp32, std::get<shape_t>(s));
  }
  if (op == "Gemm" || op == "FusedGemm") {
    const auto& a = in(0).shape;
    const auto& b = in(1).shape;
    if (a.size() != 2 || b.size() != 2) return std::string("Gemm needs 2-D inputs");
    int64_t m = n.get_i("transA", 0) ? a[1] : a[0], ka = n.get_i("transA", 0) ? a[0] : a[1];
    int64_t nn = n.get_i("transB", 0) ? b[0] : b[1], kb = n.get_i("transB", 0) ? b[1] : b[0];
    if (ka != kb)
      return "inner dimensions differ: " + shape_string(a) + " x " + shape_string(b);
    return one(datatype::fp32, {m, nn});
  }
  if (op == "Conv" || op == "FusedConv" || op == "MaxPool" || op == "AveragePool"
      || op == "GlobalAveragePool") {
    // MaxPool-12 takes INT8 and UINT8 too; the engine's kernels pool and convolve FP32.
    if (in(0).dtype != datatype::fp32)
      return "input '" + in(0).name + "' is " + std::string(to_string(in(0).dtype))
             + "; the engine runs " + op + " on FP32 (Cast it to FLOAT first)";
  }
  if (op == "Conv" || op == "FusedConv" || op == "MaxPool" || op == "AveragePool") {
    bool pool = op == "MaxPool" || op == "AveragePool";
    if (pool && n.outputs.size() > 1 && n.outputs[1] >= 0)
      return std::string("MaxPool's Indices output is not supported");
    auto geo = conv_geom(n, in(0).shape, pool ? shape_t{} : in(1).shape, pool);
    if (auto* e = std::get_if<std::string>(&geo)) return *e;
    auto c = std::get<conv_geometry>(geo);
    return one(datatype::fp32, {c.n, c.k, c.oh, c.ow});
  }
  if (op == "GlobalAveragePool") {
    shape_t s = in(0).shape;
    for (size_t i = 2; i < s.size(); ++i) s[i] = 1;
    return one(datatype::fp32, s);
  }
  if (op == "FusedAttention")
    return one(datatype::fp32, in(0).shape);
  return "no shape inference for operator '" + op + "'";
}

void run_reference(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  const auto& op = n.op;
  const auto& y = out[0];
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };

  if (is_simple_op(op)) {
    run_simple_op(n, in, out);
    return;
  }
  if (is_nd_op(op)) {
    run_nd_op(n, in, out);
    return;
  }
  if (is_more_op(op)) {
    run_more_op(n, in, out);
    return;
  }
  if (is_contrib_op(op)) {
    run_contrib_op(n, in, out);
    return;
  }
  if (is_quant_op(op)) {
    run_quant_op(n, in, out);
    return;
  }
  if (is_binary(op) || op == "Where") {
    std::array<shape_t, 3> st;
    for (size_t i = 0; i < in.size(); ++i)
      st[i] = broadcast_strides(in[i].shape, y.shape);
    if (op == "Where") {
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
      return;
    }
    std::array<shape_t, 2> st2{st[0], st[1]};
    if (op == "Pow" && in[1].dtype != in[0].dtype) {
      // From Pow-12 on the exponent may have another type than the base
      // (x ** 2 with an INT64 2): computed in double, stored as the base's type.
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
          broadcast_loop<2>(y.shape, st2, [&](int64_t i, const std::array<int64_t, 2>& off) {
            o[i] = static_cast<T>(std::pow(static_cast<double>(a[off[0]]), e[off[1]]));
          });
        }
      });
      return;
    }
    const binary_op bop = binary_op_of(op);
    dispatch(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* a = in[0].as<T>();
        const T* b = in[1].as<T>();
        if (is_compare(op)) {
          bool* o = y.as<bool>();
          broadcast_loop<2>(y.shape, st2, [&](int64_t i, const std::array<int64_t, 2>& off) {
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
          broadcast_loop<2>(y.shape, st2, [&](int64_t i, const std::array<int64_t, 2>& off) {
            o[i] = binary_apply<T>(bop, a[off[0]], b[off[1]]);
          });
        }
      } else {
        const bool* a = in[0].as<bool>();
        const bool* b = in[1].as<bool>();
        bool* o = y.as<bool>();
        broadcast_loop<2>(y.shape, st2, [&](int64_t i, const std::array<int64_t, 2>& off) {
          o[i] = bop == binary_op::mul   ? (a[off[0]] && b[off[1]])
                 : bop == binary_op::add ? (a[off[0]] || b[off[1]])
                                         : compare_apply<bool>(bop, a[off[0]], b[off[1]]);
        });
      }
    });
    return;
  }
  if (op == "Identity") {
    std::memcpy(y.data, in[0].data, y.elements() * element_size(y.dtype));
    return;
  }
  if (op == "Relu" && y.dtype != datatype::fp32) { // Relu-14's integers
    dispatch(y.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_signed_v<T>)
        for (int64_t i = 0; i < y.elements(); ++i)
          y.as<T>()[i] = in[0].as<T>()[i] > 0 ? in[0].as<T>()[i] : T{0};
    });
    return;
  }
  if (op == "Cast" || op == "CastLike") {
    run_cast(n, in[0], y);
    return;
  }
  if (op == "Clip" && y.dtype != datatype::fp32) { // Clip-12 on: integers
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
  if (is_unary(op)) {
    const float* x = in[0].as<float>();
    float* o = y.as<float>();
    int64_t cnt = y.elements();
    if (op == "Clip") {
      float lo = has(1) ? *in[1].as<float>() : -std::numeric_limits<float>::infinity();
      float hi = has(2) ? *in[2].as<float>() : std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < cnt; ++i) o[i] = std::min(std::max(x[i], lo), hi);
      return;
    }
    if (op == "FusedGelu") {
      int64_t nb = has(1) ? in[1].elements() : 0;
      for (int64_t i = 0; i < cnt; ++i) o[i] = gelu(x[i] + (nb ? in[1].as<float>()[i % nb] : 0.f));
      return;
    }
    // The operator chosen once, not per element (a standalone Sigmoid, as in
    // EfficientNet's x * sigmoid(x), took 33 ns an element comparing names).
    auto each = [&](auto f) {
      for (int64_t i = 0; i < cnt; ++i) o[i] = f(x[i]);
    };
    if (op == "Relu") each([](float v) { return v > 0 ? v : 0.0f; });
    else if (op == "Sqrt") each([](float v) { return std::sqrt(v); });
    else if (op == "Erf") each([](float v) { return std::erf(v); });
    else if (op == "Tanh") each([](float v) { return std::tanh(v); });
    else each([](float v) { return 1.0f / (1.0f + std::exp(-v)); });
    return;
  }
  if (op == "Not") {
    for (int64_t i = 0; i < y.elements(); ++i) y.as<bool>()[i] = !in[0].as<bool>()[i];
    return;
  }
  if (op == "Range") {
    dispatch(y.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        T start = *in[0].as<T>(), delta = *in[2].as<T>();
        for (int64_t i = 0; i < y.elements(); ++i)
          y.as<T>()[i] = static_cast<T>(start + static_cast<T>(i) * delta);
      }
    });
    return;
  }
  if (op == "Constant") {
    if (n.has("value")) {
      const auto& t = *n.attrs.at("value").t;
      std::memcpy(y.data, t.bytes.data(), t.bytes.size());
    } else if (n.has("value_float")) {
      *y.as<float>() = n.get_f("value_float", 0);
    } else if (n.has("value_int")) {
      *y.as<int64_t>() = n.get_i("value_int", 0);
    } else if (n.has("value_ints")) {
      auto v = n.get_ints("value_ints");
      std::memcpy(y.data, v.data(), v.size() * 8);
    } else {
      const auto& v = n.attrs.at("value_floats").floats;
      std::memcpy(y.data, v.data(), v.size() * 4);
    }
    return;
  }
  if (op == "ConstantOfShape") {
    size_t es = element_size(y.dtype);
    std::vector<uint8_t> v(es, 0);
    if (n.has("value")) std::memcpy(v.data(), n.attrs.at("value").t->bytes.data(), es);
    for (int64_t i = 0; i < y.elements(); ++i)
      std::memcpy(static_cast<uint8_t*>(y.data) + i * es, v.data(), es);
    return;
  }
  if (op == "Shape") {
    int64_t r = static_cast<int64_t>(in[0].shape.size());
    int64_t s = n.get_i("start", 0);
    if (s < 0) s += r;
    s = std::clamp<int64_t>(s, 0, r);
    for (int64_t i = 0; i < y.elements(); ++i) y.as<int64_t>()[i] = in[0].shape[s + i];
    return;
  }
  if (op == "Gather") {
    const auto& d = in[0].shape;
    int64_t axis = norm_axis(n.get_i("axis", 0), d.size());
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= d[i];
    for (size_t i = axis + 1; i < d.size(); ++i) inner *= d[i];
    auto idx = ref_ints(in[1]);
    size_t es = element_size(y.dtype);
    auto* src = static_cast<const uint8_t*>(in[0].data);
    auto* dst = static_cast<uint8_t*>(y.data);
    for (int64_t o = 0; o < outer; ++o)
      for (size_t j = 0; j < idx.size(); ++j) {
        int64_t k = idx[j] < 0 ? idx[j] + d[axis] : idx[j];
        k = std::clamp<int64_t>(k, 0, d[axis] - 1); // out-of-range ids read the last row
        std::memcpy(dst + ((o * idx.size() + j) * inner) * es,
                    src + ((o * d[axis] + k) * inner) * es, inner * es);
      }
    return;
  }
  if (op == "Slice") {
    shape_t b, step;
    slice_params(in[0].shape, ref_ints(in[1]), ref_ints(in[2]),
                 has(3) ? ref_ints(in[3]) : shape_t{}, has(4) ? ref_ints(in[4]) : shape_t{}, b,
                 step);
    auto own = strides_of(in[0].shape);
    int64_t base = 0;
    shape_t st(own.size());
    for (size_t i = 0; i < own.size(); ++i) {
      base += b[i] * own[i];
      st[i] = own[i] * step[i];
    }
    strided_copy(static_cast<const uint8_t*>(in[0].data), base, y.shape, st,
                 element_size(y.dtype), static_cast<uint8_t*>(y.data));
    return;
  }
  if (op == "Concat") {
    int64_t axis = norm_axis(n.get_i("axis", 0), y.shape.size());
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= y.shape[i];
    size_t es = element_size(y.dtype);
    int64_t row = element_count(y.shape) / std::max<int64_t>(outer, 1);
    int64_t at = 0;
    for (const auto& t : in) {
      int64_t chunk = t.elements() / std::max<int64_t>(outer, 1);
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(static_cast<uint8_t*>(y.data) + (o * row + at) * es,
                    static_cast<const uint8_t*>(t.data) + o * chunk * es, chunk * es);
      at += chunk;
    }
    return;
  }
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") {
    if (y.data != in[0].data)
      std::memcpy(y.data, in[0].data, y.elements() * element_size(y.dtype));
    return;
  }
  if (op == "Expand") {
    std::array<shape_t, 1> st{broadcast_strides(in[0].shape, y.shape)};
    size_t es = element_size(y.dtype);
    broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
      std::memcpy(static_cast<uint8_t*>(y.data) + i * es,
                  static_cast<const uint8_t*>(in[0].data) + off[0] * es, es);
    });
    return;
  }
  if (op == "Split") {
    const auto& s = in[0].shape;
    int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= s[i];
    size_t es = element_size(y.dtype);
    int64_t row = in[0].elements() / std::max<int64_t>(outer, 1);
    int64_t at = 0;
    for (const auto& t : out) {
      int64_t chunk = t.elements() / std::max<int64_t>(outer, 1);
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(static_cast<uint8_t*>(t.data) + o * chunk * es,
                    static_cast<const uint8_t*>(in[0].data) + (o * row + at) * es, chunk * es);
      at += chunk;
    }
    return;
  }
  if (op == "Transpose") {
    const auto& s = in[0].shape;
    auto perm = n.get_ints("perm");
    if (perm.empty())
      for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) perm.push_back(i);
    auto own = strides_of(s);
    shape_t st;
    for (auto p : perm) st.push_back(own[p]);
    strided_copy(static_cast<const uint8_t*>(in[0].data), 0, y.shape, st, element_size(y.dtype),
                 static_cast<uint8_t*>(y.data));
    return;
  }
  if (op == "ReduceMean" || op == "ReduceSum") {
    const auto& s = in[0].shape;
    auto axes = reduce_axes(n, nullptr, has(1) ? &in[1] : nullptr, s.size());
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
          y.as<T>()[i] = static_cast<T>(op == "ReduceMean" ? acc[i] / div : acc[i]);
      }
    });
    return;
  }
  if (op == "Softmax") {
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
    return;
  }
  if (op == "LayerNormalization" || op == "FusedLayerNorm") {
    const auto& s = in[0].shape;
    int64_t axis = norm_axis(n.get_i("axis", -1), s.size());
    int64_t inner = 1;
    for (size_t i = axis; i < s.size(); ++i) inner *= s[i];
    std::vector<float> gamma(inner), beta(inner);
    // Scale and bias broadcast to the normalised dimensions.
    for (int64_t i = 0; i < inner; ++i) {
      gamma[i] = in[1].as<float>()[i % in[1].elements()];
      beta[i] = has(2) ? in[2].as<float>()[i % in[2].elements()] : 0.f;
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
    return;
  }
  if (op == "BatchNormalization") {
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
    return;
  }
  if (op == "MatMul" || op == "FusedMatMul") {
    matmul_reference(in[0], in[1], y);
    if (op == "FusedMatMul") {
      auto act = n.get_s("activation", "");
      int64_t cnt = y.elements();
      int64_t nb = has(2) ? in[2].elements() : 0;
      float* o = y.as<float>();
      for (int64_t i = 0; i < cnt; ++i) {
        float v = o[i] + (nb ? in[2].as<float>()[i % nb] : 0.f);
        o[i] = apply_activation(act, v, n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
        if (has(3)) o[i] += in[3].as<float>()[i];
      }
    }
    return;
  }
  if (op == "Gemm" || op == "FusedGemm") {
    bool ta = n.get_i("transA", 0) != 0, tb = n.get_i("transB", 0) != 0;
    int64_t m = y.shape[0], nn = y.shape[1], k = ta ? in[0].shape[0] : in[0].shape[1];
    float alpha = n.get_f("alpha", 1.0f), beta = n.get_f("beta", 1.0f);
    float* o = y.as<float>();
    if (has(2)) {
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
    return;
  }
  if (op == "Conv" || op == "FusedConv") {
    auto geo = std::get<conv_geometry>(conv_geom(n, in[0].shape, in[1].shape, false));
    conv_reference(geo, in[0].as<float>(), in[1].as<float>(), y.as<float>());
    int64_t plane = geo.oh * geo.ow;
    auto act = n.get_s("activation", "");
    float* o = y.as<float>();
    for (int64_t b = 0; b < geo.n; ++b)
      for (int64_t k = 0; k < geo.k; ++k)
        for (int64_t i = 0; i < plane; ++i) {
          int64_t at = (b * geo.k + k) * plane + i;
          float v = o[at] + (has(2) ? in[2].as<float>()[k] : 0.f);
          if (has(3)) v += in[3].as<float>()[at];
          o[at] = apply_activation(act, v, n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
        }
    return;
  }
  if (op == "MaxPool" || op == "AveragePool") {
    auto geo = std::get<conv_geometry>(conv_geom(n, in[0].shape, {}, true));
    pool_reference(n, geo, in[0].as<float>(), y.as<float>());
    return;
  }
  if (op == "GlobalAveragePool") {
    int64_t nc = in[0].shape[0] * in[0].shape[1];
    int64_t plane = in[0].elements() / nc;
    for (int64_t i = 0; i < nc; ++i) {
      double s = 0;
      for (int64_t j = 0; j < plane; ++j) s += in[0].as<float>()[i * plane + j];
      y.as<float>()[i] = static_cast<float>(s / plane);
    }
    return;
  }
  if (op == "FusedAttention") {
    // [B, S, H*D] per head: scores = Q K^T * scale + M, softmax, x V.
    int64_t b = in[0].shape[0], s = in[0].shape[1], hd = in[0].shape[2];
    int64_t h = n.get_i("num_heads", 1), d = hd / h;
    float scale = n.get_f("scale", 1.0f);
    std::vector<float> scores(s * s);
    shape_t mask_full{b, h, s, s};
    shape_t mst = has(3) ? broadcast_strides(in[3].shape, mask_full) : shape_t{0, 0, 0, 0};
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        const float* q = in[0].as<float>() + bi * s * hd + hi * d;
        const float* k = in[1].as<float>() + bi * s * hd + hi * d;
        const float* v = in[2].as<float>() + bi * s * hd + hi * d;
        for (int64_t i = 0; i < s; ++i)
          for (int64_t j = 0; j < s; ++j) {
            double acc = 0;
            for (int64_t e = 0; e < d; ++e) acc += q[i * hd + e] * k[j * hd + e];
            float m = has(3) ? in[3].as<float>()[bi * mst[0] + hi * mst[1] + i * mst[2]
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
    return;
  }
  assert(!"run_reference: operator without a reference kernel");
}

} // namespace caf_serving::onnx
