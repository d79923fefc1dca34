#include "onnx_cpu/onnx_backend.hpp"
#include "core/reshape.hpp"
#include "executor/reshape_backend.hpp"
#include "onnx_cpu/cpu_kernels.hpp"
#include "onnx_cpu/cpu_level.hpp"

#include "engine_kernels.hpp"
#include "paged_attention.hpp"
#include "onnx/importer.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/model_config.hpp"
#include "onnx_cpu/onednn_steps.hpp"
#include "onnx_cpu/quant_steps.hpp"
#include "onnx_cpu/row_chunks.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx/ops_quant.hpp"
#include "onnx/string_passthrough.hpp"
#include "onnx_cpu/string_backend.hpp"
#include "onnx_cpu/work_pool.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <unordered_set>

extern "C" void openblas_set_num_threads(int);

namespace caf_serving::onnx {

namespace {

using exec_result = std::variant<std::monostate, serving_error>;
namespace kc = caf_serving::kernels::cpu;

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
  /// Bytes of the constants this plan alone holds (folded for its shapes),
  /// not shared with the imported graph.
  size_t owned_bytes = 0;
  /// Its matmuls' and convolutions' FLOPs (row_chunks.hpp): whether a chunk
  /// plan gives its matmuls too few rows.
  matmul_work work;

  /// What the plan costs in the shape-plan cache: its arena and owned constants.
  size_t cache_bytes() const {
    return memory.arena_bytes + owned_bytes;
  }
};

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


/// A node's tensors as a step that calls a kernel on tensor_refs sees them:
/// the shapes fixed when the plan compiles, the pointers of each run taken
/// from the plan's table.
struct node_tensors {
  node n;
  std::vector<tensor_ref> ins, outs;

  node_tensors(const graph& g, const node& of) : n(of) {
    for (int i : n.inputs)
      ins.push_back(i >= 0 ? tensor_ref{g.values[i].dtype, g.values[i].shape, nullptr}
                           : tensor_ref{});
    for (int o : n.outputs) // an omitted output (-1) keeps its place, without memory
      outs.push_back(o >= 0 ? tensor_ref{g.values[o].dtype, g.values[o].shape, nullptr}
                            : tensor_ref{});
  }

  /// This run's inputs and outputs: copies, so that plans running on several
  /// threads do not share them.
  std::pair<std::vector<tensor_ref>, std::vector<tensor_ref>> bound(void** p) const {
    auto in = ins;
    auto out = outs;
    for (size_t i = 0; i < in.size(); ++i)
      in[i].data = n.inputs[i] >= 0 ? p[n.inputs[i]] : nullptr;
    for (size_t i = 0; i < out.size(); ++i)
      out[i].data = n.outputs[i] >= 0 ? p[n.outputs[i]] : nullptr;
    return {std::move(in), std::move(out)};
  }
};

} // namespace

void engine_paged_row(const paged_row& r) {
  kernels::cpu::paged_attention_args a;
  a.q = r.q;
  a.new_keys = r.new_keys;
  a.new_values = r.new_values;
  a.pool = r.pool;
  a.blocks = r.blocks;
  a.context = r.context;
  a.new_positions = r.new_positions;
  a.heads = r.heads;
  a.kv_heads = r.kv_heads;
  a.head_dim = r.head_dim;
  a.block_tokens = r.block_tokens;
  a.block_floats = r.block_floats;
  a.key_offset = r.key_offset;
  a.value_offset = r.value_offset;
  a.scale = r.scale;
  a.y = r.y;
  kernels::cpu::engine_paged_attention(a);
}

namespace {

/// The engine's paged attention (onnx/paged_attention.hpp), its batch rows
/// split among the threads: each row reads its own blocks and writes its own
/// outputs; the engine's kernel computes each row's attention.
step paged_attention_step(const graph& g, const node& n, unsigned threads) {
  const int64_t rows = g.values[n.inputs[0]].shape[0];
  auto cuts = split_range(rows, pieces_for(rows, threads), 1, threads);
  step s;
  s.kernel = "engine.paged_attention";
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [t = node_tensors(g, n), cuts](void** p, int64_t item) {
    auto [in, out] = t.bound(p);
    run_paged_gqa_rows(t.n, in, out,
                       paged_gqa_rows{cuts[item], cuts[item + 1], engine_paged_row});
  };
  return s;
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
  bool nan_to_zero = n.get_i("nan_to_zero", 0) != 0;
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
  auto note = reference_note(p1);
  s.kernel = "onednn.matmul+engine.softmax" + (note.empty() ? reference_note(p2) : note);
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
      // nan_to_zero: the rows the reference softmax makes NaN (a NaN or +inf
      // score, or -inf throughout) become 0; the engine's softmax, which
      // clamps, would give finite values there.
      thread_local std::vector<char> nan_rows;
      if (nan_to_zero) {
        nan_rows.assign(static_cast<size_t>(sq), 0);
        for (int64_t i = 0; i < sq; ++i) {
          const float* row = scores.data() + i * sq;
          float mx = -INFINITY;
          bool nan = false;
          for (int64_t j = 0; j < sq; ++j) {
            nan |= std::isnan(row[j]);
            mx = std::max(mx, row[j]);
          }
          nan_rows[i] = nan || !std::isfinite(mx);
        }
      }
      kc::engine_softmax(scores.data(), sq, sq, 1);
      if (nan_to_zero)
        for (int64_t i = 0; i < sq; ++i)
          if (nan_rows[i])
            std::fill(scores.begin() + i * sq, scores.begin() + (i + 1) * sq, 0.0f);
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

/// Whether each output element of `op` depends only on the input elements at
/// its index, so that any slice of equally shaped inputs runs on its own (its
/// registry entry says so).
bool sliceable(const std::string& op) {
  const auto* e = find_operator(op);
  return e && e->elementwise;
}

/// An element-wise operator (sliceable()) whose inputs all have its output's
/// shape, as bands of elements over the threads; each band runs the
/// operator's reference kernel on its slice. Nothing for a broadcast or an
/// empty output (the whole reference step runs those).
std::optional<step> elementwise_step(const graph& g, const node& n, unsigned threads) {
  if (!sliceable(n.op) || n.outputs.size() != 1)
    return std::nullopt;
  const auto& y = g.values[n.outputs[0]];
  int64_t total = element_count(y.shape);
  if (total == 0)
    return std::nullopt;
  for (int v : n.inputs)
    if (v < 0 || g.values[v].shape != y.shape)
      return std::nullopt;
  // Blocks of elements small enough to spread a 64 KB tensor, large enough that
  // a band's bookkeeping stays negligible.
  constexpr int64_t block = 2048;
  auto cuts = split_range(total, pieces_for((total + block - 1) / block, threads), block, threads);
  std::vector<std::pair<int, datatype>> ins;
  for (int v : n.inputs)
    ins.emplace_back(v, g.values[v].dtype);
  step s;
  s.kernel = "engine.elementwise";
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [copy = n, ins, out = std::make_pair(n.outputs[0], y.dtype), cuts](void** p,
                                                                             int64_t item) {
    int64_t begin = cuts[item], count = cuts[item + 1] - begin;
    auto slice = [&](int v, datatype t) {
      auto* base = static_cast<uint8_t*>(p[v]);
      return tensor_ref{t, {count}, base + begin * static_cast<int64_t>(element_size(t))};
    };
    std::vector<tensor_ref> in;
    for (const auto& [v, t] : ins)
      in.push_back(slice(v, t));
    run_reference(copy, in, {slice(out.first, out.second)});
  };
  return s;
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

/// oneDNN's pooling, where it computes the node as ONNX does.
std::optional<step> onednn_pool_step(const cpu_step_context& c, const graph& g, const node& n) {
  if (n.op != "GlobalAveragePool" && !pool_runs_on_onednn(g, n))
    return std::nullopt;
  return pool_step(c.dnnl, g, n, c.layouts, c.threads);
}

/// A reorder node that assign_layouts() inserted between layouts.
std::optional<step> onednn_reorder_step(const cpu_step_context& c, const graph& g,
                                        const node& n) {
  return reorder_step(c.dnnl, g, n, c.layouts);
}

/// FusedLayerNorm on the engine's kernel, in bands of rows.
std::optional<step> engine_layer_norm_step(const cpu_step_context& c, const graph& g,
                                           const node& n) {
  auto shape_of = [&](int v) { return v >= 0 ? g.values[v].shape : dims_t{}; };
  step s;
  s.kernel = "engine.layer_norm";
  kc::layer_norm_args a;
  a.width = shape_of(n.inputs[0]).back();
  a.rows = element_count(shape_of(n.inputs[0])) / a.width;
  a.epsilon = n.get_f("epsilon", 1e-5f);
  auto cuts = row_bands(a.rows, c.threads);
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

/// FusedGelu (erf) or FusedGeluTanh on the engine's kernel, in bands of rows.
std::optional<step> engine_gelu_step(const cpu_step_context& c, const graph& g, const node& n) {
  auto shape_of = [&](int v) { return v >= 0 ? g.values[v].shape : dims_t{}; };
  bool tanh_form = n.op == "FusedGeluTanh";
  auto kernel = tanh_form ? &kc::engine_gelu_tanh : &kc::engine_gelu;
  step s;
  s.kernel = tanh_form ? "engine.gelu_tanh" : "engine.gelu";
  int x = n.inputs[0], b = n.inputs.size() > 1 ? n.inputs[1] : -1, y = n.outputs[0];
  int64_t total = element_count(shape_of(x));
  int64_t width = b >= 0 ? element_count(shape_of(b)) : total;
  auto cuts = row_bands(total / width, c.threads);
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [=](void** p, int64_t item) {
    int64_t r0 = cuts[item], rows = cuts[item + 1] - r0;
    kernel(static_cast<const float*>(p[x]) + r0 * width,
           b >= 0 ? static_cast<const float*>(p[b]) : nullptr, width, rows * width,
           static_cast<float*>(p[y]) + r0 * width, 1);
  };
  return s;
}

/// Softmax over the last axis on the engine's kernel, in bands of rows.
std::optional<step> engine_softmax_step(const cpu_step_context& c, const graph& g,
                                        const node& n) {
  auto shape_of = [&](int v) { return v >= 0 ? g.values[v].shape : dims_t{}; };
  if (!(n.get_i("axis", -1) == -1
        || n.get_i("axis", -1) + 1 == static_cast<int64_t>(shape_of(n.inputs[0]).size())))
    return std::nullopt;
  step s;
  s.kernel = "engine.softmax";
  int x = n.inputs[0], y = n.outputs[0];
  int64_t width = shape_of(x).back(), total = element_count(shape_of(x));
  auto cuts = row_bands(total / width, c.threads);
  s.items = static_cast<int64_t>(cuts.size()) - 1;
  s.run = [=](void** p, int64_t item) {
    int64_t r0 = cuts[item], rows = cuts[item + 1] - r0;
    float* out = static_cast<float*>(p[y]) + r0 * width;
    std::memcpy(out, static_cast<const float*>(p[x]) + r0 * width, rows * width * 4);
    kc::engine_softmax(out, rows, width, 1);
  };
  return s;
}

/// Per-tensor QuantizeLinear and DequantizeLinear in vectorised spans.
std::optional<step> quant_linear_spans_step(const cpu_step_context& c, const graph& g,
                                            const node& n) {
  if (!quant_linear_runs_in_spans(g, n))
    return std::nullopt;
  return quant_linear_step(g, n, c.threads);
}

} // namespace

const cpu_kernel_table& cpu_kernels() {
  using context = const cpu_step_context;
  static const cpu_kernel_table table({
    {"FusedConv", {}, "onednn.conv, engine.conv",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       if (!g.values[n.inputs[1]].constant)
         return std::nullopt;
       return conv_step(c.dnnl, g, n, c.threads, c.layouts, c.config);
     }},
    {"QLinearConv", {}, "onednn.qlinear_conv",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       if (!c.config.int8_onednn || !qlinear_conv_runs_on_onednn(g, n))
         return std::nullopt;
       return qlinear_conv_step(c.dnnl, g, n, c.threads);
     }},
    {quant_add_op, {}, "engine.qlinear_add",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       if (!qlinear_add_runs_in_spans(g, n))
         return std::nullopt;
       return qlinear_add_step(g, n, c.threads);
     }},
    {"QLinearMatMul", {}, "onednn.qlinear_matmul",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       if (!c.config.int8_onednn || !qlinear_matmul_runs_on_onednn(g, n))
         return std::nullopt;
       return qlinear_matmul_step(c.dnnl, g, n, c.threads);
     }},
    {quant_max_pool_op, {}, "onednn.qmax_pool",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       return qmax_pool_step(c.dnnl, g, n, c.threads);
     }},
    {"QuantizeLinear", {}, "engine.quantize", &quant_linear_spans_step},
    {"DequantizeLinear", {}, "engine.dequantize", &quant_linear_spans_step},
    {"MaxPool", {}, "onednn.pool", &onednn_pool_step},
    {"AveragePool", {}, "onednn.pool", &onednn_pool_step},
    {"GlobalAveragePool", {}, "onednn.pool", &onednn_pool_step},
    {"ToNHWC", {}, "onednn.reorder", &onednn_reorder_step},
    {"ToNCHW", {}, "onednn.reorder", &onednn_reorder_step},
    {"ToBlocked", {}, "onednn.reorder", &onednn_reorder_step},
    {"Mul", {}, "onednn.channel_scale",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       if (!n.has("src_layout"))
         return std::nullopt;
       return channel_scale_step(c.dnnl, g, n, c.threads);
     }},
    {"FusedMatMul", {}, "onednn.matmul",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       return matmul_step(c.dnnl, g, n, c.threads, false);
     }},
    {"FusedGemm", {}, "onednn.matmul",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       if (!gemm_as_matmul(g, n))
         return std::nullopt;
       return matmul_step(c.dnnl, g, n, c.threads, n.get_i("transB", 0) != 0);
     }},
    {"FusedLayerNorm", {}, "engine.layer_norm", &engine_layer_norm_step},
    {"FusedGelu", {}, "engine.gelu", &engine_gelu_step},
    {"FusedGeluTanh", {}, "engine.gelu_tanh", &engine_gelu_step},
    {"Softmax", {}, "engine.softmax", &engine_softmax_step},
    {"FusedAttention", {}, "onednn.matmul+engine.softmax",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       return attention_step(c.dnnl, g, n, c.threads);
     }},
    {paged_gqa_op, {}, "engine.paged_attention",
     [](context& c, const graph& g, const node& n) -> std::optional<step> {
       return paged_attention_step(g, n, c.threads);
     }},
  });
  return table;
}

namespace {

step compile_node(const dnnl_ctx& ctx, const graph& g, int idx, unsigned threads,
                  const layout_map& lay, const onnx_model_config& mcfg) {
  const node& n = g.nodes[idx];
  // The CPU kernels (cpu_kernels.hpp), then the reference kernel: in bands
  // of elements where the operator is element-wise, else whole.
  if (auto s = cpu_kernels().build(cpu_step_context{ctx, threads, lay, mcfg}, g, n)) {
    s->node = idx;
    return std::move(*s);
  }
  step s;
  s.node = idx;
  if (auto split = elementwise_step(g, n, threads)) {
    split->node = idx;
    return *split;
  }
  // Reference kernel: shapes are fixed, pointers come from the table.
  s.kernel = "reference";
  s.run = [t = node_tensors(g, n)](void** p, int64_t) {
    auto [in, out] = t.bound(p);
    run_reference(t.n, in, out);
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
/// The error names the node that cannot run at `shapes` (callers say which
/// model and request).
result<std::shared_ptr<compiled_plan>> compile(const graph& src, const model_config& cfg,
                                               const onnx_model_config& mcfg,
                                               const std::vector<dims_t>& shapes,
                                               unsigned threads, weight_store& weights,
                                               std::atomic<size_t>* compiles = nullptr) {
  if (compiles)
    compiles->fetch_add(1);
  // oneDNN fixes a primitive's thread count when the primitive is created
  // (from omp_get_max_threads()), not when it runs. Created with the default
  // count (all cores) on the loading thread, every convolution of a work item
  // forked an OpenMP team of its own: 4 busy threads on 2 cores, and a 2-thread
  // plan no faster than a 1-thread one.
  omp_threads_scope one_thread(1);
  auto opt = optimize(src, shapes, mcfg.passes);
  if (!opt)
    return opt.error();
  auto plan = std::make_shared<compiled_plan>();
  plan->g = std::move(*opt);
  plan->batch = shapes.empty() || shapes[0].empty() ? 1 : shapes[0][0];
  plan->threads = threads;
  auto& g = plan->g;
  plan->work = measure_matmul_work(g);
  auto lay = assign_layouts(g, mcfg.blocked_layout);
  if (mcfg.int8_onednn)
    assign_int8_layouts(g);
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
  std::unordered_set<const tensor_data*> imported;
  for (const auto& v : src.values)
    if (v.constant)
      imported.insert(v.constant.get());
  std::unordered_set<const tensor_data*> owned;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].constant) {
      plan->constant_ptrs[v] = const_cast<uint8_t*>(g.values[v].constant->bytes.data());
      if (!imported.count(g.values[v].constant.get())
          && owned.insert(g.values[v].constant.get()).second)
        plan->owned_bytes += g.values[v].constant->bytes.size();
    }
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const dnnl_ctx ctx{eng, &weights};
  try {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      plan->steps.push_back(
        compile_node(ctx, g, static_cast<int>(i), threads, lay, mcfg));
  } catch (const dnnl::error& e) {
    return bad_request(std::string("oneDNN cannot build a kernel: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return bad_request(std::string("the CPU backend cannot build a step: ") + e.what());
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
    out += (o ? ", " : "")
           + (n.outputs[o] >= 0 ? shape_string(p.g.values[n.outputs[o]].shape) : "-");
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

/// Plans compiled at load, read-only and shared by every instance of the model.
using plan_set = std::map<plan_key, std::shared_ptr<compiled_plan>>;

/// Rows per chunk of a batch of `rows` on `threads` threads: two chunks per
/// thread, so that a thread the OS runs late leaves less behind, but chunks big
/// enough to keep the GEMMs efficient.
int64_t chunk_rows(int64_t rows, unsigned threads) {
  int64_t chunks = std::min<int64_t>(rows, 2 * static_cast<int64_t>(threads));
  return (rows + chunks - 1) / chunks;
}

/// The plans (rows, threads) that a batch of `rows` runs on a pool of
/// `threads`; onnx_backend::execute runs exactly these.
std::vector<std::pair<int64_t, unsigned>> plans_for_batch(int64_t rows, unsigned threads) {
  if (threads <= 1 || rows < threads)
    return {{rows, threads}};
  int64_t per = chunk_rows(rows, threads);
  if (rows % per == 0)
    return {{per, 1u}};
  return {{per, 1u}, {rows % per, 1u}};
}

/// Arenas and pointer tables, one per pool thread. A model's instances share
/// them: an instance uses them only while it holds the pool, so they never
/// run at once.
struct scratch_space {
  explicit scratch_space(unsigned threads) : arenas(threads), ptrs(threads) {}
  std::vector<std::vector<uint8_t>> arenas;
  std::vector<std::vector<void*>> ptrs;
};

using plan_cache = shape_plan_cache<compiled_plan>;

/// The threads of one instance run a batch one of two ways. A batch of at
/// least as many rows as threads is cut into row chunks, and each chunk runs a
/// whole plan on one thread (no synchronisation between steps at all). Smaller
/// batches run one plan whose steps are split into work items for all threads.
/// The pool may be shared with other instances and models: an instance holds
/// it for the whole of a batch.
class onnx_backend final : public executor::backend {
public:
  /// The parts every instance of one model shares.
  struct shared_parts {
    std::shared_ptr<const graph> g;
    model_config cfg;
    onnx_model_config mcfg;
    std::shared_ptr<profiled_plans> profiled; ///< null unless profiling
    std::shared_ptr<weight_store> weights;
    /// Every plan the batch sizes 1..max_batch_size need at the shapes known
    /// at load, compiled then and pinned.
    std::shared_ptr<const plan_set> loaded;
    /// Plans of other shapes, compiled on first use by whichever instance
    /// needs them, shared by all.
    std::shared_ptr<plan_cache> cache;
    std::shared_ptr<std::atomic<size_t>> compiles;
    std::shared_ptr<work_pool> pool;
    std::shared_ptr<scratch_space> scratch; ///< sized for the pool's threads
  };

  explicit onnx_backend(const shared_parts& parts)
      : graph_(parts.g), cfg_(parts.cfg), mcfg_(parts.mcfg), profiled_(parts.profiled),
        weights_(parts.weights), loaded_(parts.loaded), cache_(parts.cache),
        compiles_(parts.compiles), pool_(parts.pool), scratch_(parts.scratch) {
    for (int v : graph_->inputs)
      input_names_.push_back(graph_->values[v].name);
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
    // A variable dimension of 0 in a shape new to the model is refused: not
    // every step of a plan compiled on the way takes empty tensors. A model
    // whose graph fixes a 0 (ONNX's node tests have them) runs the plan that
    // load compiled and checked for it, as before variable dimensions.
    bool has_zero = std::any_of(shapes.begin(), shapes.end(), [](const dims_t& shape) {
      return std::find(shape.begin(), shape.end(), 0) != shape.end();
    });
    if (has_zero && loaded_->count(std::make_pair(shapes, pool_->size())) == 0)
      return bad_request("model '" + cfg_.name + "' cannot run inputs "
                         + shapes_text(input_names_, shapes)
                         + ": a dimension of size 0; send at least one element per "
                           "dimension");
    for (size_t i = 0; i < shapes.size(); ++i)
      if (!data[i])
        return serving_error{status_code::bad_request,
                             "model '" + cfg_.name + "' needs input '"
                               + graph_->values[graph_->inputs[i]].name + "'"};
    // oneDNN and the engine kernels run single-threaded inside work items.
    omp_set_num_threads(1);
    int64_t rows = cfg_.max_batch_size > 0 && !shapes.empty() && !shapes[0].empty()
                     ? shapes[0][0] : 1;
    unsigned threads = pool_->size();
    // A shape new to the model compiles here, on this instance's own thread
    // and before it takes the compute pool: the batch that brought the shape
    // waits for it, while other instances keep running theirs.
    if (threads > 1 && rows >= threads) {
      auto chunked = chunk_plans(shapes, rows);
      if (!chunked)
        return chunked.error();
      // Chunks too short for the matmuls run as one batch (row_chunks.hpp).
      if (!chunks_starve_matmuls(chunked->first->work, mcfg_.chunk_min_matmul_rows)) {
        // Other instances (of this and other models) wait here, asleep, while
        // this one computes: one budget of compute threads for the process.
        auto turn = pool_->hold();
        return run_row_chunks(*chunked, data, rows, out);
      }
    }
    auto plan = plan_for(shapes, threads, shapes);
    if (!plan)
      return plan.error();
    auto turn = pool_->hold();
    auto& p = **plan;
    std::vector<void*> outputs;
    for (size_t i = 0; i < p.output_values.size(); ++i) {
      const auto& val = p.g.values[p.output_values[i]];
      size_t bytes = static_cast<size_t>(element_count(val.shape)) * element_size(val.dtype);
      outputs.push_back(out.allocate(cfg_.outputs[i].name, val.dtype, val.shape, bytes));
    }
    bind(p, 0, data, outputs, 0);
    void** ptrs = scratch_->ptrs[0].data();
    run_steps(p, [&](const step& s) {
      if (s.items == 1)
        s.run(ptrs, 0);
      else
        pool_->run(s.items, [&](int64_t item, unsigned) { s.run(ptrs, item); });
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

  /// The plans of a batch of `rows` cut into row chunks: the full chunks'
  /// and the last one's (the same when `rows` divides evenly).
  using chunk_pair = std::pair<std::shared_ptr<compiled_plan>, std::shared_ptr<compiled_plan>>;

  result<chunk_pair> chunk_plans(const std::vector<dims_t>& shapes, int64_t rows) {
    int64_t per = chunk_rows(rows, pool_->size());
    auto shapes_of = [&](int64_t n) {
      auto s = shapes;
      for (auto& d : s) d[0] = n;
      return s;
    };
    auto full = plan_for(shapes_of(per), 1, shapes);
    if (!full)
      return full.error();
    std::shared_ptr<compiled_plan> last = *full;
    if (rows % per != 0) {
      auto l = plan_for(shapes_of(rows % per), 1, shapes);
      if (!l)
        return l.error();
      last = *l;
    }
    return chunk_pair{*full, last};
  }

  exec_result run_row_chunks(const chunk_pair& plans, const std::vector<const void*>& data,
                             int64_t rows, executor::output_writer& out) {
    int64_t per = chunk_rows(rows, pool_->size());
    int64_t chunks = (rows + per - 1) / per;
    const auto& full = plans.first;
    const auto& last = plans.second;
    std::vector<uint8_t*> outputs;
    std::vector<size_t> out_row_bytes;
    for (size_t i = 0; i < full->output_values.size(); ++i) {
      const auto& val = full->g.values[full->output_values[i]];
      dims_t shape = val.shape;
      shape[0] = rows;
      size_t row_bytes = static_cast<size_t>(element_count(val.shape) / per)
                         * element_size(val.dtype);
      outputs.push_back(out.allocate(cfg_.outputs[i].name, val.dtype, shape, row_bytes * rows));
      out_row_bytes.push_back(row_bytes);
    }
    std::vector<size_t> in_row_bytes;
    for (size_t i = 0; i < full->g.inputs.size(); ++i) {
      const auto& in = full->g.values[full->g.inputs[i]];
      in_row_bytes.push_back(static_cast<size_t>(element_count(in.shape) / per)
                             * element_size(in.dtype));
    }
    pool_->run(chunks, [&](int64_t chunk, unsigned thread) {
      const auto& p = chunk + 1 == chunks ? *last : *full;
      int64_t r0 = chunk * per;
      std::vector<const void*> in(data.size());
      for (size_t i = 0; i < data.size(); ++i)
        in[i] = static_cast<const uint8_t*>(data[i]) + r0 * in_row_bytes[i];
      std::vector<void*> o(outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i)
        o[i] = outputs[i] + r0 * out_row_bytes[i];
      bind(p, thread, in, o, thread);
      void** ptrs = scratch_->ptrs[thread].data();
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
    auto& buf = scratch_->arenas[arena];
    if (buf.size() < p.memory.arena_bytes + 64)
      buf.assign(p.memory.arena_bytes + 64, 0);
    auto base = reinterpret_cast<uintptr_t>(buf.data());
    auto* a = reinterpret_cast<uint8_t*>((base + 63) / 64 * 64);
    auto& ptrs = scratch_->ptrs[t];
    ptrs = p.constant_ptrs;
    for (size_t v = 0; v < ptrs.size(); ++v)
      if (p.memory.offsets[v] >= 0)
        ptrs[v] = a + p.memory.offsets[v];
    for (size_t i = 0; i < inputs.size(); ++i)
      ptrs[p.g.inputs[i]] = const_cast<void*>(inputs[i]);
    for (size_t i = 0; i < outputs.size(); ++i)
      ptrs[p.output_values[i]] = outputs[i];
  }

  /// The plan for `shapes` split for `threads`: pinned at load, cached, or
  /// compiled now and cached. `request_shapes` (the whole batch's) name the
  /// request in errors: a shape the graph cannot take answers 400 with the
  /// shapes and the node, and the model keeps serving.
  result<std::shared_ptr<compiled_plan>> plan_for(const std::vector<dims_t>& shapes,
                                                  unsigned threads,
                                                  const std::vector<dims_t>& request_shapes) {
    auto key = std::make_pair(shapes, threads);
    if (auto at_load = loaded_->find(key); at_load != loaded_->end())
      return at_load->second;
    if (auto cached = cache_->find(key))
      return cached;
    auto fail = [&](const std::string& why) {
      return bad_request("model '" + cfg_.name + "' cannot run inputs "
                         + shapes_text(input_names_, request_shapes) + ": " + why);
    };
    // Not under any lock: two instances that meet the same new shape at once
    // both compile it, and the cache keeps the first.
    auto plan = compile(*graph_, cfg_, mcfg_, shapes, threads, *weights_, compiles_.get());
    if (!plan)
      return fail(plan.error().message);
    // Shapes of a variable dimension can shrink a tensor to nothing (a Slice
    // past its end); the engine's kernels need at least one element.
    for (const auto& n : (*plan)->g.nodes)
      for (int o : n.outputs) {
        if (o < 0)
          continue;
        const auto& v = (*plan)->g.values[o];
        if (!v.constant
            && std::any_of(v.shape.begin(), v.shape.end(), [](int64_t d) { return d < 1; }))
          return fail("node '" + n.name + "' (operator '" + n.op + "') computes '" + v.name
                      + "' of shape " + shape_string(v.shape)
                      + ", an empty tensor, which the engine does not run; send larger inputs");
      }
    size_t bytes = (*plan)->cache_bytes();
    if (!cache_->fits(bytes))
      return fail("its plan needs " + std::to_string(bytes) + " bytes (arena and folded "
                  "constants), more than the whole plan cache's " + std::to_string(
                    cache_->config().max_bytes)
                  + " bytes; send smaller inputs, or raise parameters \"plan_cache_bytes\" in "
                    "config.pbtxt");
    if (profiled_) {
      (*plan)->times = std::make_shared<step_times>((*plan)->steps.size());
      std::lock_guard<std::mutex> guard(profiled_->mu);
      profiled_->plans.push_back(*plan);
    }
    return cache_->insert(key, *plan, bytes);
  }

  std::shared_ptr<const graph> graph_;
  model_config cfg_;
  onnx_model_config mcfg_;
  std::shared_ptr<profiled_plans> profiled_; ///< null unless profiling
  std::shared_ptr<weight_store> weights_;    ///< shared by the model's instances
  std::shared_ptr<const plan_set> loaded_;   ///< shared by the model's instances
  std::shared_ptr<plan_cache> cache_;        ///< shared by the model's instances
  std::vector<std::string> input_names_;     ///< in the graph's input order
  std::shared_ptr<std::atomic<size_t>> compiles_;
  std::shared_ptr<work_pool> pool_;          ///< shared by every CPU executor
  std::shared_ptr<scratch_space> scratch_;   ///< shared by the model's instances
};

/// What config completion (onnx/model_config.hpp) reads of `mcfg`.
config_completion_config completion_of(const onnx_model_config& mcfg) {
  return {mcfg.model_file, mcfg.config, mcfg.expected_shapes, mcfg.auto_complete,
          mcfg.default_max_batch_size};
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
/// "engine_conv", "conv_bands", "blocked_layout", "int8_onednn" and "qdq_fusion" ("true" or
/// "false"), "plan_cache_size" (1 to 1024), "plan_cache_bytes" (at least 1 MiB),
/// "chunk_min_matmul_rows" (0 to 65536) and "expected_shapes" (shape_plans.hpp).
result<onnx_model_config> with_parameters(onnx_model_config mcfg) {
  for (const auto& [key, value] : mcfg.config.parameters) {
    if (key == "winograd" || key == "engine_conv" || key == "conv_bands"
        || key == "blocked_layout" || key == "int8_onednn" || key == "qdq_fusion") {
      if (value != "true" && value != "false")
        return load_error(mcfg, "parameters \"" + key + "\" is '" + value
                                  + "'; give string_value \"true\" or \"false\"");
      (key == "winograd"      ? mcfg.winograd
       : key == "engine_conv" ? mcfg.engine_conv
       : key == "int8_onednn" ? mcfg.int8_onednn
       : key == "qdq_fusion"  ? mcfg.passes.fuse_qdq
       : key == "blocked_layout" ? mcfg.blocked_layout
                              : mcfg.conv_bands) = value == "true";
    } else if (key == "plan_cache_size") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 1024)
        return load_error(mcfg, "parameters \"plan_cache_size\" is '" + value
                                  + "'; give a count from 1 to 1024 as string_value");
      mcfg.plan_cache_size = static_cast<size_t>(n);
    } else if (key == "chunk_min_matmul_rows") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 0 || n > 65536)
        return load_error(mcfg, "parameters \"chunk_min_matmul_rows\" is '" + value
                                  + "'; give a row count from 0 (always row chunks) to 65536 "
                                    "as string_value");
      mcfg.chunk_min_matmul_rows = n;
    } else if (key == "plan_cache_bytes") {
      char* end = nullptr;
      errno = 0;
      unsigned long long n = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || value[0] == '-' || *end != '\0' || errno == ERANGE
          || n < (1u << 20))
        return load_error(mcfg, "parameters \"plan_cache_bytes\" is '" + value
                                  + "'; give a byte count of at least 1048576 (1 MiB) as "
                                    "string_value");
      mcfg.plan_cache_bytes = static_cast<size_t>(n);
    } else if (key == "expected_shapes") {
      auto sets = parse_expected_shapes(value);
      if (!sets)
        return load_error(mcfg, sets.error().message);
      mcfg.expected_shapes = *sets;
    }
  }
  return mcfg;
}

namespace {

/// Output buffers of a warmup run, dropped after it.
struct discard_writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&,
                    size_t bytes) override {
    return buffers.emplace_back(bytes).data();
  }
};

/// The input data of one warmup sample, in the model's input order.
struct warmup_batch {
  std::vector<std::vector<uint8_t>> data;
  executor::batch_view view;
};

/// Builds `w`'s batch as Triton does: zeros, random values (in [0, 1) for
/// floating point, 0 or 1 for integers, so that ids and masks stay valid), or
/// one request's raw bytes read from the model directory's warmup/ folder and
/// repeated for every row. Checks the sample against the model's inputs.
result<warmup_batch> make_warmup_batch(const warmup_sample& w, const model_config& cfg,
                                       const onnx_model_config& mcfg) {
  auto fail = [&](const std::string& what) {
    return load_error(mcfg, "model_warmup '" + w.name + "' " + what);
  };
  int64_t rows = std::max<int64_t>(w.batch_size, 1);
  if (cfg.max_batch_size > 0 ? rows > cfg.max_batch_size : rows != 1)
    return fail("has batch_size " + std::to_string(rows) + ", but max_batch_size "
                + std::to_string(cfg.max_batch_size) + " allows "
                + (cfg.max_batch_size > 0 ? "1 to " + std::to_string(cfg.max_batch_size)
                                          : std::string("only 1")));
  for (const auto& in : w.inputs)
    if (std::none_of(cfg.inputs.begin(), cfg.inputs.end(),
                     [&](const tensor_config& t) { return t.name == in.name; }))
      return fail("names input '" + in.name + "', but model '" + cfg.name
                  + "' has no input '" + in.name + "'");
  warmup_batch b;
  b.view.rows = static_cast<uint32_t>(rows);
  std::mt19937 rng(7);
  for (const auto& t : cfg.inputs) {
    auto in = std::find_if(w.inputs.begin(), w.inputs.end(),
                           [&](const warmup_input& i) { return i.name == t.name; });
    if (in == w.inputs.end())
      return fail("gives no data for input '" + t.name + "'; add inputs { key: \"" + t.name
                  + "\" value: { ... } }");
    std::string label = "input '" + t.name + "' ";
    if (in->dtype != t.dtype)
      return fail(label + "has data_type " + std::string(to_config_string(in->dtype))
                  + ", but the model's is " + std::string(to_config_string(t.dtype)));
    bool dims_fit = in->dims.size() == t.dims.size();
    for (size_t d = 0; dims_fit && d < t.dims.size(); ++d)
      dims_fit = in->dims[d] >= 0 && (t.dims[d] < 0 || in->dims[d] == t.dims[d]);
    if (!dims_fit)
      return fail(label + "has dims " + shape_string(in->dims) + ", but the model's are "
                  + shape_string(t.dims) + " (batch dimension excluded, -1 takes any size)");
    size_t elem = element_size(t.dtype);
    if (elem == 0)
      return fail(label + "is " + std::string(to_config_string(t.dtype))
                  + ", which warmup does not support; remove the sample");
    size_t row_bytes = static_cast<size_t>(element_count(in->dims)) * elem;
    auto& data = b.data.emplace_back(row_bytes * static_cast<size_t>(rows), 0);
    if (in->data == warmup_data::random) {
      bool floating = t.dtype == datatype::fp32 || t.dtype == datatype::fp64
                      || t.dtype == datatype::fp16 || t.dtype == datatype::bf16;
      if (t.dtype == datatype::fp32) {
        std::uniform_real_distribution<float> d(0.0f, 1.0f);
        for (size_t i = 0; i + 4 <= data.size(); i += 4) {
          float v = d(rng);
          std::memcpy(data.data() + i, &v, 4);
        }
      } else if (!floating) {
        // The lowest byte of each element: 0 or 1, whatever the width.
        for (size_t i = 0; i < data.size(); i += elem)
          data[i] = static_cast<uint8_t>(rng() & 1);
      } // other floating types: zeros
    } else if (in->data == warmup_data::file) {
      auto path = mcfg.model_file.parent_path().parent_path() / "warmup" / in->file;
      std::ifstream f(path, std::ios::binary);
      if (!f)
        return fail(label + "reads " + path.string()
                    + ", which cannot be opened; put the raw bytes of one request there");
      std::vector<char> bytes((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
      if (bytes.size() != row_bytes)
        return fail(label + "reads " + path.string() + ", which holds "
                    + std::to_string(bytes.size()) + " bytes, but one request of dims "
                    + shape_string(in->dims) + " " + std::string(to_config_string(t.dtype))
                    + " is " + std::to_string(row_bytes)
                    + " bytes (Triton repeats it for each of the batch_size rows)");
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(data.data() + r * row_bytes, bytes.data(), row_bytes);
    }
    dims_t shape = in->dims;
    if (cfg.max_batch_size > 0)
      shape.insert(shape.begin(), rows);
    b.view.inputs.push_back({t.name, t.dtype, shape, data.data(), data.size()});
  }
  return b;
}

} // namespace

namespace {

/// One warning per node whose step runs a oneDNN reference kernel in any of
/// `plans`, naming the node, the step and the ISA (model.warnings).
std::vector<std::string> reference_kernel_warnings(const plan_set& plans,
                                                   const onnx_model_config& mcfg) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& [key, plan] : plans)
    for (const auto& s : plan->steps) {
      if (s.kernel.find(reference_kernel_note) == std::string::npos || s.node < 0)
        continue;
      const auto& n = plan->g.nodes[static_cast<size_t>(s.node)];
      if (!seen.insert(n.name).second)
        continue;
      out.push_back("model '" + mcfg.config.name + "': node '" + n.name + "' (" + n.op
                    + ") runs [" + s.kernel + "] at batch " + std::to_string(plan->batch)
                    + ": oneDNN has no optimised kernel for it on this CPU ("
                    + process_cpu_level().describe() + "); it is correct but slow");
    }
  return out;
}

/// A graph with STRING tensors: its numeric part loads as any graph does, and
/// the STRING tensors are served around it (string_passthrough.hpp).
result<onnx_model> load_with_strings(graph imported, const onnx_model_config& given) {
  auto passthrough = imported.strings;
  onnx_model m;
  if (!imported.outputs.empty()) {
    auto numeric = given;
    numeric.config = without_strings(given.config, imported);
    imported.strings = {};
    auto loaded = load_onnx_graph(std::move(imported), numeric);
    if (!loaded)
      return loaded.error();
    m = std::move(*loaded);
  } else {
    m.config = given.config;
    m.config.inputs.clear();
    m.config.outputs.clear();
    if (m.config.max_batch_size > 1)
      m.config.dynamic_batching_enabled = true;
    m.summary = "ONNX opset " + std::to_string(imported.opset)
                + ": STRING tensors passed through, nothing computed";
    m.profile_report = [] { return std::string(); };
    m.reordered_weight_bytes = [] { return size_t{0}; };
    m.plans_compiled = [] { return size_t{0}; };
  }
  auto strings = string_tensors(passthrough, given.config, m.config.max_batch_size);
  if (!strings)
    return load_error(given, strings.error().message);
  m.config.inputs.insert(m.config.inputs.end(), strings->inputs.begin(), strings->inputs.end());
  m.config.outputs.insert(m.config.outputs.end(), strings->outputs.begin(),
                          strings->outputs.end());
  auto numeric_instance = m.make_instance;
  m.make_instance = [numeric_instance, passthrough]() {
    return with_strings(numeric_instance ? numeric_instance() : nullptr, passthrough);
  };
  return m;
}

} // namespace

result<onnx_model> load_onnx_graph(graph imported, const onnx_model_config& given) {
  if (!imported.strings.inputs.empty())
    return load_with_strings(std::move(imported), given);
  auto with = with_parameters(given);
  if (!with)
    return with.error();
  auto mcfg = *with;
  decoder_attention_result decoder_attention;
  if (mcfg.passes.rewrite_decoder_attention)
    decoder_attention = rewrite_decoder_attention(imported);
  // The plans run on the model's shapes (reshape where given); clients see
  // the config's dims.
  auto completed = complete_model_config(imported, completion_of(mcfg));
  if (!completed)
    return completed.error();
  mcfg.config = model_side(completed->autofilled);
  const auto* cfg = &completed->model;
  const auto& client_cfg = completed->client;
  // The process's compute threads when given; else one pool for every
  // instance of this model.
  auto pool = mcfg.pool ? mcfg.pool : std::make_shared<work_pool>(std::max(1u, mcfg.threads));
  mcfg.threads = pool->size();
  auto g = std::make_shared<const graph>(inputs_in_config_order(std::move(imported), *cfg));
  openblas_set_num_threads(1);
  auto weights = std::make_shared<weight_store>();
  auto compiles = std::make_shared<std::atomic<size_t>>(0);
  auto profiled = mcfg.profile ? std::make_shared<profiled_plans>() : nullptr;
  // Every plan that a batch of 1..max_batch_size rows runs, so that no request
  // waits for a compile and no batch size the scheduler forms is evicted: at
  // the config's dims, or with variable dims at each shape known now
  // (expected_shapes, model_warmup); other shapes compile on first use.
  bool variable = has_variable_dims(*cfg);
  std::vector<shape_set> known;
  if (variable) {
    auto sets = known_shape_sets(*cfg, mcfg.expected_shapes);
    if (!sets)
      return load_error(mcfg, sets.error().message);
    for (const auto& s : *sets)
      if (std::find(known.begin(), known.end(), s) == known.end())
        known.push_back(s);
  }
  std::vector<const shape_set*> pinned_sets;
  if (!variable)
    pinned_sets.push_back(nullptr);
  for (const auto& s : known)
    pinned_sets.push_back(&s);
  auto loaded = std::make_shared<plan_set>();
  auto started = std::chrono::steady_clock::now();
  for (const shape_set* set : pinned_sets)
  for (int64_t rows = 1; rows <= std::max(1, cfg->max_batch_size); ++rows)
    for (auto wanted = plans_for_batch(rows, mcfg.threads); !wanted.empty();) {
      int64_t n = wanted.front().first;
      unsigned threads = wanted.front().second;
      wanted.erase(wanted.begin());
      plan_key key{shapes_with(*g, *cfg, n, set, 0), threads};
      auto found = loaded->find(key);
      // A chunk plan that starves its matmuls: execute runs the batch whole.
      auto whole_too = [&](const compiled_plan& p) {
        if (threads == 1 && mcfg.threads > 1 && rows >= mcfg.threads
            && n == chunk_rows(rows, mcfg.threads)
            && chunks_starve_matmuls(p.work, mcfg.chunk_min_matmul_rows))
          wanted.push_back({rows, mcfg.threads});
      };
      if (found != loaded->end()) {
        whole_too(*found->second);
        continue;
      }
      auto plan = compile(*g, *cfg, mcfg, key.first, threads, *weights, compiles.get());
      if (!plan) {
        if (!set)
          return load_error(mcfg, plan.error().message);
        std::vector<std::string> names;
        for (int v : g->inputs)
          names.push_back(g->values[v].name);
        return load_error(mcfg, "the listed input shapes " + shapes_text(names, key.first)
                                  + " (expected_shapes or model_warmup) cannot run: "
                                  + plan.error().message);
      }
      if (profiled) {
        (*plan)->times = std::make_shared<step_times>((*plan)->steps.size());
        profiled->plans.push_back(*plan);
      }
      whole_too(**plan);
      loaded->emplace(std::move(key), *plan);
    }
  auto compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now()
                                                              - started).count();
  // The arenas, sized now for the largest plan each thread runs (the caller's
  // runs every plan; the others, 1-thread chunk plans), so that no batch
  // allocates them.
  size_t largest_arena = 0, largest_chunk_arena = 0;
  for (const auto& [key, plan] : *loaded) {
    largest_arena = std::max(largest_arena, plan->memory.arena_bytes);
    if (key.second == 1)
      largest_chunk_arena = std::max(largest_chunk_arena, plan->memory.arena_bytes);
  }
  auto scratch = std::make_shared<scratch_space>(pool->size());
  for (size_t t = 0; t < scratch->arenas.size(); ++t)
    scratch->arenas[t].assign((t == 0 ? largest_arena : largest_chunk_arena) + 64, 0);
  onnx_model m;
  m.config = client_cfg;
  auto cache = std::make_shared<plan_cache>(
    shape_plan_cache_config{std::max<size_t>(1, mcfg.plan_cache_size), mcfg.plan_cache_bytes});
  onnx_backend::shared_parts parts{g,      *cfg,  mcfg,     profiled, weights,
                                   loaded, cache, compiles, pool,     scratch};
  m.make_instance = [parts, client_cfg]() -> std::shared_ptr<executor::backend> {
    return executor::with_reshape(std::make_shared<onnx_backend>(parts), client_cfg);
  };
  m.plans_compiled = [compiles] { return compiles->load(); };
  m.cached_plans = [cache] { return cache->size(); };
  m.cached_plan_bytes = [cache] { return cache->bytes(); };
  m.reordered_weight_bytes = [weights] { return weights->bytes(); };
  m.profile_report = [profiled] { return profiled ? profile_text(*profiled) : std::string(); };
  // Triton's model_warmup: each sample runs on an instance of its own before
  // the model is reported ready; any failure fails the load.
  uint64_t warmup_runs = 0;
  if (!cfg->warmup.empty()) {
    auto instance = m.make_instance();
    for (const auto& w : cfg->warmup) {
      auto batch = make_warmup_batch(w, client_cfg, mcfg);
      if (!batch)
        return batch.error();
      for (uint32_t i = 0; i < std::max(w.count, 1u); ++i) {
        discard_writer out;
        exec_result r;
        try {
          r = instance->execute(batch->view, out);
        } catch (const std::exception& e) {
          r = serving_error{status_code::internal, e.what()};
        }
        if (auto* e = std::get_if<serving_error>(&r))
          return load_error(mcfg, "model_warmup '" + w.name + "' failed: " + e->message);
        ++warmup_runs;
      }
    }
  }
  m.warnings = reference_kernel_warnings(*loaded, mcfg);
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(0);
  os << "ONNX opset " << g->opset << ", " << g->nodes.size() << " nodes";
  if (!loaded->empty()) {
    const auto& first = *loaded->begin()->second;
    os << " -> " << first.g.nodes.size() << " steps, arena " << first.memory.arena_bytes
       << " bytes at batch 1 (" << first.memory.unshared_bytes << " without reuse)";
  }
  os << ", " << mcfg.threads << " compute thread(s), " << weights->bytes() / (1 << 20)
     << " MiB of reordered weights; " << loaded->size() << " plan(s) for batch sizes 1-"
     << std::max(1, cfg->max_batch_size);
  if (variable)
    os << " at " << known.size() << " listed input shape(s)";
  os << " compiled in " << compile_ms << " ms, arenas "
     << (largest_arena + (pool->size() - 1) * largest_chunk_arena)
     << " bytes for all instances";
  if (variable)
    os << "; other input shapes compile on first use (cache: " << mcfg.plan_cache_size
       << " plan(s), " << mcfg.plan_cache_bytes << " bytes)";
  if (!cfg->warmup.empty())
    os << "; warmup: " << cfg->warmup.size() << " sample(s), " << warmup_runs << " run(s)";
  m.summary = os.str();
  m.decoder_attention = std::move(decoder_attention);
  return m;
}

result<std::string> describe_plan(const onnx_model_config& given, int64_t batch) {
  auto with = with_parameters(given);
  if (!with)
    return with.error();
  auto mcfg = *with;
  auto imported = import_model(mcfg.model_file);
  if (!imported)
    return imported.error();
  if (!imported->strings.inputs.empty()) {
    // The plan is the numeric graph's; STRING tensors are copied around it.
    if (imported->outputs.empty())
      return "plan for " + mcfg.model_file.string()
             + ": STRING tensors passed through, nothing computed\n";
    mcfg.config = without_strings(mcfg.config, *imported);
    imported->strings = {};
  }
  if (mcfg.passes.rewrite_decoder_attention)
    rewrite_decoder_attention(*imported);
  auto completed = complete_model_config(*imported, completion_of(mcfg));
  if (!completed)
    return completed.error();
  mcfg.config = model_side(completed->autofilled);
  const auto* cfg = &completed->model;
  auto g = inputs_in_config_order(std::move(*imported), *cfg);
  // With variable dims: the first shape listed in expected_shapes or model_warmup.
  std::optional<shape_set> set;
  if (has_variable_dims(*cfg)) {
    auto sets = known_shape_sets(*cfg, mcfg.expected_shapes);
    if (!sets)
      return load_error(mcfg, sets.error().message);
    if (sets->empty())
      return load_error(mcfg, "inputs have variable dimensions besides the batch; list the "
                              "shapes to show in parameters \"expected_shapes\"");
    set = sets->front();
  }
  weight_store weights;
  auto plan = compile(g, *cfg, mcfg, shapes_with(g, *cfg, batch, set ? &*set : nullptr, 0),
                      std::max(1u, mcfg.threads), weights);
  if (!plan)
    return load_error(mcfg, plan.error().message);
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
      if (o < 0) continue;
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
