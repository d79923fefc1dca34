#include "onnx_cpu/quant_steps.hpp"

#include "onnx/ops_quant.hpp"
#include "onnx_cpu/cpu_level.hpp"

#include "cpu_isa.hpp"

#include <algorithm>
#include <limits>
#include <map>
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
/// chosen at run time (engine_isa_level(): ONEDNN_MAX_CPU_ISA caps it too).
/// The arithmetic is the same (no FMA contraction), so the results are the
/// reference kernels' to the bit.
bool has_avx2() {
  static const bool yes = kernels::cpu::engine_isa_level() >= kernels::cpu::isa_level::avx2;
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

// ------------------------------------------------------- the exact path (no VNNI)
//
// Without VNNI (AVX2, or AVX-512 without VNNI), oneDNN's int8 kernels multiply
// u8 sources by s8 weights with vpmaddubsw, which adds each two neighbouring
// products into a saturating 16-bit sum: 255 * 127 * 2 = 64,770 does not fit,
// and the answer is wrong wherever a model's values are that large. For an s8
// source, oneDNN also halves the weights (rounding them) to stay clear of it.
// The exact path keeps every sum in range:
// - the weights split into w = 2 * hi + lo, hi = floor(w / 2) in [-64, 63]
//   and lo in {0, 1}: 255 * 64 * 2 = 32,640 fits;
// - an s8 source is flipped to u8 (x + 128, its zero point too), so that no
//   weights are halved;
// - oneDNN computes both products' INT32 sums (zero point included), and the
//   engine adds 2 * hi + lo + bias and requantises them as the reference
//   kernel does, to the bit.
// Twice the multiplications of the VNNI path's; docs/onnx-int8.md measures it.

namespace {

/// INT8 weights `w` as {hi, lo} with w = 2 * hi + lo (see above).
std::pair<constant_ptr, constant_ptr> split_int8_weights(const tensor_data& w) {
  auto hi = make_tensor(datatype::int8, w.shape);
  auto lo = make_tensor(datatype::int8, w.shape);
  const int8_t* v = w.as<int8_t>();
  for (int64_t i = 0; i < w.elements(); ++i) {
    hi->as_mut<int8_t>()[i] = static_cast<int8_t>(v[i] >> 1); // arithmetic: floor(v / 2)
    lo->as_mut<int8_t>()[i] = static_cast<int8_t>(v[i] & 1);
  }
  return {hi, lo};
}

/// y = x + 128 as u8 for an s8 `x`: flips the sign bit (y may be x).
inline void flip_to_u8(const uint8_t* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<uint8_t>(x[i] ^ 0x80u);
}

/// What the exact path's requantisation needs: per-column multipliers (or
/// one), the output zero point and the clamp Relu sets.
struct split_requant {
  std::vector<float> multipliers;
  int32_t zero = 0;
  bool relu = false;
};

/// `rows` rows of `cols` outputs: y = saturate(round_half_even((2 * hi + lo +
/// bias) * multiplier) + zero), clamped at zero with Relu: the reference
/// kernel's arithmetic (ops_quant.cpp's requantize and clamp_at_zero_point).
/// 1.5 * 2^23 added and taken away rounds half to even (|v| <= 255 here).
template <class Q>
inline void requantize_split(const int32_t* __restrict hi, const int32_t* __restrict lo,
                             const int32_t* __restrict bias, const split_requant& r,
                             int64_t rows, int64_t cols, Q* __restrict y) {
  const float low = r.relu ? 0.0f : float(std::numeric_limits<Q>::lowest()) - float(r.zero);
  const float high = float(std::numeric_limits<Q>::max()) - float(r.zero);
  const float* m = r.multipliers.data();
  const bool per_col = r.multipliers.size() > 1;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      int64_t e = i * cols + j;
      int32_t acc = 2 * hi[e] + lo[e] + (bias ? bias[j] : 0);
      float v = std::min(std::max(static_cast<float>(acc) * m[per_col ? j : 0], low), high);
      v = (v + 12582912.0f) - 12582912.0f;
      y[e] = static_cast<Q>(static_cast<int32_t>(v) + r.zero);
    }
}

template <class Q>
__attribute__((target("avx2"))) void requantize_split_avx2(const int32_t* hi, const int32_t* lo,
                                                           const int32_t* bias,
                                                           const split_requant& r, int64_t rows,
                                                           int64_t cols, Q* y) {
  requantize_split(hi, lo, bias, r, rows, cols, y);
}

__attribute__((target("avx2"))) void flip_to_u8_avx2(const uint8_t* x, uint8_t* y, int64_t n) {
  flip_to_u8(x, y, n);
}

/// requantize_split() into 8-bit `type`, vectorised where the engine runs AVX2.
void requantize_split_to(dt type, const int32_t* hi, const int32_t* lo, const int32_t* bias,
                         const split_requant& r, int64_t rows, int64_t cols, void* y) {
  if (type == dt::s8) {
    auto* out = static_cast<int8_t*>(y);
    if (has_avx2())
      requantize_split_avx2(hi, lo, bias, r, rows, cols, out);
    else
      requantize_split(hi, lo, bias, r, rows, cols, out);
  } else {
    auto* out = static_cast<uint8_t*>(y);
    if (has_avx2())
      requantize_split_avx2(hi, lo, bias, r, rows, cols, out);
    else
      requantize_split(hi, lo, bias, r, rows, cols, out);
  }
}

void flip_to_u8_fast(const uint8_t* x, uint8_t* y, int64_t n) {
  if (has_avx2())
    flip_to_u8_avx2(x, y, n);
  else
    flip_to_u8(x, y, n);
}

/// The two calls of one piece of the exact path: the same primitive over the
/// weights' two halves, each into an INT32 buffer. Arguments: source, weights
/// (fixed), [source zero point (fixed)], destination.
struct split_calls {
  dnnl_call hi, lo;
};

split_calls split_calls_of(const dnnl_ctx& ctx, const dnnl::primitive& prim,
                           const dnnl::memory::desc& scratch, const dnnl::memory::desc& src,
                           const dnnl::memory::desc& dst, const dnnl::memory::desc& wuser,
                           const dnnl::memory::desc& wwant,
                           const std::pair<constant_ptr, constant_ptr>& w, int32_t src_zero) {
  split_calls s;
  for (auto* c : {&s.hi, &s.lo}) {
    c->prim = prim;
    c->scratch = scratch;
    const auto& half = c == &s.hi ? w.first : w.second;
    c->args.push_back({DNNL_ARG_SRC, src, 0, 0, {}});
    c->args.push_back(
      {DNNL_ARG_WEIGHTS, {}, -1, 0, ctx.weights->get(ctx.eng, half, 0, wuser, wwant)});
    if (src_zero != 0)
      c->args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, {}, -1, 0,
                         zero_point_memory(ctx.eng, src_zero)});
    c->args.push_back({DNNL_ARG_DST, dst, 0, 0, {}});
  }
  return s;
}

/// Runs one of split_calls on `src` into `dst`.
void run_split_call(const dnnl::engine& eng, const dnnl_call& c, const void* src, void* dst) {
  const void* handles[4] = {src, nullptr, nullptr, nullptr};
  handles[c.args.size() - 1] = dst;
  run_call(eng, c, handles);
}

/// The attributes of the exact path's primitives: a runtime source zero
/// point where there is one, nothing else (INT32 out, unscaled).
dnnl::primitive_attr split_attr(int32_t src_zero) {
  auto attr = user_scratchpad_attr();
  if (src_zero != 0)
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  return attr;
}

} // namespace

namespace {

/// What both QLinearConv steps read of node `n`, and the pieces it splits
/// into: fewer images than threads split each image's output rows into bands,
/// one per thread, each a convolution of its own over the input rows it reads
/// (its own padding at the edges). NHWC (what oneDNN's AMX and VNNI int8
/// kernels read and write) keeps a band of rows one dense range.
struct qconv_node {
  struct band {
    int64_t first, in_rows; ///< input rows read
    int64_t top, bottom;    ///< rows of padding above and below them
    int64_t r0, rows;       ///< output rows written
  };
  quant_conv_geometry geo;
  std::vector<float> multipliers; ///< x_scale * w_scale[k] / y_scale, as the reference
  int32_t xz = 0, yz = 0;
  bool has_bias = false, relu = false, x_nhwc = false, y_nhwc = false;
  dt x_type = dt::u8, y_type = dt::u8;
  dnnl::memory::desc wuser; ///< the INT8 weights as ONNX has them (oihw or goihw)
  std::vector<band> bands;
};

qconv_node qconv_node_of(const graph& g, const node& n, unsigned threads) {
  const auto& xv = g.values[n.inputs[0]];
  const auto& wc = g.values[n.inputs[3]].constant;
  qconv_node q;
  q.geo = std::get<quant_conv_geometry>(quant_conv_geometry_of(n, xv.shape, wc->shape));
  const auto& geo = q.geo;
  float x_scale = constant_of(g, n, 1)->as<float>()[0];
  float y_scale = constant_of(g, n, 6)->as<float>()[0];
  const auto& ws = *constant_of(g, n, 4);
  for (int64_t i = 0; i < ws.elements(); ++i)
    q.multipliers.push_back(x_scale * ws.as<float>()[i] / y_scale); // as the reference kernel
  q.xz = int_value(*constant_of(g, n, 2), 0);
  q.yz = int_value(*constant_of(g, n, 7), 0);
  q.has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
  q.relu = n.get_s("activation", "") == "Relu";
  q.x_nhwc = n.get_i("x_nhwc", 0) != 0;
  q.y_nhwc = n.get_i("y_nhwc", 0) != 0;
  q.x_type = dnnl_type(xv.dtype);
  q.y_type = dnnl_type(g.values[n.outputs[0]].dtype);
  bool grouped = geo.group > 1;
  dnnl::memory::dims wdims = grouped ? dnnl::memory::dims{geo.group, geo.k / geo.group,
                                                           geo.c / geo.group, geo.kh, geo.kw}
                                     : dnnl::memory::dims{geo.k, geo.c, geo.kh, geo.kw};
  q.wuser = dnnl::memory::desc(wdims, dt::s8, grouped ? tag::goihw : tag::oihw);
  std::vector<int64_t> cuts{0, geo.oh};
  if (threads > 1 && geo.n < static_cast<int64_t>(threads) && geo.oh >= 2)
    cuts = split_range(geo.oh, std::min<int64_t>(threads, geo.oh), 1, threads);
  for (size_t p = 0; p + 1 < cuts.size(); ++p) {
    int64_t r0 = cuts[p], rows = cuts[p + 1] - cuts[p];
    if (cuts.size() == 2) { // the whole image, with the node's own padding
      q.bands.push_back({0, geo.h, geo.ph, geo.ph1, r0, rows});
      continue;
    }
    int64_t i0 = r0 * geo.sh - geo.ph;
    int64_t i1 = (r0 + rows - 1) * geo.sh - geo.ph + (geo.kh - 1) * geo.dh + 1;
    int64_t first = std::max<int64_t>(0, i0);
    q.bands.push_back({first, std::min(geo.h, i1) - first, std::max<int64_t>(0, -i0),
                       std::max<int64_t>(0, i1 - geo.h), r0, rows});
  }
  return q;
}

/// The source zero point of the exact path's convolution: an s8 source is
/// flipped to u8, x + 128, and its zero point with it.
int32_t exact_src_zero(const qconv_node& q) {
  return q.xz + (q.x_type == dt::s8 ? 128 : 0);
}

/// The VNNI path's attributes: the requantisation (output scales, zero
/// points, Relu) in oneDNN.
dnnl::primitive_attr qconv_vnni_attr(const qconv_node& q) {
  auto attr = user_scratchpad_attr();
  attr.set_output_scales(q.multipliers.size() > 1 ? 1 << 1 : 0, q.multipliers);
  if (q.xz != 0)
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (q.yz != 0)
    attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  if (q.relu) {
    // Applied to the scaled value before the output zero point is added:
    // max(0, v) + y_zero, the output clamped at its zero point.
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  return attr;
}

/// oneDNN's int8 convolution of `q` over one band, NHWC in and out, on the
/// path of this process (cpu_level.hpp): with VNNI, the node's own types, bias
/// and requantisation; on the exact path, a u8 source into INT32 sums.
dnnl::convolution_forward::primitive_desc qconv_pdesc(const dnnl::engine& eng,
                                                      const qconv_node& q,
                                                      const qconv_node::band& b) {
  const auto& geo = q.geo;
  const bool vnni = process_cpu_level().int8_vnni;
  dnnl::memory::desc src({1, geo.c, b.in_rows, geo.w}, vnni ? q.x_type : dt::u8, tag::nhwc);
  dnnl::memory::desc dst({1, geo.k, b.rows, geo.ow}, vnni ? q.y_type : dt::s32, tag::nhwc);
  dnnl::memory::desc wany(q.wuser.dims(), dt::s8, tag::any);
  dnnl::memory::desc bias({geo.k}, dt::s32, tag::x);
  dnnl::memory::dims strides{geo.sh, geo.sw}, dil{geo.dh - 1, geo.dw - 1},
    pad_l{b.top, geo.pw}, pad_r{b.bottom, geo.pw1};
  auto d = vnni && q.has_bias
             ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, src, wany,
                                               bias, dst, strides, dil, pad_l, pad_r)
             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, src, wany,
                                               dst, strides, dil, pad_l, pad_r);
  return dnnl::convolution_forward::primitive_desc(
    d, vnni ? qconv_vnni_attr(q) : split_attr(exact_src_zero(q)), eng);
}

/// A reorder of one band's rows between NCHW (a strided view of the whole
/// image's channels) and NHWC, as a call whose two handles are set at run time.
dnnl_call band_reorder(const dnnl_ctx& ctx, const dnnl::memory::desc& from,
                       const dnnl::memory::desc& to) {
  dnnl::reorder::primitive_desc rpd(ctx.eng, from, ctx.eng, to, user_scratchpad_attr());
  dnnl_call c;
  c.prim = dnnl::reorder(rpd);
  c.scratch = rpd.scratchpad_desc();
  c.args = {{DNNL_ARG_FROM, from, 0, 0, {}}, {DNNL_ARG_TO, to, 0, 0, {}}};
  return c;
}

/// The NCHW view of rows [first, first + rows) of an image of `channels` x
/// `height` x `width` 8-bit values.
dnnl::memory::desc nchw_rows(int64_t channels, int64_t height, int64_t width, int64_t rows,
                             dt type) {
  return dnnl::memory::desc({1, channels, rows, width}, type,
                            dnnl::memory::dims{channels * height * width, height * width,
                                               width, 1});
}

/// A 64-byte aligned view of this thread's buffer `v`, at least `bytes` long.
template <int Which>
uint8_t* thread_buffer(size_t bytes) {
  thread_local std::vector<uint8_t> v;
  if (v.size() < bytes + 64)
    v.resize(bytes + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) / 64 * 64);
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
  if (x.shape.size() != 4
      || !std::holds_alternative<quant_conv_geometry>(quant_conv_geometry_of(n, x.shape, w.shape)))
    return false;
  // Some shapes have no optimised kernel at some ISA levels (AVX2: a grouped
  // convolution of one input channel per group); the engine's reference
  // kernel, exact and without the reorders, runs those.
  auto q = qconv_node_of(g, n, 1);
  if (q.geo.h < 1 || q.geo.w < 1 || q.geo.oh < 1 || q.geo.ow < 1)
    return true; // not specialized yet: asked again when the plan is compiled
  static const dnnl::engine probe(dnnl::engine::kind::cpu, 0);
  try {
    return reference_note(qconv_pdesc(probe, q, q.bands[0])).empty();
  } catch (const dnnl::error&) {
    return false;
  }
}

step qlinear_conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  if (!process_cpu_level().int8_vnni)
    return qlinear_conv_exact_step(ctx, g, n, threads);
  auto q = qconv_node_of(g, n, threads);
  const auto& geo = q.geo;
  const auto& wc = g.values[n.inputs[3]].constant;
  const int64_t pieces = static_cast<int64_t>(q.bands.size());

  // Per piece up to three calls: NCHW input rows -> buffer a (NHWC), the
  // convolution, buffer b (NHWC) -> NCHW output rows. Tensors kept NHWC
  // between int8 nodes (assign_int8_layouts) skip their reorder. Handles:
  // a value (offset per image added at run time), -1 fixed, -2 buffer a, -3 b.
  auto calls = std::make_shared<std::vector<std::vector<dnnl_call>>>();
  size_t a_max = 0, b_max = 0;
  std::string note;
  for (const auto& band : q.bands) {
    auto pd = qconv_pdesc(ctx.eng, q, band);
    auto src = pd.src_desc(), dst = pd.dst_desc();
    if (note.empty())
      note = reference_note(pd);
    std::vector<dnnl_call> piece;
    int src_handle = n.inputs[0], dst_handle = n.outputs[0];
    int64_t src_off = band.first * geo.w * geo.c, dst_off = band.r0 * geo.ow * geo.k; // bytes
    if (!q.x_nhwc) {
      auto rows = nchw_rows(geo.c, geo.h, geo.w, band.in_rows, q.x_type);
      piece.push_back(band_reorder(ctx, rows, src));
      piece.back().args = {{DNNL_ARG_FROM, rows, n.inputs[0], band.first * geo.w, {}},
                           {DNNL_ARG_TO, src, -2, 0, {}}};
      a_max = std::max(a_max, src.get_size());
      src_handle = -2;
      src_off = 0;
    }
    if (!q.y_nhwc) {
      b_max = std::max(b_max, dst.get_size());
      dst_handle = -3;
      dst_off = 0;
    }
    dnnl_call conv;
    conv.prim = dnnl::convolution_forward(pd);
    conv.scratch = pd.scratchpad_desc();
    conv.args.push_back({DNNL_ARG_SRC, src, src_handle, src_off, {}});
    conv.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                         ctx.weights->get(ctx.eng, wc, 0, q.wuser, pd.weights_desc())});
    if (q.has_bias)
      conv.args.push_back({DNNL_ARG_BIAS, dnnl::memory::desc({geo.k}, dt::s32, tag::x),
                           n.inputs[8], 0, {}});
    if (q.xz != 0)
      conv.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, {}, -1, 0,
                           zero_point_memory(ctx.eng, q.xz)});
    if (q.yz != 0)
      conv.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, {}, -1, 0,
                           zero_point_memory(ctx.eng, q.yz)});
    conv.args.push_back({DNNL_ARG_DST, dst, dst_handle, dst_off, {}});
    piece.push_back(std::move(conv));
    if (!q.y_nhwc) {
      auto rows = nchw_rows(geo.k, geo.oh, geo.ow, band.rows, q.y_type);
      piece.push_back(band_reorder(ctx, dst, rows));
      piece.back().args = {{DNNL_ARG_FROM, dst, -3, 0, {}},
                           {DNNL_ARG_TO, rows, n.outputs[0], band.r0 * geo.ow, {}}};
    }
    calls->push_back(std::move(piece));
  }

  step s;
  s.kernel = std::string("onednn.qlinear_conv ") + (q.x_nhwc ? "nhwc" : "nchw") + "->"
             + (q.y_nhwc ? "nhwc" : "nchw") + (pieces > 1 ? " by row" : "") + note;
  // One item per image and band, run on the plan's threads.
  s.items = geo.n * pieces;
  int64_t x_image = geo.c * geo.h * geo.w, y_image = geo.k * geo.oh * geo.ow; // bytes: 8-bit
  int x = n.inputs[0], y = n.outputs[0];
  s.run = [calls, pieces, x, y, x_image, y_image, a_max, b_max, eng = ctx.eng](void** p,
                                                                               int64_t item) {
    uint8_t* a = thread_buffer<0>(a_max);
    uint8_t* b = thread_buffer<1>(b_max);
    int64_t image = item / pieces;
    for (const auto& c : (*calls)[item % pieces]) {
      const void* handles[8] = {};
      for (size_t i = 0; i < c.args.size() && i < 8; ++i) {
        const auto& arg = c.args[i];
        if (arg.value == -2)
          handles[i] = a;
        else if (arg.value == -3)
          handles[i] = b;
        else if (arg.value >= 0)
          handles[i] = static_cast<const uint8_t*>(p[arg.value]) + arg.offset
                       + (arg.value == x ? image * x_image : arg.value == y ? image * y_image : 0);
      }
      run_call(eng, c, handles);
    }
  };
  return s;
}

step qlinear_conv_exact_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                             unsigned threads) {
  auto q = qconv_node_of(g, n, threads);
  const auto& geo = q.geo;
  const bool x_s8 = q.x_type == dt::s8;
  auto weights = split_int8_weights(*g.values[n.inputs[3]].constant);
  struct piece {
    qconv_node::band band;
    dnnl_call to_nhwc;  ///< NCHW input rows -> NHWC (unless the input is NHWC)
    split_calls conv;   ///< into INT32 NHWC [rows * ow][k]
    dnnl_call to_nchw;  ///< the requantised NHWC rows -> NCHW (unless the output is NHWC)
  };
  auto pieces = std::make_shared<std::vector<piece>>();
  size_t src_max = 0, acc_max = 0, out_max = 0;
  std::string note;
  for (const auto& band : q.bands) {
    auto pd = qconv_pdesc(ctx.eng, q, band);
    auto src = pd.src_desc(), acc = pd.dst_desc();
    if (note.empty())
      note = reference_note(pd);
    piece p;
    p.band = band;
    if (!q.x_nhwc)
      p.to_nhwc = band_reorder(ctx, nchw_rows(geo.c, geo.h, geo.w, band.in_rows, q.x_type),
                               dnnl::memory::desc(src.dims(), q.x_type, tag::nhwc));
    p.conv = split_calls_of(ctx, dnnl::convolution_forward(pd), pd.scratchpad_desc(), src, acc,
                            q.wuser, pd.weights_desc(), weights, exact_src_zero(q));
    if (!q.y_nhwc) {
      dnnl::memory::desc out({1, geo.k, band.rows, geo.ow}, q.y_type, tag::nhwc);
      p.to_nchw = band_reorder(ctx, out, nchw_rows(geo.k, geo.oh, geo.ow, band.rows, q.y_type));
      out_max = std::max(out_max, out.get_size());
    }
    src_max = std::max(src_max, src.get_size());
    acc_max = std::max(acc_max, acc.get_size());
    pieces->push_back(std::move(p));
  }
  split_requant r{q.multipliers, q.yz, q.relu};
  step s;
  s.kernel = std::string("onednn.qlinear_conv ") + (q.x_nhwc ? "nhwc" : "nchw") + "->"
             + (q.y_nhwc ? "nhwc" : "nchw") + (pieces->size() > 1 ? " by row" : "")
             + " exact" + note;
  const int64_t count = static_cast<int64_t>(pieces->size());
  s.items = geo.n * count;
  const int64_t x_image = geo.c * geo.h * geo.w, y_image = geo.k * geo.oh * geo.ow; // bytes
  int x = n.inputs[0], y = n.outputs[0], bias = q.has_bias ? n.inputs[8] : -1;
  s.run = [=, eng = ctx.eng](void** ptrs, int64_t item) {
    const piece& pc = (*pieces)[item % count];
    const auto& band = pc.band;
    const int64_t image = item / count;
    uint8_t* a = thread_buffer<0>(src_max);
    auto* hi = reinterpret_cast<int32_t*>(thread_buffer<1>(acc_max));
    auto* lo = reinterpret_cast<int32_t*>(thread_buffer<2>(acc_max));
    const uint8_t* x_at = static_cast<const uint8_t*>(ptrs[x]) + image * x_image;
    const uint8_t* src = x_at + band.first * geo.w * geo.c;
    if (pc.to_nhwc.prim) {
      const void* handles[2] = {x_at + band.first * geo.w, a};
      run_call(eng, pc.to_nhwc, handles);
      src = a;
    }
    if (x_s8) {
      flip_to_u8_fast(src, a, band.in_rows * geo.w * geo.c);
      src = a;
    }
    run_split_call(eng, pc.conv.hi, src, hi);
    run_split_call(eng, pc.conv.lo, src, lo);
    uint8_t* y_at = static_cast<uint8_t*>(ptrs[y]) + image * y_image;
    uint8_t* out = pc.to_nchw.prim ? thread_buffer<3>(out_max) : y_at + band.r0 * geo.ow * geo.k;
    requantize_split_to(q.y_type, hi, lo,
                        bias >= 0 ? static_cast<const int32_t*>(ptrs[bias]) : nullptr, r,
                        band.rows * geo.ow, geo.k, out);
    if (pc.to_nchw.prim) {
      const void* handles[2] = {out, y_at + band.r0 * geo.ow};
      run_call(eng, pc.to_nchw, handles);
    }
  };
  return s;
}

namespace {

/// How an 8-bit operator takes part in assign_int8_layouts(): whether it
/// writes its output in NHWC where its readers take it, whether it reads its
/// input `i` in NHWC, which values it reads and writes in one layout (none:
/// each its own), and how it records the layouts it was given.
struct int8_layout_rule {
  bool (*writes)(const graph& g, const node& n);
  bool (*reads)(const graph& g, const node& n, size_t i);
  std::vector<int> (*tied)(const graph& g, const node& n);
  void (*mark)(const graph& g, node& n, const std::vector<bool>& nhwc);
};

/// QLinearConv on oneDNN, QLinearAdd in spans (it reads A and B), QMaxPool.
const std::map<std::string, int8_layout_rule>& int8_layout_rules() {
  static const std::map<std::string, int8_layout_rule> rules{
    {"QLinearConv",
     {[](const graph& g, const node& n) { return qlinear_conv_runs_on_onednn(g, n); },
      [](const graph& g, const node& n, size_t i) {
        return i == 0 && qlinear_conv_runs_on_onednn(g, n);
      },
      [](const graph&, const node&) { return std::vector<int>{}; },
      [](const graph& g, node& n, const std::vector<bool>& nhwc) {
        if (!qlinear_conv_runs_on_onednn(g, n))
          return;
        n.set_i("x_nhwc", nhwc[n.inputs[0]] ? 1 : 0);
        n.set_i("y_nhwc", nhwc[n.outputs[0]] ? 1 : 0);
      }}},
    {quant_add_op,
     {[](const graph& g, const node& n) { return qlinear_add_runs_in_spans(g, n); },
      [](const graph& g, const node& n, size_t i) {
        return (i == 0 || i == 3) && qlinear_add_runs_in_spans(g, n);
      },
      [](const graph& g, const node& n) {
        return qlinear_add_runs_in_spans(g, n)
                 ? std::vector<int>{n.inputs[0], n.inputs[3], n.outputs[0]}
                 : std::vector<int>{};
      },
      [](const graph&, node&, const std::vector<bool>&) {}}},
    {quant_max_pool_op,
     {[](const graph&, const node&) { return true; },
      [](const graph&, const node&, size_t i) { return i == 0; },
      [](const graph&, const node& n) { return std::vector<int>{n.inputs[0], n.outputs[0]}; },
      [](const graph&, node& n, const std::vector<bool>& nhwc) {
        n.set_i("nhwc", nhwc[n.inputs[0]] ? 1 : 0);
      }}},
  };
  return rules;
}

const int8_layout_rule* int8_layout_rule_of(const node& n) {
  auto it = int8_layout_rules().find(n.op);
  return it == int8_layout_rules().end() ? nullptr : &it->second;
}

/// Whether `n` reads value `v` only where the NHWC layout suits it: as a
/// QLinearConv's input on oneDNN, or as an input of a QLinearAdd in spans.
bool reads_nhwc(const graph& g, const node& n, int v) {
  const auto* rule = int8_layout_rule_of(n);
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.inputs[i] == v && !(rule && rule->reads(g, n, i)))
      return false;
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
    const auto* rule = int8_layout_rule_of(n);
    if (!rule || !rule->writes(g, n) || n.outputs.empty() || n.outputs[0] < 0)
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
      const auto* rule = int8_layout_rule_of(n);
      std::vector<int> tied = rule ? rule->tied(g, n) : std::vector<int>{};
      bool all = std::all_of(tied.begin(), tied.end(), [&](int v) { return nhwc[v]; });
      bool none = std::none_of(tied.begin(), tied.end(), [&](int v) { return nhwc[v]; });
      if (all || none)
        continue;
      for (int v : tied)
        nhwc[v] = false;
      changed = true;
    }
  }
  for (auto& n : g.nodes)
    if (const auto* rule = int8_layout_rule_of(n))
      rule->mark(g, n, nhwc);
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

namespace {

/// A QLinearMatMul's multipliers: a_scale * w_scale[column] / y_scale, as the reference kernel.
std::vector<float> qmatmul_multipliers(const graph& g, const node& n) {
  float a_scale = constant_of(g, n, 1)->as<float>()[0];
  float y_scale = constant_of(g, n, 6)->as<float>()[0];
  const auto& ws = *constant_of(g, n, 4);
  std::vector<float> m(static_cast<size_t>(ws.elements()));
  for (size_t i = 0; i < m.size(); ++i)
    m[i] = a_scale * ws.as<float>()[i] / y_scale;
  return m;
}

/// Bands of A's `m` rows, one per thread where there are enough rows; each
/// band is one oneDNN matmul over all the (shared) weights.
std::vector<int64_t> qmatmul_cuts(int64_t m, unsigned threads) {
  return m >= 32 * static_cast<int64_t>(threads)
           ? split_range(m, pieces_for(m / 16, threads), 16, threads)
           : std::vector<int64_t>{0, m};
}

} // namespace

step qlinear_matmul_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  if (!process_cpu_level().int8_vnni)
    return qlinear_matmul_exact_step(ctx, g, n, threads);
  const auto& av = g.values[n.inputs[0]];
  const auto& yv = g.values[n.outputs[0]];
  const auto& wc = g.values[n.inputs[3]].constant;
  int64_t k = wc->shape[0], cols = wc->shape[1], m = element_count(av.shape) / k;
  auto scales = qmatmul_multipliers(g, n);
  int32_t az = int_value(*constant_of(g, n, 2), 0);
  int32_t yz = int_value(*constant_of(g, n, 7), 0);
  bool has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
  auto attr = user_scratchpad_attr();
  attr.set_output_scales(scales.size() > 1 ? 1 << 1 : 0, scales);
  if (az != 0)
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (yz != 0)
    attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  auto cuts = qmatmul_cuts(m, threads);
  dnnl::memory::desc wuser({k, cols}, dt::s8, tag::ab);
  dnnl::memory::desc wany({k, cols}, dt::s8, tag::any);
  dnnl::memory::desc bias({1, cols}, dt::s32, tag::ab);
  std::vector<dnnl_call> calls;
  std::string note;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t rows = cuts[c + 1] - cuts[c];
    dnnl::memory::desc src({rows, k}, dnnl_type(av.dtype), tag::ab);
    dnnl::memory::desc dst({rows, cols}, dnnl_type(yv.dtype), tag::ab);
    auto d = has_bias ? dnnl::matmul::desc(src, wany, bias, dst)
                      : dnnl::matmul::desc(src, wany, dst);
    dnnl::matmul::primitive_desc pd(d, attr, ctx.eng);
    if (note.empty())
      note = reference_note(pd);
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
  s.kernel = "onednn.qlinear_matmul" + note;
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

step qlinear_matmul_exact_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                               unsigned threads) {
  const auto& av = g.values[n.inputs[0]];
  const auto& wc = g.values[n.inputs[3]].constant;
  int64_t k = wc->shape[0], cols = wc->shape[1], m = element_count(av.shape) / k;
  const bool a_s8 = av.dtype == datatype::int8;
  const int32_t src_zero = int_value(*constant_of(g, n, 2), 0) + (a_s8 ? 128 : 0);
  split_requant r{qmatmul_multipliers(g, n), int_value(*constant_of(g, n, 7), 0), false};
  dt y_type = dnnl_type(g.values[n.outputs[0]].dtype);
  auto weights = split_int8_weights(*wc);
  auto attr = split_attr(src_zero);
  auto cuts = qmatmul_cuts(m, threads);
  dnnl::memory::desc wuser({k, cols}, dt::s8, tag::ab);
  dnnl::memory::desc wany({k, cols}, dt::s8, tag::any);
  auto calls = std::make_shared<std::vector<split_calls>>();
  std::string note;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    int64_t rows = cuts[c + 1] - cuts[c];
    dnnl::memory::desc src({rows, k}, dt::u8, tag::ab);
    dnnl::memory::desc acc({rows, cols}, dt::s32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wany, acc), attr, ctx.eng);
    if (note.empty())
      note = reference_note(pd);
    calls->push_back(split_calls_of(ctx, dnnl::matmul(pd), pd.scratchpad_desc(), src, acc, wuser,
                                    pd.weights_desc(), weights, src_zero));
  }
  int64_t most_rows = 0;
  for (size_t c = 0; c + 1 < cuts.size(); ++c)
    most_rows = std::max(most_rows, cuts[c + 1] - cuts[c]);
  const size_t src_max = static_cast<size_t>(most_rows * k);
  const size_t acc_max = static_cast<size_t>(most_rows * cols) * 4;
  bool has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
  int a = n.inputs[0], y = n.outputs[0], bias = has_bias ? n.inputs[8] : -1;
  step s;
  s.kernel = "onednn.qlinear_matmul exact" + note;
  s.items = static_cast<int64_t>(calls->size());
  s.run = [=, eng = ctx.eng](void** p, int64_t item) {
    int64_t row0 = cuts[item], rows = cuts[item + 1] - row0;
    const uint8_t* src = static_cast<const uint8_t*>(p[a]) + row0 * k;
    if (a_s8) {
      uint8_t* flipped = thread_buffer<0>(src_max);
      flip_to_u8_fast(src, flipped, rows * k);
      src = flipped;
    }
    auto* hi = reinterpret_cast<int32_t*>(thread_buffer<1>(acc_max));
    auto* lo = reinterpret_cast<int32_t*>(thread_buffer<2>(acc_max));
    run_split_call(eng, (*calls)[item].hi, src, hi);
    run_split_call(eng, (*calls)[item].lo, src, lo);
    requantize_split_to(y_type, hi, lo, bias >= 0 ? static_cast<const int32_t*>(p[bias]) : nullptr,
                        r, rows, cols, static_cast<uint8_t*>(p[y]) + row0 * cols);
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
