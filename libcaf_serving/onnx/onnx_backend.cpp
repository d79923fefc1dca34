#include "onnx/onnx_backend.hpp"

#include "engine_kernels.hpp"
#include "onnx/importer.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/ops.hpp"
#include "onnx/work_pool.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

extern "C" void openblas_set_num_threads(int);

namespace caf_serving::onnx {

namespace {

using exec_result = std::variant<std::monostate, serving_error>;
using dims_t = std::vector<int64_t>;
namespace kc = caf_serving::kernels::cpu;

/// One step of a plan: `items` independent pieces of work that read and write
/// through the per-run pointer table; run(ptrs, item) does one piece.
struct step {
  std::string kernel; ///< for describe_plan
  int node = -1;
  int64_t items = 1;
  std::function<void(void** ptrs, int64_t item)> run;
};

/// With profiling on: nanoseconds spent in each step of one plan, summed over
/// its runs (a run of a plan that several threads share counts wall time; plans
/// that run on one thread per row chunk count each chunk).
struct step_times {
  explicit step_times(size_t steps) : ns(new std::atomic<int64_t>[steps]) {
    for (size_t i = 0; i < steps; ++i) ns[i] = 0;
  }
  std::unique_ptr<std::atomic<int64_t>[]> ns; ///< one per step of the plan
  std::atomic<int64_t> runs{0};
};

struct compiled_plan {
  graph g;
  int64_t batch = 0;   ///< rows this plan runs
  unsigned threads = 1; ///< threads its steps are split for
  std::shared_ptr<step_times> times; ///< null unless profiling
  memory_plan memory;
  std::vector<step> steps;
  std::vector<void*> constant_ptrs; ///< per value: constant data, else null
  std::vector<int> input_values;    ///< per config input
  std::vector<int> output_values;   ///< per config output
};

// ------------------------------------------------------------------ oneDNN steps

class weight_store;

/// What compiling a step needs: the engine, and where reordered weights live.
struct dnnl_ctx {
  dnnl::engine eng;
  weight_store* weights = nullptr;
};

dnnl::memory::dims to_dnnl(const dims_t& d) {
  return dnnl::memory::dims(d.begin(), d.end());
}

dnnl::algorithm eltwise_of(const std::string& act) {
  if (act == "Relu") return dnnl::algorithm::eltwise_relu;
  if (act == "Gelu") return dnnl::algorithm::eltwise_gelu_erf;
  if (act == "Tanh") return dnnl::algorithm::eltwise_tanh;
  if (act == "Sigmoid") return dnnl::algorithm::eltwise_logistic;
  return dnnl::algorithm::eltwise_clip;
}

/// One argument of a oneDNN call: a view at a byte offset into a value of the
/// pointer table, or fixed memory (reordered weights).
struct dnnl_arg {
  int arg = 0; ///< DNNL_ARG_*
  dnnl::memory::desc md;
  int value = -1; ///< -1: `fixed`
  int64_t offset = 0;
  std::shared_ptr<const dnnl::memory> fixed; ///< shared with weight_store
};

/// One work item of a oneDNN step: a primitive over views of the step's tensors.
/// Primitives use a user scratchpad, so items of one step and steps of plans
/// running on different threads never share oneDNN's internal scratch memory.
struct dnnl_call {
  dnnl::primitive prim;
  std::vector<dnnl_arg> args;
  dnnl::memory::desc scratch;
};

/// Per-thread oneDNN state: a stream and the scratchpad buffer.
struct dnnl_thread_state {
  dnnl::stream stream;
  std::vector<uint8_t> scratch;
};

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

/// Runs `c` on views into the pointer table.
void execute_call(const dnnl::engine& eng, const dnnl_call& c, void** ptrs) {
  const void* handles[8] = {};
  for (size_t i = 0; i < c.args.size() && i < 8; ++i)
    if (c.args[i].value >= 0)
      handles[i] = static_cast<const uint8_t*>(ptrs[c.args[i].value]) + c.args[i].offset;
  run_call(eng, c, handles);
}

/// A oneDNN step: one call per work item.
step onednn_step(const dnnl_ctx& ctx, std::string kernel, std::vector<dnnl_call> calls) {
  step s;
  s.kernel = std::move(kernel);
  s.items = static_cast<int64_t>(calls.size());
  auto shared = std::make_shared<const std::vector<dnnl_call>>(std::move(calls));
  s.run = [shared, eng = ctx.eng](void** p, int64_t item) { execute_call(eng, (*shared)[item], p); };
  return s;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

/// Reordered weights shared by every plan and instance of one model. A model
/// compiles a plan per batch size (and per chunk size); without sharing, each
/// held its own reordered copy of every weight (measured: +340 MB per plan for
/// BERT-base). Entries are keyed by the weights' contents, so that weights
/// folded anew for each plan (BatchNorm into Conv) share too.
class weight_store {
public:
  /// The weights `w` (a view at `offset` bytes, described by `user`) in the
  /// layout `want`. Plans hold what this returns; an entry that no live plan
  /// holds any more is reordered again when asked for (oneDNN's Winograd
  /// layout depends on the batch, so plans of other sizes may want another).
  std::shared_ptr<const dnnl::memory> get(const dnnl::engine& eng, const constant_ptr& w,
                                          int64_t offset, const dnnl::memory::desc& user,
                                          const dnnl::memory::desc& want) {
    std::lock_guard<std::mutex> guard(mu_);
    uint64_t h = hash_of(w);
    entry* slot = nullptr;
    for (auto& e : entries_) {
      if (e.hash == h && e.bytes == w->bytes.size() && e.offset == offset && e.user == user
          && e.want == want) {
        if (auto held = e.mem.lock())
          return held;
        slot = &e;
        break;
      }
    }
    for (auto it = entries_.begin(); !slot && it != entries_.end(); ++it)
      if (it->mem.expired())
        slot = &*it;
    dnnl::memory src(user, eng, const_cast<uint8_t*>(w->bytes.data()) + offset);
    auto dst = std::make_shared<dnnl::memory>(want, eng);
    dnnl::stream s(eng);
    dnnl::reorder(src, *dst).execute(s, src, *dst);
    s.wait();
    entry e{h, w->bytes.size(), offset, user, want, dst};
    if (slot)
      *slot = e;
    else
      entries_.push_back(e);
    return dst;
  }

  /// Bytes of reordered weights that live plans hold.
  size_t bytes() const {
    std::lock_guard<std::mutex> guard(mu_);
    size_t n = 0;
    for (const auto& e : entries_)
      if (!e.mem.expired())
        n += e.want.get_size();
    return n;
  }

private:
  struct entry {
    uint64_t hash;
    size_t bytes;
    int64_t offset;
    dnnl::memory::desc user, want;
    std::weak_ptr<const dnnl::memory> mem;
  };

  /// A 64-bit hash of the contents, computed once per live tensor (a tensor
  /// that died may leave its address to another one: the weak pointer tells).
  uint64_t hash_of(const constant_ptr& w) {
    auto it = hashes_.find(w.get());
    if (it != hashes_.end() && !it->second.first.expired())
      return it->second.second;
    uint64_t h = 1469598103934665603ull ^ w->bytes.size();
    size_t words = w->bytes.size() / 8;
    const uint8_t* p = w->bytes.data();
    for (size_t i = 0; i < words; ++i) {
      uint64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      h = (h ^ x) * 1099511628211ull;
      h ^= h >> 29;
    }
    for (size_t i = words * 8; i < w->bytes.size(); ++i)
      h = (h ^ p[i]) * 1099511628211ull;
    for (auto e = hashes_.begin(); e != hashes_.end();)
      e = e->second.first.expired() ? hashes_.erase(e) : std::next(e);
    hashes_[w.get()] = {w, h};
    return h;
  }

  mutable std::mutex mu_;
  std::vector<entry> entries_;
  std::map<const tensor_data*, std::pair<std::weak_ptr<const tensor_data>, uint64_t>> hashes_;
};

/// Row-major strides of `d`.
dnnl::memory::dims dense_strides(const dnnl::memory::dims& d) {
  dnnl::memory::dims st(d.size(), 1);
  for (int i = static_cast<int>(d.size()) - 2; i >= 0; --i)
    st[i] = st[i + 1] * d[i + 1];
  return st;
}

/// How a 4-D NCHW-indexed tensor is stored. Convolution and pooling tensors are
/// kept in oneDNN's formats between those operators: nChw16c (channel blocks of
/// 16 outermost, so that a range of whole blocks is one dense tensor and a
/// convolution splits by output channels) where the channels are a multiple of
/// 16, NHWC otherwise; every other operator reads NCHW.
enum class layout : uint8_t { nchw, nhwc, blocked16 };
using layout_map = std::vector<layout>;

const char* layout_name(layout l) {
  return l == layout::nchw ? "nchw" : l == layout::nhwc ? "nhwc" : "nChw16c";
}

/// A 4-D NCHW-indexed tensor of shape `s` stored as `l`.
dnnl::memory::desc desc_4d(const dims_t& s, layout l) {
  using dt = dnnl::memory::data_type;
  if (l == layout::blocked16)
    return dnnl::memory::desc(to_dnnl(s), dt::f32, dnnl::memory::format_tag::nChw16c);
  if (l == layout::nhwc)
    return dnnl::memory::desc(to_dnnl(s), dt::f32, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]});
  return dnnl::memory::desc(to_dnnl(s), dt::f32, dense_strides(to_dnnl(s)));
}

/// The layouts assign_layouts() chose for a oneDNN node's input 0 and output
/// (node attributes; the stored tensors have these layouts or the same bytes).
layout src_layout(const node& n) { return static_cast<layout>(n.get_i("src_layout", 0)); }
layout dst_layout(const node& n) { return static_cast<layout>(n.get_i("dst_layout", 0)); }

/// " (oneDNN reference kernel)" when oneDNN found no fast kernel for `pd`: the
/// plan shows it, and the tests check that no layout choice leads there.
std::string reference_note(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0 ? " (oneDNN reference kernel)" : "";
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
std::vector<int64_t> split_range(int64_t n, int64_t pieces, int64_t unit, unsigned threads = 1) {
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

/// Whether `n` is a convolution that oneDNN's Winograd kernel (F(4x4, 3x3),
/// about 2x fewer multiplications) can run: 3x3, stride 1, no dilation or groups.
bool winograd_shape(const node& n, const dims_t& wshape) {
  auto st = n.get_ints("strides", {1, 1});
  auto dl = n.get_ints("dilations", {1, 1});
  return n.get_i("group", 1) == 1 && wshape[2] == 3 && wshape[3] == 3 && st[0] == 1
         && st[1] == 1 && dl[0] == 1 && dl[1] == 1;
}

/// Whether the engine's own 1x1 convolution (kernels/cpu/engine_conv1x1.cpp)
/// can run node `n`: 1x1, no padding, equal strides of 1 or 2, nChw16c in and
/// out, output channels in whole groups of 64, Relu or no activation, and a
/// CPU with AVX-512.
bool engine_conv1x1_fits(const node& n, const dims_t& wshape, layout src_l, layout dst_l) {
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  auto act = n.get_s("activation", "");
  return kc::engine_conv1x1_supported() && wshape[2] == 1 && wshape[3] == 1
         && n.get_i("group", 1) == 1 && src_l == layout::blocked16 && dst_l == layout::blocked16
         && wshape[0] % 64 == 0 && wshape[1] % 16 == 0 && st[0] == st[1]
         && (st[0] == 1 || st[0] == 2) && dl[0] == 1 && dl[1] == 1
         && std::all_of(pd.begin(), pd.end(), [](int64_t p) { return p == 0; })
         && (act.empty() || act == "Relu");
}

/// A FusedConv of one image that engine_conv1x1_fits(), one band of output
/// rows per work item (`cuts`). The weights are packed once into the kernel's
/// groups of 64 output channels (a strided oneDNN reorder through the weight
/// store, so plans share them).
step engine_conv1x1_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                         std::vector<int64_t> cuts) {
  using dt = dnnl::memory::data_type;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& w = g.values[n.inputs[1]].constant;
  int64_t oc = w->shape[0], ic = w->shape[1], groups = oc / 64;
  dnnl::memory::desc user({groups, 64, ic}, dt::f32, {64 * ic, ic, 1});
  dnnl::memory::desc packed({groups, 64, ic}, dt::f32, {64 * ic, 1, 64});
  auto wmem = ctx.weights->get(ctx.eng, w, 0, user, packed);
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  int x = n.inputs[0], y = n.outputs[0], b = has_bias ? n.inputs[2] : -1,
      r = has_res ? n.inputs[3] : -1;
  kc::conv1x1_args base;
  base.ic = ic;
  base.oc = oc;
  base.ih = xs[2];
  base.iw = xs[3];
  base.stride = n.get_ints("strides", {1, 1})[0];
  base.relu = n.get_s("activation", "") == "Relu";
  step s;
  s.kernel = "engine.conv1x1 nChw16c->nChw16c by row";
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [=](void** p, int64_t item) {
    kc::conv1x1_args a = base;
    a.w = static_cast<const float*>(wmem->get_data_handle());
    a.bias = b >= 0 ? static_cast<const float*>(p[b]) : nullptr;
    a.x = static_cast<const float*>(p[x]);
    a.y = static_cast<float*>(p[y]);
    a.residual = r >= 0 ? static_cast<const float*>(p[r]) : nullptr;
    a.row_begin = cuts[item];
    a.row_end = cuts[item + 1];
    kc::engine_conv1x1(a);
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
  if (has_res)
    po.append_binary(dnnl::algorithm::binary_add, v.dst);
  if (!act.empty())
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

/// A FusedConv (no residual) of one nChw16c image split into bands of output
/// rows, one per work item. oneDNN's fast kernels want dense tensors, and a
/// band of rows of nChw16c is not one (each block of 16 channels holds all
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
  const bool try_winograd = mcfg.winograd && winograd_shape(n, w->shape);
  const auto& ys = g.values[n.outputs[0]].shape;
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
    // Output rows [a, b) read input rows [ih0, ih1), with the padding that remains.
    int64_t a = cuts[c], b = cuts[c + 1];
    int64_t first = a * st[0] - pd[0];
    int64_t ih0 = std::max<int64_t>(0, first);
    int64_t ih1 = std::min<int64_t>(xs[2], (b - 1) * st[0] - pd[0] + ext_h);
    int64_t pad_t = ih0 - first;
    int64_t pad_b = (b - a - 1) * st[0] + ext_h - (ih1 - ih0) - pad_t;
    auto src = desc_4d({1, xs[1], ih1 - ih0, xs[3]}, layout::blocked16);
    auto dst = desc_4d({1, ys[1], b - a, ys[3]}, layout::blocked16);
    auto [pdesc, wino] = conv_pdesc(ctx, n, {src, wany, dst, pad_t, pad_b, try_winograd});
    if (impl.empty())
      impl = std::string(wino ? "winograd" : "direct") + reference_note(pdesc);
    conv_band band{{}, ih0, ih1 - ih0, a, b - a};
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
  s.kernel = "onednn.conv." + impl.substr(0, impl.find(' ')) + " nChw16c->nChw16c by row (copies)"
             + (impl.find(' ') == std::string::npos ? "" : impl.substr(impl.find(' ')));
  s.items = static_cast<int64_t>(bands->size());
  s.run = [=, eng = ctx.eng](void** p, int64_t item) {
    const conv_band& band = (*bands)[item];
    size_t in_span = static_cast<size_t>((ic * band.in_rows * iw + 15) / 16 * 16);
    float* in = band_buffer(in_span + static_cast<size_t>(oc * band.out_rows * ow));
    float* out = in + in_span;
    const float* x_at = static_cast<const float*>(p[x]);
    for (int64_t cb = 0; cb < ic / 16; ++cb)
      std::memcpy(in + cb * band.in_rows * iw * 16, x_at + (cb * ih + band.ih0) * iw * 16,
                  sizeof(float) * 16 * band.in_rows * iw);
    const void* handles[4] = {in, nullptr, bv >= 0 ? p[bv] : out, out};
    run_call(eng, band.call, handles);
    float* y_at = static_cast<float*>(p[y]);
    for (int64_t ob = 0; ob < oc / 16; ++ob)
      std::memcpy(y_at + (ob * oh + band.oh0) * ow * 16, out + ob * band.out_rows * ow * 16,
                  sizeof(float) * 16 * band.out_rows * ow);
  };
  return s;
}

/// FusedConv over 4-D tensors as oneDNN convolutions, one call per work item.
/// Several images split by image. One image stored nChw16c splits by output
/// channels (whole blocks of 16, each item with its slice of the weights), or,
/// where its input outweighs its weights, into bands of output rows (on the
/// engine's 1x1 kernel, else on dense copies: banded_conv_step); one image
/// stored NHWC splits into bands of output rows (which stay dense).
/// 3x3 stride-1 convolutions on nChw16c use Winograd when `winograd` is set and
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
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  // Bytes of one image: the same in every layout.
  auto image_bytes = [](const dims_t& s) { return s[1] * s[2] * s[3] * 4; };
  enum class split { none, images, channels, rows } how = split::none;
  std::vector<int64_t> cuts{0, ys[0]};
  if (threads > 1 && ys[0] > 1) {
    how = split::images;
    cuts = split_range(ys[0], pieces_for(ys[0], threads), 1, threads);
  } else if (threads > 1 && dst_l == layout::blocked16 && group == 1 && ys[1] >= 32) {
    // One piece per thread: each piece reads (and for a strided 1x1 oneDNN
    // gathers, for Winograd transforms) all of the input again. ResNet-50,
    // batch 1, 2 threads, plans run in turn in one process: 1.01x the speed of
    // pieces of 128 channels (up to 4 per thread), and 4 pieces per thread
    // ran at 0.94x.
    how = split::channels;
    cuts = split_range(ys[1], threads, 16, threads);
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
  bool try_winograd = winograd && src_l == layout::blocked16 && dst_l == layout::blocked16
                      && winograd_shape(n, w.shape)
                      && (how != split::channels || narrowest >= 64);
  // One image whose input outweighs its weights splits into bands of output
  // rows on the engine's kernel: each thread reads its band of the input and
  // all the weights, where a oneDNN channel split has every thread read all of
  // the input (oneDNN runs a band of rows of nChw16c with its reference kernel
  // only). ResNet-50, batch 1, 2 threads: 1.077x the oneDNN-only plan.
  if (how == split::channels && mcfg.engine_conv1x1 && image_bytes(xs) >= w.elements() * 4
      && engine_conv1x1_fits(n, w.shape, src_l, dst_l))
    return engine_conv1x1_step(
      ctx, g, n, split_range(ys[2], std::min<int64_t>(ys[2], pieces_for(ys[2], threads)), 1,
                             threads));
  // Other convolutions of one such image (ResNet-50's 3x3 layers of stage 1,
  // and the strided one starting stage 2) run by bands too, as oneDNN calls
  // on dense copies of each band.
  if (how == split::channels && mcfg.conv_bands && group == 1 && !has_res
      && xs[1] % 16 == 0 && ys[1] % 16 == 0
      && (w.shape[2] > 1 || w.shape[3] > 1) && image_bytes(xs) >= w.elements() * 4)
    return banded_conv_step(ctx, g, n, threads, mcfg);
  std::vector<dnnl_call> calls;
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
    } else {
      // Output rows [a, b) read input rows [ih0, ih1), with the padding that remains.
      int64_t first = a * st[0] - pd[0];
      int64_t ih0 = std::max<int64_t>(0, first);
      int64_t ih1 = std::min<int64_t>(xs[2], (b - 1) * st[0] - pd[0] + ext_h);
      pad_t = ih0 - first;
      pad_b = (b - a - 1) * st[0] + ext_h - (ih1 - ih0) - pad_t;
      xsub[2] = ih1 - ih0;
      ysub[2] = b - a;
      xoff = ih0 * xs[3] * xs[1] * 4;
      yoff = a * ys[3] * ys[1] * 4;
    }
    tag wtag = tag::oihw;
    if (group > 1) {
      wd = {group, wd[0] / group, wd[1], wd[2], wd[3]};
      wtag = tag::goihw;
    }
    dnnl::memory::desc wuser(to_dnnl(wd), dt::f32, wtag);
    dnnl::memory::desc wany(to_dnnl(wd), dt::f32, tag::any);
    dnnl::memory::desc bias({ysub[1]}, dt::f32, tag::a);
    auto src = desc_4d(xsub, src_l);
    auto dst = desc_4d(ysub, dst_l);
    auto [pdesc, wino] = conv_pdesc(ctx, n, {src, wany, dst, pad_t, pad_b, try_winograd});
    if (impl.empty())
      impl = std::string(wino ? "winograd" : "direct") + reference_note(pdesc);
    dnnl_call call;
    call.prim = dnnl::convolution_forward(pdesc);
    call.scratch = pdesc.scratchpad_desc();
    call.args.push_back({DNNL_ARG_SRC, src, n.inputs[0], xoff, {}});
    call.args.push_back({DNNL_ARG_WEIGHTS, {}, -1, 0,
                         ctx.weights->get(ctx.eng, g.values[n.inputs[1]].constant, woff, wuser,
                                          pdesc.weights_desc())});
    if (has_bias)
      call.args.push_back({DNNL_ARG_BIAS, bias, n.inputs[2], boff, {}});
    if (has_res)
      call.args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, dst, n.inputs[3],
                           yoff, {}});
    call.args.push_back({DNNL_ARG_DST, dst, n.outputs[0], yoff, {}});
    calls.push_back(std::move(call));
  }
  static const char* split_names[] = {"", " by image", " by channel", " by row"};
  return onednn_step(ctx,
                     "onednn.conv." + impl.substr(0, impl.find(' ')) + " " + layout_name(src_l)
                       + "->" + layout_name(dst_l) + split_names[static_cast<int>(how)]
                       + (impl.find(' ') == std::string::npos ? "" : impl.substr(impl.find(' '))),
                     std::move(calls));
}

/// Pooling as oneDNN calls: by image when there are several, by blocks of 16
/// channels (dense in nChw16c) for one image, else one call.
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
  bool by_channel = threads > 1 && !by_image && src_l == layout::blocked16
                    && dst_l == layout::blocked16;
  auto cuts = by_image     ? split_range(ys[0], pieces_for(ys[0], threads), 1, threads)
              : by_channel ? split_range(ys[1], pieces_for(ys[1] / 16, threads), 16, threads)
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

/// ToNHWC / ToNChw16c / ToNCHW: a oneDNN reorder between two layouts of one 4-D tensor.
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
  return onednn_step(ctx, "onednn.reorder", std::move(calls));
}

bool runs_on_onednn_4d(const graph& g, const node& n) {
  bool spatial = (n.op == "FusedConv" && g.values[n.inputs[1]].constant) || n.op == "MaxPool"
                 || n.op == "AveragePool" || n.op == "GlobalAveragePool";
  return spatial && g.values[n.inputs[0]].shape.size() == 4;
}

/// The layouts a oneDNN node reads its input 0 in and writes its output in.
/// oneDNN's fast kernels want both in one layout, except an image's few NCHW
/// channels written nChw16c; other mixes run its reference kernel (measured:
/// 73 ms instead of 0.04 ms for an 8-channel 64x64 convolution reading NCHW and
/// writing NHWC). nChw16c needs whole blocks of 16 channels and no groups.
std::pair<layout, layout> node_layouts(const graph& g, const layout_map& lay, const node& n) {
  const auto& in = g.values[n.inputs[0]].shape;
  const auto& out = g.values[n.outputs[0]].shape;
  layout stored = lay[n.inputs[0]];
  if (n.op == "FusedConv") {
    bool blocked_out = out[1] % 16 == 0 && n.get_i("group", 1) == 1;
    if (blocked_out && in[1] % 16 == 0)
      return {layout::blocked16, layout::blocked16};
    if (blocked_out && in[1] < 16 && stored == layout::nchw)
      return {layout::nchw, layout::blocked16};
    return {layout::nhwc, layout::nhwc};
  }
  bool blocked = stored == layout::blocked16 || (stored == layout::nchw && in[1] % 16 == 0);
  return blocked ? std::make_pair(layout::blocked16, layout::blocked16)
                 : std::make_pair(layout::nhwc, layout::nhwc);
}

/// Whether value `v` stored as `a` has the bytes of layout `b` too: a 1x1
/// spatial tensor is the same in NCHW, NHWC and (whole blocks) nChw16c.
bool same_bytes(const graph& g, int v, layout a, layout b) {
  const auto& s = g.values[v].shape;
  if (a == b)
    return true;
  if (s.size() != 4 || s[2] * s[3] != 1)
    return false;
  return (a != layout::blocked16 && b != layout::blocked16) || s[1] % 16 == 0;
}

/// Stores convolution and pooling tensors in oneDNN's layouts (node_layouts),
/// inserting reorder nodes where a tensor passes between them and the other
/// operators or between two layouts. Records each oneDNN node's choice in its
/// src_layout/dst_layout attributes.
layout_map assign_layouts(graph& g) {
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
                                               : "ToNChw16c";
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
    bool dn = runs_on_onednn_4d(g, n);
    layout src = layout::nchw, out = layout::nchw;
    if (dn) {
      std::tie(src, out) = node_layouts(g, lay, n);
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
  return onednn_step(ctx, "onednn.matmul", std::move(calls));
}

// ------------------------------------------------------------------ compile

std::vector<int64_t> broadcast_strides4(const dims_t& in) {
  // Strides of a mask of rank <= 4 read as [B, H, S, S].
  dims_t full(4, 1);
  for (size_t i = 0; i < in.size(); ++i)
    full[4 - in.size() + i] = in[i];
  std::vector<int64_t> st(4, 0);
  int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    st[i] = full[i] == 1 ? 0 : s;
    s *= full[i];
  }
  return st;
}


/// FusedAttention on [B, S, H*D] tensors, per head: scores = scale * Q_h K_h^T
/// and out_h = softmax(scores + mask) V_h, both products as oneDNN matmuls
/// reading the heads in place through strides. Work items are ranges of
/// (batch row, head) jobs.
step attention_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads) {
  using dt = dnnl::memory::data_type;
  const auto& qs = g.values[n.inputs[0]].shape;
  int64_t b = qs[0], sq = qs[1], hd = qs[2], heads = n.get_i("num_heads", 1), d = hd / heads;
  float scale = n.get_f("scale", 1.0f);
  int m = n.inputs.size() > 3 ? n.inputs[3] : -1;
  std::vector<int64_t> mst(4, 0);
  if (m >= 0)
    mst = broadcast_strides4(g.values[m].shape);
  dnnl::memory::desc qd({sq, d}, dt::f32, {hd, 1});
  dnnl::memory::desc ktd({d, sq}, dt::f32, {1, hd});
  dnnl::memory::desc sd({sq, sq}, dt::f32, {sq, 1});
  dnnl::memory::desc vd({sq, d}, dt::f32, {hd, 1});
  dnnl::memory::desc od({sq, d}, dt::f32, {hd, 1});
  auto attr = user_scratchpad_attr();
  attr.set_output_scales(0, {scale});
  dnnl::matmul::primitive_desc p1(dnnl::matmul::desc(qd, ktd, sd), attr, ctx.eng);
  dnnl::matmul::primitive_desc p2(dnnl::matmul::desc(sd, vd, od), user_scratchpad_attr(),
                                  ctx.eng);
  auto calls = std::make_shared<std::vector<dnnl_call>>(2);
  (*calls)[0].prim = dnnl::matmul(p1);
  (*calls)[0].scratch = p1.scratchpad_desc();
  (*calls)[0].args = {{DNNL_ARG_SRC, qd, 0, 0, {}}, {DNNL_ARG_WEIGHTS, ktd, 0, 0, {}},
                      {DNNL_ARG_DST, sd, 0, 0, {}}};
  (*calls)[1].prim = dnnl::matmul(p2);
  (*calls)[1].scratch = p2.scratchpad_desc();
  (*calls)[1].args = {{DNNL_ARG_SRC, sd, 0, 0, {}}, {DNNL_ARG_WEIGHTS, vd, 0, 0, {}},
                      {DNNL_ARG_DST, od, 0, 0, {}}};
  auto cuts = split_range(b * heads, pieces_for(b * heads, threads), 1, threads);
  step s;
  s.kernel = "onednn.matmul+engine.softmax";
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  int q = n.inputs[0], k = n.inputs[1], v = n.inputs[2], y = n.outputs[0];
  s.run = [=, eng = ctx.eng](void** p, int64_t item) {
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(sq * sq));
    for (int64_t job = cuts[item]; job < cuts[item + 1]; ++job) {
      int64_t bi = job / heads, h = job % heads, off = bi * sq * hd + h * d;
      const void* h1[3] = {static_cast<const float*>(p[q]) + off,
                           static_cast<const float*>(p[k]) + off, scores.data()};
      run_call(eng, (*calls)[0], h1);
      if (m >= 0) {
        const float* mask = static_cast<const float*>(p[m]) + bi * mst[0] + h * mst[1];
        for (int64_t i = 0; i < sq; ++i) {
          float* row = scores.data() + i * sq;
          const float* mr = mask + i * mst[2];
          if (mst[3] == 1) {
#pragma omp simd
            for (int64_t j = 0; j < sq; ++j)
              row[j] += mr[j];
          } else {
            for (int64_t j = 0; j < sq; ++j)
              row[j] += mr[j * mst[3]];
          }
        }
      }
      kc::engine_softmax(scores.data(), sq, sq, 1);
      const void* h2[3] = {scores.data(), static_cast<const float*>(p[v]) + off,
                           static_cast<float*>(p[y]) + off};
      run_call(eng, (*calls)[1], h2);
    }
  };
  return s;
}

/// Row bands [cuts[i], cuts[i + 1]) of a row-wise kernel, one per work item.
std::vector<int64_t> row_bands(int64_t rows, unsigned threads) {
  return split_range(rows, pieces_for(rows, threads), 1, threads);
}

/// Whether FusedGemm `n` is a product with constant weights that matmul_step
/// runs: A not transposed, alpha 1, and C (if any) a constant row of biases
/// added with beta 1.
bool gemm_as_matmul(const graph& g, const node& n) {
  const auto& a = g.values[n.inputs[0]];
  const auto& w = g.values[n.inputs[1]];
  if (!w.constant || w.shape.size() != 2 || a.shape.size() != 2 || n.get_i("transA", 0) != 0
      || n.get_f("alpha", 1.0f) != 1.0f || w.dtype != datatype::fp32)
    return false;
  if (n.inputs.size() < 3 || n.inputs[2] < 0)
    return true;
  const auto& c = g.values[n.inputs[2]];
  int64_t cols = g.values[n.outputs[0]].shape[1];
  return c.constant && n.get_f("beta", 1.0f) == 1.0f && c.constant->elements() == cols
         && !c.shape.empty() && c.shape.back() == cols;
}

step compile_node(const dnnl_ctx& ctx, const graph& g, int idx, unsigned threads,
                  const layout_map& lay, const onnx_model_config& mcfg) {
  const node& n = g.nodes[idx];
  auto shape_of = [&](int v) { return v >= 0 ? g.values[v].shape : dims_t{}; };
  auto finish = [&](step s) {
    s.node = idx;
    return s;
  };
  if (n.op == "FusedConv" && g.values[n.inputs[1]].constant)
    return finish(conv_step(ctx, g, n, threads, lay, mcfg));
  if (n.op == "MaxPool" || n.op == "AveragePool" || n.op == "GlobalAveragePool")
    return finish(pool_step(ctx, g, n, lay, threads));
  if (n.op == "ToNHWC" || n.op == "ToNCHW" || n.op == "ToNChw16c")
    return finish(reorder_step(ctx, g, n, lay));
  if (n.op == "FusedMatMul")
    return finish(matmul_step(ctx, g, n, threads, false));
  if (n.op == "FusedGemm" && gemm_as_matmul(g, n))
    return finish(matmul_step(ctx, g, n, threads, n.get_i("transB", 0) != 0));
  step s;
  s.node = idx;
  if (n.op == "FusedLayerNorm") {
    s.kernel = "engine.layer_norm";
    kc::layer_norm_args a;
    a.width = shape_of(n.inputs[0]).back();
    a.rows = element_count(shape_of(n.inputs[0])) / a.width;
    a.epsilon = n.get_f("epsilon", 1e-5f);
    auto cuts = row_bands(a.rows, threads);
    s.items = static_cast<int64_t>(cuts.size()) - 1;
    int x = n.inputs[0], gm = n.inputs[1], bt = n.inputs.size() > 2 ? n.inputs[2] : -1,
        y = n.outputs[0];
    s.run = [a, cuts, x, gm, bt, y](void** p, int64_t item) {
      auto band = a;
      int64_t r0 = cuts[item];
      band.rows = cuts[item + 1] - r0;
      band.x = static_cast<const float*>(p[x]) + r0 * a.width;
      band.gamma = static_cast<const float*>(p[gm]);
      band.beta = bt >= 0 ? static_cast<const float*>(p[bt]) : nullptr;
      band.y = static_cast<float*>(p[y]) + r0 * a.width;
      kc::engine_layer_norm(band);
    };
    return s;
  }
  if (n.op == "FusedGelu") {
    s.kernel = "engine.gelu";
    int x = n.inputs[0], b = n.inputs.size() > 1 ? n.inputs[1] : -1, y = n.outputs[0];
    int64_t total = element_count(shape_of(x));
    int64_t width = b >= 0 ? element_count(shape_of(b)) : total;
    auto cuts = row_bands(total / width, threads);
    s.items = static_cast<int64_t>(cuts.size()) - 1;
    s.run = [=](void** p, int64_t item) {
      int64_t r0 = cuts[item], rows = cuts[item + 1] - r0;
      kc::engine_gelu(static_cast<const float*>(p[x]) + r0 * width,
                      b >= 0 ? static_cast<const float*>(p[b]) : nullptr, width, rows * width,
                      static_cast<float*>(p[y]) + r0 * width, 1);
    };
    return s;
  }
  if (n.op == "Softmax" && (n.get_i("axis", -1) == -1
                            || n.get_i("axis", -1) + 1
                                 == static_cast<int64_t>(shape_of(n.inputs[0]).size()))) {
    s.kernel = "engine.softmax";
    int x = n.inputs[0], y = n.outputs[0];
    int64_t width = shape_of(x).back(), total = element_count(shape_of(x));
    auto cuts = row_bands(total / width, threads);
    s.items = static_cast<int64_t>(cuts.size()) - 1;
    s.run = [=](void** p, int64_t item) {
      int64_t r0 = cuts[item], rows = cuts[item + 1] - r0;
      float* out = static_cast<float*>(p[y]) + r0 * width;
      std::memcpy(out, static_cast<const float*>(p[x]) + r0 * width, rows * width * 4);
      kc::engine_softmax(out, rows, width, 1);
    };
    return s;
  }
  if (n.op == "FusedAttention")
    return finish(attention_step(ctx, g, n, threads));
  // Reference kernel: shapes are fixed, pointers come from the table.
  s.kernel = "reference";
  std::vector<tensor_ref> ins, outs;
  for (int i : n.inputs)
    ins.push_back(i >= 0 ? tensor_ref{g.values[i].dtype, g.values[i].shape, nullptr}
                         : tensor_ref{});
  for (int o : n.outputs)
    outs.push_back({g.values[o].dtype, g.values[o].shape, nullptr});
  s.run = [copy = n, ins, outs](void** p, int64_t) {
    // Copies, so that plans running on several threads do not share them.
    auto in = ins;
    auto out = outs;
    for (size_t i = 0; i < in.size(); ++i)
      in[i].data = copy.inputs[i] >= 0 ? p[copy.inputs[i]] : nullptr;
    for (size_t i = 0; i < out.size(); ++i)
      out[i].data = p[copy.outputs[i]];
    run_reference(copy, in, out);
  };
  return s;
}

serving_error load_error(const onnx_model_config& cfg, const std::string& what) {
  return {status_code::bad_request,
          "model '" + cfg.config.name + "': " + cfg.model_file.string() + ": " + what};
}

int find_value(const graph& g, const std::vector<int>& list, const std::string& name) {
  for (int v : list)
    if (g.values[v].name == name)
      return v;
  return -1;
}

/// Sets the calling thread's OpenMP thread count for its lifetime.
class omp_threads_scope {
public:
  explicit omp_threads_scope(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~omp_threads_scope() { omp_set_num_threads(saved_); }
  omp_threads_scope(const omp_threads_scope&) = delete;
  omp_threads_scope& operator=(const omp_threads_scope&) = delete;

private:
  int saved_;
};

/// `threads`: how many threads run the plan's steps (each step is split into
/// work items for them); 1 for a plan that one thread runs on part of a batch.
result<std::shared_ptr<compiled_plan>> compile(const graph& src, const model_config& cfg,
                                               const onnx_model_config& mcfg,
                                               const std::vector<dims_t>& shapes,
                                               unsigned threads, weight_store& weights) {
  // oneDNN fixes a primitive's thread count when the primitive is created
  // (from omp_get_max_threads()), not when it runs. Created with the default
  // count (all cores) on the loading thread, every convolution of a work item
  // forked an OpenMP team of its own: 4 busy threads on 2 cores, and a 2-thread
  // plan no faster than a 1-thread one.
  omp_threads_scope one_thread(1);
  auto opt = optimize(src, shapes, mcfg.passes);
  if (!opt)
    return load_error(mcfg, opt.error().message);
  auto plan = std::make_shared<compiled_plan>();
  plan->g = std::move(*opt);
  plan->batch = shapes.empty() || shapes[0].empty() ? 1 : shapes[0][0];
  plan->threads = threads;
  auto& g = plan->g;
  auto lay = assign_layouts(g);
  for (const auto& t : cfg.inputs)
    plan->input_values.push_back(find_value(g, g.inputs, t.name));
  for (const auto& t : cfg.outputs)
    plan->output_values.push_back(find_value(g, g.outputs, t.name));
  std::vector<bool> external(g.values.size(), false);
  for (int v : g.inputs) external[v] = true;
  for (int v : plan->output_values) external[v] = true;
  memory_plan_config mc;
  mc.external = [&](int v) { return external[v]; };
  plan->memory = plan_memory(g, mc);
  plan->constant_ptrs.assign(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].constant)
      plan->constant_ptrs[v] = const_cast<uint8_t*>(g.values[v].constant->bytes.data());
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const dnnl_ctx ctx{eng, &weights};
  try {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      plan->steps.push_back(
        compile_node(ctx, g, static_cast<int>(i), threads, lay, mcfg));
  } catch (const dnnl::error& e) {
    return load_error(mcfg, std::string("oneDNN cannot build a kernel: ") + e.what());
  }
  return plan;
}

/// The plans of a model's instances that are being profiled.
struct profiled_plans {
  std::mutex mu;
  std::vector<std::shared_ptr<const compiled_plan>> plans;
};

/// Step label for plans and profiles: the operator with its fused parts.
std::string step_label(const compiled_plan& p, const step& s) {
  const auto& n = p.g.nodes[s.node];
  std::string out = n.op;
  if (n.has("activation") && !n.get_s("activation", "").empty())
    out += "+" + n.get_s("activation", "");
  if ((n.op == "FusedConv" || n.op == "FusedMatMul") && n.inputs.size() > 3 && n.inputs[3] >= 0)
    out += "+residual";
  return out;
}

/// Input shapes (constants left out) and output shapes of step `s`.
std::string step_shapes(const compiled_plan& p, const step& s) {
  const auto& n = p.g.nodes[s.node];
  std::string out = "(";
  bool first = true;
  for (int i : n.inputs) {
    if (i < 0 || p.g.values[i].constant) continue;
    out += (first ? "" : ", ") + shape_string(p.g.values[i].shape);
    first = false;
  }
  out += ") -> ";
  for (size_t o = 0; o < n.outputs.size(); ++o)
    out += (o ? ", " : "") + shape_string(p.g.values[n.outputs[o]].shape);
  return out;
}

std::string profile_text(profiled_plans& pp) {
  std::lock_guard<std::mutex> guard(pp.mu);
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  for (const auto& p : pp.plans) {
    int64_t runs = p->times->runs;
    if (runs == 0) continue;
    double total = 0;
    std::map<std::string, std::pair<double, int>> by_kind;
    std::vector<std::pair<double, size_t>> by_step;
    for (size_t i = 0; i < p->steps.size(); ++i) {
      double ms = p->times->ns[i] / 1e6 / runs;
      total += ms;
      auto& k = by_kind[step_label(*p, p->steps[i]) + " [" + p->steps[i].kernel + "]"];
      k.first += ms;
      ++k.second;
      by_step.emplace_back(ms, i);
    }
    os << "plan: batch " << p->batch << ", steps split for " << p->threads << " thread(s), "
       << runs << " run(s), " << total << " ms per run\n  by kind (ms per run, share, steps):\n";
    std::vector<std::pair<double, std::string>> kinds;
    for (const auto& [name, v] : by_kind)
      kinds.emplace_back(v.first, name + "  x" + std::to_string(v.second));
    std::sort(kinds.rbegin(), kinds.rend());
    for (const auto& [ms, name] : kinds)
      os << "    " << ms << "  " << (total > 0 ? 100 * ms / total : 0) << "%  " << name << "\n";
    std::sort(by_step.rbegin(), by_step.rend());
    os << "  slowest steps (ms per run):\n";
    for (size_t i = 0; i < by_step.size() && i < 12; ++i) {
      const auto& s = p->steps[by_step[i].second];
      os << "    " << by_step[i].first << "  " << step_label(*p, s) << " [" << s.kernel << "] "
         << p->g.nodes[s.node].name << " " << step_shapes(*p, s) << " items " << s.items << "\n";
    }
  }
  return os.str();
}

/// The threads of one instance run a batch one of two ways. A batch of at
/// least as many rows as threads is cut into row chunks, and each chunk runs a
/// whole plan on one thread (no synchronisation between steps at all). Smaller
/// batches run one plan whose steps are split into work items for all threads.
class onnx_backend final : public executor::backend {
public:
  /// `first`: the plan compiled at load (batch 1, `shapes`), shared by the
  /// instances (plans are read-only once compiled).
  onnx_backend(std::shared_ptr<const graph> g, model_config cfg, onnx_model_config mcfg,
               std::shared_ptr<profiled_plans> profiled, std::shared_ptr<weight_store> weights,
               std::shared_ptr<compiled_plan> first, std::vector<dims_t> shapes)
      : graph_(std::move(g)), cfg_(std::move(cfg)), mcfg_(std::move(mcfg)),
        profiled_(std::move(profiled)), weights_(std::move(weights)),
        pool_(std::max(1u, mcfg_.threads)), arenas_(pool_.size()), ptrs_(pool_.size()) {
    if (first && !profiled_) {
      auto key = std::make_pair(std::move(shapes), first->threads);
      plans_.emplace(std::move(key), cached_plan{std::move(first), ++uses_});
    }
  }

  bool blocks() const override { return true; }

  exec_result execute(const executor::batch_view& batch, executor::output_writer& out) override {
    std::vector<dims_t> shapes(graph_->inputs.size());
    std::vector<const void*> data(graph_->inputs.size(), nullptr);
    for (const auto& t : batch.inputs) {
      int pos = -1;
      for (size_t i = 0; i < graph_->inputs.size(); ++i)
        if (graph_->values[graph_->inputs[i]].name == t.name)
          pos = static_cast<int>(i);
      if (pos < 0)
        return serving_error{status_code::bad_request, "model '" + cfg_.name
                                                         + "' has no input '"
                                                         + std::string(t.name) + "'"};
      shapes[pos] = t.shape;
      data[pos] = t.data;
    }
    for (size_t i = 0; i < shapes.size(); ++i)
      if (!data[i])
        return serving_error{status_code::bad_request,
                             "model '" + cfg_.name + "' needs input '"
                               + graph_->values[graph_->inputs[i]].name + "'"};
    // oneDNN and the engine kernels run single-threaded inside work items.
    omp_set_num_threads(1);
    int64_t rows = cfg_.max_batch_size > 0 && !shapes.empty() && !shapes[0].empty()
                     ? shapes[0][0] : 1;
    unsigned threads = pool_.size();
    if (threads > 1 && rows >= threads)
      return run_row_chunks(shapes, data, rows, out);
    auto plan = plan_for(shapes, threads);
    if (!plan)
      return plan.error();
    auto& p = **plan;
    std::vector<void*> outputs;
    for (size_t i = 0; i < p.output_values.size(); ++i) {
      const auto& val = p.g.values[p.output_values[i]];
      size_t bytes = static_cast<size_t>(element_count(val.shape)) * element_size(val.dtype);
      outputs.push_back(out.allocate(cfg_.outputs[i].name, val.dtype, val.shape, bytes));
    }
    bind(p, 0, data, outputs, 0);
    void** ptrs = ptrs_[0].data();
    run_steps(p, [&](const step& s) {
      if (s.items == 1)
        s.run(ptrs, 0);
      else
        pool_.run(s.items, [&](int64_t item, unsigned) { s.run(ptrs, item); });
    });
    return {};
  }

private:
  /// Runs every step of `p` through `run_step`, timing each when profiling.
  template <class RunStep>
  static void run_steps(const compiled_plan& p, RunStep&& run_step) {
    if (!p.times) {
      for (const auto& s : p.steps)
        run_step(s);
      return;
    }
    using std::chrono::steady_clock;
    for (size_t i = 0; i < p.steps.size(); ++i) {
      auto t0 = steady_clock::now();
      run_step(p.steps[i]);
      p.times->ns[i] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                          steady_clock::now() - t0).count();
    }
    ++p.times->runs;
  }

  /// Rows per chunk: two chunks per thread, so that a thread the OS runs late
  /// leaves less behind, but chunks big enough to keep the GEMMs efficient.
  static int64_t chunk_rows(int64_t rows, unsigned threads) {
    int64_t chunks = std::min<int64_t>(rows, 2 * static_cast<int64_t>(threads));
    return (rows + chunks - 1) / chunks;
  }

  exec_result run_row_chunks(const std::vector<dims_t>& shapes,
                             const std::vector<const void*>& data, int64_t rows,
                             executor::output_writer& out) {
    int64_t per = chunk_rows(rows, pool_.size());
    int64_t chunks = (rows + per - 1) / per;
    auto shapes_of = [&](int64_t n) {
      auto s = shapes;
      for (auto& d : s) d[0] = n;
      return s;
    };
    // Plans are compiled here, on the caller, before any thread uses them.
    auto full = plan_for(shapes_of(per), 1);
    if (!full)
      return full.error();
    std::shared_ptr<compiled_plan> last = *full;
    if (rows % per != 0) {
      auto l = plan_for(shapes_of(rows % per), 1);
      if (!l)
        return l.error();
      last = *l;
    }
    std::vector<uint8_t*> outputs;
    std::vector<size_t> out_row_bytes;
    for (size_t i = 0; i < (*full)->output_values.size(); ++i) {
      const auto& val = (*full)->g.values[(*full)->output_values[i]];
      dims_t shape = val.shape;
      shape[0] = rows;
      size_t row_bytes = static_cast<size_t>(element_count(val.shape) / per)
                         * element_size(val.dtype);
      outputs.push_back(out.allocate(cfg_.outputs[i].name, val.dtype, shape, row_bytes * rows));
      out_row_bytes.push_back(row_bytes);
    }
    std::vector<size_t> in_row_bytes;
    for (size_t i = 0; i < shapes.size(); ++i)
      in_row_bytes.push_back(static_cast<size_t>(element_count(shapes[i]) / rows)
                             * element_size(graph_->values[graph_->inputs[i]].dtype));
    pool_.run(chunks, [&](int64_t chunk, unsigned thread) {
      const auto& p = chunk + 1 == chunks ? *last : **full;
      int64_t r0 = chunk * per;
      std::vector<const void*> in(data.size());
      for (size_t i = 0; i < data.size(); ++i)
        in[i] = static_cast<const uint8_t*>(data[i]) + r0 * in_row_bytes[i];
      std::vector<void*> o(outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i)
        o[i] = outputs[i] + r0 * out_row_bytes[i];
      bind(p, thread, in, o, thread);
      void** ptrs = ptrs_[thread].data();
      run_steps(p, [&](const step& s) {
        for (int64_t item = 0; item < s.items; ++item)
          s.run(ptrs, item);
      });
    });
    return {};
  }

  /// Fills thread `t`'s pointer table for `p`: constants, its arena, the
  /// inputs and outputs.
  void bind(const compiled_plan& p, unsigned t, const std::vector<const void*>& inputs,
            const std::vector<void*>& outputs, unsigned arena) {
    auto& buf = arenas_[arena];
    if (buf.size() < p.memory.arena_bytes + 64)
      buf.assign(p.memory.arena_bytes + 64, 0);
    auto base = reinterpret_cast<uintptr_t>(buf.data());
    auto* a = reinterpret_cast<uint8_t*>((base + 63) / 64 * 64);
    auto& ptrs = ptrs_[t];
    ptrs = p.constant_ptrs;
    for (size_t v = 0; v < ptrs.size(); ++v)
      if (p.memory.offsets[v] >= 0)
        ptrs[v] = a + p.memory.offsets[v];
    for (size_t i = 0; i < inputs.size(); ++i)
      ptrs[p.g.inputs[i]] = const_cast<void*>(inputs[i]);
    for (size_t i = 0; i < outputs.size(); ++i)
      ptrs[p.output_values[i]] = outputs[i];
  }

  result<std::shared_ptr<compiled_plan>> plan_for(const std::vector<dims_t>& shapes,
                                                  unsigned threads) {
    auto key = std::make_pair(shapes, threads);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      it->second.last_use = ++uses_;
      return it->second.plan;
    }
    // At most plan_cache_size plans: the least recently used one goes (a plan
    // holds its primitives and any constants folded for it; the reordered
    // weights stay in the shared store).
    while (plans_.size() >= std::max<size_t>(1, mcfg_.plan_cache_size)) {
      auto oldest = plans_.begin();
      for (auto p = plans_.begin(); p != plans_.end(); ++p)
        if (p->second.last_use < oldest->second.last_use)
          oldest = p;
      plans_.erase(oldest);
    }
    auto plan = compile(*graph_, cfg_, mcfg_, shapes, threads, *weights_);
    if (!plan)
      return serving_error{status_code::bad_request, plan.error().message};
    if (profiled_) {
      (*plan)->times = std::make_shared<step_times>((*plan)->steps.size());
      std::lock_guard<std::mutex> guard(profiled_->mu);
      profiled_->plans.push_back(*plan);
    }
    plans_.emplace(key, cached_plan{*plan, ++uses_});
    return *plan;
  }

  std::shared_ptr<const graph> graph_;
  model_config cfg_;
  onnx_model_config mcfg_;
  std::shared_ptr<profiled_plans> profiled_; ///< null unless profiling
  std::shared_ptr<weight_store> weights_;    ///< shared by the model's instances
  work_pool pool_;
  struct cached_plan {
    std::shared_ptr<compiled_plan> plan;
    uint64_t last_use = 0;
  };
  std::map<std::pair<std::vector<dims_t>, unsigned>, cached_plan> plans_;
  uint64_t uses_ = 0;
  std::vector<std::vector<uint8_t>> arenas_; ///< per thread
  std::vector<std::vector<void*>> ptrs_;     ///< per thread: the pointer table
};

std::string dims_text(const std::vector<int64_t>& d) {
  return shape_string(d);
}

/// Completes `cfg` from the graph, or names the contradiction.
result<model_config> complete_config(const graph& g, const onnx_model_config& mcfg) {
  model_config cfg = mcfg.config;
  bool batched = cfg.max_batch_size > 0;
  auto io_dims = [&](const value& v) -> result<dims_t> {
    if (!batched)
      return v.shape;
    if (v.shape.empty())
      return load_error(mcfg, "'" + v.name + "' has no batch dimension, but max_batch_size is "
                                + std::to_string(cfg.max_batch_size)
                                + "; set max_batch_size: 0 or export with a batch axis");
    if (v.shape[0] > 1)
      return load_error(mcfg, "'" + v.name + "' has a fixed first dimension of "
                                + std::to_string(v.shape[0]) + " in " + dims_text(v.shape)
                                + ", so it cannot take batches up to max_batch_size "
                                + std::to_string(cfg.max_batch_size)
                                + "; export with a dynamic batch axis or set max_batch_size: 0");
    return dims_t(v.shape.begin() + 1, v.shape.end());
  };
  auto compatible = [](const dims_t& a, const dims_t& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] && a[i] != -1 && b[i] != -1) return false;
    return true;
  };
  // Inputs.
  for (const auto& t : cfg.inputs)
    if (find_value(g, g.inputs, t.name) < 0) {
      std::string names;
      for (int v : g.inputs) names += (names.empty() ? "'" : ", '") + g.values[v].name + "'";
      return load_error(mcfg, "config.pbtxt declares input '" + t.name
                                + "', but the ONNX graph has no such input; its inputs are "
                                + names);
    }
  std::vector<tensor_config> inputs;
  for (int v : g.inputs) {
    const auto& val = g.values[v];
    auto dims = io_dims(val);
    if (!dims) return dims.error();
    auto it = std::find_if(cfg.inputs.begin(), cfg.inputs.end(),
                           [&](const tensor_config& t) { return t.name == val.name; });
    if (it == cfg.inputs.end()) {
      inputs.push_back({val.name, val.dtype, *dims});
      continue;
    }
    if (it->dtype != val.dtype)
      return load_error(mcfg, "config.pbtxt gives input '" + val.name + "' data_type "
                                + std::string(to_string(it->dtype)) + ", but the ONNX graph has "
                                + std::string(to_string(val.dtype)));
    if (!it->dims.empty() && !compatible(it->dims, *dims))
      return load_error(mcfg, "config.pbtxt gives input '" + val.name + "' dims "
                                + dims_text(it->dims) + ", but the ONNX graph has "
                                + dims_text(*dims) + " (batch dimension excluded)");
    tensor_config t = *it;
    if (t.dims.empty()) t.dims = *dims;
    inputs.push_back(t);
  }
  // Keep config order when it listed inputs; the graph's otherwise.
  if (!cfg.inputs.empty()) {
    std::vector<tensor_config> ordered;
    for (const auto& t : cfg.inputs)
      for (const auto& c : inputs) if (c.name == t.name) ordered.push_back(c);
    for (const auto& c : inputs)
      if (std::none_of(ordered.begin(), ordered.end(),
                       [&](const tensor_config& o) { return o.name == c.name; }))
        ordered.push_back(c);
    inputs = ordered;
  }
  cfg.inputs = inputs;

  // Output shapes come from shape inference at batch 1.
  std::vector<dims_t> shapes;
  for (int v : g.inputs) {
    const auto& in = *std::find_if(cfg.inputs.begin(), cfg.inputs.end(),
                                   [&](const tensor_config& t) { return t.name == g.values[v].name; });
    dims_t s = in.dims;
    for (auto& d : s)
      if (d < 0)
        return load_error(mcfg, "input '" + in.name + "' has a variable dimension " + dims_text(s)
                                  + " besides the batch; give it a fixed size in config.pbtxt "
                                    "dims or export with static shapes");
    if (batched) s.insert(s.begin(), 1);
    shapes.push_back(s);
  }
  auto spec = specialize(g, shapes);
  if (!spec)
    return load_error(mcfg, spec.error().message);
  for (const auto& t : cfg.outputs)
    if (find_value(*spec, spec->outputs, t.name) < 0) {
      std::string names;
      for (int v : spec->outputs)
        names += (names.empty() ? "'" : ", '") + spec->values[v].name + "'";
      return load_error(mcfg, "config.pbtxt declares output '" + t.name
                                + "', but the ONNX graph has no such output; its outputs are "
                                + names);
    }
  std::vector<tensor_config> outputs;
  for (int v : spec->outputs) {
    const auto& val = spec->values[v];
    dims_t dims = val.shape;
    if (batched) dims.erase(dims.begin());
    auto it = std::find_if(cfg.outputs.begin(), cfg.outputs.end(),
                           [&](const tensor_config& t) { return t.name == val.name; });
    if (it == cfg.outputs.end()) {
      if (cfg.outputs.empty())
        outputs.push_back({val.name, val.dtype, dims});
      continue;
    }
    if (it->dtype != val.dtype)
      return load_error(mcfg, "config.pbtxt gives output '" + val.name + "' data_type "
                                + std::string(to_string(it->dtype)) + ", but the ONNX graph has "
                                + std::string(to_string(val.dtype)));
    if (!it->dims.empty() && !compatible(it->dims, dims))
      return load_error(mcfg, "config.pbtxt gives output '" + val.name + "' dims "
                                + dims_text(it->dims) + ", but the ONNX graph computes "
                                + dims_text(dims) + " (batch dimension excluded)");
    tensor_config t = *it;
    if (t.dims.empty()) t.dims = dims;
    outputs.push_back(t);
  }
  if (!cfg.outputs.empty()) {
    std::vector<tensor_config> ordered;
    for (const auto& t : cfg.outputs)
      for (const auto& c : outputs) if (c.name == t.name) ordered.push_back(c);
    outputs = ordered;
  }
  cfg.outputs = outputs;
  return cfg;
}

std::vector<dims_t> shapes_at(const model_config& cfg, int64_t batch) {
  std::vector<dims_t> shapes;
  for (const auto& t : cfg.inputs) {
    dims_t s = t.dims;
    if (cfg.max_batch_size > 0) s.insert(s.begin(), batch);
    shapes.push_back(s);
  }
  return shapes;
}

/// The graph's inputs reordered as cfg.inputs lists them (compile() expects that order).
graph inputs_in_config_order(graph g, const model_config& cfg) {
  std::vector<int> ordered;
  for (const auto& t : cfg.inputs)
    ordered.push_back(find_value(g, g.inputs, t.name));
  g.inputs = ordered;
  return g;
}

} // namespace

result<onnx_model> load_onnx_model(const onnx_model_config& mcfg) {
  auto imported = import_model(mcfg.model_file);
  if (!imported)
    return serving_error{status_code::bad_request,
                         "model '" + mcfg.config.name + "': " + imported.error().message};
  return load_onnx_graph(std::move(*imported), mcfg);
}

/// config.pbtxt's `parameters` for the ONNX backend: "winograd",
/// "engine_conv1x1" and "conv_bands" ("true" or "false") and
/// "plan_cache_size" (1 to 1024).
result<onnx_model_config> with_parameters(onnx_model_config mcfg) {
  for (const auto& [key, value] : mcfg.config.parameters) {
    if (key == "winograd" || key == "engine_conv1x1" || key == "conv_bands") {
      if (value != "true" && value != "false")
        return load_error(mcfg, "parameters \"" + key + "\" is '" + value
                                  + "'; give string_value \"true\" or \"false\"");
      (key == "winograd"         ? mcfg.winograd
       : key == "engine_conv1x1" ? mcfg.engine_conv1x1
                                 : mcfg.conv_bands) = value == "true";
    } else if (key == "plan_cache_size") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 1024)
        return load_error(mcfg, "parameters \"plan_cache_size\" is '" + value
                                  + "'; give a count from 1 to 1024 as string_value");
      mcfg.plan_cache_size = static_cast<size_t>(n);
    }
  }
  return mcfg;
}

result<onnx_model> load_onnx_graph(graph imported, const onnx_model_config& given) {
  auto with = with_parameters(given);
  if (!with)
    return with.error();
  const auto& mcfg = *with;
  auto cfg = complete_config(imported, mcfg);
  if (!cfg)
    return cfg.error();
  auto g = std::make_shared<const graph>(inputs_in_config_order(std::move(imported), *cfg));
  openblas_set_num_threads(1);
  auto weights = std::make_shared<weight_store>();
  auto plan = compile(*g, *cfg, mcfg, shapes_at(*cfg, 1), std::max(1u, mcfg.threads), *weights);
  if (!plan)
    return plan.error();
  onnx_model m;
  m.config = *cfg;
  std::ostringstream os;
  os << "ONNX opset " << g->opset << ", " << g->nodes.size() << " nodes -> "
     << (*plan)->g.nodes.size() << " steps, arena " << (*plan)->memory.arena_bytes
     << " bytes at batch 1 (" << (*plan)->memory.unshared_bytes << " without reuse), "
     << mcfg.threads << " compute thread(s), " << weights->bytes() / (1 << 20)
     << " MiB of reordered weights";
  m.summary = os.str();
  auto profiled = mcfg.profile ? std::make_shared<profiled_plans>() : nullptr;
  m.make_instance = [g, c = *cfg, mcfg, profiled, weights, first = *plan,
                     shapes = shapes_at(*cfg, 1)]() -> std::shared_ptr<executor::backend> {
    return std::make_shared<onnx_backend>(g, c, mcfg, profiled, weights, first, shapes);
  };
  m.reordered_weight_bytes = [weights] { return weights->bytes(); };
  m.profile_report = [profiled] { return profiled ? profile_text(*profiled) : std::string(); };
  return m;
}

result<std::string> describe_plan(const onnx_model_config& given, int64_t batch) {
  auto with = with_parameters(given);
  if (!with)
    return with.error();
  const auto& mcfg = *with;
  auto imported = import_model(mcfg.model_file);
  if (!imported)
    return imported.error();
  auto cfg = complete_config(*imported, mcfg);
  if (!cfg)
    return cfg.error();
  auto g = inputs_in_config_order(std::move(*imported), *cfg);
  weight_store weights;
  auto plan = compile(g, *cfg, mcfg, shapes_at(*cfg, batch), std::max(1u, mcfg.threads), weights);
  if (!plan)
    return plan.error();
  const auto& p = **plan;
  std::ostringstream os;
  os << "plan for " << mcfg.model_file.string() << " at batch " << batch << ", "
     << mcfg.threads << " compute thread(s): opset " << g.opset << ", " << g.nodes.size()
     << " ONNX nodes -> " << p.steps.size() << " steps\n";
  for (const auto& s : p.steps) {
    const auto& n = p.g.nodes[s.node];
    os << "  " << step_label(p, s) << "  [" << s.kernel << "]  " << n.name << "  "
       << step_shapes(p, s);
    for (int o : n.outputs) {
      if (p.memory.offsets[o] >= 0) os << " @" << p.memory.offsets[o];
      else os << " (output)";
    }
    os << "\n";
  }
  os << "arena: " << p.memory.arena_bytes << " bytes (" << p.memory.unshared_bytes
     << " without buffer reuse)\n";
  return os.str();
}

} // namespace caf_serving::onnx
