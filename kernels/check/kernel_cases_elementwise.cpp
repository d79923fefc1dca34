#include "check/kernel_cases.hpp"

#include <string>
#include <utility>

namespace caf_serving::kernels {

const char* pattern_name(broadcast_pattern p) {
  switch (p) {
    case broadcast_pattern::same:
      return "same";
    case broadcast_pattern::misaligned:
      return "misaligned";
    case broadcast_pattern::row_bias:
      return "[b,s,c]+[c]";
    case broadcast_pattern::attention_mask:
      return "[b,h,s,s]+[b,1,1,s]";
    case broadcast_pattern::causal_mask:
      return "[b,h,s,s]+[s,s]";
    case broadcast_pattern::scalar_a:
      return "scalar+[r,c]";
    case broadcast_pattern::scalar_b:
      return "[r,c]+scalar";
    case broadcast_pattern::squeeze_excite:
      return "[b,c,r,i]*[b,c,1,1]";
    case broadcast_pattern::outer:
      return "[r,1]+[1,c]";
    case broadcast_pattern::rank6:
      return "rank6";
  }
  return "?";
}

pattern_shapes_result pattern_shapes(const kernel_case& c, const case_size& s) {
  using dims = std::vector<std::int64_t>;
  auto n = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  dims rc{n(s.rows), n(s.cols)};
  bool where = c.operation == op::where;
  if (c.operation == op::unary || c.operation == op::cast)
    return {{rc}, rc};
  switch (c.elementwise.pattern) {
    case broadcast_pattern::same:
    case broadcast_pattern::misaligned:
      return {where ? std::vector<dims>{rc, rc, rc} : std::vector<dims>{rc, rc}, rc};
    case broadcast_pattern::row_bias: {
      dims out{n(s.batch), n(s.seq), n(s.cols)};
      if (where) // a per-feature condition selecting between x and a scalar
        return {{{n(s.cols)}, out, {}}, out};
      return {{out, {n(s.cols)}}, out};
    }
    case broadcast_pattern::attention_mask: {
      dims out{n(s.batch), n(s.heads), n(s.seq), n(s.seq)};
      dims mask{n(s.batch), 1, 1, n(s.seq)};
      if (where)
        return {{mask, out, {}}, out};
      return {{out, mask}, out};
    }
    case broadcast_pattern::causal_mask: {
      dims out{n(s.batch), n(s.heads), n(s.seq), n(s.seq)};
      if (where)
        return {{{1, 1, n(s.seq), n(s.seq)}, out, {}}, out};
      return {{out, {n(s.seq), n(s.seq)}}, out};
    }
    case broadcast_pattern::scalar_a:
      if (where)
        return {{rc, {}, rc}, rc};
      return {{{}, rc}, rc};
    case broadcast_pattern::scalar_b:
      if (where)
        return {{rc, rc, {}}, rc};
      return {{rc, {}}, rc};
    case broadcast_pattern::squeeze_excite: {
      dims out{n(s.batch), n(s.cols), n(s.rows), n(s.inner)};
      dims scale{n(s.batch), n(s.cols), 1, 1};
      if (where)
        return {{scale, out, scale}, out};
      return {{out, scale}, out};
    }
    case broadcast_pattern::outer: {
      dims col{n(s.rows), 1}, row{1, n(s.cols)};
      if (where)
        return {{col, row, col}, rc};
      return {{col, row}, rc};
    }
    case broadcast_pattern::rank6: {
      dims a{n(s.batch), 1, n(s.heads), 3, 1, n(s.cols)};
      dims b{1, 2, 1, 3, n(s.seq), 1};
      dims out{n(s.batch), 2, n(s.heads), 3, n(s.seq), n(s.cols)};
      if (where)
        return {{b, a, b}, out};
      return {{a, b}, out};
    }
  }
  return {};
}

namespace {

// ---- sizes -------------------------------------------------------------------------------

case_size sized(std::size_t batch, std::size_t heads, std::size_t seq, std::size_t rows,
                std::size_t cols, std::size_t inner) {
  case_size s;
  s.batch = batch;
  s.heads = heads;
  s.seq = seq;
  s.rows = rows;
  s.cols = cols;
  s.inner = inner;
  return s;
}

/// Sizes per pattern: one element; ragged counts (not a multiple of the 8-element
/// chunk); one that is a multiple; one of the models' real sizes.
std::vector<case_size> sweep_for(broadcast_pattern p) {
  switch (p) {
    case broadcast_pattern::row_bias:
      return {sized(1, 1, 1, 1, 1, 1), sized(2, 1, 3, 1, 7, 1), sized(2, 1, 17, 1, 768, 1),
              sized(3, 1, 5, 1, 1000, 1), sized(1, 1, 9, 1, 13, 1)};
    case broadcast_pattern::attention_mask:
    case broadcast_pattern::causal_mask:
      return {sized(1, 1, 1, 1, 1, 1), sized(2, 3, 17, 1, 1, 1), sized(1, 2, 100, 1, 1, 1),
              sized(2, 12, 128, 1, 1, 1)};
    case broadcast_pattern::squeeze_excite: // N, C, H, W = batch, cols, rows, inner
      return {sized(1, 1, 1, 1, 1, 1), sized(2, 1, 1, 7, 5, 7), sized(1, 1, 1, 1, 3, 1),
              sized(2, 1, 1, 56, 16, 56), sized(1, 1, 1, 14, 40, 14)};
    case broadcast_pattern::rank6:
      return {sized(1, 1, 1, 1, 1, 1), sized(2, 3, 5, 1, 7, 1), sized(4, 2, 16, 1, 8, 1)};
    case broadcast_pattern::outer:
      return {sized(1, 1, 1, 1, 1, 1), sized(1, 1, 1, 3, 7, 1), sized(1, 1, 1, 64, 1000, 1),
              sized(1, 1, 1, 1, 9, 1), sized(1, 1, 1, 33, 1, 1)};
    default: // [r, c]
      return {matrix(1, 1), matrix(3, 7), matrix(17, 40), matrix(129, 768), matrix(33, 1001),
              matrix(1, 65539)};
  }
}

// ---- tolerances --------------------------------------------------------------------------

constexpr const char* exact_why
  = "exact: the kernel and the reference run the same f32/integer operation (IEEE + - * /, "
    "sqrt, comparisons, selections, conversions) and round it once to the output type, both "
    "to nearest even";

tolerance math_tolerance(dtype t) {
  if (t == dtype::f32)
    return {2e-6, 1e-5};
  if (t == dtype::f16)
    return {1e-5, 1.5e-3};
  return {1e-4, 8e-3};
}

std::string math_why(dtype t) {
  std::string f32
    = "CUDA's expf/erff/tanhf/powf/sinf are within 2-4 ulps and glibc's within 1-2, and nvcc "
      "contracts a*b+c into FMAs; composite forms (GELU, SiLU, Softplus) add a few ulps more "
      "and GELU's 1+erf cancels to ~1e-6 absolute at x ~ -4";
  if (t == dtype::f32)
    return "f32 output: " + f32;
  if (t == dtype::f16)
    return "f16 output: the f32 results above may straddle a rounding boundary: 1 f16 ulp "
           "(<= 9.8e-4 relative); " + f32;
  return "bf16 output: the f32 results above may straddle a rounding boundary: 1 bf16 ulp "
         "(<= 7.8e-3 relative); " + f32;
}

/// Exact unless the operator calls a transcendental function or a fused multiply-add
/// may form (nvcc contracts a*b+c; the host compiler does not).
bool is_exact_unary(unary_op op) {
  switch (op) {
    case unary_op::neg:
    case unary_op::abs:
    case unary_op::sqrt:
    case unary_op::reciprocal:
    case unary_op::relu:
    case unary_op::leaky_relu:
    case unary_op::clip:
    case unary_op::floor:
    case unary_op::ceil:
    case unary_op::round:
    case unary_op::logical_not:
    case unary_op::identity:
      return true;
    default:
      return false;
  }
}

void set_tolerance(kernel_case& c, bool exact) {
  if (exact) {
    c.tol = {0, 0};
    c.why = exact_why;
  } else {
    c.tol = math_tolerance(c.type);
    c.why = math_why(c.type);
  }
}

// ---- cases -------------------------------------------------------------------------------

kernel_case binary_case(binary_op o, dtype t, broadcast_pattern p, elementwise_spec spec = {}) {
  kernel_case c;
  c.operation = op::binary;
  c.type = t;
  spec.binary = o;
  spec.pattern = p;
  c.elementwise = spec;
  c.name = std::string("binary ") + binary_op_name(o) + " " + pattern_name(p) + " "
           + dtype_name(t);
  set_tolerance(c, o != binary_op::pow || !is_floating(t));
  c.sweep = sweep_for(p);
  return c;
}

kernel_case unary_case(unary_op o, dtype t, elementwise_spec spec = {}) {
  kernel_case c;
  c.operation = op::unary;
  c.type = t;
  spec.unary = o;
  bool has_alpha = o == unary_op::leaky_relu || o == unary_op::elu || o == unary_op::hard_sigmoid;
  if (has_alpha && spec.params.alpha == 0 && spec.params.beta == 0)
    spec.params = default_params(o); // ONNX's defaults unless the case sets its own
  c.elementwise = spec;
  c.name = std::string("unary ") + unary_op_name(o) + " "
           + (spec.pattern == broadcast_pattern::misaligned ? "misaligned " : "") + dtype_name(t);
  set_tolerance(c, is_exact_unary(o) || !is_floating(t));
  c.sweep = sweep_for(spec.pattern);
  return c;
}

kernel_case where_case(dtype t, broadcast_pattern p) {
  kernel_case c;
  c.operation = op::where;
  c.type = t;
  c.elementwise.pattern = p;
  c.name = std::string("where ") + pattern_name(p) + " " + dtype_name(t);
  set_tolerance(c, true);
  c.sweep = sweep_for(p);
  return c;
}

kernel_case cast_case(dtype from, dtype to, broadcast_pattern p = broadcast_pattern::same) {
  kernel_case c;
  c.operation = op::cast;
  c.type = from;
  c.convert_to = to;
  c.elementwise.pattern = p;
  c.elementwise.extremes = true;
  c.name = std::string("cast ") + dtype_name(from) + "->" + dtype_name(to)
           + (p == broadcast_pattern::misaligned ? " misaligned" : "");
  set_tolerance(c, true);
  c.sweep = sweep_for(p);
  return c;
}

elementwise_spec range(float lo, float hi) {
  elementwise_spec s;
  s.lo = lo;
  s.hi = hi;
  return s;
}

elementwise_spec quantised(float q) {
  elementwise_spec s;
  s.quantum = q;
  return s;
}

elementwise_spec with_extremes() {
  elementwise_spec s;
  s.extremes = true;
  return s;
}

} // namespace

void add_elementwise_cases(std::vector<kernel_case>& t) {
  using bp = broadcast_pattern;
  constexpr dtype floats[] = {dtype::f32, dtype::f16, dtype::bf16};
  // ---- binary: the models' broadcasts, every float type on the common ones.
  for (dtype f : floats) {
    auto bias = binary_case(binary_op::add, f, bp::row_bias);
    auto residual = binary_case(binary_op::add, f, bp::same);
    auto excite = binary_case(binary_op::mul, f, bp::squeeze_excite);
    auto mask = binary_case(binary_op::add, f, bp::attention_mask);
    if (f != dtype::bf16)
      bias.bench = {sized(64, 1, 512, 1, 768, 1)}; // [64,512,768] + [768]
    if (f == dtype::f16) {
      residual.bench = {matrix(8192, 4096)};         // 32M elements
      excite.bench = {sized(32, 1, 1, 56, 256, 56)}; // [32,256,56,56] * [32,256,1,1]
      mask.bench = {sized(64, 12, 128, 1, 1, 1)};    // [64,12,128,128] + [64,1,1,128]
    }
    for (auto* c : {&bias, &residual, &excite, &mask})
      t.push_back(std::move(*c));
  }
  t.push_back(binary_case(binary_op::add, dtype::f32, bp::causal_mask));
  t.push_back(binary_case(binary_op::add, dtype::f16, bp::misaligned));
  t.push_back(binary_case(binary_op::add, dtype::f32, bp::rank6));
  t.push_back(binary_case(binary_op::mul, dtype::i64, bp::rank6, with_extremes()));
  t.push_back(binary_case(binary_op::sub, dtype::f32, bp::scalar_a)); // 1 - mask
  t.push_back(binary_case(binary_op::sub, dtype::bf16, bp::outer));
  t.push_back(binary_case(binary_op::mul, dtype::f16, bp::scalar_b)); // mask * -10000
  t.back().bench = {matrix(8192, 4096)};
  {
    elementwise_spec divisor;
    divisor.nonzero = true;
    t.push_back(binary_case(binary_op::div, dtype::f32, bp::scalar_b, divisor)); // x / sqrt(d)
    t.push_back(binary_case(binary_op::div, dtype::bf16, bp::same, divisor));
    t.push_back(binary_case(binary_op::div, dtype::f16, bp::row_bias, divisor)); // x / std
  }
  t.push_back(binary_case(binary_op::pow, dtype::f32, bp::scalar_b, range(0.1f, 3.0f)));
  t.push_back(binary_case(binary_op::pow, dtype::f16, bp::scalar_b, range(0.1f, 3.0f)));
  t.push_back(binary_case(binary_op::pow, dtype::bf16, bp::same, range(0.1f, 2.0f)));
  t.push_back(binary_case(binary_op::max, dtype::f32, bp::outer));
  t.push_back(binary_case(binary_op::min, dtype::bf16, bp::same));
  t.push_back(binary_case(binary_op::max, dtype::f16, bp::scalar_b));
  // Integers: wrapping arithmetic, division by zero and MIN / -1, integer Pow.
  t.push_back(binary_case(binary_op::add, dtype::i64, bp::same, with_extremes()));
  t.back().bench = {matrix(4096, 4096)};
  t.push_back(binary_case(binary_op::sub, dtype::i64, bp::scalar_b, with_extremes()));
  t.push_back(binary_case(binary_op::mul, dtype::i32, bp::outer, with_extremes()));
  t.push_back(binary_case(binary_op::div, dtype::i64, bp::same, with_extremes()));
  t.push_back(binary_case(binary_op::div, dtype::i32, bp::row_bias, with_extremes()));
  t.push_back(binary_case(binary_op::pow, dtype::i32, bp::same, range(-4.0f, 12.0f)));
  t.push_back(binary_case(binary_op::pow, dtype::i64, bp::outer, range(-3.0f, 40.0f)));
  t.push_back(binary_case(binary_op::max, dtype::i64, bp::row_bias, with_extremes()));
  t.push_back(binary_case(binary_op::min, dtype::i32, bp::same, with_extremes()));
  // Comparisons (output bool); inputs on a 1/2 grid so that equal pairs occur.
  t.push_back(binary_case(binary_op::equal, dtype::i64, bp::same, quantised(1)));
  t.push_back(binary_case(binary_op::equal, dtype::f16, bp::row_bias, quantised(0.5f)));
  t.push_back(binary_case(binary_op::less, dtype::f32, bp::row_bias, quantised(0.5f)));
  t.push_back(binary_case(binary_op::less_or_equal, dtype::f16, bp::scalar_b, quantised(0.5f)));
  t.push_back(binary_case(binary_op::greater, dtype::bf16, bp::outer, quantised(0.5f)));
  t.push_back(binary_case(binary_op::greater_or_equal, dtype::i32, bp::causal_mask, quantised(1)));
  t.push_back(binary_case(binary_op::equal, dtype::boolean, bp::same));
  // Logic.
  t.push_back(binary_case(binary_op::logical_and, dtype::boolean, bp::same));
  t.push_back(binary_case(binary_op::logical_or, dtype::boolean, bp::outer));
  t.push_back(binary_case(binary_op::logical_xor, dtype::boolean, bp::scalar_b));
  t.push_back(binary_case(binary_op::logical_and, dtype::boolean, bp::attention_mask));

  // ---- unary: every operator in f32 and f16, the models' activations in bf16 too.
  struct unary_entry {
    unary_op op;
    elementwise_spec spec;
  };
  elementwise_spec clip = range(-8.0f, 8.0f);
  clip.params.lo = -1.5f;
  clip.params.hi = 6.0f; // ReLU6
  std::vector<unary_entry> unary_ops = {
    {unary_op::neg, {}},
    {unary_op::abs, {}},
    {unary_op::sqrt, range(0.0f, 16.0f)},
    {unary_op::reciprocal, range(0.25f, 8.0f)},
    {unary_op::exp, range(-8.0f, 8.0f)},
    {unary_op::log, range(0.01f, 16.0f)},
    {unary_op::erf, {}},
    {unary_op::tanh, {}},
    {unary_op::sigmoid, range(-8.0f, 8.0f)},
    {unary_op::relu, {}},
    {unary_op::leaky_relu, {}},
    {unary_op::elu, {}},
    {unary_op::gelu_erf, range(-6.0f, 6.0f)},
    {unary_op::gelu_tanh, range(-6.0f, 6.0f)},
    {unary_op::silu, range(-8.0f, 8.0f)},
    {unary_op::hard_sigmoid, range(-8.0f, 8.0f)},
    {unary_op::hard_swish, range(-8.0f, 8.0f)},
    {unary_op::clip, clip},
    {unary_op::softplus, range(-30.0f, 30.0f)},
    {unary_op::floor, quantised(0.25f)},
    {unary_op::ceil, quantised(0.25f)},
    {unary_op::round, quantised(0.25f)}, // ties at +-0.5, +-1.5: half to even
    {unary_op::sin, range(-10.0f, 10.0f)},
    {unary_op::cos, range(-10.0f, 10.0f)},
  };
  for (const auto& e : unary_ops) {
    t.push_back(unary_case(e.op, dtype::f32, e.spec));
    t.push_back(unary_case(e.op, dtype::f16, e.spec));
  }
  for (unary_op o : {unary_op::gelu_erf, unary_op::gelu_tanh, unary_op::silu, unary_op::relu,
                     unary_op::hard_swish, unary_op::sigmoid, unary_op::tanh, unary_op::exp})
    t.push_back(unary_case(o, dtype::bf16, range(-6.0f, 6.0f)));
  for (dtype i : {dtype::i64, dtype::i32}) {
    t.push_back(unary_case(unary_op::neg, i, with_extremes()));
    t.push_back(unary_case(unary_op::abs, i, with_extremes()));
  }
  t.push_back(unary_case(unary_op::logical_not, dtype::boolean));
  t.push_back(unary_case(unary_op::identity, dtype::i64, with_extremes()));
  t.push_back(unary_case(unary_op::identity, dtype::boolean));
  {
    elementwise_spec m = range(-6.0f, 6.0f);
    m.pattern = bp::misaligned;
    t.push_back(unary_case(unary_op::gelu_erf, dtype::f16, m));
    t.push_back(unary_case(unary_op::neg, dtype::i64, m));
  }
  for (auto& c : t) // bench the activations of the models at a large FFN size
    if (c.operation == op::unary && c.type == dtype::f16
        && c.elementwise.pattern == bp::same
        && (c.elementwise.unary == unary_op::gelu_erf || c.elementwise.unary == unary_op::silu
            || c.elementwise.unary == unary_op::hard_swish))
      c.bench = {matrix(8192, 4096)};

  // ---- Where.
  t.push_back(where_case(dtype::f32, bp::same));
  t.push_back(where_case(dtype::f16, bp::causal_mask));
  t.back().bench = {sized(16, 12, 512, 1, 1, 1)}; // GPT-2's causal mask at 512
  t.push_back(where_case(dtype::bf16, bp::attention_mask));
  t.push_back(where_case(dtype::i64, bp::scalar_b));
  t.push_back(where_case(dtype::boolean, bp::outer));
  t.push_back(where_case(dtype::i32, bp::row_bias));
  t.push_back(where_case(dtype::f16, bp::misaligned));
  t.push_back(where_case(dtype::f32, bp::rank6));
  t.push_back(where_case(dtype::u8, bp::scalar_a));

  // ---- Cast: every ordered pair of distinct types, and unaligned buffers.
  constexpr dtype all[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::i64,
                           dtype::i32, dtype::i8,  dtype::u8,   dtype::boolean};
  for (dtype from : all)
    for (dtype to : all)
      if (from != to)
        t.push_back(cast_case(from, to));
  t.push_back(cast_case(dtype::f32, dtype::i64, bp::misaligned));
  t.push_back(cast_case(dtype::bf16, dtype::i8, bp::misaligned));
  for (auto& c : t)
    if (c.operation == op::cast
        && ((c.type == dtype::f32 && c.convert_to == dtype::f16)
            || (c.type == dtype::i64 && c.convert_to == dtype::i32)
            || (c.type == dtype::boolean && c.convert_to == dtype::f32))
        && c.elementwise.pattern == bp::same)
      c.bench = {matrix(std::size_t{1} << 26, 1)}; // 64M elements
}

} // namespace caf_serving::kernels
