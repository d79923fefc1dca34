#include "onnx_cpu/onednn_steps.hpp"

#include "onnx_cpu/cpu_level.hpp"

#include "engine_kernels.hpp"
#include "onnx/op_registry.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>

namespace caf_serving::onnx {

namespace kc = caf_serving::kernels::cpu;

namespace {

dnnl::memory::dims to_dnnl(const dims_t& d) {
  return dnnl::memory::dims(d.begin(), d.end());
}

/// oneDNN's eltwise algorithm for an activation named as in ops_common.hpp's
/// apply_activation. Throws std::invalid_argument for another name (the
/// plan's compile turns it into a load error): no silent stand-in.
dnnl::algorithm eltwise_of(const std::string& act) {
  if (act == "Relu") return dnnl::algorithm::eltwise_relu;
  if (act == "Gelu") return dnnl::algorithm::eltwise_gelu_erf;
  if (act == "GeluTanh") return dnnl::algorithm::eltwise_gelu_tanh;
  if (act == "Tanh") return dnnl::algorithm::eltwise_tanh;
  if (act == "Sigmoid") return dnnl::algorithm::eltwise_logistic;
  // oneDNN 2.x fixes alpha 1/6 and beta 1/2, as ONNX's HardSwish does; 3.x reads them.
  if (act == "HardSwish") return dnnl::algorithm::eltwise_hardswish;
  if (act == "Swish") return dnnl::algorithm::eltwise_swish; // x * sigmoid(alpha * x)
  if (act == "Clip") return dnnl::algorithm::eltwise_clip;
  throw std::invalid_argument("activation '" + act
                              + "' has no oneDNN epilogue; add it to eltwise_of");
}

/// Per-thread oneDNN state: a stream and the scratchpad buffer.
struct dnnl_thread_state {
  dnnl::stream stream;
  std::vector<uint8_t> scratch;
};

} // namespace

/// Runs `c` with one data handle per argument (fixed arguments ignore theirs).
void run_call(const dnnl::engine& eng, const dnnl_call& c, const void* const* handles) {
  thread_local std::unique_ptr<dnnl_thread_state> ts;
  if (!ts) {
    ts = std::make_unique<dnnl_thread_state>();
    ts->stream = dnnl::stream(eng);
  }
  std::vector<dnnl::memory> mems;
  mems.reserve(c.args.size() + 1);
  std::vector<dnnl_exec_arg_t> args;
  args.reserve(c.args.size() + 1);
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto& a = c.args[i];
    if (a.value < 0 && a.fixed) {
      args.push_back({a.arg, a.fixed->get()});
      continue;
    }
    mems.emplace_back(a.md, eng, const_cast<void*>(handles[i]));
    args.push_back({a.arg, mems.back().get()});
  }
  size_t sbytes = c.scratch.get_size();
  if (sbytes > 0) {
    if (ts->scratch.size() < sbytes + 64)
      ts->scratch.resize(sbytes + 64);
    auto base = reinterpret_cast<uintptr_t>(ts->scratch.data());
    mems.emplace_back(c.scratch, eng, reinterpret_cast<void*>((base + 63) / 64 * 64));
    args.push_back({DNNL_ARG_SCRATCHPAD, mems.back().get()});
  }
  auto st = dnnl_primitive_execute(c.prim.get(), ts->stream.get(), static_cast<int>(args.size()),
                                   args.data());
  if (st != dnnl_success)
    throw dnnl::error(st, "oneDNN could not execute a primitive");
}

namespace {

/// Runs `c` on views into the pointer table.
void execute_call(const dnnl::engine& eng, const dnnl_call& c, void** ptrs) {
  const void* handles[8] = {};
  for (size_t i = 0; i < c.args.size() && i < 8; ++i)
    if (c.args[i].value >= 0)
      handles[i] = static_cast<const uint8_t*>(ptrs[c.args[i].value]) + c.args[i].offset;
  run_call(eng, c, handles);
}

/// A oneDNN step: calls in turn per work item.
step onednn_step(const dnnl_ctx& ctx, std::string kernel,
                 std::vector<std::vector<dnnl_call>> items) {
  step s;
  s.kernel = std::move(kernel);
  s.items = static_cast<int64_t>(items.size());
  auto shared = std::make_shared<const std::vector<std::vector<dnnl_call>>>(std::move(items));
  s.run = [shared, eng = ctx.eng](void** p, int64_t item) {
    for (const auto& c : (*shared)[item])
      execute_call(eng, c, p);
  };
  return s;
}

/// A oneDNN step: one call per work item.
step onednn_step(const dnnl_ctx& ctx, std::string kernel, std::vector<dnnl_call> calls) {
  std::vector<std::vector<dnnl_call>> items;
  for (auto& c : calls)
    items.push_back({std::move(c)});
  return onednn_step(ctx, std::move(kernel), std::move(items));
}

} // namespace

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {

/// Row-major strides of `d`.
dnnl::memory::dims dense_strides(const dnnl::memory::dims& d) {
  dnnl::memory::dims st(d.size(), 1);
  for (int i = static_cast<int>(d.size()) - 2; i >= 0; --i)
    st[i] = st[i + 1] * d[i + 1];
  return st;
}

/// Channels per block of layout::blocked in this process (cpu_level.hpp).
int64_t block() {
  static const int64_t b = process_cpu_level().channel_block;
  return b;
}

const char* layout_name(layout l) {
  if (l == layout::blocked)
    return block() == 16 ? "nChw16c" : "nChw8c";
  return l == layout::nchw ? "nchw" : "nhwc";
}

/// A 4-D NCHW-indexed tensor of shape `s` stored as `l`.
dnnl::memory::desc desc_4d(const dims_t& s, layout l) {
  using dt = dnnl::memory::data_type;
  if (l == layout::blocked)
    return dnnl::memory::desc(to_dnnl(s), dt::f32,
                              block() == 16 ? dnnl::memory::format_tag::nChw16c
                                            : dnnl::memory::format_tag::nChw8c);
  if (l == layout::nhwc)
    return dnnl::memory::desc(to_dnnl(s), dt::f32, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]});
  return dnnl::memory::desc(to_dnnl(s), dt::f32, dense_strides(to_dnnl(s)));
}

/// The layouts assign_layouts() chose for a oneDNN node's input 0 and output
/// (node attributes; the stored tensors have these layouts or the same bytes).
layout src_layout(const node& n) { return static_cast<layout>(n.get_i("src_layout", 0)); }
layout dst_layout(const node& n) { return static_cast<layout>(n.get_i("dst_layout", 0)); }

} // namespace

/// The plan shows it, the loader warns of it, and the tests check that no
/// layout choice at any ISA leads there.
std::string reference_note(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0 ? reference_kernel_note : "";
}

/// How many pieces a step of `work` units splits into for `threads` threads:
/// a few per thread so that a thread the OS runs late leaves little behind.
int64_t pieces_for(int64_t work, unsigned threads) {
  if (threads <= 1)
    return 1;
  return std::max<int64_t>(1, std::min<int64_t>(work, 4 * static_cast<int64_t>(threads)));
}

/// Splits [0, n) into about `pieces` ranges of whole `unit`s; returns the
/// range starts (and n at the end). Prefers a count that divides the units
/// evenly and is a multiple of `threads`, so that no thread gets a piece more.
std::vector<int64_t> split_range(int64_t n, int64_t pieces, int64_t unit, unsigned threads) {
  int64_t units = (n + unit - 1) / unit;
  pieces = std::max<int64_t>(1, std::min(pieces, units));
  for (int64_t p = pieces; p >= static_cast<int64_t>(threads) && p > 1; --p)
    if (units % p == 0 && p % threads == 0) {
      pieces = p;
      break;
    }
  std::vector<int64_t> at;
  for (int64_t p = 0; p < pieces; ++p)
    at.push_back(std::min(n, units * p / pieces * unit));
  at.push_back(n);
  return at;
}

namespace {

/// Output maps smaller than this (either side) skip Winograd: a 4x4 output
/// tile over a 2x2 or 4x4 map is mostly padding, and its transforms cost more
/// than they save. ResNet-50 at 64x64 input (layer3 4x4, layer4 2x2) ran at
/// 0.71x ONNX Runtime's speed at batch 8 with Winograd there, 1.37x without
/// it; at 224 the smallest maps are 7x7 and keep it.
constexpr int64_t winograd_min_map = 7;

/// Whether `n` is a convolution that oneDNN's Winograd kernel (F(4x4, 3x3),
/// about 2x fewer multiplications) should run: 3x3, stride 1, no dilation or
/// groups, an output map (`ys`, NCHW) of at least winograd_min_map a side.
bool winograd_shape(const node& n, const dims_t& wshape, const dims_t& ys) {
  auto st = n.get_ints("strides", {1, 1});
  auto dl = n.get_ints("dilations", {1, 1});
  return n.get_i("group", 1) == 1 && wshape[2] == 3 && wshape[3] == 3 && st[0] == 1
         && st[1] == 1 && dl[0] == 1 && dl[1] == 1 && ys.size() == 4
         && ys[2] >= winograd_min_map && ys[3] >= winograd_min_map;
}

/// Whether the engine's own direct convolution (kernels/cpu/engine_conv.cpp)
/// can run node `n`: no groups, no dilation, nChw16c in and out (blocks of
/// 16: this process runs AVX-512), input channels in whole blocks of 16 and
/// output channels in whole groups of 64, Relu or no activation.
bool engine_conv_fits(const node& n, const dims_t& wshape, layout src_l, layout dst_l) {
  auto dl = n.get_ints("dilations", {1, 1});
  auto act = n.get_s("activation", "");
  return kc::engine_conv_supported() && n.get_i("group", 1) == 1
         && block() == 16 && src_l == layout::blocked && dst_l == layout::blocked
         && wshape[0] % 64 == 0
         && wshape[1] % 16 == 0 && dl[0] == 1 && dl[1] == 1 && (act.empty() || act == "Relu");
}

/// The weights of a convolution that engine_conv_fits() as ONNX has them
/// (oihw) or as the engine's kernel and oneDNN's AVX-512 kernels read them
/// (OIhw16i16o): plans of either kind share the one reordered copy.
dnnl::memory::desc engine_weights(const dims_t& wshape, dnnl::memory::format_tag t) {
  return dnnl::memory::desc(to_dnnl(wshape), dnnl::memory::data_type::f32, t);
}

/// A FusedConv that engine_conv_fits(): work items are bands of output rows
/// (`row_cuts`) times ranges of output channels (`oc_cuts`, whole groups of
/// 64), each over every image of the batch. The weights are packed once into
/// the kernel's groups of 64 output channels (a strided oneDNN reorder
/// through the weight store, so plans share them).
step engine_conv_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                      std::vector<int64_t> row_cuts, std::vector<int64_t> oc_cuts) {
  using tag = dnnl::memory::format_tag;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ys = g.values[n.outputs[0]].shape;
  const auto& w = g.values[n.inputs[1]].constant;
  int64_t oc = w->shape[0], ic = w->shape[1], kh = w->shape[2], kw = w->shape[3];
  auto wmem = ctx.weights->get(ctx.eng, w, 0, engine_weights(w->shape, tag::oihw),
                               engine_weights(w->shape, tag::OIhw16i16o));
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  int x = n.inputs[0], y = n.outputs[0], b = has_bias ? n.inputs[2] : -1,
      r = has_res ? n.inputs[3] : -1;
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  kc::conv_args base;
  base.ic = ic;
  base.oc = oc;
  base.ih = xs[2];
  base.iw = xs[3];
  base.oh = ys[2];
  base.ow = ys[3];
  base.kh = kh;
  base.kw = kw;
  base.stride_h = st[0];
  base.stride_w = st[1];
  base.pad_top = pd[0];
  base.pad_left = pd[1];
  base.relu = n.get_s("activation", "") == "Relu";
  const int64_t images = ys[0], x_image = xs[1] * xs[2] * xs[3], y_image = ys[1] * ys[2] * ys[3];
  const int64_t oc_pieces = static_cast<int64_t>(oc_cuts.size()) - 1;
  step s;
  s.kernel = std::string("engine.conv nChw16c->nChw16c")
             + (row_cuts.size() > 2 ? " by row" : oc_pieces > 1 ? " by channel" : "");
  s.items = (static_cast<int64_t>(row_cuts.size()) - 1) * oc_pieces;
  s.run = [=](void** p, int64_t item) {
    kc::conv_args a = base;
    a.w = static_cast<const float*>(wmem->get_data_handle());
    a.bias = b >= 0 ? static_cast<const float*>(p[b]) : nullptr;
    a.row_begin = row_cuts[item / oc_pieces];
    a.row_end = row_cuts[item / oc_pieces + 1];
    a.oc_begin = oc_cuts[item % oc_pieces];
    a.oc_end = oc_cuts[item % oc_pieces + 1];
    for (int64_t i = 0; i < images; ++i) {
      a.x = static_cast<const float*>(p[x]) + i * x_image;
      a.y = static_cast<float*>(p[y]) + i * y_image;
      a.residual = r >= 0 ? static_cast<const float*>(p[r]) + i * y_image : nullptr;
      kc::engine_conv(a);
    }
  };
  return s;
}

/// What a oneDNN convolution of one node runs on: views of its input, weights
/// (format any) and output, the rows of padding above and below them (a band
/// of rows has its own), and whether to try Winograd.
struct conv_views {
  dnnl::memory::desc src, weights, dst;
  int64_t pad_top = 0, pad_bottom = 0;
  bool try_winograd = false;
  /// false: bias only; the residual and the activation run after it (epilogue_call).
  bool epilogue = true;
};

/// The primitive conv_pdesc() chose, and whether it is Winograd's.
struct conv_choice {
  dnnl::convolution_forward::primitive_desc pd;
  bool winograd = false;
};

/// The oneDNN convolution of node `n` (its strides, dilations, left and right
/// padding, bias, residual and activation) on `v`: Winograd when asked for and
/// oneDNN has a kernel for it, else direct.
conv_choice conv_pdesc(const dnnl_ctx& ctx, const node& n, const conv_views& v) {
  using dt = dnnl::memory::data_type;
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  auto act = n.get_s("activation", "");
  dnnl::memory::desc bias({v.dst.dims()[1]}, dt::f32, dnnl::memory::format_tag::a);
  dnnl::post_ops po;
  if (has_res && v.epilogue)
    po.append_binary(dnnl::algorithm::binary_add, v.dst);
  if (!act.empty() && v.epilogue)
    po.append_eltwise(1.0f, eltwise_of(act), n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
  auto attr = user_scratchpad_attr();
  attr.set_post_ops(po);
  dnnl::memory::dims strides{st[0], st[1]}, dilations{dl[0] - 1, dl[1] - 1};
  dnnl::memory::dims pad_l{v.pad_top, pd[1]}, pad_r{v.pad_bottom, pd[3]};
  auto make = [&](dnnl::algorithm alg) {
    auto d = has_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, alg,
                                                        v.src, v.weights, bias, v.dst, strides,
                                                        dilations, pad_l, pad_r)
                      : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, alg,
                                                        v.src, v.weights, v.dst, strides,
                                                        dilations, pad_l, pad_r);
    return dnnl::convolution_forward::primitive_desc(d, attr, ctx.eng);
  };
  if (v.try_winograd) {
    try {
      return {make(dnnl::algorithm::convolution_winograd), true};
    } catch (const dnnl::error&) {
      // No Winograd kernel for this shape or CPU: the direct one below.
    }
  }
  return {make(dnnl::algorithm::convolution_direct), false};
}

/// The residual add and the activation of convolution `n` as a oneDNN binary
/// primitive over its output `dst` (a view at `offset` bytes), in place: the
/// second call where the convolution's kernel cannot take them (conv_step).
dnnl_call epilogue_call(const dnnl_ctx& ctx, const node& n, const dnnl::memory::desc& dst,
                        int64_t offset) {
  auto act = n.get_s("activation", "");
  dnnl::post_ops po;
  if (!act.empty())
    po.append_eltwise(1.0f, eltwise_of(act), n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
  auto attr = user_scratchpad_attr();
  attr.set_post_ops(po);
  dnnl::binary::primitive_desc pd(dnnl::binary::desc(dnnl::algorithm::binary_add, dst, dst, dst),
                                  attr, ctx.eng);
  dnnl_call c;
  c.prim = dnnl::binary(pd);
  c.scratch = pd.scratchpad_desc();
  c.args = {{DNNL_ARG_SRC_0, dst, n.outputs[0], offset, {}},
            {DNNL_ARG_SRC_1, dst, n.inputs[3], offset, {}},
            {DNNL_ARG_DST, dst, n.outputs[0], offset, {}}};
  return c;
}

/// The input rows [begin, end) that output rows [a, b) of a convolution read,
/// and the rows of padding that remain above and below them.
struct band_input {
  int64_t begin, end, pad_top, pad_bottom;
};

/// band_input for a kernel `ext_h` rows tall (with dilation), `stride` and
/// `pad_top` rows of padding above an input of `height` rows.
band_input rows_read(int64_t a, int64_t b, int64_t stride, int64_t pad_top, int64_t ext_h,
                     int64_t height) {
  int64_t first = a * stride - pad_top;
  int64_t begin = std::max<int64_t>(0, first);
  int64_t end = std::min<int64_t>(height, (b - 1) * stride - pad_top + ext_h);
  int64_t above = begin - first;
  return {begin, end, above, (b - a - 1) * stride + ext_h - (end - begin) - above};
}

/// This thread's buffer for the dense copies of one band of a banded
/// convolution: 64-byte aligned, at least `floats` long. It grows to the
/// largest band the thread has run (bounded by the model's largest layer).
float* band_buffer(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats + 16)
    buf.resize(floats + 16);
  auto base = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((base + 63) / 64 * 64);
}

/// One band of output rows of a banded convolution: the oneDNN call on dense
/// copies (input rows [ih0, ih0 + in_rows), output rows [oh0, oh0 + out_rows)).
struct conv_band {
  dnnl_call call;
  int64_t ih0, in_rows, oh0, out_rows;
};

/// A FusedConv (no residual) of one blocked image split into bands of output
/// rows, one per work item. oneDNN's fast kernels want dense tensors, and a
/// band of rows of nChw16c is not one (each block of channels holds all
/// rows): each item copies its input rows (with the rows the kernel reads
/// above and below) into a dense buffer, runs oneDNN on it, and copies its
/// output rows back. Each thread then reads only its band of the input, where
/// a channel split has every thread read (and Winograd transform) all of it.
step banded_conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads,
                      const onnx_model_config& mcfg) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& w = g.values[n.inputs[1]].constant;
  const auto& ys = g.values[n.outputs[0]].shape;
  const bool try_winograd = mcfg.winograd && winograd_shape(n, w->shape, ys);
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  int64_t ext_h = (w->shape[2] - 1) * dl[0] + 1;
  // Two bands per thread, so that a thread the OS runs late leaves less
  // behind, but no more: each band reads the rows above and below it too.
  // Winograd computes tiles of 4x4 output pixels: bands of whole tiles.
  auto cuts = split_range(ys[2], std::min<int64_t>(ys[2], 2 * threads), try_winograd ? 4 : 1,
                          threads);
  dnnl::memory::desc wuser(to_dnnl(w->shape), dt::f32, tag::oihw);
  dnnl::memory::desc wany(to_dnnl(w->shape), dt::f32, tag::any);
  dnnl::memory::desc bias({ys[1]}, dt::f32, tag::a);
  auto bands = std::make_shared<std::vector<conv_band>>();
  std::string impl;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t a = cuts[c], b = cuts[c + 1];
    auto in = rows_read(a, b, st[0], pd[0], ext_h, xs[2]);
    auto src = desc_4d({1, xs[1], in.end - in.begin, xs[3]}, layout::blocked);
    auto dst = desc_4d({1, ys[1], b - a, ys[3]}, layout::blocked);
    auto [pdesc, wino] =
      conv_pdesc(ctx, n, {src, wany, dst, in.pad_top, in.pad_bottom, try_winograd});
    if (impl.empty())
      impl = std::string(wino ? "winograd" : "direct") + reference_note(pdesc);
    conv_band band{{}, in.begin, in.end - in.begin, a, b - a};
    band.call.prim = dnnl::convolution_forward(pdesc);
    band.call.scratch = pdesc.scratchpad_desc();
    band.call.args.push_back({DNNL_ARG_SRC, src, -1, 0, {}});
    band.call.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                              ctx.weights->get(ctx.eng, w, 0, wuser, pdesc.weights_desc())});
    if (has_bias)
      band.call.args.push_back({DNNL_ARG_BIAS, bias, -1, 0, {}});
    band.call.args.push_back({DNNL_ARG_DST, dst, -1, 0, {}});
    bands->push_back(std::move(band));
  }
  int x = n.inputs[0], y = n.outputs[0], bv = has_bias ? n.inputs[2] : -1;
  int64_t ic = xs[1], ih = xs[2], iw = xs[3], oc = ys[1], oh = ys[2], ow = ys[3];
  step s;
  const std::string blocked = layout_name(layout::blocked);
  s.kernel = "onednn.conv." + impl.substr(0, impl.find(' ')) + " " + blocked + "->" + blocked
             + " by row (copies)"
             + (impl.find(' ') == std::string::npos ? "" : impl.substr(impl.find(' ')));
  s.items = static_cast<int64_t>(bands->size());
  const int64_t cb = block();
  s.run = [=, eng = ctx.eng](void** p, int64_t item) {
    const conv_band& band = (*bands)[item];
    size_t in_span = static_cast<size_t>((ic * band.in_rows * iw + 15) / 16 * 16);
    float* in = band_buffer(in_span + static_cast<size_t>(oc * band.out_rows * ow));
    float* out = in + in_span;
    const float* x_at = static_cast<const float*>(p[x]);
    for (int64_t ib = 0; ib < ic / cb; ++ib)
      std::memcpy(in + ib * band.in_rows * iw * cb, x_at + (ib * ih + band.ih0) * iw * cb,
                  sizeof(float) * cb * band.in_rows * iw);
    const void* handles[4] = {in, nullptr, bv >= 0 ? p[bv] : out, out};
    run_call(eng, band.call, handles);
    float* y_at = static_cast<float*>(p[y]);
    for (int64_t ob = 0; ob < oc / cb; ++ob)
      std::memcpy(y_at + (ob * oh + band.oh0) * ow * cb, out + ob * band.out_rows * ow * cb,
                  sizeof(float) * cb * band.out_rows * ow);
  };
  return s;
}

/// Whether `n` is a depthwise convolution (one input and one output channel
/// per group, as MobileNet's and EfficientNet's): oneDNN's depthwise kernels
/// read and write the blocked layout, so it stays blocked between the 1x1
/// convolutions around it (measured in NHWC with reorders around it:
/// MobileNetV3 ran at 0.65x the speed of an all-NHWC plan at AVX2, batch 1).
bool depthwise(const node& n, const dims_t& xs, const dims_t& ys) {
  int64_t group = n.get_i("group", 1);
  return group > 1 && xs.size() == 4 && ys.size() == 4 && group == xs[1] && group == ys[1];
}

} // namespace

/// FusedConv over 4-D tensors as oneDNN convolutions, one call per work item.
/// Several images split by image. One image stored blocked splits by output
/// channels (whole blocks, each item with its slice of the weights, and a
/// depthwise one with its slice of the input too), or,
/// where its input outweighs its weights, into bands of output rows (on the
/// engine's 1x1 kernel, else on dense copies: banded_conv_step); one image
/// stored NHWC splits into bands of output rows (which stay dense).
/// 3x3 stride-1 convolutions on blocked tensors use Winograd when `winograd` is set and
/// oneDNN has the kernel.
step conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads,
               const layout_map& lay, const onnx_model_config& mcfg) {
  const bool winograd = mcfg.winograd;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& w = *g.values[n.inputs[1]].constant;
  const auto& ys = g.values[n.outputs[0]].shape;
  int64_t group = n.get_i("group", 1);
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  layout src_l = src_layout(n), dst_l = dst_layout(n);
  const bool dw = depthwise(n, xs, ys);
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  // Bytes of one image: the same in every layout.
  auto image_bytes = [](const dims_t& s) { return s[1] * s[2] * s[3] * 4; };
  enum class split { none, images, channels, rows } how = split::none;
  std::vector<int64_t> cuts{0, ys[0]};
  if (threads > 1 && ys[0] > 1) {
    how = split::images;
    cuts = split_range(ys[0], pieces_for(ys[0], threads), 1, threads);
  } else if (threads > 1 && dst_l == layout::blocked && (group == 1 || dw) && ys[1] >= 32) {
    // One piece per thread: each piece reads (and for a strided 1x1 oneDNN
    // gathers, for Winograd transforms) all of the input again. ResNet-50,
    // batch 1, 2 threads, plans run in turn in one process: 1.01x the speed of
    // pieces of 128 channels (up to 4 per thread), and 4 pieces per thread
    // ran at 0.94x.
    how = split::channels;
    cuts = split_range(ys[1], threads, block(), threads);
  } else if (threads > 1 && src_l == layout::nhwc && dst_l == layout::nhwc) {
    // Every band reads all the weights: keep at least 64 output pixels per band
    // so that it does enough work per weight read, but give each thread one.
    how = split::rows;
    int64_t pieces = std::max<int64_t>(std::min<int64_t>(threads, ys[2]),
                                       std::min(pieces_for(ys[2], threads), ys[2] * ys[3] / 64));
    cuts = split_range(ys[2], pieces, 1, threads);
  }
  int64_t ext_h = (w.shape[2] - 1) * dl[0] + 1;
  int64_t w_per_oc = w.elements() / w.shape[0];
  // Each piece of a channel split transforms the whole input again: with
  // fewer than 64 channels a piece, Winograd loses its lead (measured on
  // ResNet-50's 64-channel 56x56 layers: no faster on 2 threads than on 1).
  int64_t narrowest = how == split::channels ? ys[1] : 0;
  for (size_t c = 0; how == split::channels && c + 1 < cuts.size(); ++c)
    narrowest = std::min(narrowest, cuts[c + 1] - cuts[c]);
  bool try_winograd = winograd && src_l == layout::blocked && dst_l == layout::blocked
                      && winograd_shape(n, w.shape, ys)
                      && (how != split::channels || narrowest >= 64);
  // The engine's direct kernel runs every convolution it fits that Winograd
  // does not: the 1x1 layers and the strided 3x3 ones of ResNet-50.
  // - One image on one thread: ResNet-50 ran at 1.04x with it for the 1x1
  //   layers than with oneDNN's, and 1.03x more with the strided 3x3 too.
  // - One image on several threads splits into bands of output rows where
  //   its input outweighs its weights: each thread reads its band of the
  //   input and all the weights, where a oneDNN channel split has every thread
  //   read all of the input (oneDNN runs a band of rows of nChw16c with its
  //   reference kernel only); ResNet-50, 2 threads: 1.077x the oneDNN-only
  //   plan. Else into ranges of output channels, where there are groups of
  //   64 enough for every thread, up to 4 ranges per thread: each range's
  //   kernel call reads the input again, but it would anyway for every group
  //   of 64, and the work pool hands a slower core's last ranges to the
  //   other (1.02-1.04x one range per thread).
  // - Several images keep oneDNN for layers whose weights outweigh an image:
  //   it reuses the weights across images, the engine's kernel streams them
  //   again for every image (ResNet-50 at batch 32 fell from 1.12-1.20x
  //   ONNX Runtime's speed to 0.99-1.04x).
  // (All measured with plans in turn in one process, caf-onnx-bench --versus.)
  const bool input_heavy = image_bytes(xs) >= w.elements() * 4;
  const bool engine = mcfg.engine_conv && !(winograd && winograd_shape(n, w.shape, ys))
                      && engine_conv_fits(n, w.shape, src_l, dst_l);
  if (engine) {
    if (how == split::none && (ys[0] == 1 || input_heavy))
      return engine_conv_step(ctx, g, n, {0, ys[2]}, {0, ys[1]});
    if (how == split::channels && (input_heavy || ys[1] / 64 < threads))
      return engine_conv_step(
        ctx, g, n,
        split_range(ys[2], std::min<int64_t>(ys[2], pieces_for(ys[2], threads)), 1, threads),
        {0, ys[1]});
    if (how == split::channels)
      return engine_conv_step(ctx, g, n, {0, ys[2]},
                              split_range(ys[1], pieces_for(ys[1] / 64, threads), 64, threads));
  }
  // Other convolutions of one image whose input outweighs its weights
  // (ResNet-50's Winograd 3x3 layers of stage 1, and those the engine's kernel
  // does not fit) run by bands of rows too, as oneDNN calls on dense copies of
  // each band.
  if (how == split::channels && mcfg.conv_bands && group == 1 && !has_res
      && xs[1] % block() == 0 && ys[1] % block() == 0 && (w.shape[2] > 1 || w.shape[3] > 1)
      && input_heavy)
    return banded_conv_step(ctx, g, n, threads, mcfg);
  std::vector<std::vector<dnnl_call>> calls;
  std::string impl;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t a = cuts[c], b = cuts[c + 1];
    dims_t xsub = xs, ysub = ys, wd = w.shape;
    int64_t xoff = 0, yoff = 0, woff = 0, boff = 0, pad_t = pd[0], pad_b = pd[2];
    if (how == split::images || how == split::none) {
      xsub[0] = ysub[0] = b - a;
      xoff = a * image_bytes(xs);
      yoff = a * image_bytes(ys);
    } else if (how == split::channels) {
      ysub[1] = wd[0] = b - a;
      yoff = a * ys[2] * ys[3] * 4;
      woff = a * w_per_oc * 4;
      boff = a * 4;
      if (dw) { // its own blocks of the input too
        xsub[1] = b - a;
        xoff = a * xs[2] * xs[3] * 4;
      }
    } else {
      auto in = rows_read(a, b, st[0], pd[0], ext_h, xs[2]);
      pad_t = in.pad_top;
      pad_b = in.pad_bottom;
      xsub[2] = in.end - in.begin;
      ysub[2] = b - a;
      xoff = in.begin * xs[3] * xs[1] * 4;
      yoff = a * ys[3] * ys[1] * 4;
    }
    tag wtag = tag::oihw;
    if (group > 1) {
      int64_t groups = dw ? ysub[1] : group; // a channel piece of a depthwise one: its own
      wd = {groups, wd[0] / groups, wd[1], wd[2], wd[3]};
      wtag = tag::goihw;
    }
    dnnl::memory::desc wuser(to_dnnl(wd), dt::f32, wtag);
    // Whole weights of a layer the engine's kernel runs in other plans: the
    // layout it reads, so that both share one copy; else oneDNN's choice.
    // (With `engine` a channel split never gets here.)
    dnnl::memory::desc wasked(to_dnnl(wd), dt::f32, engine ? tag::OIhw16i16o : tag::any);
    dnnl::memory::desc bias({ysub[1]}, dt::f32, tag::a);
    auto src = desc_4d(xsub, src_l);
    auto dst = desc_4d(ysub, dst_l);
    auto [pdesc, wino] = conv_pdesc(ctx, n, {src, wasked, dst, pad_t, pad_b, try_winograd});
    // oneDNN 2.6's im2col convolution (x64:gemm:jit), which it takes where it
    // has no direct kernel (ConvNeXt's 7x7 depthwise over a 2x2 map, NHWC),
    // adds a residual post-op at the wrong places (relative error 0.95, seen
    // with groups): with it the residual and the activation run as a second call.
    bool split_epilogue = has_res
                          && std::string(pdesc.impl_info_str()).find("gemm") != std::string::npos;
    if (split_epilogue)
      pdesc = conv_pdesc(ctx, n, {src, wasked, dst, pad_t, pad_b, false, false}).pd;
    if (impl.empty())
      impl = std::string(wino ? "winograd" : "direct") + (split_epilogue ? "+binary" : "")
             + reference_note(pdesc);
    dnnl_call call;
    call.prim = dnnl::convolution_forward(pdesc);
    call.scratch = pdesc.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC, src, n.inputs[0], xoff, {}});
    call.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                         ctx.weights->get(ctx.eng, g.values[n.inputs[1]].constant, woff, wuser,
                                          pdesc.weights_desc())});
    if (has_bias)
      call.args.push_back({DNNL_ARG_BIAS, bias, n.inputs[2], boff, {}});
    if (has_res && !split_epilogue)
      call.args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, dst, n.inputs[3],
                           yoff, {}});
    call.args.push_back({DNNL_ARG_DST, dst, n.outputs[0], yoff, {}});
    std::vector<dnnl_call> item{std::move(call)};
    if (split_epilogue)
      item.push_back(epilogue_call(ctx, n, dst, yoff));
    calls.push_back(std::move(item));
  }
  static const char* split_names[] = {"", " by image", " by channel", " by row"};
  return onednn_step(ctx,
                     "onednn.conv." + impl.substr(0, impl.find(' ')) + " " + layout_name(src_l)
                       + "->" + layout_name(dst_l) + split_names[static_cast<int>(how)]
                       + (impl.find(' ') == std::string::npos ? "" : impl.substr(impl.find(' '))),
                     std::move(calls));
}

bool pool_runs_on_onednn(const graph& g, const node& n) {
  // oneDNN 2.6 has only its reference kernel for dilated windows (opset 10's
  // MaxPool, 19's AveragePool), slower than the engine's own in NCHW once the
  // two reorders around it are counted.
  auto dl = n.get_ints("dilations", {});
  if (std::any_of(dl.begin(), dl.end(), [](int64_t d) { return d != 1; }))
    return false;
  if (n.op != "AveragePool" || !n.get_i("count_include_pad", 0))
    return true;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ys = g.values[n.outputs[0]].shape;
  auto k = n.get_ints("kernel_shape");
  auto st = n.get_ints("strides", {1, 1});
  auto pads = n.get_ints("pads", {0, 0, 0, 0});
  auto d = n.get_ints("dilations", {1, 1});
  if (xs.size() != 4 || ys.size() != 4 || k.size() != 2 || st.size() != 2 || pads.size() != 4
      || d.size() != 2)
    return true; // pool_step() is not reached: inference refused these shapes
  for (int i = 0; i < 2; ++i)
    if ((ys[2 + i] - 1) * st[i] + (k[i] - 1) * d[i] + 1 - xs[2 + i] - pads[i] > pads[2 + i])
      return false;
  return true;
}

/// Pooling as oneDNN calls: by image when there are several, by blocks of
/// channels (dense in the blocked layout) for one image, else one call.
step pool_step(const dnnl_ctx& ctx, const graph& g, const node& n, const layout_map& lay,
               unsigned threads) {
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ys = g.values[n.outputs[0]].shape;
  layout src_l = src_layout(n), dst_l = dst_layout(n);
  dims_t k, st, pl, pr, dil{0, 0};
  dnnl::algorithm alg;
  if (n.op == "GlobalAveragePool") {
    k = {xs[2], xs[3]};
    st = {1, 1};
    pl = pr = {0, 0};
    alg = dnnl::algorithm::pooling_avg_exclude_padding;
  } else {
    k = n.get_ints("kernel_shape");
    st = n.get_ints("strides", {1, 1});
    auto pads = n.get_ints("pads", {0, 0, 0, 0});
    auto d = n.get_ints("dilations", {1, 1});
    dil = {d[0] - 1, d[1] - 1};
    pl = {pads[0], pads[1]};
    // Right padding that gives ONNX's output size (ceil_mode included).
    for (int i = 0; i < 2; ++i)
      pr.push_back((ys[2 + i] - 1) * st[i] + (k[i] - 1) * d[i] + 1 - xs[2 + i] - pl[i]);
    alg = n.op == "MaxPool" ? dnnl::algorithm::pooling_max
          : n.get_i("count_include_pad", 0) ? dnnl::algorithm::pooling_avg_include_padding
                                            : dnnl::algorithm::pooling_avg_exclude_padding;
  }
  bool by_image = threads > 1 && ys[0] > 1;
  bool by_channel = threads > 1 && !by_image && src_l == layout::blocked
                    && dst_l == layout::blocked;
  auto cuts = by_image     ? split_range(ys[0], pieces_for(ys[0], threads), 1, threads)
              : by_channel ? split_range(ys[1], pieces_for(ys[1] / block(), threads), block(),
                                         threads)
                           : std::vector<int64_t>{0, ys[0]};
  std::vector<dnnl_call> calls;
  std::string note;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    dims_t xsub = xs, ysub = ys;
    int64_t xoff, yoff;
    if (by_channel) {
      xsub[1] = ysub[1] = cuts[c + 1] - cuts[c];
      xoff = cuts[c] * xs[2] * xs[3] * 4;
      yoff = cuts[c] * ys[2] * ys[3] * 4;
    } else {
      xsub[0] = ysub[0] = cuts[c + 1] - cuts[c];
      xoff = cuts[c] * xs[1] * xs[2] * xs[3] * 4;
      yoff = cuts[c] * ys[1] * ys[2] * ys[3] * 4;
    }
    auto src = desc_4d(xsub, src_l);
    auto dst = desc_4d(ysub, dst_l);
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, src, dst,
                                     to_dnnl(st), to_dnnl(k), to_dnnl(dil), to_dnnl(pl),
                                     to_dnnl(pr));
    dnnl::pooling_v2_forward::primitive_desc pdesc(d, user_scratchpad_attr(), ctx.eng);
    dnnl_call call;
    call.prim = dnnl::pooling_v2_forward(pdesc);
    note = reference_note(pdesc);
    call.scratch = pdesc.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC, src, n.inputs[0], xoff, {}});
    call.args.push_back({DNNL_ARG_DST, dst, n.outputs[0], yoff, {}});
    calls.push_back(std::move(call));
  }
  return onednn_step(ctx,
                     std::string("onednn.pool ") + layout_name(src_l)
                       + (by_image ? " by image" : by_channel ? " by channel" : "") + note,
                     std::move(calls));
}

/// A channel scale (is_channel_scale: Mul of [N,C,H,W] by [N or 1,C,1,1]) as
/// oneDNN's binary multiply in the tensor's layout, split by image.
step channel_scale_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ss = g.values[n.inputs[1]].shape;
  layout l = src_layout(n);
  bool by_image = threads > 1 && xs[0] > 1;
  auto cuts = by_image ? split_range(xs[0], pieces_for(xs[0], threads), 1, threads)
                       : std::vector<int64_t>{0, xs[0]};
  std::vector<dnnl_call> calls;
  std::string note;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t images = cuts[c + 1] - cuts[c];
    dims_t xsub{images, xs[1], xs[2], xs[3]};
    dims_t ssub{ss[0] == 1 ? 1 : images, ss[1], 1, 1};
    int64_t xoff = cuts[c] * xs[1] * xs[2] * xs[3] * 4;
    int64_t soff = ss[0] == 1 ? 0 : cuts[c] * ss[1] * 4;
    auto x = desc_4d(xsub, l);
    // [n,C,1,1] has the same bytes in every layout (C a multiple of the block
    // where the tensor is blocked); described in the tensor's, oneDNN 2.6 takes
    // its fast kernel (in NCHW against nChw16c, its reference one).
    auto s = desc_4d(ssub, l);
    dnnl::binary::desc d(dnnl::algorithm::binary_mul, x, s, x);
    dnnl::binary::primitive_desc pdesc(d, user_scratchpad_attr(), ctx.eng);
    dnnl_call call;
    call.prim = dnnl::binary(pdesc);
    note = reference_note(pdesc);
    call.scratch = pdesc.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC_0, x, n.inputs[0], xoff, {}});
    call.args.push_back({DNNL_ARG_SRC_1, s, n.inputs[1], soff, {}});
    call.args.push_back({DNNL_ARG_DST, x, n.outputs[0], xoff, {}});
    calls.push_back(std::move(call));
  }
  return onednn_step(ctx,
                     std::string("onednn.channel_scale ") + layout_name(l)
                       + (by_image ? " by image" : "") + note,
                     std::move(calls));
}

/// ToNHWC / ToBlocked / ToNCHW: a oneDNN reorder between two layouts of one 4-D tensor.
step reorder_step(const dnnl_ctx& ctx, const graph& g, const node& n, const layout_map& lay) {
  const auto& shape = g.values[n.inputs[0]].shape;
  auto src = desc_4d(shape, lay[n.inputs[0]]);
  auto dst = desc_4d(shape, lay[n.outputs[0]]);
  dnnl::reorder::primitive_desc pdesc(ctx.eng, src, ctx.eng, dst, user_scratchpad_attr());
  dnnl_call call;
  call.prim = dnnl::reorder(pdesc);
  call.scratch = pdesc.scratchpad_desc();
  call.args.push_back({DNNL_ARG_FROM, src, n.inputs[0], 0, {}});
  call.args.push_back({DNNL_ARG_TO, dst, n.outputs[0], 0, {}});
  std::vector<dnnl_call> calls;
  calls.push_back(std::move(call));
  return onednn_step(ctx, "onednn.reorder" + reference_note(pdesc), std::move(calls));
}

namespace {

/// Whether `n` multiplies a 4-D tensor (input 0) by one value per image and
/// channel ([N,C,1,1] or [1,C,1,1]): squeeze-and-excitation's scale, which then
/// runs in the tensor's layout instead of between two reorders to NCHW.
bool is_channel_scale(const graph& g, const node& n) {
  if (n.op != "Mul" || n.inputs.size() != 2 || n.inputs[0] < 0 || n.inputs[1] < 0)
    return false;
  const auto& x = g.values[n.inputs[0]];
  const auto& s = g.values[n.inputs[1]];
  const auto& y = g.values[n.outputs[0]];
  return x.shape.size() == 4 && s.shape.size() == 4 && !x.constant && x.dtype == datatype::fp32
         && s.dtype == datatype::fp32 && y.shape == x.shape
         && (s.shape[0] == x.shape[0] || s.shape[0] == 1) && s.shape[1] == x.shape[1]
         && s.shape[2] == 1 && s.shape[3] == 1;
}

bool runs_on_onednn_4d(const graph& g, const node& n) {
  bool spatial = (n.op == "FusedConv" && g.values[n.inputs[1]].constant)
                 || ((n.op == "MaxPool" || n.op == "AveragePool") && pool_runs_on_onednn(g, n))
                 || n.op == "GlobalAveragePool" || is_channel_scale(g, n);
  return spatial && g.values[n.inputs[0]].shape.size() == 4;
}

/// Whether oneDNN has an optimised kernel for depthwise convolution `n` with
/// both tensors blocked. Its depthwise kernels have none for some windows
/// (ConvNeXt's 7x7 with padding 3 over a 2x2 map: ref:any, at every ISA);
/// NHWC has one there.
bool blocked_depthwise_is_fast(const graph& g, const node& n) {
  static const dnnl::engine probe(dnnl::engine::kind::cpu, 0);
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ys = g.values[n.outputs[0]].shape;
  const auto& w = g.values[n.inputs[1]].shape;
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  int64_t group = n.get_i("group", 1);
  dnnl::memory::desc wany({group, w[0] / group, w[1], w[2], w[3]}, dnnl::memory::data_type::f32,
                          dnnl::memory::format_tag::any);
  try {
    auto choice = conv_pdesc({probe, nullptr}, n,
                             {desc_4d(xs, layout::blocked), wany, desc_4d(ys, layout::blocked),
                              pd[0], pd[2], false});
    return reference_note(choice.pd).empty();
  } catch (const dnnl::error&) {
    return false;
  }
}

/// A channel scale (Mul) reads and writes the tensor as it is stored.
std::pair<layout, layout> channel_scale_layouts(const graph&, const layout_map& lay,
                                                const node& n) {
  layout stored = lay[n.inputs[0]];
  return {stored, stored};
}

/// A convolution's: the blocked layout needs whole blocks of channels and no
/// groups, or depthwise ones.
std::pair<layout, layout> conv_layouts(const graph& g, const layout_map& lay, const node& n) {
  const auto& in = g.values[n.inputs[0]].shape;
  const auto& out = g.values[n.outputs[0]].shape;
  layout stored = lay[n.inputs[0]];
  bool blocked_out = out[1] % block() == 0
                     && (n.get_i("group", 1) == 1
                         || (depthwise(n, in, out) && blocked_depthwise_is_fast(g, n)));
  if (blocked_out && in[1] % block() == 0)
    return {layout::blocked, layout::blocked};
  if (blocked_out && in[1] < block() && stored == layout::nchw)
    return {layout::nchw, layout::blocked};
  return {layout::nhwc, layout::nhwc};
}

/// The layouts a oneDNN node reads its input 0 in and writes its output in.
/// oneDNN's fast kernels want both in one layout, except an image's few NCHW
/// channels written nChw16c; other mixes run its reference kernel (measured:
/// 73 ms instead of 0.04 ms for an 8-channel 64x64 convolution reading NCHW and
/// writing NHWC).
std::pair<layout, layout> node_layouts(const graph& g, const layout_map& lay, const node& n) {
  using layouts_of = std::pair<layout, layout> (*)(const graph&, const layout_map&, const node&);
  static const std::map<std::string, layouts_of> own{
    {"FusedConv", &conv_layouts}, {"Mul", &channel_scale_layouts}};
  if (auto it = own.find(n.op); it != own.end())
    return it->second(g, lay, n);
  // The pools: blocked where the input is or can be, else NHWC.
  const auto& in = g.values[n.inputs[0]].shape;
  layout stored = lay[n.inputs[0]];
  bool blocked = stored == layout::blocked || (stored == layout::nchw && in[1] % block() == 0);
  return blocked ? std::make_pair(layout::blocked, layout::blocked)
                 : std::make_pair(layout::nhwc, layout::nhwc);
}

/// Whether value `v` stored as `a` has the bytes of layout `b` too: a 1x1
/// spatial tensor is the same in NCHW, NHWC and (whole blocks) the blocked layout.
bool same_bytes(const graph& g, int v, layout a, layout b) {
  const auto& s = g.values[v].shape;
  if (a == b)
    return true;
  if (s.size() != 4 || s[2] * s[3] != 1)
    return false;
  return (a != layout::blocked && b != layout::blocked) || s[1] % block() == 0;
}

} // namespace

/// Stores convolution and pooling tensors in oneDNN's layouts (node_layouts),
/// inserting reorder nodes where a tensor passes between them and the other
/// operators or between two layouts. Records each oneDNN node's choice in its
/// src_layout/dst_layout attributes.
layout_map assign_layouts(graph& g, bool blocked) {
  std::vector<bool> is_output(g.values.size(), false);
  for (int o : g.outputs) is_output[o] = true;
  layout_map lay(g.values.size(), layout::nchw);
  std::map<std::pair<int, layout>, int> converted;
  std::vector<node> nodes;
  auto add_value = [&](int like, layout l) {
    int nv = g.add_value(g.values[like].name + "/" + layout_name(l), datatype::fp32,
                         g.values[like].shape, true);
    lay.resize(g.values.size(), layout::nchw);
    lay[nv] = l;
    return nv;
  };
  auto reorder = [&](int from, int to) {
    const char* op = lay[to] == layout::nchw   ? "ToNCHW"
                     : lay[to] == layout::nhwc ? "ToNHWC"
                                               : "ToBlocked";
    nodes.push_back(node{op, g.values[to].name + "/reorder", {from}, {to}, {}});
  };
  auto convert = [&](int v, layout to) {
    auto key = std::make_pair(v, to);
    if (auto it = converted.find(key); it != converted.end()) return it->second;
    int nv = add_value(v, to);
    reorder(v, nv);
    converted[key] = nv;
    return nv;
  };
  for (auto n : g.nodes) {
    // torchvision's SE writes scale * x: the tensor first, as the step reads it.
    if (n.op == "Mul" && n.inputs.size() == 2 && n.inputs[0] >= 0 && n.inputs[1] >= 0) {
      node swapped = n;
      std::swap(swapped.inputs[0], swapped.inputs[1]);
      if (!is_channel_scale(g, n) && is_channel_scale(g, swapped))
        n = swapped;
    }
    bool dn = runs_on_onednn_4d(g, n);
    layout src = layout::nchw, out = layout::nchw;
    if (dn) {
      std::tie(src, out) = node_layouts(g, lay, n);
      if (!blocked && n.op != "Mul") // a channel scale keeps the layout it finds
        src = out = layout::nhwc;
      n.set_i("src_layout", static_cast<int64_t>(src));
      n.set_i("dst_layout", static_cast<int64_t>(out));
    }
    // Input 0 and a convolution's residual are read in the node's layouts,
    // every other input NCHW.
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (v < 0 || g.values[v].constant) continue;
      layout want = !dn ? layout::nchw : i == 0 ? src
                    : n.op == "FusedConv" && i == 3 ? out : layout::nchw;
      if (!same_bytes(g, v, lay[v], want))
        n.inputs[i] = convert(v, want);
    }
    if (!dn) {
      nodes.push_back(n);
      continue;
    }
    // The output: in the node's layout, except a 1x1 one (stored NCHW, the
    // same bytes) and a graph output, written through a reorder to NCHW.
    int o = n.outputs[0];
    if (same_bytes(g, o, layout::nchw, out)) {
      nodes.push_back(n);
    } else if (is_output[o]) {
      n.outputs[0] = add_value(o, out);
      nodes.push_back(n);
      reorder(n.outputs[0], o);
    } else {
      lay[o] = out;
      nodes.push_back(n);
    }
  }
  g.nodes = std::move(nodes);
  lay.resize(g.values.size(), layout::nchw);
  return lay;
}

/// FusedMatMul: A [..., K] x constant W [K, N] + bias, activation, + residual;
/// also FusedGemm with W stored [N, K] (`trans_w`). Many rows split into bands
/// of rows sharing the weights; few rows split into bands of 64 columns, each
/// with its own slice of the weights.
step matmul_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads,
                 bool trans_w) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const auto& as = g.values[n.inputs[0]].shape;
  const auto& w = *g.values[n.inputs[1]].constant;
  int64_t k = as.back(), nn = trans_w ? w.shape[0] : w.shape[1];
  int64_t m = element_count(as) / k;
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  auto act = n.get_s("activation", "");
  int64_t pieces = pieces_for(std::max<int64_t>(1, m / 32 + nn / 64), threads);
  bool by_rows = m >= 64 * pieces || nn < 128;
  auto cuts = by_rows ? split_range(m, pieces, 16, threads) : split_range(nn, pieces, 64, threads);
  std::vector<dnnl_call> calls;
  std::string note;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t a = cuts[c], b = cuts[c + 1];
    int64_t mc = by_rows ? b - a : m, nc = by_rows ? nn : b - a;
    int64_t col0 = by_rows ? 0 : a, row0 = by_rows ? a : 0;
    dnnl::memory::desc src({mc, k}, dt::f32, tag::ab);
    dnnl::memory::desc wuser({k, nc}, dt::f32, trans_w ? dnnl::memory::dims{1, k}
                                                         : dnnl::memory::dims{nn, 1});
    dnnl::memory::desc wany({k, nc}, dt::f32, tag::any);
    dnnl::memory::desc dst({mc, nc}, dt::f32, {nn, 1});
    dnnl::memory::desc bias({1, nc}, dt::f32, tag::ab);
    dnnl::post_ops po;
    if (!act.empty())
      po.append_eltwise(1.0f, eltwise_of(act), n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
    if (has_res)
      po.append_binary(dnnl::algorithm::binary_add, dst);
    auto attr = user_scratchpad_attr();
    attr.set_post_ops(po);
    auto d = has_bias ? dnnl::matmul::desc(src, wany, bias, dst)
                      : dnnl::matmul::desc(src, wany, dst);
    dnnl::matmul::primitive_desc pdesc(d, attr, ctx.eng);
    note = reference_note(pdesc);
    int64_t out_off = (row0 * nn + col0) * 4;
    dnnl_call call;
    call.prim = dnnl::matmul(pdesc);
    call.scratch = pdesc.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC, src, n.inputs[0], row0 * k * 4, {}});
    call.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                         ctx.weights->get(ctx.eng, g.values[n.inputs[1]].constant,
                                          col0 * (trans_w ? k : 1) * 4, wuser,
                                          pdesc.weights_desc())});
    if (has_bias)
      call.args.push_back({DNNL_ARG_BIAS, bias, n.inputs[2], col0 * 4, {}});
    if (has_res)
      call.args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(act.empty() ? 0 : 1) | DNNL_ARG_SRC_1,
                           dst, n.inputs[3], out_off, {}});
    call.args.push_back({DNNL_ARG_DST, dst, n.outputs[0], out_off, {}});
    calls.push_back(std::move(call));
  }
  return onednn_step(ctx, "onednn.matmul" + note, std::move(calls));
}

} // namespace caf_serving::onnx
