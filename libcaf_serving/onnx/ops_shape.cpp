#include "onnx/ops_shape.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;

std::vector<inferred> one(datatype t, shape_t s) {
  return {{t, std::move(s)}};
}

bool has_input(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

const value& input(const graph& g, const node& n, size_t i) {
  return g.values[n.inputs[i]];
}

/// Copies a strided view: out[i] = in[base + sum(idx_d * st_d)] for byte elements of `esize`.
void strided_copy(const uint8_t* in, int64_t base, const shape_t& out_shape, const shape_t& st,
                  size_t esize, uint8_t* out) {
  std::array<shape_t, 1> s{st};
  broadcast_loop<1>(out_shape, s, [&](int64_t i, const std::array<int64_t, 1>& off) {
    std::memcpy(out + i * esize, in + (base + off[0]) * esize, esize);
  });
}

// ------------------------------------------------------------------ constants, Shape

infer_result infer_range(const graph& g, const node& n) {
  for (size_t i = 0; i < 3; ++i)
    if (auto e = need_constant(g, n, i, "Range's start, limit and delta")) return *e;
  auto num = [&](int v) {
    const auto& t = *g.values[v].constant;
    return t.dtype == datatype::fp32 ? static_cast<double>(t.as<float>()[0])
           : t.dtype == datatype::int32 ? static_cast<double>(t.as<int32_t>()[0])
                                        : static_cast<double>(t.as<int64_t>()[0]);
  };
  double start = num(n.inputs[0]), limit = num(n.inputs[1]), delta = num(n.inputs[2]);
  int64_t count = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((limit - start) / delta)));
  return one(input(g, n, 0).dtype, {count});
}

void run_range(const node&, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  dispatch(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      T start = *in[0].as<T>(), delta = *in[2].as<T>();
      for (int64_t i = 0; i < y.elements(); ++i)
        y.as<T>()[i] = static_cast<T>(start + static_cast<T>(i) * delta);
    }
  });
}

infer_result infer_constant(const graph&, const node& n) {
  if (n.has("value")) {
    auto t = n.attrs.at("value").t;
    return one(t->dtype, t->shape);
  }
  if (n.has("value_float")) return one(datatype::fp32, {});
  if (n.has("value_int")) return one(datatype::int64, {});
  if (n.has("value_ints"))
    return one(datatype::int64, {static_cast<int64_t>(n.get_ints("value_ints").size())});
  if (n.has("value_floats"))
    return one(datatype::fp32, {static_cast<int64_t>(n.attrs.at("value_floats").floats.size())});
  return std::string("Constant without a value attribute the engine reads");
}

void run_constant(const node& n, const std::vector<tensor_ref>&,
                  const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  if (n.has("value")) {
    const auto& t = *n.attrs.at("value").t;
    std::memcpy(y.data, t.bytes.data(), t.bytes.size());
  } else if (n.has("value_float")) {
    *y.as<float>() = n.get_f("value_float", 0);
  } else if (n.has("value_int")) {
    *y.as<int64_t>() = n.get_i("value_int", 0);
  } else if (n.has("value_ints")) {
    auto v = n.get_ints("value_ints");
    std::memcpy(y.data, v.data(), v.size() * 8);
  } else {
    const auto& v = n.attrs.at("value_floats").floats;
    std::memcpy(y.data, v.data(), v.size() * 4);
  }
}

std::optional<std::string> check_constant(const graph& g, const node& n, int64_t version) {
  for (const char* a : {"value_string", "value_strings", "sparse_value"})
    if (n.has(a))
      return "attribute '" + std::string(a) + "'" + selected_version(g, n, version)
             + " is a kind of constant the engine does not run (it runs value, value_float(s) "
               "and value_int(s)); fold the constant into the model's inputs";
  return std::nullopt;
}

infer_result infer_constant_of_shape(const graph& g, const node& n) {
  if (auto e = need_constant(g, n, 0, "the shape")) return *e;
  datatype t = n.has("value") ? n.attrs.at("value").t->dtype : datatype::fp32;
  return one(t, const_ints(g, n.inputs[0]));
}

void run_constant_of_shape(const node& n, const std::vector<tensor_ref>&,
                           const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  size_t es = element_size(y.dtype);
  std::vector<uint8_t> v(es, 0);
  if (n.has("value")) std::memcpy(v.data(), n.attrs.at("value").t->bytes.data(), es);
  for (int64_t i = 0; i < y.elements(); ++i)
    std::memcpy(static_cast<uint8_t*>(y.data) + i * es, v.data(), es);
}

infer_result infer_shape(const graph& g, const node& n) {
  int64_t r = static_cast<int64_t>(input(g, n, 0).shape.size());
  int64_t s = n.get_i("start", 0), e = n.get_i("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  return one(datatype::int64, {std::max<int64_t>(0, e - s)});
}

void run_shape(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  int64_t r = static_cast<int64_t>(in[0].shape.size());
  int64_t s = n.get_i("start", 0);
  if (s < 0) s += r;
  s = std::clamp<int64_t>(s, 0, r);
  for (int64_t i = 0; i < y.elements(); ++i) y.as<int64_t>()[i] = in[0].shape[s + i];
}

std::optional<std::string> check_shape(const graph& g, const node& n, int64_t version) {
  if (auto e = attribute_from(g, n, version, "start", 15))
    return e;
  return attribute_from(g, n, version, "end", 15);
}

// ------------------------------------------------------------------ views

infer_result infer_reshape(const graph& g, const node& n) {
  if (auto e = need_constant(g, n, 1, "the target shape")) return *e;
  auto target = const_ints(g, n.inputs[1]);
  const auto& s = input(g, n, 0).shape;
  int64_t known = 1, minus = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0 && !n.get_i("allowzero", 0)) target[i] = s.at(i);
    if (target[i] == -1) minus = static_cast<int64_t>(i);
    else known *= target[i];
  }
  if (minus >= 0) target[minus] = known ? element_count(s) / known : 0;
  if (element_count(target) != element_count(s))
    return "cannot reshape " + shape_string(s) + " to " + shape_string(target);
  return one(input(g, n, 0).dtype, target);
}

std::optional<std::string> check_reshape(const graph& g, const node& n, int64_t version) {
  return attribute_from(g, n, version, "allowzero", 14);
}

infer_result infer_flatten(const graph& g, const node& n) {
  const auto& s = input(g, n, 0).shape;
  int64_t axis = norm_axis(n.get_i("axis", 1), s.size());
  int64_t a = 1, b = 1;
  for (size_t i = 0; i < s.size(); ++i) (static_cast<int64_t>(i) < axis ? a : b) *= s[i];
  return one(input(g, n, 0).dtype, {a, b});
}

/// The axes of Squeeze or Unsqueeze: its constant second input.
std::variant<shape_t, std::string> squeeze_axes(const graph& g, const node& n) {
  if (auto e = need_constant(g, n, 1, "the axes")) return *e;
  return has_input(n, 1) ? const_ints(g, n.inputs[1]) : n.get_ints("axes");
}

infer_result infer_squeeze(const graph& g, const node& n) {
  auto given = squeeze_axes(g, n);
  if (auto* e = std::get_if<std::string>(&given)) return *e;
  auto axes = std::get<shape_t>(given);
  const auto& s = input(g, n, 0).shape;
  if (axes.empty())
    for (size_t i = 0; i < s.size(); ++i) if (s[i] == 1) axes.push_back(i);
  for (auto& a : axes) a = norm_axis(a, s.size());
  shape_t out;
  for (size_t i = 0; i < s.size(); ++i)
    if (std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) == axes.end())
      out.push_back(s[i]);
  return one(input(g, n, 0).dtype, out);
}

infer_result infer_unsqueeze(const graph& g, const node& n) {
  auto given = squeeze_axes(g, n);
  if (auto* e = std::get_if<std::string>(&given)) return *e;
  auto axes = std::get<shape_t>(given);
  shape_t s = input(g, n, 0).shape;
  size_t r = s.size() + axes.size();
  for (auto& a : axes) a = norm_axis(a, r);
  std::sort(axes.begin(), axes.end());
  for (auto a : axes) s.insert(s.begin() + a, 1);
  return one(input(g, n, 0).dtype, s);
}

/// Squeeze's and Unsqueeze's axes attribute, which version 13 made the second input.
std::optional<std::string> check_squeeze(const graph& g, const node& n, int64_t version) {
  if (n.has("axes"))
    return "attribute 'axes' was replaced by the second input 'axes' in " + n.op + "-13"
           + selected_version(g, n, version) + "; pass the axes as a constant input";
  return std::nullopt;
}

/// As Squeeze's, and the axes input is not optional.
std::optional<std::string> check_unsqueeze(const graph& g, const node& n, int64_t version) {
  if (auto e = check_squeeze(g, n, version))
    return e;
  if (!has_input(n, 1))
    return "the second input 'axes' is missing" + selected_version(g, n, version)
           + "; Unsqueeze needs it";
  return std::nullopt;
}

/// Reshape, Flatten, Squeeze, Unsqueeze: the bytes as they are (none to copy
/// where a plan gives the output the input's memory).
void run_view(const node&, const std::vector<tensor_ref>& in,
              const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  if (y.data != in[0].data)
    std::memcpy(y.data, in[0].data, y.elements() * element_size(y.dtype));
}

// ------------------------------------------------------------------ copies

infer_result infer_gather(const graph& g, const node& n) {
  const auto& d = input(g, n, 0).shape;
  int64_t axis = norm_axis(n.get_i("axis", 0), d.size());
  if (axis < 0 || axis >= static_cast<int64_t>(d.size()))
    return "axis " + std::to_string(n.get_i("axis", 0)) + " is out of range for "
           + shape_string(d);
  shape_t s(d.begin(), d.begin() + axis);
  s.insert(s.end(), input(g, n, 1).shape.begin(), input(g, n, 1).shape.end());
  s.insert(s.end(), d.begin() + axis + 1, d.end());
  return one(input(g, n, 0).dtype, s);
}

void run_gather(const node& n, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& d = in[0].shape;
  int64_t axis = norm_axis(n.get_i("axis", 0), d.size());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= d[i];
  for (size_t i = axis + 1; i < d.size(); ++i) inner *= d[i];
  auto idx = ref_ints(in[1]);
  size_t es = element_size(y.dtype);
  auto* src = static_cast<const uint8_t*>(in[0].data);
  auto* dst = static_cast<uint8_t*>(y.data);
  for (int64_t o = 0; o < outer; ++o)
    for (size_t j = 0; j < idx.size(); ++j) {
      int64_t k = idx[j] < 0 ? idx[j] + d[axis] : idx[j];
      k = std::clamp<int64_t>(k, 0, d[axis] - 1); // out-of-range ids read the last row
      std::memcpy(dst + ((o * idx.size() + j) * inner) * es,
                  src + ((o * d[axis] + k) * inner) * es, inner * es);
    }
}

shape_t slice_params(const shape_t& in, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                     std::vector<int64_t> steps, shape_t& begin, shape_t& step) {
  size_t r = in.size();
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty())
    steps.assign(starts.size(), 1);
  shape_t out = in;
  begin.assign(r, 0);
  step.assign(r, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = norm_axis(axes[i], r), d = in[a], s = steps[i];
    int64_t b = starts[i], e = ends[i];
    if (b < 0) b += d;
    if (e < 0) e += d;
    if (s > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      out[a] = e > b ? (e - b + s - 1) / s : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      out[a] = b > e ? (b - e - s - 1) / (-s) : 0;
    }
    begin[a] = b;
    step[a] = s;
  }
  return out;
}

infer_result infer_slice(const graph& g, const node& n) {
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (auto e = need_constant(g, n, i, "Slice's starts, ends, axes and steps")) return *e;
  shape_t b, st;
  return one(input(g, n, 0).dtype,
             slice_params(input(g, n, 0).shape, const_ints(g, n.inputs[1]),
                          const_ints(g, n.inputs[2]),
                          has_input(n, 3) ? const_ints(g, n.inputs[3]) : shape_t{},
                          has_input(n, 4) ? const_ints(g, n.inputs[4]) : shape_t{}, b, st));
}

void run_slice(const node&, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  shape_t b, step;
  slice_params(in[0].shape, ref_ints(in[1]), ref_ints(in[2]),
               has(3) ? ref_ints(in[3]) : shape_t{}, has(4) ? ref_ints(in[4]) : shape_t{}, b,
               step);
  auto own = strides_of(in[0].shape);
  int64_t base = 0;
  shape_t st(own.size());
  for (size_t i = 0; i < own.size(); ++i) {
    base += b[i] * own[i];
    st[i] = own[i] * step[i];
  }
  strided_copy(static_cast<const uint8_t*>(in[0].data), base, y.shape, st,
               element_size(y.dtype), static_cast<uint8_t*>(y.data));
}

infer_result infer_concat(const graph& g, const node& n) {
  shape_t s = input(g, n, 0).shape;
  int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    const auto& o = input(g, n, i).shape;
    if (o.size() != s.size())
      return "inputs of different ranks: " + shape_string(s) + " and " + shape_string(o);
    s[axis] += o[axis];
  }
  return one(input(g, n, 0).dtype, s);
}

void run_concat(const node& n, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  int64_t axis = norm_axis(n.get_i("axis", 0), y.shape.size());
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= y.shape[i];
  size_t es = element_size(y.dtype);
  int64_t row = element_count(y.shape) / std::max<int64_t>(outer, 1);
  int64_t at = 0;
  for (const auto& t : in) {
    int64_t chunk = t.elements() / std::max<int64_t>(outer, 1);
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<uint8_t*>(y.data) + (o * row + at) * es,
                  static_cast<const uint8_t*>(t.data) + o * chunk * es, chunk * es);
    at += chunk;
  }
}

infer_result infer_expand(const graph& g, const node& n) {
  if (auto e = need_constant(g, n, 1, "the target shape")) return *e;
  auto b = broadcast_shapes(input(g, n, 0).shape, const_ints(g, n.inputs[1]));
  if (!b) return "cannot expand " + shape_string(input(g, n, 0).shape);
  return one(input(g, n, 0).dtype, *b);
}

void run_expand(const node&, const std::vector<tensor_ref>& in,
                const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  std::array<shape_t, 1> st{broadcast_strides(in[0].shape, y.shape)};
  size_t es = element_size(y.dtype);
  broadcast_loop<1>(y.shape, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
    std::memcpy(static_cast<uint8_t*>(y.data) + i * es,
                static_cast<const uint8_t*>(in[0].data) + off[0] * es, es);
  });
}

infer_result infer_split(const graph& g, const node& n) {
  if (auto e = need_constant(g, n, 1, "the split sizes")) return *e;
  const auto& s = input(g, n, 0).shape;
  int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
  auto sizes = has_input(n, 1) ? const_ints(g, n.inputs[1]) : shape_t{};
  if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
    return "axis " + std::to_string(n.get_i("axis", 0)) + " is out of range for "
           + shape_string(s);
  if (sizes.empty()) {
    // Equal parts, one per output (num_outputs, which the importer checked
    // against the outputs, from Split-18). Split-18 makes the last part
    // smaller when they do not divide evenly; Split-13 must divide evenly.
    int64_t k = static_cast<int64_t>(n.outputs.size()), d = s[axis];
    if (d % k != 0 && g.opset != 0 && g.opset < 18)
      return "Split-13 divides axis " + std::to_string(axis) + " of " + shape_string(s)
             + " into " + std::to_string(k) + " equal parts, which it cannot; give the sizes "
             "as the 'split' input, or re-export at opset 18 or newer (num_outputs)";
    sizes.assign(k, (d + k - 1) / k);
    sizes.back() = d - sizes[0] * (k - 1);
    if (sizes.back() < 0)
      return "axis " + std::to_string(axis) + " of " + shape_string(s) + " cannot be split "
             "into " + std::to_string(k) + " parts of " + std::to_string(sizes[0])
             + " with a smaller last one (ONNX's rule); give the sizes as the 'split' input";
  }
  if (sizes.size() != n.outputs.size())
    return std::to_string(sizes.size()) + " split sizes for " + std::to_string(n.outputs.size())
           + " outputs";
  int64_t total = 0;
  for (auto sz : sizes) total += sz;
  if (total != s[axis])
    return "split sizes add up to " + std::to_string(total) + ", not to axis "
           + std::to_string(axis) + " of " + shape_string(s);
  std::vector<inferred> out;
  for (auto sz : sizes) {
    shape_t o = s;
    o[axis] = sz;
    out.push_back({input(g, n, 0).dtype, o});
  }
  return out;
}

void run_split(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& s = in[0].shape;
  int64_t axis = norm_axis(n.get_i("axis", 0), s.size());
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[i];
  size_t es = element_size(y.dtype);
  int64_t row = in[0].elements() / std::max<int64_t>(outer, 1);
  int64_t at = 0;
  for (const auto& t : out) {
    int64_t chunk = t.elements() / std::max<int64_t>(outer, 1);
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<uint8_t*>(t.data) + o * chunk * es,
                  static_cast<const uint8_t*>(in[0].data) + (o * row + at) * es, chunk * es);
    at += chunk;
  }
}

/// num_outputs (from Split-18, and with the sizes input not both) and the split
/// attribute (an input from Split-13).
std::optional<std::string> check_split(const graph& g, const node& n, int64_t version) {
  const std::string at = selected_version(g, n, version);
  if (auto e = attribute_from(g, n, version, "num_outputs", 18))
    return e;
  if (n.has("num_outputs")) {
    int64_t k = n.get_i("num_outputs", 0);
    if (has_input(n, 1))
      return "attribute 'num_outputs' (" + std::to_string(k) + ") and the input 'split' are "
             "both given" + at + "; ONNX allows one of them: drop one";
    if (k < 1 || k != static_cast<int64_t>(n.outputs.size()))
      return "attribute 'num_outputs' is " + std::to_string(k) + " but the node has "
             + std::to_string(n.outputs.size()) + " outputs" + at
             + "; they must be equal: re-export the model";
  }
  if (n.has("split"))
    return "attribute 'split' was replaced by the second input 'split' in Split-13" + at
           + "; pass the sizes as a constant input";
  return std::nullopt;
}

infer_result infer_transpose(const graph& g, const node& n) {
  const auto& s = input(g, n, 0).shape;
  auto perm = n.get_ints("perm");
  if (perm.empty())
    for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) perm.push_back(i);
  shape_t o;
  for (auto p : perm) o.push_back(s.at(p));
  return one(input(g, n, 0).dtype, o);
}

void run_transpose(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  const auto& s = in[0].shape;
  auto perm = n.get_ints("perm");
  if (perm.empty())
    for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) perm.push_back(i);
  auto own = strides_of(s);
  shape_t st;
  for (auto p : perm) st.push_back(own[p]);
  strided_copy(static_cast<const uint8_t*>(in[0].data), 0, y.shape, st, element_size(y.dtype),
               static_cast<uint8_t*>(y.data));
}

} // namespace

const op_table& shape_operator_table() {
  // Every version ONNX 1.23.2 defines, from the first up to opset 28; where a
  // version from 13 on changed what the operator means, the comment says so
  // and the entry's check or kernel follows the version the model selects.
  // The other versions changed only the spec's type lists (bfloat16, float8,
  // int4, float4, int2; ConstantOfShape's bfloat16 from 20; Range's
  // float16/bfloat16 from 27).
  static const op_table ops{
    {"Concat", {1, 4, 11, 13}, &infer_concat, &run_concat},
    // 12: value_float(s), value_int(s)
    {"Constant", {1, 9, 11, 12, 13, 19, 21, 23, 24, 25}, &infer_constant, &run_constant,
     &check_constant},
    {"ConstantOfShape", {9, 20, 21, 23, 24, 25}, &infer_constant_of_shape,
     &run_constant_of_shape},
    {"Expand", {8, 13}, &infer_expand, &run_expand},
    {"Flatten", {1, 9, 11, 13, 21, 23, 24, 25}, &infer_flatten, &run_view},
    {"Gather", {1, 11, 13}, &infer_gather, &run_gather},
    {"Range", {11, 27}, &infer_range, &run_range}, // 27: stash_type, for float16/bfloat16 only
    // 14: allowzero
    {"Reshape", {1, 5, 13, 14, 19, 21, 23, 24, 25}, &infer_reshape, &run_view, &check_reshape},
    // 15: start and end
    {"Shape", {1, 13, 15, 19, 21, 23, 24, 25}, &infer_shape, &run_shape, &check_shape},
    {"Slice", {1, 10, 11, 13}, &infer_slice, &run_slice},
    // 13: split is an input; 18: num_outputs, uneven last part
    {"Split", {1, 2, 11, 13, 18}, &infer_split, &run_split, &check_split},
    // 13: axes is an input
    {"Squeeze", {1, 11, 13, 21, 23, 24, 25}, &infer_squeeze, &run_view, &check_squeeze},
    {"Transpose", {1, 13, 21, 23, 24, 25}, &infer_transpose, &run_transpose},
    {"Unsqueeze", {1, 11, 13, 21, 23, 24, 25}, &infer_unsqueeze, &run_view, &check_unsqueeze},
  };
  return ops;
}

} // namespace caf_serving::onnx
