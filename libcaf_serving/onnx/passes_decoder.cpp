#include "onnx/passes_decoder.hpp"

#include "onnx/passes.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <variant>

namespace caf_serving::onnx {

namespace {

using dims = std::vector<int64_t>;
using refusal = std::string;

/// Shapes and an attention mask to fold the bias with: `batch` rows of
/// `sequence` new positions after `past` cached ones.
struct probe {
  int64_t batch = 0, sequence = 0, past = 0;
  std::vector<int64_t> mask; ///< [batch, past + sequence], row-major, 0 or 1
  int64_t total() const { return past + sequence; }
};

/// A probe whose mask opens every position of row 0, has a gap after the
/// first position in odd rows and padding at the end of the past in the
/// other rows, and masks row 2's last new position. Every row's first
/// position is open, so that no query row is masked throughout (exports may
/// treat such a row specially; the runner never sends one).
probe mixed_probe(int64_t batch, int64_t sequence, int64_t past) {
  probe p{batch, sequence, past, {}};
  const int64_t t = p.total();
  p.mask.assign(static_cast<size_t>(batch * t), 1);
  for (int64_t b = 1; b < batch; ++b)
    for (int64_t j = 1; j < t; ++j) {
      bool closed = b % 2 == 1 ? j < std::min<int64_t>(4, past) : j >= past / 2 && j < past;
      if (b == 2 && sequence > 1 && j == t - 1)
        closed = true;
      if (closed)
        p.mask[static_cast<size_t>(b * t + j)] = 0;
    }
  return p;
}

/// A layer's attention as matched (value and node indices of the graph).
struct layer {
  std::string name; ///< the Softmax's
  int q = -1, k_new = -1, v_new = -1;
  int past_k = -1, past_v = -1;
  int present_k = -1, present_v = -1;
  int concat_k = -1, concat_v = -1; ///< nodes
  int bias = -1;
  int out = -1;
  float scale = 1.f;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
};

/// The shapes of every graph input but the mask at `p`, or why an input
/// has no place in a decoder's probe.
std::variant<std::vector<dims>, refusal> probe_shapes(const graph& g, int mask, const probe& p) {
  std::vector<dims> shapes;
  for (int i : g.inputs) {
    if (i == mask)
      continue;
    const auto& v = g.values[i];
    if (v.shape.size() == 2 && (v.dtype == datatype::int64 || v.dtype == datatype::int32)) {
      shapes.push_back({p.batch, p.sequence}); // input_ids, position_ids
    } else if (v.shape.size() == 4 && v.shape[1] > 0 && v.shape[3] > 0) {
      shapes.push_back({p.batch, v.shape[1], p.past, v.shape[3]}); // the past
    } else {
      return "input '" + v.name + "' " + shape_string(v.shape) + " is neither [batch, sequence] "
             "ids nor a past [batch, kv_heads, past, head_dim] with its heads and head size "
             "fixed";
    }
  }
  return shapes;
}

/// `g` specialized at `p` with its attention mask a constant: what depends
/// on the mask and shapes alone folds.
std::variant<graph, refusal> fold_at(const graph& g, int mask, const probe& p) {
  auto shapes = probe_shapes(g, mask, p);
  if (auto* r = std::get_if<refusal>(&shapes))
    return *r;
  graph c = g;
  auto t = make_tensor(g.values[mask].dtype, {p.batch, p.total()});
  for (size_t i = 0; i < p.mask.size(); ++i) {
    if (t->dtype == datatype::int64)
      t->as_mut<int64_t>()[i] = p.mask[i];
    else
      t->as_mut<int32_t>()[i] = static_cast<int32_t>(p.mask[i]);
  }
  c.values[mask].constant = t;
  c.values[mask].shape = t->shape;
  c.values[mask].shape_known = true;
  c.inputs.erase(std::find(c.inputs.begin(), c.inputs.end(), mask));
  auto s = specialize(c, std::get<std::vector<dims>>(shapes));
  if (!s)
    return "the graph does not specialize at batch " + std::to_string(p.batch) + ", sequence "
           + std::to_string(p.sequence) + ", past " + std::to_string(p.past) + ": "
           + s.error().message;
  return std::move(*s);
}

/// Matches layers in `g` with the shapes and constants of `s` (g folded at `p`).
class matcher {
public:
  matcher(const graph& g, const graph& s, const probe& p)
    : g_(g), s_(s), p_(p), prod_(g.producers()), rd_(g) {}

  std::variant<layer, refusal> match(int softmax) const {
    const node& soft = g_.nodes[softmax];
    layer l;
    l.name = soft.name;
    auto no = [&](const std::string& why) { return "Softmax '" + soft.name + "': " + why; };
    const int x = soft.inputs[0];
    if (shape(x).size() != 4)
      return no("its input " + shape_string(shape(x)) + " is not attention scores "
                "[batch, heads, sequence, total]");
    int64_t axis = soft.get_i("axis", g_.opset >= 13 ? -1 : 1);
    if (axis != -1 && axis != 3)
      return no("axis " + std::to_string(axis) + " is not the last");
    const int add = producer(x, "Add");
    if (add < 0 || rd_.single(x) < 0)
      return no("its input is not Add(scores, mask) read by it alone (a softcap, a missing "
                "mask or another bias)");
    const node& a = g_.nodes[add];
    if (a.inputs.size() != 2)
      return no("Add '" + a.name + "' has not two inputs");
    const bool first = folded(a.inputs[0]), second = folded(a.inputs[1]);
    if (first == second)
      return no(std::string(first ? "both" : "neither") + " of Add '" + a.name + "''s inputs "
                "is built from attention_mask and shapes alone");
    l.bias = first ? a.inputs[0] : a.inputs[1];
    auto [scores, c] = through_scaling(first ? a.inputs[1] : a.inputs[0]);
    const int qk = producer(scores, "MatMul");
    if (qk < 0 || rd_.single(scores) < 0)
      return no("the scores are not MatMul(q, k^T) scaled by constants and read once "
                "(softcapping or another transform between them and the Softmax)");
    auto [q, sa] = through_scaling(g_.nodes[qk].inputs[0]);
    auto [kt, sb] = through_scaling(g_.nodes[qk].inputs[1]);
    const int tr = producer(kt, "Transpose");
    if (tr < 0 || g_.nodes[tr].get_ints("perm") != dims{0, 1, 3, 2})
      return no("the keys of MatMul '" + g_.nodes[qk].name + "' are not Transpose(k, "
                "(0, 1, 3, 2))");
    auto [k_all, sk] = through_scaling(g_.nodes[tr].inputs[0]);
    l.q = q;
    l.scale = c * sa * sb * sk;
    if (!(l.scale > 0.f) || !std::isfinite(l.scale))
      return no("the scale " + std::to_string(l.scale) + " is not positive");

    // The probabilities, through torch's guard against rows masked throughout.
    const int probs = soft.outputs[0];
    int pv = -1, p_in = probs;
    const auto& readers = rd_.readers[probs];
    if (readers.size() == 1 && !rd_.is_output[probs]) {
      pv = readers[0];
    } else if (readers.size() == 2 && !rd_.is_output[probs]) {
      int isnan = g_.nodes[readers[0]].op == "IsNaN" ? readers[0] : readers[1];
      int where = isnan == readers[0] ? readers[1] : readers[0];
      const node& w = g_.nodes[where];
      if (g_.nodes[isnan].op == "IsNaN" && w.op == "Where" && w.inputs.size() == 3
          && w.inputs[0] == g_.nodes[isnan].outputs[0] && w.inputs[2] == probs
          && rd_.single(g_.nodes[isnan].outputs[0]) == where && scalar(w.inputs[1]) == 0.f
          && rd_.single(w.outputs[0]) >= 0) {
        p_in = w.outputs[0];
        pv = rd_.single(p_in);
      }
    }
    if (pv < 0 || g_.nodes[pv].op != "MatMul" || g_.nodes[pv].inputs[0] != p_in)
      return no("its probabilities are not read by MatMul(p, v) alone (or through "
                "Where(IsNaN(p), 0, p))");
    l.out = g_.nodes[pv].outputs[0];
    if (rd_.is_output[l.out])
      return no("the attention output '" + g_.values[l.out].name + "' is a graph output");

    // The caches.
    auto k = cache(k_all);
    if (auto* r = std::get_if<refusal>(&k))
      return no("keys: " + *r);
    auto v = cache(g_.nodes[pv].inputs[1]);
    if (auto* r = std::get_if<refusal>(&v))
      return no("values: " + *r);
    const auto& kc = std::get<cache_read>(k);
    const auto& vc = std::get<cache_read>(v);
    l.concat_k = kc.concat;
    l.concat_v = vc.concat;
    l.past_k = kc.past;
    l.past_v = vc.past;
    l.present_k = kc.present;
    l.present_v = vc.present;
    l.k_new = kc.fresh;
    l.v_new = vc.fresh;
    if (kc.concat == vc.concat)
      return no("keys and values read the same cache");

    // Shapes at the probe: q [B, N, S, hd], new k and v [B, kv, S, hd].
    const int64_t B = p_.batch, S = p_.sequence, T = p_.total();
    const dims& qs = shape(q);
    const dims& ks = shape(l.present_k);
    if (qs.size() != 4 || ks.size() != 4)
      return no("q " + shape_string(qs) + " or the key cache " + shape_string(ks)
                + " is not 4-D");
    l.heads = qs[1];
    l.kv_heads = ks[1];
    l.head_dim = qs[3];
    const int64_t N = l.heads, kv = l.kv_heads, hd = l.head_dim;
    if (qs != dims{B, N, S, hd} || kv <= 0 || N % kv != 0 || ks != dims{B, kv, T, hd}
        || shape(l.present_v) != ks || shape(l.k_new) != dims{B, kv, S, hd}
        || shape(l.v_new) != dims{B, kv, S, hd} || shape(l.past_k) != dims{B, kv, T - S, hd}
        || shape(l.past_v) != dims{B, kv, T - S, hd} || shape(l.out) != dims{B, N, S, hd}
        || shape(k_all) != dims{B, N, T, hd} || shape(g_.nodes[pv].inputs[1]) != dims{B, N, T, hd}
        || shape(x) != dims{B, N, S, T})
      return no("the shapes at batch " + std::to_string(B) + ", sequence " + std::to_string(S)
                + ", past " + std::to_string(T - S) + " are not those of attention with q "
                + shape_string(qs) + " over caches " + shape_string(ks));
    for (int val : {q, l.k_new, l.v_new, l.present_k, l.present_v, x, l.out})
      if (s_.values[val].dtype != datatype::fp32)
        return no("'" + g_.values[val].name + "' is not FLOAT");
    return l;
  }

  /// The largest magnitude of an integer constant among what `v` is built
  /// from (a window size would be one).
  int64_t largest_integer_under(int v) const {
    int64_t largest = 0;
    std::vector<int> todo{v};
    std::vector<char> seen(g_.values.size(), 0);
    while (!todo.empty()) {
      int x = todo.back();
      todo.pop_back();
      if (x < 0 || seen[x])
        continue;
      seen[x] = 1;
      const int p = prod_[x];
      const bool given = g_.values[x].constant || (p >= 0 && g_.nodes[p].op == "Constant");
      const auto* t = s_.values[x].constant.get();
      if (given && t && t->elements() <= 16) {
        for (int64_t i = 0; i < t->elements(); ++i) {
          int64_t n = t->dtype == datatype::int64   ? t->as<int64_t>()[i]
                      : t->dtype == datatype::int32 ? t->as<int32_t>()[i]
                                                    : 0;
          largest = std::max(largest, n < 0 ? -n : n);
        }
      }
      if (p >= 0)
        for (int i : g_.nodes[p].inputs)
          todo.push_back(i);
    }
    return largest;
  }

private:
  /// Where a layer reads a cache: present = Concat(past, fresh, axis 2), a
  /// graph output, maybe repeated to the query heads.
  struct cache_read {
    int concat = -1, past = -1, fresh = -1, present = -1;
  };

  std::variant<cache_read, refusal> cache(int v) const {
    int present = unrepeat(v);
    const int cat = producer(present, "Concat");
    if (cat < 0)
      return "'" + g_.values[v].name + "' is not Concat(past, new, axis 2) (or its heads "
             "repeated by Unsqueeze, Expand, Reshape)";
    const node& c = g_.nodes[cat];
    int64_t axis = c.get_i("axis", 0);
    if (c.inputs.size() != 2 || (axis != 2 && axis != -2))
      return "Concat '" + c.name + "' is not of the past and the new positions on axis 2";
    if (!rd_.is_output[present])
      return "the cache '" + g_.values[present].name + "' is not a graph output (present)";
    int past = c.inputs[0];
    while (prod_[past] >= 0
           && (g_.nodes[prod_[past]].op == "Identity"
               || (g_.nodes[prod_[past]].op == "Concat" && g_.nodes[prod_[past]].inputs.size() == 1)))
      past = g_.nodes[prod_[past]].inputs[0];
    if (std::find(g_.inputs.begin(), g_.inputs.end(), past) == g_.inputs.end())
      return "the past of Concat '" + c.name + "' is not a graph input";
    return cache_read{cat, past, c.inputs[1], present};
  }

  /// repeat_kv's source: Reshape(Expand(Unsqueeze(x, 2), [B, kv, r, T, hd]),
  /// [B, kv * r, T, hd]) gives x; anything else is itself. The shapes alone
  /// fix what these do (a reshape is row-major, Unsqueeze adds a 1).
  int unrepeat(int v) const {
    const int r = producer(v, "Reshape");
    const int e = r >= 0 ? producer(g_.nodes[r].inputs[0], "Expand") : -1;
    const int u = e >= 0 ? producer(g_.nodes[e].inputs[0], "Unsqueeze") : -1;
    if (u < 0)
      return v;
    const int x = g_.nodes[u].inputs[0];
    const dims& xs = shape(x);
    const dims& es = shape(g_.nodes[e].outputs[0]);
    if (xs.size() != 4 || shape(g_.nodes[u].outputs[0]) != dims{xs[0], xs[1], 1, xs[2], xs[3]}
        || es.size() != 5 || es != dims{xs[0], xs[1], es[2], xs[2], xs[3]}
        || shape(v) != dims{xs[0], xs[1] * es[2], xs[2], xs[3]})
      return v;
    return x;
  }

  const dims& shape(int v) const { return s_.values[v].shape; }
  bool folded(int v) const { return v >= 0 && s_.values[v].constant != nullptr; }

  std::optional<float> scalar(int v) const {
    const auto* t = v >= 0 ? s_.values[v].constant.get() : nullptr;
    if (!t || t->elements() != 1 || t->dtype != datatype::fp32)
      return std::nullopt;
    return t->as<float>()[0];
  }

  int producer(int v, const char* op) const {
    return v >= 0 && prod_[v] >= 0 && g_.nodes[prod_[v]].op == op ? prod_[v] : -1;
  }

  /// Up from `v` through Mul or Div by constant scalars (torch's SDPA scales
  /// q and k by sqrt(scale) each): the source and the product of the factors.
  std::pair<int, float> through_scaling(int v) const {
    float factor = 1.f;
    for (;;) {
      const int p = prod_[v];
      if (p < 0 || rd_.single(v) < 0)
        return {v, factor};
      const node& n = g_.nodes[p];
      const bool mul = n.op == "Mul", div = n.op == "Div";
      if ((!mul && !div) || n.inputs.size() != 2)
        return {v, factor};
      auto c1 = scalar(n.inputs[1]), c0 = mul ? scalar(n.inputs[0]) : std::nullopt;
      if (c1 && !folded(n.inputs[0])) {
        factor *= mul ? *c1 : 1.f / *c1;
        v = n.inputs[0];
      } else if (c0 && !folded(n.inputs[1])) {
        factor *= *c0;
        v = n.inputs[1];
      } else {
        return {v, factor};
      }
    }
  }

  const graph& g_;
  const graph& s_;
  const probe& p_;
  std::vector<int> prod_;
  value_readers rd_;
};

/// Whether the bias folded at `p` is 0 exactly where key j <= past + i and
/// mask[b, j] is 1, and at most -1e30 elsewhere; else what differs.
std::optional<refusal> check_bias(const graph& folded, int bias, const probe& p, int64_t heads,
                                  const std::string& layer) {
  const auto& v = folded.values[bias];
  const std::string at = "at batch " + std::to_string(p.batch) + ", sequence "
                         + std::to_string(p.sequence) + ", past " + std::to_string(p.past);
  if (!v.constant || v.constant->dtype != datatype::fp32)
    return "Softmax '" + layer + "': its mask '" + v.name + "' does not fold to FLOAT " + at;
  const dims full{p.batch, heads, p.sequence, p.total()};
  const dims& s = v.constant->shape;
  if (s.size() > 4)
    return "Softmax '" + layer + "': its mask " + shape_string(s) + " has more than 4 axes";
  // Strides of the mask over `full`, 0 where it broadcasts.
  dims stride(4, 0);
  int64_t step = 1;
  for (size_t k = 0; k < s.size(); ++k) {
    size_t axis = 3 - k, own = s.size() - 1 - k;
    if (s[own] != 1 && s[own] != full[axis])
      return "Softmax '" + layer + "': its mask " + shape_string(s) + " does not broadcast to "
             + shape_string(full) + " " + at;
    stride[axis] = s[own] == 1 ? 0 : step;
    step *= s[own];
  }
  const float* m = v.constant->as<float>();
  for (int64_t b = 0; b < full[0]; ++b)
    for (int64_t h = 0; h < full[1]; ++h)
      for (int64_t i = 0; i < full[2]; ++i)
        for (int64_t j = 0; j < full[3]; ++j) {
          float x = m[b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3]];
          bool open = j <= p.past + i && p.mask[static_cast<size_t>(b * p.total() + j)] != 0;
          if (open ? x != 0.f : !(x <= -1e30f))
            return "Softmax '" + layer + "': its mask is not causal plus attention_mask's "
                   "padding (" + at + ", row " + std::to_string(b) + ", head "
                   + std::to_string(h) + ", query " + std::to_string(i) + ", key "
                   + std::to_string(j) + ": " + std::to_string(x) + " where "
                   + (open ? "0" : "-inf") + " was expected)";
        }
  return std::nullopt;
}

/// Nodes reordered so that each follows the producers of its inputs, else
/// in their order.
void topological_order(graph& g) {
  const auto prod = g.producers();
  std::vector<char> state(g.nodes.size(), 0); // 0 new, 1 waiting for its inputs, 2 placed
  std::vector<node> out;
  out.reserve(g.nodes.size());
  for (size_t root = 0; root < g.nodes.size(); ++root) {
    if (state[root] != 0)
      continue;
    state[root] = 1;
    std::vector<std::pair<int, size_t>> stack{{static_cast<int>(root), 0}};
    while (!stack.empty()) {
      const int n = stack.back().first;
      size_t& next = stack.back().second;
      if (next < g.nodes[n].inputs.size()) {
        const int v = g.nodes[n].inputs[next++];
        const int p = v >= 0 ? prod[v] : -1;
        if (p >= 0 && state[p] == 0) {
          state[p] = 1;
          stack.push_back({p, 0});
        }
        continue;
      }
      state[n] = 2;
      out.push_back(std::move(g.nodes[n]));
      stack.pop_back();
    }
  }
  g.nodes = std::move(out);
}

/// A new INT64 constant.
int int64_constant(graph& g, const std::string& name, dims shape, const dims& data) {
  auto t = make_tensor(datatype::int64, std::move(shape));
  std::copy(data.begin(), data.end(), t->as_mut<int64_t>());
  return g.add_constant(name, t);
}

/// A new value written by a new node of one output.
int add_op(graph& g, const std::string& op, const std::string& name, std::vector<int> inputs) {
  int out = g.add_value(name);
  g.add_node(op, name, std::move(inputs), {out});
  return out;
}

void rewrite(graph& g, int mask, const std::vector<layer>& layers) {
  const std::string base = "decoder_attention/";
  // seqlens_k and total_sequence_length, as onnxruntime-genai's builder computes them.
  int axes = int64_constant(g, base + "axis_1", {1}, {1});
  auto one_t = make_tensor(g.values[mask].dtype, {});
  if (one_t->dtype == datatype::int64)
    one_t->as_mut<int64_t>()[0] = 1;
  else
    one_t->as_mut<int32_t>()[0] = 1;
  int one = g.add_constant(base + "one", one_t);
  int sum = add_op(g, "ReduceSum", base + "mask_sum", {mask, axes});
  g.nodes.back().set_i("keepdims", 0);
  int last = add_op(g, "Sub", base + "mask_sum_minus_1", {sum, one});
  int seqlens = add_op(g, "Cast", base + "seqlens_k", {last});
  g.nodes.back().set_i("to", 6); // INT32
  int mask_shape = add_op(g, "Shape", base + "mask_shape", {mask});
  int index = int64_constant(g, base + "index_1", {}, {1});
  int width = add_op(g, "Gather", base + "mask_width", {mask_shape, index});
  g.nodes.back().set_i("axis", 0);
  int total = add_op(g, "Cast", base + "total_sequence_length", {width});
  g.nodes.back().set_i("to", 6);
  int flat = int64_constant(g, base + "flat_heads", {3}, {0, 0, -1});

  for (const auto& l : layers) {
    const std::string at = l.name + "/gqa/";
    auto to_3d = [&](int x, const std::string& what) {
      int t = add_op(g, "Transpose", at + what + "_bshd", {x});
      g.nodes.back().set_ints("perm", {0, 2, 1, 3});
      return add_op(g, "Reshape", at + what, {t, flat});
    };
    int q = to_3d(l.q, "query"), k = to_3d(l.k_new, "key"), v = to_3d(l.v_new, "value");
    // The Concats' outputs (the graph's present tensors) come from the GQA now.
    for (int c : {l.concat_k, l.concat_v}) {
      g.nodes[c].op = "Dead";
      g.nodes[c].inputs.clear();
      g.nodes[c].outputs.clear();
    }
    int y = g.add_value(at + "y");
    node& gqa = g.add_node("com.microsoft.GroupQueryAttention", at + "GroupQueryAttention",
                           {q, k, v, l.past_k, l.past_v, seqlens, total},
                           {y, l.present_k, l.present_v});
    gqa.set_i("num_heads", l.heads);
    gqa.set_i("kv_num_heads", l.kv_heads);
    gqa.set_f("scale", l.scale);
    gqa.set_i("do_rotary", 0);
    int heads = int64_constant(g, at + "heads_shape", {4}, {0, 0, l.heads, l.head_dim});
    int r = add_op(g, "Reshape", at + "y_heads", {y, heads});
    int o = add_op(g, "Transpose", at + "output", {r});
    g.nodes.back().set_ints("perm", {0, 2, 1, 3});
    for (auto& n : g.nodes)
      for (auto& i : n.inputs)
        if (i == l.out)
          i = o;
  }
  remove_dead_nodes(g);
  topological_order(g);
}

} // namespace

decoder_attention_result rewrite_decoder_attention(graph& g) {
  decoder_attention_result out;
  auto refuse = [&](std::string why) {
    out.layers = 0;
    out.refused = std::move(why);
    return out;
  };
  int mask = -1;
  for (int i : g.inputs)
    if (g.values[i].name == "attention_mask")
      mask = i;
  if (mask < 0)
    return refuse("the graph has no input 'attention_mask'");
  const auto& mv = g.values[mask];
  if (mv.shape.size() != 2 || (mv.dtype != datatype::int64 && mv.dtype != datatype::int32))
    return refuse("its attention_mask " + shape_string(mv.shape) + " is not INT64 or INT32 "
                  "[batch, total]");
  std::vector<int> softmaxes;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (g.nodes[n].op == "Softmax")
      softmaxes.push_back(static_cast<int>(n));
  if (softmaxes.empty())
    return refuse("the graph has no Softmax (no attention computed as a chain of operators)");

  // Match at one probe, then check every layer's bias at more.
  const probe first = mixed_probe(3, 5, 8);
  auto folded = fold_at(g, mask, first);
  if (auto* r = std::get_if<refusal>(&folded))
    return refuse(*r);
  const graph& shaped = std::get<graph>(folded);
  matcher m(g, shaped, first);
  std::vector<layer> layers;
  int64_t largest = 0;
  for (int s : softmaxes) {
    auto l = m.match(s);
    if (auto* r = std::get_if<refusal>(&l))
      return refuse(*r);
    layers.push_back(std::get<layer>(l));
    largest = std::max(largest, m.largest_integer_under(layers.back().bias));
  }
  // Every cache in the graph belongs to a layer.
  size_t caches = 0;
  for (int i : g.inputs)
    if (g.values[i].shape.size() == 4)
      ++caches;
  if (caches != 2 * layers.size())
    return refuse(std::to_string(layers.size()) + " attention layers read "
                  + std::to_string(2 * layers.size()) + " caches, but the graph has "
                  + std::to_string(caches) + " 4-D inputs");
  // A context beyond any window the mask could hold as a constant.
  const int64_t long_total = std::max<int64_t>(64, 2 * largest + 2);
  if (long_total > (int64_t{1} << 16))
    return refuse("the mask reads an integer constant of " + std::to_string(largest)
                  + " (a window?), too large to check");
  const std::vector<probe> probes{first, mixed_probe(2, 1, long_total - 1),
                                  mixed_probe(3, 3, long_total - 3)};
  for (size_t k = 0; k < probes.size(); ++k) {
    const probe& p = probes[k];
    std::variant<graph, refusal> at;
    if (k > 0)
      at = fold_at(g, mask, p);
    if (auto* r = std::get_if<refusal>(&at))
      return refuse(*r);
    const graph& f = k == 0 ? shaped : std::get<graph>(at);
    for (const auto& l : layers)
      if (auto bad = check_bias(f, l.bias, p, l.heads, l.name))
        return refuse(*bad);
  }

  graph rewritten = g;
  rewrite(rewritten, mask, layers);
  // The rewritten graph must specialize to the same output shapes.
  auto shapes = probe_shapes(rewritten, mask, first);
  if (auto* r = std::get_if<refusal>(&shapes))
    return refuse(*r);
  auto& list = std::get<std::vector<dims>>(shapes); // every input's but the mask's
  auto at_mask = std::find(rewritten.inputs.begin(), rewritten.inputs.end(), mask);
  list.insert(list.begin() + (at_mask - rewritten.inputs.begin()), {first.batch, first.total()});
  auto check = specialize(rewritten, list);
  if (!check)
    return refuse("the rewritten graph does not specialize: " + check.error().message);
  for (size_t i = 0; i < g.outputs.size(); ++i)
    if (check->values[check->outputs[i]].shape != shaped.values[shaped.outputs[i]].shape)
      return refuse("the rewritten graph's output '" + g.values[g.outputs[i]].name + "' is "
                    + shape_string(check->values[check->outputs[i]].shape) + ", not "
                    + shape_string(shaped.values[shaped.outputs[i]].shape));
  g = std::move(rewritten);
  out.layers = static_cast<int>(layers.size());
  return out;
}

bool last_position_logits(graph& g) {
  int logits = -1;
  for (int v : g.outputs)
    if (g.values[v].name == "logits")
      logits = v;
  if (logits < 0)
    return false;
  auto producers = g.producers();
  int at = producers[logits];
  if (at < 0)
    return false;
  const node& head = g.nodes[at];
  const bool matmul = head.op == "MatMul" || head.op == "com.microsoft.MatMulNBits";
  // Before specialization the hidden state's shape is unknown; the output's
  // declared rank is its rank (a 2-D weight, or MatMulNBits' packed one).
  if (!matmul || head.inputs.size() < 2 || head.inputs[0] < 0 || head.inputs[1] < 0
      || !g.values[head.inputs[1]].constant || g.values[logits].shape.size() != 3
      || (head.op == "MatMul" && g.values[head.inputs[1]].constant->shape.size() != 2))
    return false;
  auto ints = [&](const std::string& name, int64_t value) {
    auto t = make_tensor(datatype::int64, {1});
    t->as_mut<int64_t>()[0] = value;
    return g.add_constant(head.name + "/last_position/" + name, t);
  };
  int starts = ints("starts", -1);
  int ends = ints("ends", std::numeric_limits<int64_t>::max());
  int axes = ints("axes", 1);
  const int hidden = g.nodes[at].inputs[0];
  auto shape = g.values[hidden].shape;
  if (shape.size() == 3)
    shape[1] = 1;
  int last = g.add_value(g.values[hidden].name + "/last_position", g.values[hidden].dtype, shape,
                         g.values[hidden].shape_known && shape.size() == 3);
  // add_node may move the nodes: `at` names the head again after it.
  g.add_node("Slice", g.nodes[at].name + "/last_position", {hidden, starts, ends, axes}, {last});
  node slice = std::move(g.nodes.back());
  g.nodes.pop_back();
  g.nodes[at].inputs[0] = last;
  g.nodes.insert(g.nodes.begin() + at, std::move(slice));
  auto& out = g.values[logits].shape;
  if (out.size() == 3)
    out[1] = 1;
  return true;
}

} // namespace caf_serving::onnx
