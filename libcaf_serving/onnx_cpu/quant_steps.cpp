#include "onnx_cpu/quant_steps.hpp"

#include "onnx/ops_quant.hpp"

#include <memory>

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

  auto attr = user_scratchpad_attr();
  attr.set_output_scales(scales.size() > 1 ? 1 << 1 : 0, scales);
  if (xz != 0)
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (yz != 0)
    attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  // NCHW in the plan's tensors; oneDNN's int8 kernels want their own layout
  // (NHWC or blocked): a plain-layout primitive is its reference loops, some
  // hundred times slower. Each image is reordered in and out around the call.
  dnnl::memory::desc src({1, geo.c, geo.h, geo.w}, dnnl_type(xv.dtype), tag::nchw);
  dnnl::memory::desc dst({1, geo.k, geo.oh, geo.ow}, dnnl_type(yv.dtype), tag::nchw);
  dnnl::memory::desc src_any({1, geo.c, geo.h, geo.w}, dnnl_type(xv.dtype), tag::any);
  dnnl::memory::desc dst_any({1, geo.k, geo.oh, geo.ow}, dnnl_type(yv.dtype), tag::any);
  dnnl::memory::desc bias({geo.k}, dt::s32, tag::x);
  bool grouped = geo.group > 1;
  dnnl::memory::dims wdims = grouped ? dnnl::memory::dims{geo.group, geo.k / geo.group,
                                                           geo.c / geo.group, geo.kh, geo.kw}
                                     : dnnl::memory::dims{geo.k, geo.c, geo.kh, geo.kw};
  dnnl::memory::desc wuser(wdims, dt::s8, grouped ? tag::goihw : tag::oihw);
  dnnl::memory::desc wany(wdims, dt::s8, tag::any);
  dnnl::memory::dims strides{geo.sh, geo.sw}, dil{geo.dh - 1, geo.dw - 1},
    pad_l{geo.ph, geo.pw}, pad_r{geo.ph1, geo.pw1};
  auto d = has_bias ? dnnl::convolution_forward::desc(
                        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                        src_any, wany, bias, dst_any, strides, dil, pad_l, pad_r)
                    : dnnl::convolution_forward::desc(
                        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                        src_any, wany, dst_any, strides, dil, pad_l, pad_r);
  dnnl::convolution_forward::primitive_desc pd(d, attr, ctx.eng);
  auto src_in = pd.src_desc(), dst_in = pd.dst_desc();

  // calls[0]: NCHW image -> buffer a; calls[1]: the convolution, a -> b;
  // calls[2]: b -> NCHW image. Handles: -1 value = fixed, -2 = buffer a, -3 = b.
  auto calls = std::make_shared<std::vector<dnnl_call>>(3);
  auto reorder_call = [&](const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
    dnnl_call c;
    auto attr_r = user_scratchpad_attr();
    dnnl::reorder::primitive_desc rpd(ctx.eng, from, ctx.eng, to, attr_r);
    c.prim = dnnl::reorder(rpd);
    c.scratch = rpd.scratchpad_desc();
    return c;
  };
  (*calls)[0] = reorder_call(src, src_in);
  (*calls)[0].args.push_back({DNNL_ARG_FROM, src, n.inputs[0], 0, {}});
  (*calls)[0].args.push_back({DNNL_ARG_TO, src_in, -2, 0, {}});
  auto& conv = (*calls)[1];
  conv.prim = dnnl::convolution_forward(pd);
  conv.scratch = pd.scratchpad_desc();
  conv.args.push_back({DNNL_ARG_SRC, src_in, -2, 0, {}});
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
  conv.args.push_back({DNNL_ARG_DST, dst_in, -3, 0, {}});
  (*calls)[2] = reorder_call(dst_in, dst);
  (*calls)[2].args.push_back({DNNL_ARG_FROM, dst_in, -3, 0, {}});
  (*calls)[2].args.push_back({DNNL_ARG_TO, dst, n.outputs[0], 0, {}});

  step s;
  s.kernel = "onednn.qlinear_conv";
  // One item per image; the images of a batch run on the plan's threads.
  s.items = geo.n;
  (void)threads;
  int64_t x_image = geo.c * geo.h * geo.w, y_image = geo.k * geo.oh * geo.ow; // bytes: 8-bit
  size_t a_bytes = src_in.get_size(), b_bytes = dst_in.get_size();
  s.run = [calls, x_image, y_image, a_bytes, b_bytes, eng = ctx.eng](void** p, int64_t item) {
    thread_local std::vector<uint8_t> a, b;
    if (a.size() < a_bytes + 64) a.resize(a_bytes + 64);
    if (b.size() < b_bytes + 64) b.resize(b_bytes + 64);
    auto aligned = [](std::vector<uint8_t>& v) {
      return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 63) / 64 * 64);
    };
    for (const auto& c : *calls) {
      std::vector<const void*> handles(c.args.size(), nullptr);
      for (size_t i = 0; i < c.args.size(); ++i) {
        const auto& arg = c.args[i];
        if (arg.value == -2)
          handles[i] = aligned(a);
        else if (arg.value == -3)
          handles[i] = aligned(b);
        else if (arg.value >= 0)
          handles[i] = static_cast<const uint8_t*>(p[arg.value])
                       + (arg.arg == DNNL_ARG_FROM ? item * x_image
                          : arg.arg == DNNL_ARG_TO ? item * y_image
                                                   : 0);
      }
      run_call(eng, c, handles.data());
    }
  };
  return s;
}

} // namespace caf_serving::onnx
