#include "onnx_cpu/quant_steps.hpp"

#include "onnx/ops_quant.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>

namespace caf_serving::onnx {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

const tensor_data* constant_of(const graph& g, const node& n, size_t i) {
  if (n.inputs.size() <= i || n.inputs[i] < 0)
    return nullptr;
  return g.values[n.inputs[i]].constant.get();
}

int32_t int_value(const tensor_data& t, int64_t i) {
  if (t.dtype == datatype::int8)
    return t.as<int8_t>()[i];
  if (t.dtype == datatype::uint8)
    return t.as<uint8_t>()[i];
  return t.as<int32_t>()[i];
}

dt dnnl_type(datatype t) {
  return t == datatype::int8 ? dt::s8 : dt::u8;
}

bool is_8bit(datatype t) {
  return t == datatype::int8 || t == datatype::uint8;
}

/// Cuts of `total` elements into spans for `threads`: blocks big enough that
/// a span's bookkeeping is negligible.
std::vector<int64_t> span_cuts(int64_t total, unsigned threads) {
  constexpr int64_t block = 4096;
  return split_range(total, pieces_for((total + block - 1) / block, threads), block, threads);
}

/// The element-wise int8 loops vectorise 8 floats wide with AVX2 (twice the
/// speed of the SSE2 baseline the build targets): compiled again for it and
/// chosen at run time. The arithmetic is the same (no FMA contraction), so
/// the results are the reference kernels' to the bit.
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") != 0;
  return yes;
}

/// QuantizeLinear per tensor as ops_more.cpp's reference: saturate(round_half_even(
/// x / scale) + zero). Saturating before rounding gives the same (the bounds
/// are integers); 1.5 * 2^23 added and taken away rounds half to even.
template <class Q>
inline void quantize_span(const float* __restrict x, Q* __restrict y, int64_t n, float scale,
                          int32_t zero) {
  const float lo = float(std::numeric_limits<Q>::lowest()) - float(zero);
  const float hi = float(std::numeric_limits<Q>::max()) - float(zero);
  for (int64_t i = 0; i < n; ++i) {
    float v = std::min(std::max(x[i] / scale, lo), hi);
    v = (v + 12582912.0f) - 12582912.0f;
    y[i] = static_cast<Q>(static_cast<int32_t>(v) + zero);
  }
}

/// DequantizeLinear per tensor as the reference: (x - zero) * scale.
template <class Q>
inline void dequantize_span(const Q* __restrict x, float* __restrict y, int64_t n, float scale,
                            int32_t zero) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(static_cast<int32_t>(x[i]) - zero) * scale;
}

template <class Q>
__attribute__((target("avx2"))) void quantize_span_avx2(const float* x, Q* y, int64_t n,
                                                        float scale, int32_t zero) {
  quantize_span(x, y, n, scale, zero);
}

template <class Q>
__attribute__((target("avx2"))) void dequantize_span_avx2(const Q* x, float* y, int64_t n,
                                                          float scale, int32_t zero) {
  dequantize_span(x, y, n, scale, zero);
}

template <class Q>
__attribute__((target("avx2"))) void add_span_avx2(const quant_add_params& p, const Q* a,
                                                   const Q* b, Q* c, int64_t n) {
  quant_add_span(p, a, b, c, n);
}

/// A one-value INT32 memory for a runtime zero point.
std::shared_ptr<const dnnl::memory> zero_point_memory(const dnnl::engine& eng, int32_t v) {
  auto m = std::make_shared<dnnl::memory>(dnnl::memory::desc({1}, dt::s32, tag::x), eng);
  *static_cast<int32_t*>(m->get_data_handle()) = v;
  return m;
}

} // namespace

bool qlinear_conv_runs_on_onednn(const graph& g, const node& n) {
  if (n.op != "QLinearConv" || n.inputs.size() < 8)
    return false;
  // The scales, zero points and weights are known at load.
  for (size_t i = 1; i < 8; ++i)
    if (!constant_of(g, n, i))
      return false;
  const auto& w = *constant_of(g, n, 3);
  if (w.dtype != datatype::int8 || w.shape.size() != 4)
    return false; // oneDNN's int8 convolution takes INT8 weights only
  const auto& wz = *constant_of(g, n, 5);
  for (int64_t i = 0; i < wz.elements(); ++i)
    if (int_value(wz, i) != 0)
      return false; // oneDNN has no per-channel weight zero points
  const auto& x = g.values[n.inputs[0]];
  return x.shape.size() == 4
         && std::holds_alternative<quant_conv_geometry>(quant_conv_geometry_of(n, x.shape, w.shape));
}

step qlinear_conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  const auto& xv = g.values[n.inputs[0]];
  const auto& yv = g.values[n.outputs[0]];
  const auto& wc = g.values[n.inputs[3]].constant;
  auto geo = std::get<quant_conv_geometry>(quant_conv_geometry_of(n, xv.shape, wc->shape));
  float x_scale = constant_of(g, n, 1)->as<float>()[0];
  float y_scale = constant_of(g, n, 6)->as<float>()[0];
  const auto& ws = *constant_of(g, n, 4);
  std::vector<float> scales(static_cast<size_t>(ws.elements()));
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = x_scale * ws.as<float>()[i] / y_scale; // as the reference kernel
  int32_t xz = int_value(*constant_of(g, n, 2), 0);
  int32_t yz = int_value(*constant_of(g, n, 7), 0);
  bool has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
  bool relu = n.get_s("activation", "") == "Relu";
  bool x_nhwc = n.get_i("x_nhwc", 0) != 0, y_nhwc = n.get_i("y_nhwc", 0) != 0;
  bool grouped = geo.group > 1;

  auto attr = user_scratchpad_attr();
  attr.set_output_scales(scales.size() > 1 ? 1 << 1 : 0, scales);
  if (xz != 0)
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (yz != 0)
    attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  if (relu) {
    // Applied to the scaled value before the output zero point is added:
    // max(0, v) + y_zero, the output clamped at its zero point.
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  dnnl::memory::dims wdims = grouped ? dnnl::memory::dims{geo.group, geo.k / geo.group,
                                                           geo.c / geo.group, geo.kh, geo.kw}
                                     : dnnl::memory::dims{geo.k, geo.c, geo.kh, geo.kw};
  dnnl::memory::desc wuser(wdims, dt::s8, grouped ? tag::goihw : tag::oihw);
  dnnl::memory::desc wany(wdims, dt::s8, tag::any);
  dnnl::memory::desc bias({geo.k}, dt::s32, tag::x);
  dt x_type = dnnl_type(xv.dtype), y_type = dnnl_type(yv.dtype);

  // Fewer images than threads: each image's output rows split into bands, one
  // per thread, each a convolution of its own over the input rows it reads
  // (its own padding at the edges). NHWC (what oneDNN's AMX and VNNI int8
  // kernels read and write) keeps a band of rows one dense range.
  int64_t pieces = 1;
  std::vector<int64_t> cuts{0, geo.oh};
  if (threads > 1 && geo.n < static_cast<int64_t>(threads) && geo.oh >= 2) {
    cuts = split_range(geo.oh, std::min<int64_t>(threads, geo.oh), 1, threads);
    pieces = static_cast<int64_t>(cuts.size()) - 1;
  }

  // Per piece up to three calls: NCHW input rows -> buffer a (NHWC), the
  // convolution, buffer b (NHWC) -> NCHW output rows. Tensors kept NHWC
  // between int8 nodes (assign_int8_layouts) skip their reorder. Handles:
  // a value (offset per image added at run time), -1 fixed, -2 buffer a, -3 b.
  auto calls = std::make_shared<std::vector<std::vector<dnnl_call>>>();
  size_t a_max = 0, b_max = 0;
  auto reorder_call = [&](const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
    dnnl_call c;
    auto attr_r = user_scratchpad_attr();
    dnnl::reorder::primitive_desc rpd(ctx.eng, from, ctx.eng, to, attr_r);
    c.prim = dnnl::reorder(rpd);
    c.scratch = rpd.scratchpad_desc();
    return c;
  };
  for (int64_t p = 0; p < pieces; ++p) {
    int64_t r0 = cuts[p], rows = cuts[p + 1] - cuts[p];
    int64_t i0 = r0 * geo.sh - geo.ph;
    int64_t i1 = (r0 + rows - 1) * geo.sh - geo.ph + (geo.kh - 1) * geo.dh + 1;
    int64_t top = std::max<int64_t>(0, -i0), bottom = std::max<int64_t>(0, i1 - geo.h);
    int64_t first = std::max<int64_t>(0, i0), in_rows = std::min(geo.h, i1) - first;
    if (pieces == 1) { // the whole image, with the node's own padding
      first = 0;
      in_rows = geo.h;
      top = geo.ph;
      bottom = geo.ph1;
    }
    dnnl::memory::desc src({1, geo.c, in_rows, geo.w}, x_type, tag::nhwc);
    dnnl::memory::desc dst({1, geo.k, rows, geo.ow}, y_type, tag::nhwc);
    dnnl::memory::dims strides{geo.sh, geo.sw}, dil{geo.dh - 1, geo.dw - 1},
      pad_l{top, geo.pw}, pad_r{bottom, geo.pw1};
    auto d = has_bias ? dnnl::convolution_forward::desc(
                          dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                          src, wany, bias, dst, strides, dil, pad_l, pad_r)
                      : dnnl::convolution_forward::desc(
                          dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                          src, wany, dst, strides, dil, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc pd(d, attr, ctx.eng);
    std::vector<dnnl_call> piece;
    int src_handle = n.inputs[0], dst_handle = n.outputs[0];
    int64_t src_off = first * geo.w * geo.c, dst_off = r0 * geo.ow * geo.k; // NHWC bytes
    if (!x_nhwc) {
      // NCHW rows [first, first + in_rows) of every channel: a strided view.
      dnnl::memory::desc rows_nchw({1, geo.c, in_rows, geo.w}, x_type,
                                   dnnl::memory::dims{geo.c * geo.h * geo.w, geo.h * geo.w,
                                                      geo.w, 1});
      piece.push_back(reorder_call(rows_nchw, src));
      piece.back().args.push_back({DNNL_ARG_FROM, rows_nchw, n.inputs[0], first * geo.w, {}});
      piece.back().args.push_back({DNNL_ARG_TO, src, -2, 0, {}});
      a_max = std::max(a_max, src.get_size());
      src_handle = -2;
      src_off = 0;
    }
    if (!y_nhwc) {
      b_max = std::max(b_max, dst.get_size());
      dst_handle = -3;
      dst_off = 0;
    }
    dnnl_call conv;
    conv.prim = dnnl::convolution_forward(pd);
    conv.scratch = pd.scratchpad_desc();
    conv.args.push_back({DNNL_ARG_SRC, src, src_handle, src_off, {}});
    conv.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                         ctx.weights->get(ctx.eng, wc, 0, wuser, pd.weights_desc())});
    if (has_bias)
      conv.args.push_back({DNNL_ARG_BIAS, bias, n.inputs[8], 0, {}});
    if (xz != 0)
      conv.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, {}, -1, 0,
                           zero_point_memory(ctx.eng, xz)});
    if (yz != 0)
      conv.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, {}, -1, 0,
                           zero_point_memory(ctx.eng, yz)});
    conv.args.push_back({DNNL_ARG_DST, dst, dst_handle, dst_off, {}});
    piece.push_back(std::move(conv));
    if (!y_nhwc) {
      dnnl::memory::desc rows_nchw({1, geo.k, rows, geo.ow}, y_type,
                                   dnnl::memory::dims{geo.k * geo.oh * geo.ow, geo.oh * geo.ow,
                                                      geo.ow, 1});
      piece.push_back(reorder_call(dst, rows_nchw));
      piece.back().args.push_back({DNNL_ARG_FROM, dst, -3, 0, {}});
      piece.back().args.push_back({DNNL_ARG_TO, rows_nchw, n.outputs[0], r0 * geo.ow, {}});
    }
    calls->push_back(std::move(piece));
  }

  step s;
  s.kernel = std::string("onednn.qlinear_conv ") + (x_nhwc ? "nhwc" : "nchw") + "->"
             + (y_nhwc ? "nhwc" : "nchw") + (pieces > 1 ? " by row" : "");
  // One item per image and band, run on the plan's threads.
  s.items = geo.n * pieces;
  int64_t x_image = geo.c * geo.h * geo.w, y_image = geo.k * geo.oh * geo.ow; // bytes: 8-bit
  int x = n.inputs[0], y = n.outputs[0];
  s.run = [calls, pieces, x, y, x_image, y_image, a_max, b_max, eng = ctx.eng](void** p,
                                                                               int64_t item) {
    thread_local std::vector<uint8_t> a, b;
    if (a.size() < a_max + 64) a.resize(a_max + 64);
    if (b.size() < b_max + 64) b.resize(b_max + 64);
    auto aligned = [](std::vector<uint8_t>& v) {
      return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 63) / 64 * 64);
    };
    int64_t image = item / pieces;
    for (const auto& c : (*calls)[item % pieces]) {
      const void* handles[8] = {};
      for (size_t i = 0; i < c.args.size() && i < 8; ++i) {
        const auto& arg = c.args[i];
        if (arg.value == -2)
          handles[i] = aligned(a);
        else if (arg.value == -3)
          handles[i] = aligned(b);
        else if (arg.value >= 0)
          handles[i] = static_cast<const uint8_t*>(p[arg.value]) + arg.offset
                       + (arg.value == x ? image * x_image : arg.value == y ? image * y_image : 0);
      }
      run_call(eng, c, handles);
    }
  };
  return s;
}

namespace {

/// Whether `n` reads value `v` only where the NHWC layout suits it: as a
/// QLinearConv's input on oneDNN, or as an input of a QLinearAdd in spans.
bool reads_nhwc(const graph& g, const node& n, int v) {
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] != v)
      continue;
    bool ok = (n.op == "QLinearConv" && i == 0 && qlinear_conv_runs_on_onednn(g, n))
              || (n.op == quant_add_op && (i == 0 || i == 3) && qlinear_add_runs_in_spans(g, n))
              || (n.op == quant_max_pool_op && i == 0);
    if (!ok)
      return false;
  }
  return true;
}

} // namespace

void assign_int8_layouts(graph& g) {
  std::vector<bool> nhwc(g.values.size(), false), is_output(g.values.size(), false);
  for (int o : g.outputs)
    is_output[o] = true;
  std::vector<std::vector<int>> readers(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int v : g.nodes[i].inputs)
      if (v >= 0)
        readers[v].push_back(static_cast<int>(i));
  for (const auto& n : g.nodes) {
    bool writes = (n.op == "QLinearConv" && qlinear_conv_runs_on_onednn(g, n))
                  || (n.op == quant_add_op && qlinear_add_runs_in_spans(g, n))
                  || n.op == quant_max_pool_op;
    if (!writes || n.outputs.empty() || n.outputs[0] < 0)
      continue;
    int v = n.outputs[0];
    if (is_output[v] || g.values[v].shape.size() != 4 || readers[v].empty())
      continue;
    nhwc[v] = std::all_of(readers[v].begin(), readers[v].end(),
                          [&](int r) { return reads_nhwc(g, g.nodes[r], v); });
  }
  // A QLinearAdd (QMaxPool) reads and writes its tensors in one layout: NHWC
  // for all three (two) or for none, until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& n : g.nodes) {
      std::vector<int> tied;
      if (n.op == quant_add_op && qlinear_add_runs_in_spans(g, n))
        tied = {n.inputs[0], n.inputs[3], n.outputs[0]};
      else if (n.op == quant_max_pool_op)
        tied = {n.inputs[0], n.outputs[0]};
      bool all = std::all_of(tied.begin(), tied.end(), [&](int v) { return nhwc[v]; });
      bool none = std::none_of(tied.begin(), tied.end(), [&](int v) { return nhwc[v]; });
      if (all || none)
        continue;
      for (int v : tied)
        nhwc[v] = false;
      changed = true;
    }
  }
  for (auto& n : g.nodes) {
    if (n.op == "QLinearConv" && qlinear_conv_runs_on_onednn(g, n)) {
      n.set_i("x_nhwc", nhwc[n.inputs[0]] ? 1 : 0);
      n.set_i("y_nhwc", nhwc[n.outputs[0]] ? 1 : 0);
    }
    if (n.op == quant_max_pool_op)
      n.set_i("nhwc", nhwc[n.inputs[0]] ? 1 : 0);
  }
}

bool qlinear_add_runs_in_spans(const graph& g, const node& n) {
  if (n.op != quant_add_op || n.inputs.size() < 8)
    return false;
  for (size_t i : {1, 2, 4, 5, 6, 7})
    if (!constant_of(g, n, i))
      return false;
  const auto& y = g.values[n.outputs[0]].shape;
  return g.values[n.inputs[0]].shape == y && g.values[n.inputs[3]].shape == y;
}

step qlinear_add_step(const graph& g, const node& n, unsigned threads) {
  std::vector<tensor_ref> params(8);
  for (size_t i : {1, 2, 4, 5, 6, 7}) {
    const auto& c = *constant_of(g, n, i);
    params[i] = tensor_ref{c.dtype, c.shape, const_cast<uint8_t*>(c.bytes.data())};
  }
  auto p = quant_add_params_of(params);
  int64_t total = element_count(g.values[n.outputs[0]].shape);
  auto cuts = span_cuts(total, threads);
  bool a8 = g.values[n.inputs[0]].dtype == datatype::int8;
  bool b8 = g.values[n.inputs[3]].dtype == datatype::int8;
  bool c8 = g.values[n.outputs[0]].dtype == datatype::int8;
  int a = n.inputs[0], b = n.inputs[3], c = n.outputs[0];
  bool relu = n.get_s("activation", "") == "Relu";
  step s;
  s.kernel = "engine.qlinear_add";
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [=](void** ptrs, int64_t item) {
    int64_t begin = cuts[item], count = cuts[item + 1] - begin;
    auto typed = [&](auto at, auto bt, auto ct) {
      using A = decltype(at);
      using B = decltype(bt);
      using C = decltype(ct);
      C* out = static_cast<C*>(ptrs[c]) + begin;
      const A* ap = static_cast<const A*>(ptrs[a]) + begin;
      const B* bp = static_cast<const B*>(ptrs[b]) + begin;
      if constexpr (std::is_same_v<A, B> && std::is_same_v<A, C>) {
        if (has_avx2())
          add_span_avx2(p, ap, bp, out, count);
        else
          quant_add_span(p, ap, bp, out, count);
      } else {
        quant_add_span(p, ap, bp, out, count);
      }
      if (relu)
        for (int64_t i = 0; i < count; ++i)
          out[i] = std::max(out[i], static_cast<C>(p.c_zero));
    };
    auto with_c = [&](auto at, auto bt) {
      if (c8) typed(at, bt, int8_t{}); else typed(at, bt, uint8_t{});
    };
    auto with_b = [&](auto at) {
      if (b8) with_c(at, int8_t{}); else with_c(at, uint8_t{});
    };
    if (a8) with_b(int8_t{}); else with_b(uint8_t{});
  };
  return s;
}

step qmax_pool_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ys = g.values[n.outputs[0]].shape;
  auto k = n.get_ints("kernel_shape");
  auto st = n.get_ints("strides", {1, 1});
  auto pads = n.get_ints("pads", {0, 0, 0, 0});
  auto d = n.get_ints("dilations", {1, 1});
  dnnl::memory::dims pl{pads[0], pads[1]}, pr;
  for (int i = 0; i < 2; ++i) // the right padding that gives the output's size
    pr.push_back((ys[2 + i] - 1) * st[i] + (k[i] - 1) * d[i] + 1 - xs[2 + i] - pl[i]);
  auto fmt = n.get_i("nhwc", 0) ? tag::nhwc : tag::nchw;
  auto type = dnnl_type(g.values[n.inputs[0]].dtype);
  auto cuts = split_range(ys[0], pieces_for(ys[0], threads), 1, threads);
  std::vector<dnnl_call> calls;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t images = cuts[c + 1] - cuts[c];
    dnnl::memory::desc src({images, xs[1], xs[2], xs[3]}, type, fmt);
    dnnl::memory::desc dst({images, ys[1], ys[2], ys[3]}, type, fmt);
    dnnl::pooling_v2_forward::desc pd(dnnl::prop_kind::forward_inference,
                                      dnnl::algorithm::pooling_max, src, dst, {st[0], st[1]},
                                      {k[0], k[1]}, {d[0] - 1, d[1] - 1}, pl, pr);
    dnnl::pooling_v2_forward::primitive_desc pdesc(pd, user_scratchpad_attr(), ctx.eng);
    dnnl_call call;
    call.prim = dnnl::pooling_v2_forward(pdesc);
    call.scratch = pdesc.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC, src, n.inputs[0], cuts[c] * xs[1] * xs[2] * xs[3], {}});
    call.args.push_back({DNNL_ARG_DST, dst, n.outputs[0], cuts[c] * ys[1] * ys[2] * ys[3], {}});
    calls.push_back(std::move(call));
  }
  auto shared = std::make_shared<std::vector<dnnl_call>>(std::move(calls));
  step s;
  s.kernel = std::string("onednn.qmax_pool ") + (fmt == tag::nhwc ? "nhwc" : "nchw");
  s.items = static_cast<int64_t>(shared->size());
  s.run = [shared, eng = ctx.eng](void** p, int64_t item) {
    const auto& c = (*shared)[item];
    const void* handles[2];
    for (size_t i = 0; i < 2; ++i)
      handles[i] = static_cast<const uint8_t*>(p[c.args[i].value]) + c.args[i].offset;
    run_call(eng, c, handles);
  };
  return s;
}

bool qlinear_matmul_runs_on_onednn(const graph& g, const node& n) {
  if (n.op != "QLinearMatMul" || n.inputs.size() < 8)
    return false;
  for (size_t i = 1; i < 8; ++i)
    if (!constant_of(g, n, i))
      return false;
  if (n.inputs.size() > 8 && n.inputs[8] >= 0 && !constant_of(g, n, 8))
    return false;
  const auto& w = *constant_of(g, n, 3);
  if (w.dtype != datatype::int8 || w.shape.size() != 2)
    return false;
  const auto& wz = *constant_of(g, n, 5);
  for (int64_t i = 0; i < wz.elements(); ++i)
    if (int_value(wz, i) != 0)
      return false;
  const auto& a = g.values[n.inputs[0]].shape;
  return a.size() >= 2 && a.back() == w.shape[0];
}

step qlinear_matmul_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  const auto& av = g.values[n.inputs[0]];
  const auto& yv = g.values[n.outputs[0]];
  const auto& wc = g.values[n.inputs[3]].constant;
  int64_t k = wc->shape[0], cols = wc->shape[1], m = element_count(av.shape) / k;
  float a_scale = constant_of(g, n, 1)->as<float>()[0];
  float y_scale = constant_of(g, n, 6)->as<float>()[0];
  const auto& ws = *constant_of(g, n, 4);
  std::vector<float> scales(static_cast<size_t>(ws.elements()));
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = a_scale * ws.as<float>()[i] / y_scale; // as the reference kernel
  int32_t az = int_value(*constant_of(g, n, 2), 0);
  int32_t yz = int_value(*constant_of(g, n, 7), 0);
  bool has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
  auto attr = user_scratchpad_attr();
  attr.set_output_scales(scales.size() > 1 ? 1 << 1 : 0, scales);
  if (az != 0)
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (yz != 0)
    attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  // Bands of rows, one per thread where there are enough rows; each band is
  // one oneDNN matmul over all the (shared) weights.
  auto cuts = m >= 32 * static_cast<int64_t>(threads)
                ? split_range(m, pieces_for(m / 16, threads), 16, threads)
                : std::vector<int64_t>{0, m};
  dnnl::memory::desc wuser({k, cols}, dt::s8, tag::ab);
  dnnl::memory::desc wany({k, cols}, dt::s8, tag::any);
  dnnl::memory::desc bias({1, cols}, dt::s32, tag::ab);
  std::vector<dnnl_call> calls;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t rows = cuts[c + 1] - cuts[c];
    dnnl::memory::desc src({rows, k}, dnnl_type(av.dtype), tag::ab);
    dnnl::memory::desc dst({rows, cols}, dnnl_type(yv.dtype), tag::ab);
    auto d = has_bias ? dnnl::matmul::desc(src, wany, bias, dst)
                      : dnnl::matmul::desc(src, wany, dst);
    dnnl::matmul::primitive_desc pd(d, attr, ctx.eng);
    dnnl_call call;
    call.prim = dnnl::matmul(pd);
    call.scratch = pd.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC, src, n.inputs[0], cuts[c] * k, {}});
    call.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                         ctx.weights->get(ctx.eng, wc, 0, wuser, pd.weights_desc())});
    if (has_bias)
      call.args.push_back({DNNL_ARG_BIAS, bias, n.inputs[8], 0, {}});
    if (az != 0)
      call.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, {}, -1, 0,
                           zero_point_memory(ctx.eng, az)});
    if (yz != 0)
      call.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, {}, -1, 0,
                           zero_point_memory(ctx.eng, yz)});
    call.args.push_back({DNNL_ARG_DST, dst, n.outputs[0], cuts[c] * cols, {}});
    calls.push_back(std::move(call));
  }
  auto shared = std::make_shared<std::vector<dnnl_call>>(std::move(calls));
  step s;
  s.kernel = "onednn.qlinear_matmul";
  s.items = static_cast<int64_t>(shared->size());
  s.run = [shared, eng = ctx.eng](void** p, int64_t item) {
    const auto& c = (*shared)[item];
    const void* handles[8] = {};
    for (size_t i = 0; i < c.args.size() && i < 8; ++i)
      if (c.args[i].value >= 0)
        handles[i] = static_cast<const uint8_t*>(p[c.args[i].value]) + c.args[i].offset;
    run_call(eng, c, handles);
  };
  return s;
}

bool quant_linear_runs_in_spans(const graph& g, const node& n) {
  if ((n.op != "QuantizeLinear" && n.op != "DequantizeLinear") || n.inputs.size() < 3
      || n.outputs.size() != 1 || n.get_i("block_size", 0) != 0)
    return false;
  const auto* scale = constant_of(g, n, 1);
  const auto* zero = constant_of(g, n, 2);
  if (!scale || !zero || scale->elements() != 1 || zero->elements() != 1
      || scale->dtype != datatype::fp32)
    return false;
  bool q = n.op == "QuantizeLinear";
  const auto& x = g.values[n.inputs[0]];
  const auto& y = g.values[n.outputs[0]];
  const auto& wide = q ? x : y;
  const auto& narrow = q ? y : x;
  return wide.dtype == datatype::fp32 && is_8bit(narrow.dtype) && zero->dtype == narrow.dtype
         && x.shape == y.shape;
}

step quant_linear_step(const graph& g, const node& n, unsigned threads) {
  float scale = constant_of(g, n, 1)->as<float>()[0];
  int32_t zero = int_value(*constant_of(g, n, 2), 0);
  bool q = n.op == "QuantizeLinear";
  bool s8 = g.values[q ? n.outputs[0] : n.inputs[0]].dtype == datatype::int8;
  auto cuts = span_cuts(element_count(g.values[n.outputs[0]].shape), threads);
  int x = n.inputs[0], y = n.outputs[0];
  step s;
  s.kernel = q ? "engine.quantize" : "engine.dequantize";
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [=](void** p, int64_t item) {
    int64_t begin = cuts[item], count = cuts[item + 1] - begin;
    auto typed = [&](auto tag) {
      using Q = decltype(tag);
      if (q) {
        const float* in = static_cast<const float*>(p[x]) + begin;
        Q* out = static_cast<Q*>(p[y]) + begin;
        if (has_avx2())
          quantize_span_avx2(in, out, count, scale, zero);
        else
          quantize_span(in, out, count, scale, zero);
      } else {
        const Q* in = static_cast<const Q*>(p[x]) + begin;
        float* out = static_cast<float*>(p[y]) + begin;
        if (has_avx2())
          dequantize_span_avx2(in, out, count, scale, zero);
        else
          dequantize_span(in, out, count, scale, zero);
      }
    };
    if (s8) typed(int8_t{}); else typed(uint8_t{});
  };
  return s;
}

} // namespace caf_serving::onnx
