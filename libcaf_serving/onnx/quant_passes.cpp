#include "onnx/quant_passes.hpp"

#include "onnx/ops_quant.hpp"
#include "onnx/passes.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

namespace caf_serving::onnx {

namespace {

bool is_8bit(datatype t) {
  return t == datatype::int8 || t == datatype::uint8;
}

const tensor_data* cst(const graph& g, int v) {
  return v >= 0 ? g.values[v].constant.get() : nullptr;
}

int32_t int_value(const tensor_data& t, int64_t i) {
  switch (t.dtype) {
    case datatype::int8: return t.as<int8_t>()[i];
    case datatype::uint8: return t.as<uint8_t>()[i];
    default: return t.as<int32_t>()[i];
  }
}


/// A DequantizeLinear or QuantizeLinear node with constant parameters.
struct quant_node {
  int node = -1;
  int q = -1;            ///< the 8-bit (or INT32) tensor: DQ's input, Q's output
  int scale = -1, zero = -1;
  const tensor_data* s = nullptr; ///< FLOAT scales
  const tensor_data* z = nullptr; ///< zero points; null when absent (0)
  int64_t axis = 1;
};

/// The Q or DQ node `idx` (op `op`) when its scale and zero point are
/// constants, block_size is 0 and (for a Q) the zero point gives its type.
std::optional<quant_node> quant_params(const graph& g, int idx, const char* op) {
  if (idx < 0)
    return std::nullopt;
  const node& n = g.nodes[idx];
  if (n.op != op || n.inputs.size() < 2 || n.outputs.empty() || n.get_i("block_size", 0) != 0)
    return std::nullopt;
  quant_node p;
  p.node = idx;
  p.q = n.op == std::string("QuantizeLinear") ? n.outputs[0] : n.inputs[0];
  p.scale = n.inputs[1];
  p.zero = n.inputs.size() > 2 ? n.inputs[2] : -1;
  p.s = cst(g, p.scale);
  p.z = cst(g, p.zero);
  p.axis = n.get_i("axis", 1);
  if (!p.s || p.s->dtype != datatype::fp32 || (p.zero >= 0 && !p.z))
    return std::nullopt;
  if (p.z && p.z->elements() != p.s->elements())
    return std::nullopt;
  return p;
}

/// A per-tensor 8-bit quantization: one scale and a zero point whose type is
/// the tensor's (required: without it a Q's type depends on output_dtype).
bool per_tensor_8bit(const quant_node& p) {
  return p.s->elements() == 1 && p.z && p.z->elements() == 1 && is_8bit(p.z->dtype);
}

/// The per-tensor DQ that produces `v`.
std::optional<quant_node> activation_dq(const graph& g, const std::vector<int>& prod, int v) {
  if (v < 0)
    return std::nullopt;
  auto p = quant_params(g, prod[v], "DequantizeLinear");
  if (!p || !per_tensor_8bit(*p) || cst(g, p->q))
    return std::nullopt;
  return p;
}

/// The Q that alone reads `v` (through a Relu that alone reads it, when
/// `relu` is given), per tensor; the Relu's node index in `relu`.
std::optional<quant_node> output_q(const graph& g, const value_readers& rd, int v, int* relu) {
  int r = rd.single(v);
  if (r < 0)
    return std::nullopt;
  if (g.nodes[r].op == "Relu" && relu) {
    *relu = r;
    r = rd.single(g.nodes[r].outputs[0]);
  }
  auto p = quant_params(g, r, "QuantizeLinear");
  if (!p || !per_tensor_8bit(*p) || g.nodes[r].inputs[0] < 0)
    return std::nullopt;
  return p;
}

/// Constant 8-bit weights of rank `rank` through their DQ, per tensor or per
/// channel along `channel_axis`: a Conv's [M, C, kH, kW] per output channel
/// (rank 4, axis 0), a MatMul's [K, N] per column (rank 2, axis 1), a Gemm's
/// transposed [N, K] per row (rank 2, axis 0).
std::optional<quant_node> weight_dq(const graph& g, const std::vector<int>& prod, int v,
                                    size_t rank, int64_t channel_axis) {
  if (v < 0)
    return std::nullopt;
  auto p = quant_params(g, prod[v], "DequantizeLinear");
  if (!p)
    return std::nullopt;
  const auto* w = cst(g, p->q);
  if (!w || !is_8bit(w->dtype) || w->shape.size() != rank || (p->z && p->z->dtype != w->dtype))
    return std::nullopt;
  int64_t channels = p->s->elements();
  if (channels == 1)
    return p;
  int64_t axis = p->axis < 0 ? p->axis + static_cast<int64_t>(rank) : p->axis;
  if (axis != channel_axis || channels != w->shape[channel_axis])
    return std::nullopt;
  return p;
}

/// The bias of a Conv as FLOAT values (one per output channel): a constant,
/// or a DQ of a constant, through Identity nodes. `exact` gets the INT32
/// values when they are the DQ's own with scale x_scale * w_scale and zero 0.
std::optional<std::vector<float>> bias_values(const graph& g, const std::vector<int>& prod, int v,
                                              int64_t channels) {
  while (v >= 0 && prod[v] >= 0 && g.nodes[prod[v]].op == "Identity")
    v = g.nodes[prod[v]].inputs[0];
  if (v < 0)
    return std::nullopt;
  std::vector<float> b(static_cast<size_t>(channels));
  if (const auto* c = cst(g, v)) {
    if (c->dtype != datatype::fp32 || c->elements() != channels)
      return std::nullopt;
    for (int64_t k = 0; k < channels; ++k)
      b[k] = c->as<float>()[k];
    return b;
  }
  auto p = quant_params(g, prod[v], "DequantizeLinear");
  if (!p)
    return std::nullopt;
  const auto* q = cst(g, p->q);
  int64_t per = p->s->elements();
  if (!q || q->elements() != channels || (per != 1 && per != channels)
      || (q->dtype != datatype::int32 && !is_8bit(q->dtype)))
    return std::nullopt;
  for (int64_t k = 0; k < channels; ++k) {
    int64_t s = per == 1 ? 0 : k;
    int32_t zero = p->z ? int_value(*p->z, s) : 0;
    b[k] = static_cast<float>(static_cast<int64_t>(int_value(*q, k)) - zero)
           * p->s->as<float>()[s];
  }
  return b;
}

/// round_half_even(b / (x_scale * w_scale[k])) as INT32, saturated. When the
/// model quantized the bias with that very scale (as onnxruntime's quantizer
/// does), b / scale is the integer it stored, and this gives it back.
constant_ptr quantized_bias(const std::vector<float>& b, float x_scale, const tensor_data& ws) {
  auto t = make_tensor(datatype::int32, {static_cast<int64_t>(b.size())});
  auto* out = t->as_mut<int32_t>();
  for (size_t k = 0; k < b.size(); ++k) {
    float scale = x_scale * ws.as<float>()[ws.elements() == 1 ? 0 : k];
    double v = std::nearbyint(static_cast<double>(b[k]) / scale);
    v = std::clamp(v, double(std::numeric_limits<int32_t>::lowest()),
                   double(std::numeric_limits<int32_t>::max()));
    out[k] = static_cast<int32_t>(v);
  }
  return t;
}

/// A zero point of 0 of the type of `like` (for a weight DQ without one).
int zero_constant(graph& g, const std::string& name, datatype like) {
  return g.add_constant(name, make_tensor(like, {}));
}

void kill(node& n) {
  n.op = "Dead";
  n.inputs.clear();
  n.outputs.clear();
}

bool fuse_conv(graph& g, const std::vector<int>& prod, const value_readers& rd, int idx) {
  const node conv = g.nodes[idx];
  if (conv.inputs.size() < 2 || conv.outputs.size() != 1)
    return false;
  auto x = activation_dq(g, prod, conv.inputs[0]);
  auto w = weight_dq(g, prod, conv.inputs[1], 4, 0);
  int relu = -1;
  auto y = output_q(g, rd, conv.outputs[0], &relu);
  if (!x || !w || !y)
    return false;
  const auto* wt = cst(g, w->q);
  int64_t channels = wt->shape[0];
  int bias = -1;
  if (conv.inputs.size() > 2 && conv.inputs[2] >= 0) {
    auto b = bias_values(g, prod, conv.inputs[2], channels);
    if (!b)
      return false;
    bias = g.add_constant(conv.name + "/bias_int32",
                          quantized_bias(*b, x->s->as<float>()[0], *w->s));
  }
  int w_zero = w->zero >= 0 ? w->zero : zero_constant(g, conv.name + "/w_zero", wt->dtype);
  node q;
  q.op = "QLinearConv";
  q.name = conv.name;
  q.attrs = conv.attrs;
  q.inputs = {x->q, x->scale, x->zero, w->q, w->scale, w_zero, y->scale, y->zero};
  if (bias >= 0)
    q.inputs.push_back(bias);
  q.outputs = {y->q};
  if (relu >= 0) {
    q.set_s("activation", "Relu");
    kill(g.nodes[relu]);
  }
  kill(g.nodes[y->node]);
  g.nodes[idx] = std::move(q);
  return true;
}

bool fuse_add(graph& g, const std::vector<int>& prod, const value_readers& rd, int idx) {
  const node add = g.nodes[idx];
  if (add.inputs.size() != 2 || add.outputs.size() != 1)
    return false;
  auto a = activation_dq(g, prod, add.inputs[0]);
  auto b = activation_dq(g, prod, add.inputs[1]);
  int relu = -1;
  auto c = output_q(g, rd, add.outputs[0], &relu);
  if (!a || !b || !c)
    return false;
  node q;
  q.op = quant_add_op;
  q.name = add.name;
  q.inputs = {a->q, a->scale, a->zero, b->q, b->scale, b->zero, c->scale, c->zero};
  q.outputs = {c->q};
  if (relu >= 0) {
    q.set_s("activation", "Relu");
    kill(g.nodes[relu]);
  }
  kill(g.nodes[c->node]);
  g.nodes[idx] = std::move(q);
  return true;
}

/// `w` [N, K] as [K, N].
constant_ptr transposed(const tensor_data& w) {
  int64_t n = w.shape[0], k = w.shape[1];
  auto t = make_tensor(w.dtype, {k, n});
  const auto* in = w.bytes.data();
  auto* out = t->as_mut<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      out[j * n + i] = in[i * k + j];
  return t;
}

bool fuse_matmul(graph& g, const std::vector<int>& prod, const value_readers& rd, int idx) {
  const node mm = g.nodes[idx];
  bool gemm = mm.op == "Gemm";
  if (mm.inputs.size() < 2 || mm.outputs.size() != 1)
    return false;
  bool trans = gemm && mm.get_i("transB", 0) != 0;
  if (gemm && (mm.get_i("transA", 0) != 0 || mm.get_f("alpha", 1.0f) != 1.0f
               || (mm.inputs.size() > 2 && mm.inputs[2] >= 0 && mm.get_f("beta", 1.0f) != 1.0f)))
    return false;
  auto x = activation_dq(g, prod, mm.inputs[0]);
  auto w = weight_dq(g, prod, mm.inputs[1], 2, trans ? 0 : 1);
  auto y = output_q(g, rd, mm.outputs[0], nullptr);
  if (!x || !w || !y)
    return false;
  const auto* wt = cst(g, w->q);
  int64_t columns = wt->shape[trans ? 0 : 1];
  int bias = -1;
  if (gemm && mm.inputs.size() > 2 && mm.inputs[2] >= 0) {
    auto b = bias_values(g, prod, mm.inputs[2], columns);
    if (!b)
      return false; // a C of another shape (a matrix, a scalar) keeps the fp32 Gemm
    bias = g.add_constant(mm.name + "/bias_int32",
                          quantized_bias(*b, x->s->as<float>()[0], *w->s));
  }
  int weights = trans ? g.add_constant(mm.name + "/w_transposed", transposed(*wt)) : w->q;
  int w_zero = w->zero >= 0 ? w->zero : zero_constant(g, mm.name + "/w_zero", wt->dtype);
  node q;
  q.op = "QLinearMatMul";
  q.name = mm.name;
  q.inputs = {x->q, x->scale, x->zero, weights, w->scale, w_zero, y->scale, y->zero};
  if (bias >= 0)
    q.inputs.push_back(bias);
  q.outputs = {y->q};
  kill(g.nodes[y->node]);
  g.nodes[idx] = std::move(q);
  return true;
}

/// Whether two per-tensor quantizations are the same (scale bits, zero point, type).
bool same_quantization(const quant_node& a, const quant_node& b) {
  return a.s->as<float>()[0] == b.s->as<float>()[0] && a.z->dtype == b.z->dtype
         && int_value(*a.z, 0) == int_value(*b.z, 0);
}

bool fuse_max_pool(graph& g, const std::vector<int>& prod, const value_readers& rd, int idx) {
  const node pool = g.nodes[idx];
  if (pool.inputs.size() != 1 || pool.outputs.empty() || pool.outputs[0] < 0)
    return false;
  for (size_t i = 1; i < pool.outputs.size(); ++i)
    if (pool.outputs[i] >= 0)
      return false; // Indices
  if (pool.get_s("auto_pad", "NOTSET") != "NOTSET" || pool.get_i("ceil_mode", 0) != 0
      || pool.get_i("storage_order", 0) != 0 || pool.get_ints("kernel_shape").size() != 2)
    return false;
  auto x = activation_dq(g, prod, pool.inputs[0]);
  auto y = output_q(g, rd, pool.outputs[0], nullptr);
  if (!x || !y || !same_quantization(*x, *y))
    return false;
  node q;
  q.op = quant_max_pool_op;
  q.name = pool.name;
  q.attrs = pool.attrs;
  q.inputs = {x->q};
  q.outputs = {y->q};
  kill(g.nodes[y->node]);
  g.nodes[idx] = std::move(q);
  return true;
}

} // namespace

qdq_fusions fuse_qdq(graph& g) {
  qdq_fusions done;
  auto prod = g.producers();
  value_readers rd(g);
  // A rewrite replaces its node in place and kills the Relu and Q behind it;
  // it never changes what a later group's match reads (DQs stay until the
  // dead nodes go), so one pass over the nodes finds every group.
  struct rewrite {
    bool (*fuse)(graph& g, const std::vector<int>& prod, const value_readers& rd, int idx);
    int qdq_fusions::*count;
  };
  static const std::map<std::string, rewrite> rewrites{
    {"Add", {&fuse_add, &qdq_fusions::adds}},
    {"Conv", {&fuse_conv, &qdq_fusions::convs}},
    {"Gemm", {&fuse_matmul, &qdq_fusions::matmuls}},
    {"MatMul", {&fuse_matmul, &qdq_fusions::matmuls}},
    {"MaxPool", {&fuse_max_pool, &qdq_fusions::max_pools}},
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto r = rewrites.find(g.nodes[i].op);
    if (r != rewrites.end() && r->second.fuse(g, prod, rd, static_cast<int>(i)))
      ++(done.*r->second.count);
  }
  if (done.convs + done.adds + done.max_pools + done.matmuls > 0)
    remove_dead_nodes(g);
  return done;
}

} // namespace caf_serving::onnx
