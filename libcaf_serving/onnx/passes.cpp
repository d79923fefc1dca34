#include "onnx/passes.hpp"

#include "onnx/op_registry.hpp"
#include "onnx/ops_contrib.hpp"
#include "onnx/ops_common.hpp"
#include "onnx/ops_nn.hpp"
#include "onnx/quant_passes.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>

namespace caf_serving::onnx {

namespace {

serving_error node_error(const graph& g, const node& n, const std::string& what) {
  return {status_code::bad_request, "node '" + n.name + "' (operator '" + n.op + "', opset "
                                      + std::to_string(g.opset) + "): " + what};
}


const tensor_data* cst(const graph& g, int v) {
  return v >= 0 ? g.values[v].constant.get() : nullptr;
}

/// The value of a constant scalar (or one-element tensor) of fp32.
std::optional<float> scalar(const graph& g, int v) {
  auto* t = cst(g, v);
  if (!t || t->elements() != 1 || t->dtype != datatype::fp32)
    return std::nullopt;
  return t->as<float>()[0];
}

bool near(std::optional<float> v, float want, float tol = 1e-3f) {
  return v && std::fabs(*v - want) <= tol * std::max(1.0f, std::fabs(want));
}

/// For a commutative binary node, the input that is not `known` (or -1).
int other_input(const node& n, int known) {
  if (n.inputs.size() != 2)
    return -1;
  if (n.inputs[0] == known) return n.inputs[1];
  if (n.inputs[1] == known) return n.inputs[0];
  return -1;
}

void kill(node& n) {
  n.op = "Dead";
  n.inputs.clear();
  n.outputs.clear();
}

/// Makes every reader of `from` read `to` instead (and graph outputs too).
void replace_uses(graph& g, int from, int to) {
  for (auto& n : g.nodes)
    for (auto& i : n.inputs)
      if (i == from)
        i = to;
  for (auto& o : g.outputs)
    if (o == from) {
      // A graph output keeps its value (and name): move the producer over instead.
      o = to;
      g.values[to].name = g.values[from].name;
    }
}

void drop_dead(graph& g) {
  g.nodes.erase(std::remove_if(g.nodes.begin(), g.nodes.end(),
                               [](const node& n) { return n.op == "Dead"; }),
                g.nodes.end());
}

} // namespace

result<graph> specialize(const graph& src, const std::vector<std::vector<int64_t>>& shapes) {
  graph g = src;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    auto& v = g.values[g.inputs[i]];
    v.shape = shapes.at(i);
    v.shape_known = true;
  }
  for (auto& v : g.values)
    if (!v.constant && std::find(g.inputs.begin(), g.inputs.end(), &v - g.values.data())
                         == g.inputs.end()) {
      v.shape.clear();
      v.shape_known = false;
    }
  for (auto& n : g.nodes) {
    for (int i : n.inputs)
      if (i >= 0 && !g.values[i].shape_known)
        return node_error(g, n, "input '" + g.values[i].name + "' has no known shape");
    explicit_pads(g, n);
    auto inf = infer_shapes(g, n);
    if (auto* e = std::get_if<std::string>(&inf))
      return node_error(g, n, *e);
    auto& outs = std::get<std::vector<inferred>>(inf);
    if (outs.size() < n.outputs.size())
      n.outputs.resize(outs.size());
    bool all_const = true;
    for (int i : n.inputs)
      if (i >= 0 && !g.values[i].constant)
        all_const = false;
    bool fold = (all_const && foldable(n.op)) || n.op == "Shape" || n.op == "Constant";
    std::vector<tensor_ref> in_refs, out_refs;
    std::vector<std::shared_ptr<tensor_data>> results;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] < 0) {
        if (fold) // an omitted output keeps its place, without memory
          out_refs.push_back(tensor_ref{});
        continue;
      }
      auto& v = g.values[n.outputs[k]];
      v.dtype = outs[k].dtype;
      v.shape = outs[k].shape;
      v.shape_known = true;
      if (fold) {
        results.push_back(make_tensor(v.dtype, v.shape));
        out_refs.push_back({v.dtype, v.shape, results.back()->bytes.data()});
      }
    }
    if (!fold)
      continue;
    for (int i : n.inputs) {
      if (i < 0) {
        in_refs.push_back({});
        continue;
      }
      const auto& v = g.values[i];
      in_refs.push_back({v.dtype, v.shape,
                         v.constant ? const_cast<uint8_t*>(v.constant->bytes.data()) : nullptr});
    }
    run_reference(n, in_refs, out_refs);
    size_t r = 0;
    for (int o : n.outputs)
      if (o >= 0)
        g.values[o].constant = results[r++];
    kill(n);
  }
  // A folded graph output still needs a node that writes it.
  for (auto& o : g.outputs)
    if (g.values[o].constant) {
      int out = g.add_value(g.values[o].name, g.values[o].dtype, g.values[o].shape, true);
      int c = g.add_constant(g.values[o].name + "/folded", g.values[o].constant);
      g.add_node("Identity", g.values[o].name + "/folded", {c}, {out});
      o = out;
    }
  drop_dead(g);
  return g;
}

void fold_batchnorm(graph& g) {
  value_readers cons(g);
  for (auto& bn : g.nodes) {
    if (bn.op != "BatchNormalization" || bn.inputs.size() < 5)
      continue;
    int conv_out = bn.inputs[0];
    auto producers = g.producers();
    int p = producers[conv_out];
    if (p < 0 || g.nodes[p].op != "Conv" || cons.single(conv_out) < 0)
      continue;
    auto& conv = g.nodes[p];
    auto* w = cst(g, conv.inputs[1]);
    auto* b = conv.inputs.size() > 2 ? cst(g, conv.inputs[2]) : nullptr;
    auto *s = cst(g, bn.inputs[1]), *sh = cst(g, bn.inputs[2]), *mu = cst(g, bn.inputs[3]),
         *var = cst(g, bn.inputs[4]);
    if (!w || !s || !sh || !mu || !var || (conv.inputs.size() > 2 && conv.inputs[2] >= 0 && !b))
      continue;
    int64_t k = w->shape[0], per = w->elements() / k;
    auto nw = make_tensor(datatype::fp32, w->shape);
    auto nb = make_tensor(datatype::fp32, {k});
    float eps = bn.get_f("epsilon", 1e-5f);
    for (int64_t o = 0; o < k; ++o) {
      float scale = s->as<float>()[o] / std::sqrt(var->as<float>()[o] + eps);
      for (int64_t i = 0; i < per; ++i)
        nw->as_mut<float>()[o * per + i] = w->as<float>()[o * per + i] * scale;
      float bias = b ? b->as<float>()[o] : 0.f;
      nb->as_mut<float>()[o] = (bias - mu->as<float>()[o]) * scale + sh->as<float>()[o];
    }
    conv.inputs.resize(3);
    conv.inputs[1] = g.add_constant(conv.name + "/W_bn", nw);
    conv.inputs[2] = g.add_constant(conv.name + "/B_bn", nb);
    int bn_out = bn.outputs[0];
    kill(bn);
    // The conv now writes what the BatchNormalization wrote.
    conv.outputs[0] = bn_out;
  }
  drop_dead(g);
}

void fuse_layernorm(graph& g) {
  for (auto& n : g.nodes) {
    // FusedLayerNorm writes Y only: a node whose Mean or InvStdDev is read stays.
    bool stats = std::any_of(n.outputs.begin() + std::min<size_t>(1, n.outputs.size()),
                             n.outputs.end(), [](int v) { return v >= 0; });
    if (n.op == "LayerNormalization" && !stats
        && (n.get_i("axis", -1) == -1
            || n.get_i("axis", -1)
                 == static_cast<int64_t>(g.values[n.inputs[0]].shape.size()) - 1))
      n.op = "FusedLayerNorm";
  }
  value_readers cons(g);
  auto prod = g.producers();
  auto is = [&](int node, const char* op) { return node >= 0 && g.nodes[node].op == op; };
  auto last_axis = [&](const node& n) {
    // The axes attribute before ReduceMean-18, a constant input from 18 on.
    auto axes = n.inputs.size() > 1 && n.inputs[1] >= 0 ? ops_internal::const_ints(g, n.inputs[1])
                                                         : n.get_ints("axes");
    int64_t r = static_cast<int64_t>(g.values[n.inputs[0]].shape.size());
    return axes.size() == 1 && (axes[0] == -1 || axes[0] == r - 1)
           && n.get_i("keepdims", 1) == 1;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto& mean = g.nodes[i];
    if (mean.op != "ReduceMean" || !last_axis(mean))
      continue;
    int x = mean.inputs[0];
    // Sub(x, mean) -> used by Pow and by Div.
    int sub = cons.single(mean.outputs[0]);
    if (!is(sub, "Sub") || g.nodes[sub].inputs[0] != x || g.nodes[sub].inputs[1] != mean.outputs[0])
      continue;
    int d = g.nodes[sub].outputs[0];
    if (cons.readers[d].size() != 2 || cons.is_output[d])
      continue;
    int pw = -1, dv = -1;
    for (int r : cons.readers[d]) {
      if (is(r, "Pow") && near(scalar(g, g.nodes[r].inputs[1]), 2.0f)) pw = r;
      if (is(r, "Div") && g.nodes[r].inputs[0] == d) dv = r;
    }
    if (pw < 0 || dv < 0)
      continue;
    int m2 = cons.single(g.nodes[pw].outputs[0]);
    if (!is(m2, "ReduceMean") || !last_axis(g.nodes[m2]))
      continue;
    int ad = cons.single(g.nodes[m2].outputs[0]);
    if (!is(ad, "Add"))
      continue;
    auto eps = scalar(g, other_input(g.nodes[ad], g.nodes[m2].outputs[0]));
    if (!eps)
      continue;
    int sq = cons.single(g.nodes[ad].outputs[0]);
    if (!is(sq, "Sqrt") || g.nodes[dv].inputs[1] != g.nodes[sq].outputs[0])
      continue;
    int mul = cons.single(g.nodes[dv].outputs[0]);
    if (!is(mul, "Mul"))
      continue;
    int gamma = other_input(g.nodes[mul], g.nodes[dv].outputs[0]);
    if (!cst(g, gamma))
      continue;
    int add = cons.single(g.nodes[mul].outputs[0]);
    int beta = is(add, "Add") ? other_input(g.nodes[add], g.nodes[mul].outputs[0]) : -1;
    int64_t width = g.values[x].shape.back();
    auto fits = [&](int v) { return cst(g, v) && cst(g, v)->elements() == width; };
    if (!fits(gamma))
      continue;
    int out = g.nodes[mul].outputs[0];
    std::vector<int> ins{x, gamma};
    if (beta >= 0 && fits(beta)) {
      ins.push_back(beta);
      out = g.nodes[add].outputs[0];
      kill(g.nodes[add]);
    }
    for (int k : {sub, pw, m2, ad, sq, dv})
      kill(g.nodes[k]);
    // The fused node takes the place of the last node of the pattern.
    node fused{"FusedLayerNorm", mean.name + "/fused_layernorm", ins, {out}, {}};
    fused.set_f("epsilon", *eps);
    g.nodes[mul] = fused;
    kill(mean);
    (void)prod;
  }
  drop_dead(g);
}

namespace {

/// A polynomial in the input x of a GELU pattern and the output t of its
/// Tanh: terms[i][j] is the coefficient of x^i t^j. GELU's tanh form needs x^3
/// and x t; a product past these degrees ends the match.
struct gelu_polynomial {
  static constexpr int max_x = 3;
  static constexpr int max_t = 1;
  std::array<std::array<double, max_t + 1>, max_x + 1> terms{};

  static gelu_polynomial monomial(double c, int i, int j) {
    gelu_polynomial p;
    p.terms[i][j] = c;
    return p;
  }
};

gelu_polynomial sum(const gelu_polynomial& a, const gelu_polynomial& b, double sign) {
  gelu_polynomial p = a;
  for (int i = 0; i <= gelu_polynomial::max_x; ++i)
    for (int j = 0; j <= gelu_polynomial::max_t; ++j)
      p.terms[i][j] += sign * b.terms[i][j];
  return p;
}

std::optional<gelu_polynomial> product(const gelu_polynomial& a, const gelu_polynomial& b) {
  gelu_polynomial p;
  for (int i = 0; i <= gelu_polynomial::max_x; ++i)
    for (int j = 0; j <= gelu_polynomial::max_t; ++j)
      for (int k = 0; k <= gelu_polynomial::max_x; ++k)
        for (int l = 0; l <= gelu_polynomial::max_t; ++l) {
          double c = a.terms[i][j] * b.terms[k][l];
          if (c == 0)
            continue;
          if (i + k > gelu_polynomial::max_x || j + l > gelu_polynomial::max_t)
            return std::nullopt;
          p.terms[i + k][j + l] += c;
        }
  return p;
}

/// Reads the arithmetic below a value (Add, Sub, Mul, Div by a constant, Pow
/// by 1, 2 or 3) as a polynomial in x and, where `t` is given, the Tanh output
/// t. Every value it reads through, except the root, is read by that one node
/// and is no graph output, so the nodes it records (`nodes`) can all go once
/// the root is computed another way. Any other value is a leaf: a one-element
/// fp32 constant is a coefficient, `t` is t, and anything else is x: every
/// such leaf must be the same value (the first one seen, or the `x` given).
/// So every ordering of one formula reads as the same polynomial: x*x*x or
/// Pow(x, 3), the 0.5 on either side, constants on either side.
class polynomial_reader {
public:
  polynomial_reader(const graph& g, const value_readers& cons, const std::vector<int>& prod,
                    int x, int t)
    : g_(g), cons_(cons), prod_(prod), x_(x), t_(t) {}

  std::optional<gelu_polynomial> read(int root) { return value(root, true); }
  int x() const { return x_; }
  const std::vector<int>& nodes() const { return nodes_; }

private:
  /// A pattern has about ten nodes; a read through more is no GELU.
  static constexpr size_t max_nodes = 16;

  std::optional<gelu_polynomial> value(int v, bool root) {
    if (v < 0)
      return std::nullopt;
    if (v == t_)
      return gelu_polynomial::monomial(1, 0, 1);
    if (auto c = scalar(g_, v))
      return gelu_polynomial::monomial(*c, 0, 0);
    int p = prod_[v];
    auto kind = p >= 0 ? arithmetic_of(g_.nodes[p]) : std::nullopt;
    bool through = kind && g_.values[v].dtype == datatype::fp32 && (root || cons_.single(v) >= 0);
    if (!through) {
      if (cst(g_, v) || (x_ >= 0 && x_ != v))
        return std::nullopt;
      x_ = v;
      return gelu_polynomial::monomial(1, 1, 0);
    }
    if (nodes_.size() == max_nodes)
      return std::nullopt;
    nodes_.push_back(p);
    const node& n = g_.nodes[p];
    auto a = value(n.inputs[0], false);
    if (!a)
      return std::nullopt;
    switch (*kind) {
      case arithmetic::pow: {
        auto e = scalar(g_, n.inputs[1]);
        if (!e || !(*e == 1.0f || *e == 2.0f || *e == 3.0f))
          return std::nullopt;
        auto r = a;
        for (int k = 1; r && k < static_cast<int>(*e); ++k)
          r = product(*r, *a);
        return r;
      }
      case arithmetic::div: {
        auto d = scalar(g_, n.inputs[1]);
        if (!d || *d == 0.0f)
          return std::nullopt;
        return product(*a, gelu_polynomial::monomial(1.0 / *d, 0, 0));
      }
      default:
        break;
    }
    auto b = value(n.inputs[1], false);
    if (!b)
      return std::nullopt;
    if (*kind == arithmetic::mul)
      return product(*a, *b);
    return sum(*a, *b, *kind == arithmetic::add ? 1.0 : -1.0);
  }

  enum class arithmetic { add, sub, mul, div, pow };

  /// The arithmetic a node does, for the binary nodes read through.
  static std::optional<arithmetic> arithmetic_of(const node& n) {
    static const std::map<std::string, arithmetic> kinds{{"Add", arithmetic::add},
                                                         {"Sub", arithmetic::sub},
                                                         {"Mul", arithmetic::mul},
                                                         {"Div", arithmetic::div},
                                                         {"Pow", arithmetic::pow}};
    auto k = kinds.find(n.op);
    if (k == kinds.end() || n.inputs.size() != 2 || n.outputs.size() != 1)
      return std::nullopt;
    return k->second;
  }

  const graph& g_;
  const value_readers& cons_;
  const std::vector<int>& prod_;
  int x_;
  int t_;
  std::vector<int> nodes_;
};

/// Whether `p`'s terms are `want`'s, each within 1e-3 of it relatively
/// (exporters write sqrt(2/pi) and 0.044715 to a few digits; 0.0447 passes,
/// 0.045 does not), and no other.
bool same_terms(const gelu_polynomial& p, const gelu_polynomial& want) {
  for (int i = 0; i <= gelu_polynomial::max_x; ++i)
    for (int j = 0; j <= gelu_polynomial::max_t; ++j) {
      double w = want.terms[i][j], got = p.terms[i][j];
      bool ok = w == 0 ? std::fabs(got) <= 1e-6
                       : std::fabs(got - w) <= 1e-3 * std::fabs(w);
      if (!ok)
        return false;
    }
  return true;
}

/// GELU's tanh form written out, as torch exports transformers' GPT-2 (its
/// NewGELUActivation) and the other orderings of the same formula:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) becomes FusedGeluTanh(x).
/// Anchored at each Tanh: its argument must read as the polynomial
/// sqrt(2/pi) x + sqrt(2/pi) 0.044715 x^3, and some node at most four
/// single-reader steps after it as 0.5 x + 0.5 x t of the same x.
void fuse_gelu_tanh_pattern(graph& g) {
  constexpr double k = 0.79788456080286536; // sqrt(2 / pi)
  gelu_polynomial argument = sum(gelu_polynomial::monomial(k, 1, 0),
                                 gelu_polynomial::monomial(k * 0.044715, 3, 0), 1.0);
  gelu_polynomial gelu = sum(gelu_polynomial::monomial(0.5, 1, 0),
                             gelu_polynomial::monomial(0.5, 1, 1), 1.0);
  value_readers cons(g);
  auto prod = g.producers();
  for (size_t ti = 0; ti < g.nodes.size(); ++ti) {
    if (g.nodes[ti].op != "Tanh" || g.nodes[ti].inputs.size() != 1)
      continue;
    int arg = g.nodes[ti].inputs[0], t = g.nodes[ti].outputs[0];
    if (cons.single(arg) != static_cast<int>(ti) || cons.single(t) < 0)
      continue;
    polynomial_reader inner(g, cons, prod, -1, -1);
    auto a = inner.read(arg);
    if (!a || !same_terms(*a, argument))
      continue;
    int x = inner.x();
    if (g.values[x].dtype != datatype::fp32)
      continue;
    int v = t;
    for (int step = 0; step < 4; ++step) {
      int r = cons.single(v);
      if (r < 0 || g.nodes[r].outputs.size() != 1)
        break;
      v = g.nodes[r].outputs[0];
      polynomial_reader outer(g, cons, prod, x, t);
      auto o = outer.read(v);
      if (!o || !same_terms(*o, gelu) || g.values[v].shape != g.values[x].shape)
        continue;
      std::string name = g.nodes[ti].name + "/fused_gelu";
      for (int dead : inner.nodes())
        kill(g.nodes[dead]);
      for (int dead : outer.nodes())
        kill(g.nodes[dead]);
      kill(g.nodes[ti]);
      // The fused node takes the place of the pattern's last node.
      g.nodes[r] = node{"FusedGeluTanh", name, {x}, {v}, {}};
      break;
    }
  }
}

} // namespace

void fuse_gelu(graph& g) {
  // ONNX's own Gelu (opset 20) is FusedGelu (the exact erf form) or
  // FusedGeluTanh (approximate "tanh"): the engine's vectorised kernels, and
  // an epilogue of the MatMul before it.
  for (auto& n : g.nodes) {
    if (n.op != "Gelu" || g.values[n.inputs[0]].dtype != datatype::fp32)
      continue;
    auto approximate = n.get_s("approximate", "none");
    if (approximate == "none")
      n = node{"FusedGelu", n.name, {n.inputs[0]}, {n.outputs[0]}, {}};
    else if (approximate == "tanh")
      n = node{"FusedGeluTanh", n.name, {n.inputs[0]}, {n.outputs[0]}, {}};
  }
  fuse_gelu_tanh_pattern(g);
  value_readers cons(g);
  auto prod = g.producers();
  for (auto& erf : g.nodes) {
    if (erf.op != "Erf")
      continue;
    int scaled = erf.inputs[0];
    int p = prod[scaled];
    if (p < 0 || cons.single(scaled) < 0)
      continue;
    auto& pre = g.nodes[p];
    int x = pre.inputs[0];
    bool ok = (pre.op == "Div" && near(scalar(g, pre.inputs[1]), std::sqrt(2.0f)))
              || (pre.op == "Mul" && near(scalar(g, pre.inputs[1]), std::sqrt(0.5f)));
    if (!ok)
      continue;
    int add = cons.single(erf.outputs[0]);
    if (add < 0 || g.nodes[add].op != "Add"
        || !near(scalar(g, other_input(g.nodes[add], erf.outputs[0])), 1.0f))
      continue;
    int m1 = cons.single(g.nodes[add].outputs[0]);
    if (m1 < 0 || g.nodes[m1].op != "Mul")
      continue;
    int other = other_input(g.nodes[m1], g.nodes[add].outputs[0]);
    int last = -1;
    if (other == x) {
      // x * (1 + erf) * 0.5
      int m2 = cons.single(g.nodes[m1].outputs[0]);
      if (m2 < 0 || g.nodes[m2].op != "Mul"
          || !near(scalar(g, other_input(g.nodes[m2], g.nodes[m1].outputs[0])), 0.5f))
        continue;
      last = m2;
      kill(g.nodes[m1]);
    } else if (other >= 0 && prod[other] >= 0 && g.nodes[prod[other]].op == "Mul"
               && cons.single(other) == m1) {
      // (x * 0.5) * (1 + erf)
      auto& half = g.nodes[prod[other]];
      if (other_input(half, x) < 0 || !near(scalar(g, other_input(half, x)), 0.5f))
        continue;
      last = m1;
      kill(half);
    } else {
      continue;
    }
    int out = g.nodes[last].outputs[0];
    kill(g.nodes[add]);
    kill(pre);
    g.nodes[last] = node{"FusedGelu", erf.name + "/fused_gelu", {x}, {out}, {}};
    kill(erf);
  }
  drop_dead(g);
}

namespace {

/// A node multiplying (or dividing) its other input by a constant fp32 scalar:
/// the factor, else nothing. `x` is the non-constant input.
std::optional<float> scalar_factor(const graph& g, const node& n, int& x) {
  if ((n.op != "Mul" && n.op != "Div") || n.inputs.size() != 2)
    return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    if (n.op == "Div" && k == 0)
      continue; // c / x is no scaling
    auto c = scalar(g, n.inputs[k]);
    if (c && std::isfinite(*c) && *c != 0.0f) {
      x = n.inputs[1 - k];
      return n.op == "Div" ? 1.0f / *c : *c;
    }
  }
  return std::nullopt;
}

/// Follows the layout nodes up from `v`, composing their permutations, and
/// returns the source value and the composed perm (identity when none):
///  - Transpose;
///  - Reshape to its own shape (TorchScript's SDPA writes one);
///  - the dynamo exporter's K^T of [B, H, S, D]: Reshape to [B*H, S, D],
///    Transpose (0, 2, 1), Reshape to [B, H, D, S] - a Transpose (0, 1, 3, 2);
///  - Mul or Div by a constant scalar (torch's SDPA scales Q and K by
///    sqrt(scale) each), which commutes with the layout: its factor
///    multiplies `scale`.
std::pair<int, std::vector<int64_t>> through_layout(const graph& g, const std::vector<int>& prod,
                                                     int v, std::vector<int>& chain,
                                                     float& scale) {
  std::vector<int64_t> perm(g.values[v].shape.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  auto compose = [&](const std::vector<int64_t>& p) {
    // out[i] = in[p[i]]; composing: total[i] = p[total[i]]
    std::vector<int64_t> next(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) next[i] = p[perm[i]];
    perm = next;
  };
  auto producer = [&](int x, const char* op) {
    return prod[x] >= 0 && g.nodes[prod[x]].op == op ? prod[x] : -1;
  };
  while (prod[v] >= 0) {
    const auto& t = g.nodes[prod[v]];
    int x = -1;
    if (t.op == "Transpose" && t.get_ints("perm").size() == perm.size()) {
      compose(t.get_ints("perm"));
      chain.push_back(prod[v]);
      v = t.inputs[0];
    } else if (t.op == "Reshape" && g.values[t.inputs[0]].shape == g.values[v].shape) {
      chain.push_back(prod[v]);
      v = t.inputs[0];
    } else if (auto c = scalar_factor(g, t, x); c && g.values[x].shape == g.values[v].shape) {
      scale *= *c;
      chain.push_back(prod[v]);
      v = x;
    } else if (t.op == "Reshape" && perm.size() == 4) {
      // [B, H, D, S] = Reshape(Transpose(Reshape([B, H, S, D] -> [B*H, S, D]), (0, 2, 1))).
      const auto& o = g.values[v].shape;
      int tr = producer(t.inputs[0], "Transpose");
      if (tr < 0 || g.nodes[tr].get_ints("perm") != std::vector<int64_t>{0, 2, 1})
        break;
      int rs = producer(g.nodes[tr].inputs[0], "Reshape");
      if (rs < 0)
        break;
      int src = g.nodes[rs].inputs[0];
      const auto& mid = g.values[g.nodes[rs].outputs[0]].shape;
      const auto& in = g.values[src].shape;
      if (in.size() != 4 || mid.size() != 3 || mid[0] != in[0] * in[1] || mid[1] != in[2]
          || mid[2] != in[3] || o != std::vector<int64_t>{in[0], in[1], in[3], in[2]})
        break;
      compose({0, 1, 3, 2});
      chain.push_back(prod[v]);
      chain.push_back(tr);
      chain.push_back(rs);
      v = src;
    } else {
      break;
    }
  }
  return {v, perm};
}

/// Whether `mask` (added to scores of shape `scores`) broadcasts to that shape
/// without growing it, as FusedAttention reads it ([B, H, S, S] at most).
bool mask_fits(const graph& g, int mask, const std::vector<int64_t>& scores) {
  const auto& m = g.values[mask];
  if (m.dtype != datatype::fp32 || m.shape.size() > scores.size())
    return false;
  for (size_t i = 0; i < m.shape.size(); ++i) {
    int64_t d = m.shape[i], s = scores[scores.size() - m.shape.size() + i];
    if (d != 1 && d != s)
      return false;
  }
  return true;
}

/// `v` = Reshape(src [B,S,H*D]) to [B,S,H,D]: returns src, or -1.
int unheads(const graph& g, const std::vector<int>& prod, int v, int64_t& heads,
            std::vector<int>& chain) {
  int p = prod[v];
  if (p < 0 || g.nodes[p].op != "Reshape")
    return -1;
  int src = g.nodes[p].inputs[0];
  const auto& s = g.values[src].shape;
  const auto& o = g.values[v].shape;
  if (s.size() != 3 || o.size() != 4 || o[0] != s[0] || o[1] != s[1] || o[2] * o[3] != s[2])
    return -1;
  heads = o[2];
  chain.push_back(p);
  return src;
}

} // namespace

namespace {

/// ONNX's own Attention (opset 23) in the form FusedAttention runs becomes it:
/// Q, K and V of one shape, 3-D [B, S, H*D] or 4-D [B, H, S, D] (as many KV
/// heads as query heads, self-attention), no BOOL mask, and Y the only output
/// read; is_causal without a mask becomes a constant mask of minus infinity
/// above the diagonal. 4-D inputs (torch's scaled_dot_product_attention as the
/// exporter writes it) go through Transpose and Reshape to [B, S, H*D] and back.
/// A row whose float mask is minus infinity throughout gives zeros, as the
/// Attention reference kernel does (FusedAttention's nan_to_zero).
void attention_to_fused(graph& g) {
  auto uses = g.use_counts();
  std::vector<node> nodes;
  nodes.reserve(g.nodes.size());
  for (const auto& n : g.nodes) {
    auto keep = [&] { nodes.push_back(n); };
    if (n.op != "Attention" || n.inputs.size() < 3 || n.get_f("softcap", 0.0f) != 0.0f) {
      keep();
      continue;
    }
    bool causal = n.get_i("is_causal", 0) != 0;
    bool extra_inputs = false;
    for (size_t i = 4; i < n.inputs.size(); ++i)
      extra_inputs = extra_inputs || n.inputs[i] >= 0;
    bool extra_outputs = false;
    for (size_t o = 1; o < n.outputs.size(); ++o)
      extra_outputs = extra_outputs || (n.outputs[o] >= 0 && uses[n.outputs[o]] > 0);
    auto q = g.values[n.inputs[0]].shape; // a copy: the rewrite adds values
    bool four_d = q.size() == 4;
    int64_t heads = four_d ? q[1] : n.get_i("q_num_heads", 0);
    if (extra_inputs || extra_outputs || (q.size() != 3 && !four_d) || heads < 1
        || (!four_d && (n.get_i("kv_num_heads", 0) != heads || q[2] % heads != 0))
        || g.values[n.inputs[1]].shape != q || g.values[n.inputs[2]].shape != q) {
      keep();
      continue;
    }
    int mask = n.inputs.size() > 3 ? n.inputs[3] : -1;
    if (mask >= 0 && (causal || g.values[mask].dtype != datatype::fp32
                      || g.values[mask].shape.size() > 4)) {
      keep();
      continue;
    }
    int64_t batch = q[0], len = four_d ? q[2] : q[1], head = four_d ? q[3] : q[2] / heads;
    if (causal) {
      auto tri = make_tensor(datatype::fp32, {len, len});
      for (int64_t i = 0; i < len; ++i)
        for (int64_t j = i + 1; j < len; ++j)
          tri->as_mut<float>()[i * len + j] = -INFINITY;
      mask = g.add_constant(n.name + "/causal_mask", tri);
    }
    auto shape_constant = [&](const std::string& name, std::vector<int64_t> dims) {
      auto t = make_tensor(datatype::int64, {static_cast<int64_t>(dims.size())});
      std::copy(dims.begin(), dims.end(), t->as_mut<int64_t>());
      return g.add_constant(n.name + name, t);
    };
    // [B, H, S, D] -> [B, S, H, D] -> [B, S, H*D]
    auto to_rows = [&](int v, const std::string& what) {
      int t = g.add_value(n.name + "/" + what + "_bshd", datatype::fp32, {batch, len, heads, head},
                          true);
      int r = g.add_value(n.name + "/" + what + "_rows", datatype::fp32,
                          {batch, len, heads * head}, true);
      nodes.push_back(node{"Transpose", n.name + "/" + what + "_transpose", {v}, {t}, {}});
      nodes.back().set_ints("perm", {0, 2, 1, 3});
      nodes.push_back(node{"Reshape", n.name + "/" + what + "_reshape",
                           {t, shape_constant("/" + what + "_shape", {batch, len, heads * head})},
                           {r}, {}});
      return r;
    };
    std::vector<int> ins{n.inputs[0], n.inputs[1], n.inputs[2]};
    if (four_d)
      ins = {to_rows(ins[0], "q"), to_rows(ins[1], "k"), to_rows(ins[2], "v")};
    if (mask >= 0)
      ins.push_back(mask);
    int y = n.outputs[0];
    int fused_out = four_d ? g.add_value(n.name + "/rows", datatype::fp32,
                                         {batch, len, heads * head}, true)
                           : y;
    nodes.push_back(node{"FusedAttention", n.name, ins, {fused_out}, {}});
    nodes.back().set_i("num_heads", heads);
    nodes.back().set_f("scale", n.get_f("scale", 1.0f / std::sqrt(static_cast<float>(head))));
    nodes.back().set_i("nan_to_zero", 1);
    if (four_d) { // [B, S, H*D] -> [B, S, H, D] -> [B, H, S, D]
      int t = g.add_value(n.name + "/y_bshd", datatype::fp32, {batch, len, heads, head}, true);
      nodes.push_back(node{"Reshape", n.name + "/y_reshape",
                           {fused_out, shape_constant("/y_shape", {batch, len, heads, head})},
                           {t}, {}});
      nodes.push_back(node{"Transpose", n.name + "/y_transpose", {t}, {y}, {}});
      nodes.back().set_ints("perm", {0, 2, 1, 3});
    }
  }
  g.nodes = std::move(nodes);
}

} // namespace

void fuse_attention(graph& g) {
  attention_to_fused(g);
  using perm_t = std::vector<int64_t>;
  const perm_t bhsd{0, 2, 1, 3}, bhds{0, 2, 3, 1};
  for (size_t si = 0; si < g.nodes.size(); ++si) {
    value_readers cons(g);
    auto prod = g.producers();
    auto& sm = g.nodes[si];
    if (sm.op != "Softmax")
      continue;
    int64_t rank = static_cast<int64_t>(g.values[sm.inputs[0]].shape.size());
    if (rank != 4 || (sm.get_i("axis", -1) != -1 && sm.get_i("axis", -1) != 3))
      continue;
    std::vector<int> chain;
    int scores = sm.inputs[0];
    const auto scores_shape = g.values[scores].shape;
    int mask = -1;
    int pa = prod[scores];
    // Additive mask: Add(scores, mask). Masked fill: Where(cond, fill, scores).
    if (pa >= 0 && g.nodes[pa].op == "Add" && cons.single(scores) == static_cast<int>(si)) {
      auto& add = g.nodes[pa];
      for (int k = 0; k < 2; ++k) {
        int a = add.inputs[k], b = add.inputs[1 - k];
        if (prod[a] >= 0 && (g.nodes[prod[a]].op == "MatMul" || g.nodes[prod[a]].op == "Div"
                             || g.nodes[prod[a]].op == "Mul")
            && g.values[a].shape == scores_shape) {
          mask = b;
          chain.push_back(pa);
          scores = a;
          break;
        }
      }
      if (mask >= 0 && !mask_fits(g, mask, scores_shape))
        continue;
    } else if (pa >= 0 && g.nodes[pa].op == "Where" && cons.single(scores) == static_cast<int>(si)) {
      auto& wh = g.nodes[pa];
      if (!cst(g, wh.inputs[1]) || cst(g, wh.inputs[1])->elements() != 1
          || g.values[wh.inputs[2]].shape != scores_shape
          || !mask_fits(g, wh.inputs[0], scores_shape))
        continue;
      // mask = Where(cond, fill, 0): computed as a node of its own.
      auto zero = make_tensor(datatype::fp32, {});
      int z = g.add_constant(wh.name + "/zero", zero);
      mask = g.add_value(wh.name + "/additive_mask");
      chain.push_back(pa);
      scores = wh.inputs[2];
      node mk{"Where", wh.name + "/additive_mask", {wh.inputs[0], wh.inputs[1], z}, {mask}, {}};
      auto cs = g.values[wh.inputs[0]].shape;
      g.values[mask].shape = cs;
      g.values[mask].shape_known = true;
      // Inserted before the attention: placed where the Where was.
      g.nodes[pa] = mk;
      chain.pop_back();
      cons = value_readers(g);
      prod = g.producers();
    }
    float scale = 1.0f;
    int mm = prod[scores];
    if (mm >= 0 && (g.nodes[mm].op == "Div" || g.nodes[mm].op == "Mul")) {
      int x = -1;
      auto c = scalar_factor(g, g.nodes[mm], x);
      if (!c || cons.single(scores) < 0)
        continue;
      scale = *c;
      chain.push_back(mm);
      scores = x;
      mm = prod[scores];
    }
    if (mm < 0 || g.nodes[mm].op != "MatMul" || cons.single(scores) < 0)
      continue;
    chain.push_back(mm);
    int qv = g.nodes[mm].inputs[0], kv = g.nodes[mm].inputs[1];
    // Q and K may each be scaled by a constant on the way (DistilBERT divides
    // Q; torch's SDPA multiplies both by sqrt(scale)).
    auto [qsrc, qperm] = through_layout(g, prod, qv, chain, scale);
    auto [ksrc, kperm] = through_layout(g, prod, kv, chain, scale);
    int64_t hq = 0, hk = 0, hv = 0;
    int q = qperm == bhsd ? unheads(g, prod, qsrc, hq, chain) : -1;
    int k = kperm == bhds ? unheads(g, prod, ksrc, hk, chain) : -1;
    if (q < 0 || k < 0 || hq != hk)
      continue;
    // probs x V, then back to [B, S, H*D]. torch's SDPA puts Where(IsNaN(p),
    // 0, p) between the softmax and the product (a row masked with -inf
    // throughout is NaN): FusedAttention's nan_to_zero does the same.
    int probs = sm.outputs[0];
    std::vector<int> guard;
    if (cons.readers[probs].size() == 2 && !cons.is_output[probs]) {
      int isnan = -1, where = -1;
      for (int r : cons.readers[probs]) {
        if (g.nodes[r].op == "IsNaN") isnan = r;
        if (g.nodes[r].op == "Where") where = r;
      }
      if (isnan < 0 || where < 0)
        continue;
      const auto& wh = g.nodes[where];
      int flag = g.nodes[isnan].outputs[0];
      if (wh.inputs[0] != flag || wh.inputs[2] != probs || !near(scalar(g, wh.inputs[1]), 0.0f)
          || cons.single(flag) != where)
        continue;
      guard = {isnan, where};
      probs = wh.outputs[0];
    }
    int pv = cons.single(probs);
    if (pv < 0 || g.nodes[pv].op != "MatMul" || g.nodes[pv].inputs[0] != probs)
      continue;
    float vscale = 1.0f;
    auto [vsrc, vperm] = through_layout(g, prod, g.nodes[pv].inputs[1], chain, vscale);
    int v = vperm == bhsd && vscale == 1.0f ? unheads(g, prod, vsrc, hv, chain) : -1;
    if (v < 0 || hv != hq)
      continue;
    int ctx = g.nodes[pv].outputs[0];
    std::vector<int> tail;
    int tr = cons.single(ctx);
    // TorchScript's SDPA reshapes the context to its own shape first.
    while (tr >= 0 && g.nodes[tr].op == "Reshape"
           && g.values[g.nodes[tr].outputs[0]].shape == g.values[ctx].shape) {
      tail.push_back(tr);
      tr = cons.single(g.nodes[tr].outputs[0]);
    }
    if (tr < 0 || g.nodes[tr].op != "Transpose" || g.nodes[tr].get_ints("perm") != bhsd)
      continue;
    int rs = cons.single(g.nodes[tr].outputs[0]);
    if (rs < 0 || g.nodes[rs].op != "Reshape")
      continue;
    if (g.values[q].shape != g.values[k].shape || g.values[q].shape != g.values[v].shape)
      continue;
    // The context may be reshaped to [B*S, H*D] for a Gemm (GPT-2): that
    // Reshape stays, reading the fused [B, S, H*D].
    const auto& rs_shape = g.values[g.nodes[rs].outputs[0]].shape;
    bool keep_reshape = rs_shape != g.values[q].shape;
    if (keep_reshape && (rs_shape.size() != 2 || rs_shape[1] != g.values[q].shape[2]))
      continue;
    // Every intermediate must be read only inside the pattern.
    bool private_chain = true;
    for (int c : chain)
      for (int o : g.nodes[c].outputs)
        if (cons.is_output[o] || cons.readers[o].size() > 1) private_chain = false;
    if (!private_chain)
      continue;
    std::vector<int> ins{q, k, v};
    if (mask >= 0) ins.push_back(mask);
    node fused{"FusedAttention", g.nodes[rs].name + "/fused_attention", ins, {}, {}};
    fused.set_i("num_heads", hq);
    fused.set_f("scale", scale);
    if (!guard.empty())
      fused.set_i("nan_to_zero", 1);
    for (int c : chain) kill(g.nodes[c]);
    for (int c : guard) kill(g.nodes[c]);
    for (int c : tail) kill(g.nodes[c]);
    kill(g.nodes[pv]);
    kill(sm);
    if (keep_reshape) {
      // The fused node takes the Transpose's place, the Reshape reads it.
      int out = g.add_value(fused.name, datatype::fp32, g.values[q].shape, true);
      fused.outputs = {out};
      g.nodes[rs].inputs[0] = out;
      g.nodes[tr] = fused;
    } else {
      fused.outputs = {g.nodes[rs].outputs[0]};
      kill(g.nodes[tr]);
      g.nodes[rs] = fused;
    }
  }
  drop_dead(g);
}

/// A fused node's output `y` read by exactly Sigmoid(y) and Mul(y, Sigmoid(y))
/// (either order): SiLU, EfficientNet's activation as torch exports it.
/// The node takes the Mul's place with activation "Swish".
bool fuse_silu(graph& g, const value_readers& cons, node& n) {
  int out = n.outputs[0];
  if (out < 0 || cons.is_output[out] || cons.readers[out].size() != 2)
    return false;
  int si = cons.readers[out][0], mi = cons.readers[out][1];
  if (g.nodes[si].op != "Sigmoid")
    std::swap(si, mi);
  node& sig = g.nodes[si];
  node& mul = g.nodes[mi];
  if (sig.op != "Sigmoid" || mul.op != "Mul" || mul.inputs.size() != 2)
    return false;
  int s = sig.outputs[0];
  bool pair = (mul.inputs[0] == out && mul.inputs[1] == s)
              || (mul.inputs[0] == s && mul.inputs[1] == out);
  if (!pair || cons.single(s) != mi)
    return false;
  n.set_s("activation", "Swish");
  n.set_f("act_alpha", 1.0f);
  n.outputs[0] = mul.outputs[0];
  mul = n;
  kill(n);
  kill(sig);
  return true;
}

namespace {

/// How a fused Conv, MatMul or Gemm takes in the activation node `act` behind
/// it: the attributes it sets on `fused`; false (and nothing set) where this
/// one does not fit.
using activation_fusion = bool (*)(const graph& g, const node& act, node& fused);

bool fuse_named_activation(const graph&, const node& act, node& fused) {
  fused.set_s("activation", act.op);
  return true;
}

/// FusedGelu is activation "Gelu" (erf), FusedGeluTanh "GeluTanh"; one with a
/// bias input is left as it is.
bool fuse_gelu_activation(const graph&, const node& act, node& fused) {
  if (act.inputs.size() > 1)
    return false;
  fused.set_s("activation", act.op == "FusedGeluTanh" ? "GeluTanh" : "Gelu");
  return true;
}

bool fuse_clip_activation(const graph& g, const node& act, node& fused) {
  auto lo = act.inputs.size() > 1 ? scalar(g, act.inputs[1]) : std::optional<float>(-INFINITY);
  auto hi = act.inputs.size() > 2 ? scalar(g, act.inputs[2]) : std::optional<float>(INFINITY);
  if (!lo || !hi)
    return false;
  fused.set_s("activation", "Clip");
  fused.set_f("act_alpha", *lo);
  fused.set_f("act_beta", *hi);
  return true;
}

/// MobileNetV3's activation: kept in the convolution's layout, not a reorder
/// to NCHW and back around a separate step.
bool fuse_hard_swish_activation(const graph&, const node&, node& fused) {
  fused.set_s("activation", "HardSwish");
  fused.set_f("act_alpha", 1.0f / 6);
  fused.set_f("act_beta", 0.5f);
  return true;
}

/// The activations fuse_epilogues() folds into the node before them.
const std::map<std::string, activation_fusion>& activation_fusions() {
  static const std::map<std::string, activation_fusion> fusions{
    {"Clip", &fuse_clip_activation},
    {"FusedGelu", &fuse_gelu_activation},
    {"FusedGeluTanh", &fuse_gelu_activation},
    {"HardSwish", &fuse_hard_swish_activation},
    {"Relu", &fuse_named_activation},
    {"Sigmoid", &fuse_named_activation},
    {"Tanh", &fuse_named_activation},
  };
  return fusions;
}

/// Operators that give their input's elements in the same order, only another
/// shape: an element-wise activation after one may as well come before it.
bool keeps_element_order(const std::string& op) {
  return op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze";
}

} // namespace

void fuse_epilogues(graph& g) {
  // Conv / MatMul (constant 2-D weights) / Gemm become their fused forms.
  struct fused_form {
    const char* op;
    bool (*takes)(const graph& g, const node& n); ///< nullptr: every node
  };
  static const std::map<std::string, fused_form> fused_forms{
    {"Conv", {"FusedConv", nullptr}},
    {"Gemm", {"FusedGemm", nullptr}},
    {"MatMul", {"FusedMatMul", [](const graph& g, const node& n) {
       return cst(g, n.inputs[1]) && g.values[n.inputs[1]].shape.size() == 2;
     }}},
  };
  for (auto& n : g.nodes) {
    auto fused = fused_forms.find(n.op);
    if (fused != fused_forms.end() && (!fused->second.takes || fused->second.takes(g, n)))
      n.op = fused->second.op;
  }
  bool changed = true;
  while (changed) {
    changed = false;
    value_readers cons(g);
    for (auto& n : g.nodes) {
      bool conv = n.op == "FusedConv", mm = n.op == "FusedMatMul", gm = n.op == "FusedGemm";
      if (!conv && !mm && !gm)
        continue;
      // A matmul adds its residual after the activation, so SiLU would come too early.
      bool matmul_residual = mm && n.inputs.size() > 3 && n.inputs[3] >= 0;
      if (!n.has("activation") && !matmul_residual && fuse_silu(g, cons, n)) {
        changed = true;
        break; // consumers changed
      }
      int out = n.outputs[0];
      int r = cons.single(out);
      if (r < 0)
        continue;
      auto& next = g.nodes[r];
      bool has_act = n.has("activation");
      bool has_res = n.inputs.size() > 3 && n.inputs[3] >= 0;
      const auto& oshape = g.values[out].shape;
      if (next.op == "Add" && !has_act) {
        int other = other_input(next, out);
        if (other < 0)
          continue;
        const auto* c = cst(g, other);
        int64_t width = oshape.back();
        if (mm && c && c->elements() == width && g.values[other].shape.back() == width
            && (n.inputs.size() < 3 || n.inputs[2] < 0)) {
          n.inputs.resize(3, -1);
          n.inputs[2] = other; // bias
        } else if ((conv || mm) && !c && !has_res && g.values[other].shape == oshape
                   && g.values[other].dtype == datatype::fp32) {
          n.inputs.resize(4, -1);
          n.inputs[3] = other; // residual
        } else {
          continue;
        }
      } else if (auto act = activation_fusions().find(next.op);
                 !has_act && !(mm && has_res) && act != activation_fusions().end()) {
        if (!act->second(g, next, n))
          continue;
      } else if (keeps_element_order(next.op) && !has_act && !(mm && has_res)) {
        // An activation after a Reshape of the output (GPT-2's Conv1D is a
        // Gemm, then a Reshape to [B, S, N], then its GELU) works element by
        // element, so it moves before the Reshape: the fused node keeps its
        // place and output, and the Reshape writes the activation's output.
        int after = cons.single(next.outputs[0]);
        if (after < 0 || g.nodes[after].inputs.empty()
            || g.nodes[after].inputs[0] != next.outputs[0])
          continue;
        auto act_after = activation_fusions().find(g.nodes[after].op);
        if (act_after == activation_fusions().end()
            || !act_after->second(g, g.nodes[after], n))
          continue;
        next.outputs[0] = g.nodes[after].outputs[0];
        kill(g.nodes[after]);
        changed = true;
        break; // consumers changed
      } else {
        continue;
      }
      n.outputs[0] = next.outputs[0];
      // The fused node takes the consumer's place: a residual may be computed
      // between the two, so the producer's place would read it too early.
      next = n;
      kill(n);
      changed = true;
      break; // consumers changed
    }
    drop_dead(g);
  }
}

void cancel_transposes(graph& g) {
  // A Reshape to its own shape (GPT-2's export writes one between the
  // attention's MatMul and its Transpose) copies: its readers read its input.
  {
    value_readers cons(g);
    for (auto& n : g.nodes) {
      if (n.op != "Reshape" || n.outputs.size() != 1)
        continue;
      int in = n.inputs[0], out = n.outputs[0];
      const auto &a = g.values[in], &b = g.values[out];
      if (a.shape_known && b.shape_known && a.shape == b.shape && a.dtype == b.dtype
          && !cons.is_output[out]) {
        replace_uses(g, out, in);
        kill(n);
      }
    }
    drop_dead(g);
  }
  value_readers cons(g);
  auto prod = g.producers();
  for (auto& outer : g.nodes) {
    if (outer.op != "Transpose" || outer.inputs.size() != 1)
      continue;
    int mid = outer.inputs[0];
    int p = prod[mid];
    if (p < 0 || g.nodes[p].op != "Transpose" || cons.single(mid) < 0)
      continue;
    node& inner = g.nodes[p];
    int x = inner.inputs[0];
    auto rank = static_cast<int64_t>(g.values[mid].shape.size());
    // Transpose's default perm reverses the dims.
    auto perm_of = [rank](const node& t) {
      auto perm = t.get_ints("perm");
      if (perm.empty())
        for (int64_t i = rank - 1; i >= 0; --i)
          perm.push_back(i);
      return perm;
    };
    auto first = perm_of(inner), second = perm_of(outer);
    auto in_range = [rank](int64_t d) { return d >= 0 && d < rank; };
    if (static_cast<int64_t>(first.size()) != rank || static_cast<int64_t>(second.size()) != rank
        || !std::all_of(second.begin(), second.end(), in_range))
      continue;
    // Output dim i of the pair is dim second[i] of mid, which is dim first[second[i]] of x.
    std::vector<int64_t> both(rank);
    bool identity = true;
    for (int64_t i = 0; i < rank; ++i) {
      both[i] = first[second[i]];
      identity = identity && both[i] == i;
    }
    int y = outer.outputs[0];
    if (identity && !cons.is_output[y]) {
      replace_uses(g, y, x);
      kill(outer);
    } else {
      outer.inputs[0] = x;
      outer.set_ints("perm", both);
    }
    kill(inner);
  }
  drop_dead(g);
}

void remove_dead_nodes(graph& g) {
  bool changed = true;
  while (changed) {
    changed = false;
    auto uses = g.use_counts();
    for (auto& n : g.nodes) {
      bool used = false;
      for (int o : n.outputs)
        if (o >= 0 && uses[o] > 0) used = true;
      if (!used && n.op != "Dead") {
        kill(n);
        changed = true;
      }
    }
    drop_dead(g);
  }
}

namespace {

/// A Pad of zeros on the spatial dimensions only (constant mode, pads known,
/// none negative), read by one Conv alone, becomes that convolution's own
/// padding: TensorFlow-converted and some torch models pad explicitly ("same"
/// padding), which otherwise costs a copy of the whole input and a reference
/// step before a convolution that pads for free.
void fold_pad_into_conv(graph& g) {
  value_readers cons(g);
  for (auto& pad : g.nodes) {
    if (pad.op != "Pad" || pad.get_s("mode", "constant") != "constant" || pad.inputs.size() < 2
        || (pad.inputs.size() > 3 && pad.inputs[3] >= 0))
      continue;
    int x = pad.inputs[0];
    const auto& shape = g.values[x].shape;
    auto* pads = cst(g, pad.inputs[1]);
    if (pads == nullptr || pads->dtype != datatype::int64 || shape.size() < 3
        || pads->elements() != static_cast<int64_t>(2 * shape.size()))
      continue;
    if (pad.inputs.size() > 2 && pad.inputs[2] >= 0 && !near(scalar(g, pad.inputs[2]), 0.0f, 0))
      continue;
    int c = cons.single(pad.outputs[0]);
    if (c < 0 || g.nodes[c].op != "Conv" || g.nodes[c].inputs[0] != pad.outputs[0]
        || g.nodes[c].get_s("auto_pad", "NOTSET") != "NOTSET"
        || g.values[x].dtype != datatype::fp32)
      continue;
    size_t rank = shape.size(), spatial = rank - 2;
    const int64_t* p = pads->as<int64_t>();
    bool fits = p[0] == 0 && p[1] == 0 && p[rank] == 0 && p[rank + 1] == 0;
    for (size_t i = 0; i < 2 * rank; ++i)
      fits = fits && p[i] >= 0;
    if (!fits)
      continue;
    auto& conv = g.nodes[c];
    auto conv_pads = conv.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
    if (conv_pads.size() != 2 * spatial)
      continue;
    for (size_t i = 0; i < spatial; ++i) {
      conv_pads[i] += p[2 + i];
      conv_pads[spatial + i] += p[rank + 2 + i];
    }
    conv.set_ints("pads", conv_pads);
    conv.inputs[0] = x;
    kill(pad);
  }
  drop_dead(g);
}

} // namespace

result<graph> optimize(const graph& src, const std::vector<std::vector<int64_t>>& shapes,
                       const pass_config& cfg) {
  graph quantized;
  if (cfg.fuse_qdq) { // before folding turns the INT8 weights into FLOAT ones
    quantized = src;
    fuse_qdq(quantized);
  }
  auto g = specialize(cfg.fuse_qdq ? quantized : src, shapes);
  if (!g)
    return g;
  remove_dead_nodes(*g);
  if (cfg.fold_batchnorm)
    fold_batchnorm(*g);
  if (cfg.fuse_patterns) {
    lower_contrib_ops(*g); // com.microsoft nodes that the fusions below can take
    fuse_layernorm(*g);
    fuse_gelu(*g);
    fuse_packed_attention(*g);
    fuse_attention(*g);
    cancel_transposes(*g); // after fuse_attention, which reads the Transposes around SDPA
  }
  if (cfg.fuse_epilogues) {
    fold_pad_into_conv(*g);
    fuse_epilogues(*g);
  }
  remove_dead_nodes(*g);
  return g;
}

} // namespace caf_serving::onnx
