/// fuse_packed_attention (passes.hpp): torch's nn.MultiheadAttention with
/// batch_first=True and one packed in-projection (torchvision's ViT), as the
/// TorchScript exporter writes it at opsets 14-17, becomes FusedAttention.
///
/// The exported graph computes attention in [S, B, E] order, so that
/// fuse_attention (which starts from a [B, S, H*D] Reshape per Q, K and V)
/// never matched it, and every one of ViT-B/16's layers ran two batched
/// MatMuls, the softmax, eight Transposes and a 5-D Transpose of Q, K and V on
/// the reference kernels (a quarter of the model's time at batch 1):
///
///     xt  = Transpose(x [B, S, E], (1, 0, 2))                   [S, B, E]
///     qkv = Add(MatMul(xt, W [E, 3E]), bias [3E])               [S, B, 3E]
///     p   = Squeeze(Transpose(Unsqueeze(Reshape(qkv, [S, B, 3, E]), 0),
///                             (3, 1, 2, 0, 4)), 3)              [3, S, B, E]
///     q   = Reshape(Transpose(Reshape(Gather(p, 0), [S, B*H, D]), (1, 0, 2)),
///                   [B, H, S, D]) * c          (k: index 1, Transpose (0, 1, 3, 2), * c;
///                                               v: index 2, unscaled)
///     o   = MatMul(Softmax(MatMul(q, k)), v)                    [B, H, S, D]
///     y   = Transpose(Reshape(Gemm(Reshape(Transpose(o, (2, 0, 1, 3)), [S*B, E]),
///                             Wo, bo), [S, B, E']), (1, 0, 2)) [B, S, E']
///
/// The in-projection works row by row, so it runs on x in [B, S, E] order
/// without the Transposes; the rewrite is
///
///     q, k, v = Split(Add(MatMul(x, W), bias), axis 2)         [B, S, E] each
///     a       = FusedAttention(q, k, v) [num_heads H, scale c*c]
///     y       = Reshape(Gemm(Reshape(a, [B*S, E]), Wo, bo), [B, S, E'])
///
/// and the epilogue pass then fuses the bias into the in-projection's matmul.
/// Anything else (a mask, unpacked projections, batch_first=False, a value read
/// outside the pattern) leaves the graph as it is: it runs unfused, correctly.

#include "onnx/passes.hpp"

#include <cmath>
#include <optional>

namespace caf_serving::onnx {

namespace {

using dims = std::vector<int64_t>;

struct mha_graph {
  graph& g;
  std::vector<int> prod;
  value_readers rd;

  explicit mha_graph(graph& gr) : g(gr), prod(gr.producers()), rd(gr) {}

  const dims& shape(int v) const { return g.values[v].shape; }

  /// The node producing `v` when its operator is `op` and `v` is read by one
  /// node only (so the pattern may remove it); -1 otherwise.
  int private_producer(int v, const char* op) const {
    if (v < 0 || prod[v] < 0 || g.nodes[prod[v]].op != op || rd.single(v) < 0)
      return -1;
    return prod[v];
  }

  /// The only reader of `v` when its operator is `op`; -1 otherwise.
  int single_reader(int v, const char* op) const {
    int r = rd.single(v);
    return r >= 0 && g.nodes[r].op == op ? r : -1;
  }

  std::optional<float> scalar(int v) const {
    const auto* t = v >= 0 ? g.values[v].constant.get() : nullptr;
    if (!t || t->elements() != 1 || t->dtype != datatype::fp32)
      return std::nullopt;
    return t->as<float>()[0];
  }

  std::optional<int64_t> int_scalar(int v) const {
    const auto* t = v >= 0 ? g.values[v].constant.get() : nullptr;
    if (!t || t->elements() != 1 || t->dtype != datatype::int64)
      return std::nullopt;
    return t->as<int64_t>()[0];
  }
};

bool transpose_is(const node& n, const dims& perm) {
  return n.op == "Transpose" && n.get_ints("perm") == perm;
}

/// One head operand of the products: `v` [B, H, S, D] (or [B, H, D, S] for K)
/// traced back to Gather(p, index) of the packed [3, S, B, E] projections.
struct head_operand {
  int packed = -1;
  int64_t index = -1;
  float scale = 1.0f;
  std::vector<int> nodes; ///< the pattern's nodes on the way, to remove
};

/// Follows `v` up through a constant scalar Mul/Div (any number, factors into
/// `scale`), Transpose (0, 1, 3, 2) exactly when `transposed`, then the
/// per-head layout Reshape [B*H, S, D] -> [B, H, S, D], Transpose (1, 0, 2),
/// Reshape [S, B, E] -> [S, B*H, D], and Gather(p, index, axis 0).
std::optional<head_operand> trace_head(const mha_graph& m, int v, bool transposed,
                                       const dims& bhsd) {
  head_operand h;
  bool swapped = false;
  for (;;) {
    int p = m.prod[v];
    if (p < 0 || m.rd.is_output[v] || m.rd.readers[v].size() != 1)
      return std::nullopt;
    const node& n = m.g.nodes[p];
    if ((n.op == "Mul" || n.op == "Div") && n.inputs.size() == 2) {
      int k = m.scalar(n.inputs[1]) ? 1 : (n.op == "Mul" && m.scalar(n.inputs[0]) ? 0 : -1);
      if (k < 0)
        return std::nullopt;
      float c = *m.scalar(n.inputs[k]);
      if (!std::isfinite(c) || c == 0.0f || m.shape(n.inputs[1 - k]) != m.shape(v))
        return std::nullopt;
      h.scale *= n.op == "Div" ? 1.0f / c : c;
      h.nodes.push_back(p);
      v = n.inputs[1 - k];
    } else if (transposed && !swapped && transpose_is(n, {0, 1, 3, 2})) {
      swapped = true;
      h.nodes.push_back(p);
      v = n.inputs[0];
    } else {
      break;
    }
  }
  if (transposed != swapped || m.shape(v) != bhsd)
    return std::nullopt;
  int64_t b = bhsd[0], heads = bhsd[1], s = bhsd[2], d = bhsd[3];
  int r4 = m.private_producer(v, "Reshape");
  if (r4 < 0)
    return std::nullopt;
  int t_in = m.g.nodes[r4].inputs[0];
  int t = m.private_producer(t_in, "Transpose");
  if (t < 0 || !transpose_is(m.g.nodes[t], {1, 0, 2}) || m.shape(t_in) != dims{b * heads, s, d})
    return std::nullopt;
  int r3_out = m.g.nodes[t].inputs[0];
  int r3 = m.private_producer(r3_out, "Reshape");
  if (r3 < 0 || m.shape(r3_out) != dims{s, b * heads, d})
    return std::nullopt;
  int gathered = m.g.nodes[r3].inputs[0];
  int ga = m.private_producer(gathered, "Gather");
  if (ga < 0 || m.shape(gathered) != dims{s, b, heads * d} || m.g.nodes[ga].get_i("axis", 0) != 0)
    return std::nullopt;
  auto index = m.int_scalar(m.g.nodes[ga].inputs[1]);
  if (!index || !m.g.values[m.g.nodes[ga].inputs[1]].shape.empty())
    return std::nullopt;
  h.packed = m.g.nodes[ga].inputs[0];
  h.index = *index;
  h.nodes.insert(h.nodes.end(), {r4, t, r3, ga});
  return h;
}

/// The packed [3, S, B, E] value traced up to the in-projection: returns the
/// [B, S, E] input x, the weights, the bias (-1 if none) and the nodes.
struct in_projection {
  int x = -1, weights = -1, bias = -1;
  std::vector<int> nodes;
};

std::optional<in_projection> trace_in_projection(const mha_graph& m, int packed, int64_t s,
                                                 int64_t b, int64_t e) {
  in_projection ip;
  // The packed value is read by the three Gathers (checked by the caller).
  int sq = m.prod[packed];
  if (sq < 0 || m.g.nodes[sq].op != "Squeeze" || m.rd.is_output[packed]
      || m.shape(packed) != dims{3, s, b, e})
    return std::nullopt;
  int tr_out = m.g.nodes[sq].inputs[0];
  int tr = m.private_producer(tr_out, "Transpose");
  if (tr < 0 || !transpose_is(m.g.nodes[tr], {3, 1, 2, 0, 4})
      || m.shape(tr_out) != dims{3, s, b, 1, e})
    return std::nullopt;
  int un_out = m.g.nodes[tr].inputs[0];
  int un = m.private_producer(un_out, "Unsqueeze");
  if (un < 0 || m.shape(un_out) != dims{1, s, b, 3, e})
    return std::nullopt;
  int rs_out = m.g.nodes[un].inputs[0];
  int rs = m.private_producer(rs_out, "Reshape");
  if (rs < 0 || m.shape(rs_out) != dims{s, b, 3, e})
    return std::nullopt;
  int qkv = m.g.nodes[rs].inputs[0];
  if (m.shape(qkv) != dims{s, b, 3 * e})
    return std::nullopt;
  ip.nodes = {sq, tr, un, rs};
  int mm = -1;
  if (int add = m.private_producer(qkv, "Add"); add >= 0) {
    const auto& an = m.g.nodes[add];
    for (int k = 0; k < 2 && mm < 0; ++k) {
      const auto* c = m.g.values[an.inputs[k]].constant.get();
      int other = an.inputs[1 - k];
      if (c && c->dtype == datatype::fp32 && m.shape(an.inputs[k]) == dims{3 * e}
          && (mm = m.private_producer(other, "MatMul")) >= 0)
        ip.bias = an.inputs[k];
    }
    if (mm < 0)
      return std::nullopt;
    ip.nodes.push_back(add);
  } else {
    mm = m.private_producer(qkv, "MatMul");
    if (mm < 0)
      return std::nullopt;
  }
  const auto& mn = m.g.nodes[mm];
  const auto* w = m.g.values[mn.inputs[1]].constant.get();
  if (!w || w->dtype != datatype::fp32 || w->shape != dims{e, 3 * e})
    return std::nullopt;
  int xt = mn.inputs[0];
  int t = m.private_producer(xt, "Transpose");
  if (t < 0 || !transpose_is(m.g.nodes[t], {1, 0, 2}) || m.shape(xt) != dims{s, b, e})
    return std::nullopt;
  ip.x = m.g.nodes[t].inputs[0];
  if (m.g.values[ip.x].dtype != datatype::fp32)
    return std::nullopt;
  ip.weights = mn.inputs[1];
  ip.nodes.insert(ip.nodes.end(), {mm, t});
  return ip;
}

/// The context [B, H, S, D] traced down to the output [B, S, E']: its
/// Transpose (2, 0, 1, 3), Reshape [S*B, E], Gemm (constant weights), Reshape
/// [S, B, E'] and Transpose (1, 0, 2).
struct out_projection {
  int gemm = -1, y = -1;
  std::vector<int> nodes; ///< every node but the Gemm
};

std::optional<out_projection> trace_out_projection(const mha_graph& m, int ctx, int64_t s,
                                                   int64_t b, int64_t e) {
  out_projection op;
  int t1 = m.single_reader(ctx, "Transpose");
  if (t1 < 0 || !transpose_is(m.g.nodes[t1], {2, 0, 1, 3}))
    return std::nullopt;
  int r1 = m.single_reader(m.g.nodes[t1].outputs[0], "Reshape");
  if (r1 < 0 || m.shape(m.g.nodes[r1].outputs[0]) != dims{s * b, e})
    return std::nullopt;
  int gm = m.single_reader(m.g.nodes[r1].outputs[0], "Gemm");
  if (gm < 0 || m.g.nodes[gm].inputs[0] != m.g.nodes[r1].outputs[0]
      || m.g.nodes[gm].get_i("transA", 0) != 0)
    return std::nullopt;
  const auto& go = m.shape(m.g.nodes[gm].outputs[0]);
  if (go.size() != 2 || go[0] != s * b)
    return std::nullopt;
  int64_t eo = go[1];
  int r2 = m.single_reader(m.g.nodes[gm].outputs[0], "Reshape");
  if (r2 < 0 || m.shape(m.g.nodes[r2].outputs[0]) != dims{s, b, eo})
    return std::nullopt;
  int t2 = m.single_reader(m.g.nodes[r2].outputs[0], "Transpose");
  if (t2 < 0 || !transpose_is(m.g.nodes[t2], {1, 0, 2}))
    return std::nullopt;
  op.gemm = gm;
  op.y = m.g.nodes[t2].outputs[0];
  op.nodes = {t1, r1, r2, t2};
  return op;
}

int shape_constant(graph& g, const std::string& name, const dims& d) {
  auto t = make_tensor(datatype::int64, {static_cast<int64_t>(d.size())});
  std::copy(d.begin(), d.end(), t->as_mut<int64_t>());
  return g.add_constant(name, t);
}

} // namespace

void fuse_packed_attention(graph& g) {
  // Matches first (producers and readers stay those of the graph as it came),
  // then rewrites: each match's nodes go, its new nodes take the place of its
  // last node (the Transpose back to [B, S, E']), where all it reads exists.
  mha_graph m(g);
  std::vector<bool> dead(g.nodes.size(), false);
  std::vector<std::vector<node>> at(g.nodes.size());
  for (size_t si = 0; si < g.nodes.size(); ++si) {
    const node& sm = g.nodes[si];
    if (sm.op != "Softmax" || dead[si] || sm.inputs.empty())
      continue;
    const auto& sc = m.shape(sm.inputs[0]);
    if (sc.size() != 4 || (sm.get_i("axis", -1) != -1 && sm.get_i("axis", -1) != 3))
      continue;
    int mm1 = m.private_producer(sm.inputs[0], "MatMul");
    int pv = m.single_reader(sm.outputs[0], "MatMul");
    if (mm1 < 0 || pv < 0 || g.nodes[pv].inputs[0] != sm.outputs[0])
      continue;
    int64_t b = sc[0], heads = sc[1], s = sc[2];
    const auto& qshape = m.shape(g.nodes[mm1].inputs[0]);
    if (qshape.size() != 4 || sc[3] != s)
      continue;
    int64_t d = qshape[3], e = heads * d;
    dims bhsd{b, heads, s, d};
    auto q = trace_head(m, g.nodes[mm1].inputs[0], false, bhsd);
    auto k = trace_head(m, g.nodes[mm1].inputs[1], true, bhsd);
    auto v = trace_head(m, g.nodes[pv].inputs[1], false, bhsd);
    if (!q || !k || !v || v->scale != 1.0f || q->index != 0 || k->index != 1 || v->index != 2
        || q->packed != k->packed || q->packed != v->packed
        || m.rd.readers[q->packed].size() != 3)
      continue;
    auto ip = trace_in_projection(m, q->packed, s, b, e);
    auto op = ip ? trace_out_projection(m, g.nodes[pv].outputs[0], s, b, e) : std::nullopt;
    if (!op)
      continue;
    std::vector<int> gone{mm1, static_cast<int>(si), pv, op->gemm};
    for (const auto* list : {&q->nodes, &k->nodes, &v->nodes, &ip->nodes, &op->nodes})
      gone.insert(gone.end(), list->begin(), list->end());
    bool taken = false;
    for (int n : gone)
      taken = taken || dead[n];
    if (taken)
      continue;
    for (int n : gone)
      dead[n] = true;

    const std::string name = g.nodes[op->gemm].name + "/packed_attention";
    const auto& gemm_out = m.shape(g.nodes[op->gemm].outputs[0]);
    int64_t eo = gemm_out[1];
    std::vector<node> nodes;
    int proj = g.add_value(name + "/qkv_matmul", datatype::fp32, {b, s, 3 * e}, true);
    nodes.push_back(node{"MatMul", name + "/qkv_matmul", {ip->x, ip->weights}, {proj}, {}});
    if (ip->bias >= 0) {
      int biased = g.add_value(name + "/qkv", datatype::fp32, {b, s, 3 * e}, true);
      nodes.push_back(node{"Add", name + "/qkv_bias", {proj, ip->bias}, {biased}, {}});
      proj = biased;
    }
    std::vector<int> qkv;
    for (const char* part : {"/q", "/k", "/v"})
      qkv.push_back(g.add_value(name + part, datatype::fp32, {b, s, e}, true));
    nodes.push_back(node{"Split", name + "/split", {proj}, qkv, {}});
    nodes.back().set_i("axis", 2);
    int att = g.add_value(name + "/context", datatype::fp32, {b, s, e}, true);
    nodes.push_back(node{"FusedAttention", name, qkv, {att}, {}});
    nodes.back().set_i("num_heads", heads);
    nodes.back().set_f("scale", q->scale * k->scale);
    int rows = g.add_value(name + "/rows", datatype::fp32, {b * s, e}, true);
    nodes.push_back(node{"Reshape", name + "/rows", {att, shape_constant(g, name + "/rows_shape",
                                                                         {b * s, e})},
                         {rows}, {}});
    node gemm = g.nodes[op->gemm];
    int projected = g.add_value(name + "/out", datatype::fp32, {b * s, eo}, true);
    gemm.inputs[0] = rows;
    gemm.outputs = {projected};
    nodes.push_back(gemm);
    nodes.push_back(node{"Reshape", name + "/out_bse",
                         {projected, shape_constant(g, name + "/out_shape", {b, s, eo})},
                         {op->y}, {}});
    at[op->nodes.back()] = std::move(nodes);
  }
  std::vector<node> out;
  out.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!at[i].empty())
      for (auto& n : at[i])
        out.push_back(std::move(n));
    else if (!dead[i])
      out.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(out);
}

} // namespace caf_serving::onnx
