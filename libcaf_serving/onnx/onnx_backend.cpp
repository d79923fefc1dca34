#include "onnx/onnx_backend.hpp"

#include "engine_kernels.hpp"
#include "onnx/importer.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/ops.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
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

/// One step of a plan: reads and writes through the per-run pointer table.
struct step {
  std::string kernel; ///< for describe_plan
  int node = -1;
  std::function<void(void** ptrs)> run;
};

struct compiled_plan {
  graph g;
  memory_plan memory;
  std::vector<step> steps;
  std::vector<void*> constant_ptrs; ///< per value: constant data, else null
  std::vector<int> input_values;    ///< per config input
  std::vector<int> output_values;   ///< per config output
};

// ------------------------------------------------------------------ oneDNN steps

struct dnnl_ctx {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
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

/// A oneDNN primitive with its user-side memory objects; the data handles are
/// set from the pointer table on every run.
struct dnnl_step {
  dnnl::primitive prim;
  std::vector<std::pair<int, dnnl::memory>> args; ///< (DNNL_ARG_*, memory)
  std::vector<int> values;                        ///< value per arg (-1: fixed memory)
  int threads = 1;
  dnnl::engine eng;

  void operator()(void** ptrs) {
    std::unordered_map<int, dnnl::memory> m;
    for (size_t i = 0; i < args.size(); ++i) {
      if (values[i] >= 0)
        args[i].second.set_data_handle(ptrs[values[i]]);
      m.emplace(args[i].first, args[i].second);
    }
    dnnl::stream s(eng);
    prim.execute(s, m);
    s.wait();
  }
};

/// Reorders constant weights into the layout a primitive chose.
dnnl::memory reorder_weights(const dnnl_ctx& ctx, const tensor_data& w,
                             const dnnl::memory::desc& user, const dnnl::memory::desc& want) {
  dnnl::memory src(user, ctx.eng, const_cast<uint8_t*>(w.bytes.data()));
  dnnl::memory dst(want, ctx.eng);
  dnnl::stream s(ctx.eng);
  dnnl::reorder(src, dst).execute(s, src, dst);
  s.wait();
  return dst;
}

/// Which 4-D values are stored channels-last (NHWC): oneDNN's fast convolution
/// and pooling kernels want it; everything else reads NCHW.
using layout_map = std::vector<bool>;

dnnl::memory::format_tag tag_of(const graph& g, const layout_map& nhwc, int v, bool prefer_cl) {
  const auto& s = g.values[v].shape;
  // A 1x1 spatial tensor has the same bytes in either layout.
  if (nhwc[v] || (prefer_cl && s.size() == 4 && s[2] * s[3] == 1))
    return dnnl::memory::format_tag::nhwc;
  return dnnl::memory::format_tag::nchw;
}

std::shared_ptr<dnnl_step> conv_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                                     int threads, const layout_map& nhwc) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& w = *g.values[n.inputs[1]].constant;
  const auto& ys = g.values[n.outputs[0]].shape;
  int64_t group = n.get_i("group", 1);
  auto st = n.get_ints("strides", {1, 1});
  auto pd = n.get_ints("pads", {0, 0, 0, 0});
  auto dl = n.get_ints("dilations", {1, 1});
  bool cl = nhwc[n.inputs[0]];
  dnnl::memory::desc src({to_dnnl(xs)}, dt::f32, tag_of(g, nhwc, n.inputs[0], false));
  dnnl::memory::desc dst({to_dnnl(ys)}, dt::f32, tag_of(g, nhwc, n.outputs[0], cl));
  dims_t wd = w.shape;
  tag wtag = tag::oihw;
  if (group > 1) {
    wd = {group, w.shape[0] / group, w.shape[1], w.shape[2], w.shape[3]};
    wtag = tag::goihw;
  }
  dnnl::memory::desc wuser(to_dnnl(wd), dt::f32, wtag);
  dnnl::memory::desc wany(to_dnnl(wd), dt::f32, tag::any);
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  dnnl::memory::desc bias({ys[1]}, dt::f32, tag::a);
  dnnl::post_ops po;
  if (has_res)
    po.append_binary(dnnl::algorithm::binary_add, dst);
  auto act = n.get_s("activation", "");
  if (!act.empty())
    po.append_eltwise(1.0f, eltwise_of(act), n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  auto d = has_bias ? dnnl::convolution_forward::desc(
                        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                        src, wany, bias, dst, {st[0], st[1]}, {dl[0] - 1, dl[1] - 1},
                        {pd[0], pd[1]}, {pd[2], pd[3]})
                    : dnnl::convolution_forward::desc(
                        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                        src, wany, dst, {st[0], st[1]}, {dl[0] - 1, dl[1] - 1}, {pd[0], pd[1]},
                        {pd[2], pd[3]});
  dnnl::convolution_forward::primitive_desc pdesc(d, attr, ctx.eng);
  auto s = std::make_shared<dnnl_step>();
  s->eng = ctx.eng;
  s->threads = threads;
  s->prim = dnnl::convolution_forward(pdesc);
  s->args.push_back({DNNL_ARG_SRC, dnnl::memory(src, ctx.eng, DNNL_MEMORY_NONE)});
  s->values.push_back(n.inputs[0]);
  s->args.push_back({DNNL_ARG_WEIGHTS, reorder_weights(ctx, w, wuser, pdesc.weights_desc())});
  s->values.push_back(-1);
  if (has_bias) {
    s->args.push_back({DNNL_ARG_BIAS, dnnl::memory(bias, ctx.eng, DNNL_MEMORY_NONE)});
    s->values.push_back(n.inputs[2]);
  }
  if (has_res) {
    s->args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                       dnnl::memory(dst, ctx.eng, DNNL_MEMORY_NONE)});
    s->values.push_back(n.inputs[3]);
  }
  s->args.push_back({DNNL_ARG_DST, dnnl::memory(dst, ctx.eng, DNNL_MEMORY_NONE)});
  s->values.push_back(n.outputs[0]);
  return s;
}

std::shared_ptr<dnnl_step> pool_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                                     const layout_map& nhwc) {
  using dt = dnnl::memory::data_type;
  const auto& xs = g.values[n.inputs[0]].shape;
  const auto& ys = g.values[n.outputs[0]].shape;
  bool cl = nhwc[n.inputs[0]];
  dnnl::memory::desc src({to_dnnl(xs)}, dt::f32, tag_of(g, nhwc, n.inputs[0], false));
  dnnl::memory::desc dst({to_dnnl(ys)}, dt::f32, tag_of(g, nhwc, n.outputs[0], cl));
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
  dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, src, dst,
                                   to_dnnl(st), to_dnnl(k), to_dnnl(dil), to_dnnl(pl),
                                   to_dnnl(pr));
  dnnl::pooling_v2_forward::primitive_desc pdesc(d, ctx.eng);
  auto s = std::make_shared<dnnl_step>();
  s->eng = ctx.eng;
  s->prim = dnnl::pooling_v2_forward(pdesc);
  s->args.push_back({DNNL_ARG_SRC, dnnl::memory(src, ctx.eng, DNNL_MEMORY_NONE)});
  s->values.push_back(n.inputs[0]);
  s->args.push_back({DNNL_ARG_DST, dnnl::memory(dst, ctx.eng, DNNL_MEMORY_NONE)});
  s->values.push_back(n.outputs[0]);
  return s;
}

/// ToNHWC / ToNCHW: a oneDNN reorder between the two layouts of one 4-D tensor.
std::shared_ptr<dnnl_step> reorder_step(const dnnl_ctx& ctx, const graph& g, const node& n) {
  using tag = dnnl::memory::format_tag;
  auto dims = to_dnnl(g.values[n.inputs[0]].shape);
  bool to_cl = n.op == "ToNHWC";
  dnnl::memory::desc src(dims, dnnl::memory::data_type::f32, to_cl ? tag::nchw : tag::nhwc);
  dnnl::memory::desc dst(dims, dnnl::memory::data_type::f32, to_cl ? tag::nhwc : tag::nchw);
  auto s = std::make_shared<dnnl_step>();
  s->eng = ctx.eng;
  dnnl::memory a(src, ctx.eng, DNNL_MEMORY_NONE), b(dst, ctx.eng, DNNL_MEMORY_NONE);
  s->prim = dnnl::reorder(a, b);
  s->args.push_back({DNNL_ARG_FROM, a});
  s->values.push_back(n.inputs[0]);
  s->args.push_back({DNNL_ARG_TO, b});
  s->values.push_back(n.outputs[0]);
  return s;
}

bool runs_on_onednn_4d(const graph& g, const node& n) {
  bool spatial = (n.op == "FusedConv" && g.values[n.inputs[1]].constant) || n.op == "MaxPool"
                 || n.op == "AveragePool" || n.op == "GlobalAveragePool";
  return spatial && g.values[n.inputs[0]].shape.size() == 4;
}

/// Stores convolution and pooling tensors channels-last, inserting ToNHWC and
/// ToNCHW nodes where a tensor passes between them and the other operators.
layout_map assign_channels_last(graph& g) {
  std::vector<bool> is_output(g.values.size(), false);
  for (int o : g.outputs) is_output[o] = true;
  layout_map nhwc(g.values.size(), false);
  std::map<std::pair<int, bool>, int> converted;
  std::vector<node> nodes;
  auto convert = [&](int v, bool to_cl) {
    auto key = std::make_pair(v, to_cl);
    if (auto it = converted.find(key); it != converted.end()) return it->second;
    int nv = g.add_value(g.values[v].name + (to_cl ? "/nhwc" : "/nchw"), datatype::fp32,
                         g.values[v].shape, true);
    nhwc.resize(g.values.size(), false);
    nhwc[nv] = to_cl;
    nodes.push_back(node{to_cl ? "ToNHWC" : "ToNCHW", g.values[v].name + (to_cl ? "/to_nhwc" : "/to_nchw"),
                         {v}, {nv}, {}});
    converted[key] = nv;
    return nv;
  };
  for (auto n : g.nodes) {
    bool dn = runs_on_onednn_4d(g, n);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (v < 0 || g.values[v].constant) continue;
      bool want = dn && (i == 0 || (n.op == "FusedConv" && i == 3));
      if (want && !nhwc[v]) n.inputs[i] = convert(v, true);
      else if (!want && nhwc[v]) n.inputs[i] = convert(v, false);
    }
    if (dn)
      for (int o : n.outputs) {
        const auto& s = g.values[o].shape;
        if (!is_output[o] && s[2] * s[3] > 1) nhwc[o] = true;
      }
    nodes.push_back(n);
  }
  g.nodes = std::move(nodes);
  nhwc.resize(g.values.size(), false);
  return nhwc;
}

/// FusedMatMul: A [..., K] x constant W [K, N] + bias, activation, + residual.
std::shared_ptr<dnnl_step> matmul_step(const dnnl_ctx& ctx, const graph& g, const node& n) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const auto& as = g.values[n.inputs[0]].shape;
  const auto& w = *g.values[n.inputs[1]].constant;
  int64_t k = as.back(), nn = w.shape[1];
  int64_t m = element_count(as) / k;
  dnnl::memory::desc src({m, k}, dt::f32, tag::ab);
  dnnl::memory::desc wuser({k, nn}, dt::f32, tag::ab);
  dnnl::memory::desc wany({k, nn}, dt::f32, tag::any);
  dnnl::memory::desc dst({m, nn}, dt::f32, tag::ab);
  dnnl::memory::desc bias({1, nn}, dt::f32, tag::ab);
  bool has_bias = n.inputs.size() > 2 && n.inputs[2] >= 0;
  bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
  dnnl::post_ops po;
  auto act = n.get_s("activation", "");
  if (!act.empty())
    po.append_eltwise(1.0f, eltwise_of(act), n.get_f("act_alpha", 0), n.get_f("act_beta", 0));
  if (has_res)
    po.append_binary(dnnl::algorithm::binary_add, dst);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  auto d = has_bias ? dnnl::matmul::desc(src, wany, bias, dst) : dnnl::matmul::desc(src, wany, dst);
  dnnl::matmul::primitive_desc pdesc(d, attr, ctx.eng);
  auto s = std::make_shared<dnnl_step>();
  s->eng = ctx.eng;
  s->prim = dnnl::matmul(pdesc);
  s->args.push_back({DNNL_ARG_SRC, dnnl::memory(src, ctx.eng, DNNL_MEMORY_NONE)});
  s->values.push_back(n.inputs[0]);
  s->args.push_back({DNNL_ARG_WEIGHTS, reorder_weights(ctx, w, wuser, pdesc.weights_desc())});
  s->values.push_back(-1);
  if (has_bias) {
    s->args.push_back({DNNL_ARG_BIAS, dnnl::memory(bias, ctx.eng, DNNL_MEMORY_NONE)});
    s->values.push_back(n.inputs[2]);
  }
  if (has_res) {
    int idx = act.empty() ? 0 : 1;
    s->args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1,
                       dnnl::memory(dst, ctx.eng, DNNL_MEMORY_NONE)});
    s->values.push_back(n.inputs[3]);
  }
  s->args.push_back({DNNL_ARG_DST, dnnl::memory(dst, ctx.eng, DNNL_MEMORY_NONE)});
  s->values.push_back(n.outputs[0]);
  return s;
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

step compile_node(const dnnl_ctx& ctx, const graph& g, int idx, int threads,
                  const layout_map& nhwc) {
  const node& n = g.nodes[idx];
  step s;
  s.node = idx;
  auto shape_of = [&](int v) { return v >= 0 ? g.values[v].shape : dims_t{}; };
  if (n.op == "FusedConv" && g.values[n.inputs[1]].constant) {
    s.kernel = "onednn.conv";
    auto st = conv_step(ctx, g, n, threads, nhwc);
    s.run = [st](void** p) { (*st)(p); };
    return s;
  }
  if (n.op == "MaxPool" || n.op == "AveragePool" || n.op == "GlobalAveragePool") {
    s.kernel = "onednn.pool";
    auto st = pool_step(ctx, g, n, nhwc);
    s.run = [st](void** p) { (*st)(p); };
    return s;
  }
  if (n.op == "ToNHWC" || n.op == "ToNCHW") {
    s.kernel = "onednn.reorder";
    auto st = reorder_step(ctx, g, n);
    s.run = [st](void** p) { (*st)(p); };
    return s;
  }
  if (n.op == "FusedMatMul") {
    s.kernel = "onednn.matmul";
    auto st = matmul_step(ctx, g, n);
    s.run = [st](void** p) { (*st)(p); };
    return s;
  }
  if (n.op == "FusedLayerNorm") {
    s.kernel = "engine.layer_norm";
    kc::layer_norm_args a;
    a.width = shape_of(n.inputs[0]).back();
    a.rows = element_count(shape_of(n.inputs[0])) / a.width;
    a.epsilon = n.get_f("epsilon", 1e-5f);
    a.threads = threads;
    int x = n.inputs[0], gm = n.inputs[1], bt = n.inputs.size() > 2 ? n.inputs[2] : -1,
        y = n.outputs[0];
    s.run = [a, x, gm, bt, y](void** p) mutable {
      a.x = static_cast<const float*>(p[x]);
      a.gamma = static_cast<const float*>(p[gm]);
      a.beta = bt >= 0 ? static_cast<const float*>(p[bt]) : nullptr;
      a.y = static_cast<float*>(p[y]);
      kc::engine_layer_norm(a);
    };
    return s;
  }
  if (n.op == "FusedGelu") {
    s.kernel = "engine.gelu";
    int x = n.inputs[0], b = n.inputs.size() > 1 ? n.inputs[1] : -1, y = n.outputs[0];
    int64_t total = element_count(shape_of(x));
    int64_t width = b >= 0 ? element_count(shape_of(b)) : total;
    s.run = [=](void** p) {
      kc::engine_gelu(static_cast<const float*>(p[x]),
                      b >= 0 ? static_cast<const float*>(p[b]) : nullptr, width, total,
                      static_cast<float*>(p[y]), threads);
    };
    return s;
  }
  if (n.op == "Softmax" && (n.get_i("axis", -1) == -1
                            || n.get_i("axis", -1) + 1
                                 == static_cast<int64_t>(shape_of(n.inputs[0]).size()))) {
    s.kernel = "engine.softmax";
    int x = n.inputs[0], y = n.outputs[0];
    int64_t width = shape_of(x).back(), total = element_count(shape_of(x));
    s.run = [=](void** p) {
      std::memcpy(p[y], p[x], total * 4);
      kc::engine_softmax(static_cast<float*>(p[y]), total / width, width, threads);
    };
    return s;
  }
  if (n.op == "FusedAttention") {
    s.kernel = "engine.attention";
    kc::attention_args a;
    const auto& qs = shape_of(n.inputs[0]);
    a.batch = qs[0];
    a.seq = qs[1];
    a.heads = n.get_i("num_heads", 1);
    a.head_dim = qs[2] / a.heads;
    a.scale = n.get_f("scale", 1.0f);
    a.threads = threads;
    int m = n.inputs.size() > 3 ? n.inputs[3] : -1;
    if (m >= 0) {
      auto st = broadcast_strides4(shape_of(m));
      std::copy(st.begin(), st.end(), a.mask_strides);
    }
    int q = n.inputs[0], k = n.inputs[1], v = n.inputs[2], y = n.outputs[0];
    s.run = [a, q, k, v, m, y](void** p) mutable {
      a.q = static_cast<const float*>(p[q]);
      a.k = static_cast<const float*>(p[k]);
      a.v = static_cast<const float*>(p[v]);
      a.mask = m >= 0 ? static_cast<const float*>(p[m]) : nullptr;
      a.out = static_cast<float*>(p[y]);
      kc::engine_attention(a);
    };
    return s;
  }
  // Reference kernel: shapes are fixed, pointers come from the table.
  s.kernel = "reference";
  std::vector<tensor_ref> ins, outs;
  for (int i : n.inputs)
    ins.push_back(i >= 0 ? tensor_ref{g.values[i].dtype, g.values[i].shape, nullptr}
                         : tensor_ref{});
  for (int o : n.outputs)
    outs.push_back({g.values[o].dtype, g.values[o].shape, nullptr});
  node copy = n;
  s.run = [copy, ins, outs](void** p) mutable {
    for (size_t i = 0; i < ins.size(); ++i)
      ins[i].data = copy.inputs[i] >= 0 ? p[copy.inputs[i]] : nullptr;
    for (size_t i = 0; i < outs.size(); ++i)
      outs[i].data = p[copy.outputs[i]];
    run_reference(copy, ins, outs);
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

result<std::shared_ptr<compiled_plan>> compile(const graph& src, const model_config& cfg,
                                               const onnx_model_config& mcfg,
                                               const std::vector<dims_t>& shapes) {
  auto opt = optimize(src, shapes, mcfg.passes);
  if (!opt)
    return load_error(mcfg, opt.error().message);
  auto plan = std::make_shared<compiled_plan>();
  plan->g = std::move(*opt);
  auto& g = plan->g;
  auto nhwc = assign_channels_last(g);
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
  static const dnnl_ctx ctx;
  try {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      plan->steps.push_back(compile_node(ctx, g, static_cast<int>(i), mcfg.threads, nhwc));
  } catch (const dnnl::error& e) {
    return load_error(mcfg, std::string("oneDNN cannot build a kernel: ") + e.what());
  }
  return plan;
}

class onnx_backend final : public executor::backend {
public:
  onnx_backend(std::shared_ptr<const graph> g, model_config cfg, onnx_model_config mcfg)
      : graph_(std::move(g)), cfg_(std::move(cfg)), mcfg_(std::move(mcfg)) {}

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
    auto plan = plan_for(shapes);
    if (!plan)
      return plan.error();
    auto& p = **plan;
    if (arena_.size() < p.memory.arena_bytes + 64)
      arena_.assign(p.memory.arena_bytes + 64, 0);
    auto base = reinterpret_cast<uintptr_t>(arena_.data());
    auto* arena = reinterpret_cast<uint8_t*>((base + 63) / 64 * 64);
    ptrs_ = p.constant_ptrs;
    for (size_t v = 0; v < ptrs_.size(); ++v)
      if (p.memory.offsets[v] >= 0)
        ptrs_[v] = arena + p.memory.offsets[v];
    for (size_t i = 0; i < data.size(); ++i)
      ptrs_[p.g.inputs[i]] = const_cast<void*>(data[i]);
    for (size_t i = 0; i < p.output_values.size(); ++i) {
      int v = p.output_values[i];
      const auto& val = p.g.values[v];
      size_t bytes = static_cast<size_t>(element_count(val.shape)) * element_size(val.dtype);
      ptrs_[v] = out.allocate(cfg_.outputs[i].name, val.dtype, val.shape, bytes);
    }
    omp_set_num_threads(static_cast<int>(mcfg_.threads));
    for (auto& s : p.steps)
      s.run(ptrs_.data());
    return {};
  }

private:
  result<std::shared_ptr<compiled_plan>> plan_for(const std::vector<dims_t>& shapes) {
    auto it = plans_.find(shapes);
    if (it != plans_.end())
      return it->second;
    auto plan = compile(*graph_, cfg_, mcfg_, shapes);
    if (!plan)
      return serving_error{status_code::bad_request, plan.error().message};
    plans_.emplace(shapes, *plan);
    return *plan;
  }

  std::shared_ptr<const graph> graph_;
  model_config cfg_;
  onnx_model_config mcfg_;
  std::map<std::vector<dims_t>, std::shared_ptr<compiled_plan>> plans_;
  std::vector<uint8_t> arena_;
  std::vector<void*> ptrs_;
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
  auto cfg = complete_config(*imported, mcfg);
  if (!cfg)
    return cfg.error();
  auto g = std::make_shared<const graph>(inputs_in_config_order(std::move(*imported), *cfg));
  openblas_set_num_threads(1);
  auto plan = compile(*g, *cfg, mcfg, shapes_at(*cfg, 1));
  if (!plan)
    return plan.error();
  onnx_model m;
  m.config = *cfg;
  std::ostringstream os;
  os << "ONNX opset " << g->opset << ", " << g->nodes.size() << " nodes -> "
     << (*plan)->g.nodes.size() << " steps, arena " << (*plan)->memory.arena_bytes
     << " bytes at batch 1 (" << (*plan)->memory.unshared_bytes << " without reuse), "
     << mcfg.threads << " compute thread(s)";
  m.summary = os.str();
  auto first = *plan;
  m.make_instance = [g, c = *cfg, mcfg]() -> std::shared_ptr<executor::backend> {
    return std::make_shared<onnx_backend>(g, c, mcfg);
  };
  return m;
}

result<std::string> describe_plan(const onnx_model_config& mcfg, int64_t batch) {
  auto imported = import_model(mcfg.model_file);
  if (!imported)
    return imported.error();
  auto cfg = complete_config(*imported, mcfg);
  if (!cfg)
    return cfg.error();
  auto g = inputs_in_config_order(std::move(*imported), *cfg);
  auto plan = compile(g, *cfg, mcfg, shapes_at(*cfg, batch));
  if (!plan)
    return plan.error();
  const auto& p = **plan;
  std::ostringstream os;
  os << "plan for " << mcfg.model_file.string() << " at batch " << batch << ": opset "
     << g.opset << ", " << g.nodes.size() << " ONNX nodes -> " << p.steps.size() << " steps\n";
  for (const auto& s : p.steps) {
    const auto& n = p.g.nodes[s.node];
    os << "  " << n.op;
    if (n.has("activation")) os << "+" << n.get_s("activation", "");
    if ((n.op == "FusedConv" || n.op == "FusedMatMul") && n.inputs.size() > 3 && n.inputs[3] >= 0)
      os << "+residual";
    os << "  [" << s.kernel << "]  " << n.name << "  (";
    bool first = true;
    for (int i : n.inputs) {
      if (i < 0 || p.g.values[i].constant) continue;
      os << (first ? "" : ", ") << shape_string(p.g.values[i].shape);
      first = false;
    }
    os << ") -> ";
    for (int o : n.outputs) {
      os << shape_string(p.g.values[o].shape);
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
