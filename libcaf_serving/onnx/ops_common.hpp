#pragma once
/// What the operator files share, naming no operator: the tensors a reference
/// kernel reads and writes, the registry entry that an operator file fills in
/// for each of its operators (op_entry), and the helpers the kernels share
/// (numpy broadcasting, axes, integer constants, the dispatch from a datatype to
/// a C++ element type, the fused operators' activations, the wording of version
/// checks). A leaf: it includes no operator file and not the registry, so the
/// operator files (ops_*.cpp) and the registry (op_registry.cpp) build on it
/// without a cycle.
///
/// Usage (an operator file; docs/onnx-backend-layout.md):
///
///     const op_table& foo_operator_table() {
///       static const op_table ops{{"Foo", {13, 18}, &infer_foo, &run_foo}};
///       return ops;
///     }

#include "onnx/ir.hpp"

#include <array>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

// ------------------------------------------------------------------ tensors

/// A tensor in memory that a kernel reads or writes.
struct tensor_ref {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  void* data = nullptr;

  template <class T>
  T* as() const { return static_cast<T*>(data); }
  int64_t elements() const { return element_count(shape); }
};

/// An output's inferred type and shape.
struct inferred {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
};

/// The outputs' types and shapes, or what does not fit.
using infer_result = std::variant<std::vector<inferred>, std::string>;

// ------------------------------------------------------------------ registry entries

/// Shape inference of an operator: the outputs' types and shapes of `n` given
/// its input values (which have known shapes; shape-determining inputs such as
/// Reshape's target must be constants). The error says what does not fit,
/// without the node's name (the caller adds it).
using infer_function = infer_result (*)(const graph& g, const node& n);

/// The reference kernel of an operator: runs `n` on shapes and types its shape
/// inference accepted; an omitted input or output has no data.
using reference_function = void (*)(const node& n, const std::vector<tensor_ref>& in,
                                    const std::vector<tensor_ref>& out);

/// What in `n`'s attributes, inputs or outputs the operator's `version` (the one
/// `g.opset` selects) does not define, or defines with a meaning the engine does
/// not implement; nothing when the engine runs `n` as ONNX defines it. The text
/// names the attribute, its value and what to do, without the node's name.
using check_function = std::optional<std::string> (*)(const graph& g, const node& n,
                                                      int64_t version);

/// One operator: every ONNX version of it (since_version, ascending; none for
/// the engine's own operators, which no model names), its shape inference, its
/// reference kernel (the ground truth of the tests and the fallback of every
/// backend) and, where a version defines something the engine does not run, its
/// check. An entry covers all its versions: where a version changed the
/// operator's meaning, its functions follow the version the graph's opset
/// selects.
struct op_entry {
  std::string op; ///< as node::op names it ("Conv", "com.microsoft.Attention")
  std::vector<int64_t> since;
  infer_function infer = nullptr;
  reference_function reference = nullptr;
  check_function check = nullptr; ///< nullptr: nothing any version defines is refused
  /// Each output element comes from the input elements at its index alone, so
  /// that the reference kernel runs on any slice of equally shaped inputs (the
  /// CPU backend's engine.elementwise bands).
  bool elementwise = false;
};

/// The operators of one operator file.
using op_table = std::vector<op_entry>;

/// The first version (since.front()) of each operator of `table`, by name:
/// what an operator file's inference checks a model's opset against.
std::map<std::string, int64_t> first_versions(const op_table& table);

/// What the operators of an operator file refuse alike before their own
/// inference: an opset before the operator's first version `since`, and no
/// first input (`n.op + no_input`). Nothing when neither applies.
std::optional<std::string> refused_opset_or_input(const graph& g, const node& n, int64_t since,
                                                  const char* no_input = " needs its first input");

/// The refusal of a first input whose type is not one of `types` (the types the
/// kernel takes; `", "` between their names); nothing when it is one.
std::optional<std::string> refused_input_type(const graph& g, const node& n,
                                              const std::vector<datatype>& types);

/// An entry's inference that runs its file's common refusals (`Refuse`) first:
/// an operator file's `checked<Infer>` is `refuse_then<its refused_input, Infer>`.
template <std::optional<std::string> (*Refuse)(const graph&, const node&), infer_function Infer>
infer_result refuse_then(const graph& g, const node& n) {
  if (auto e = Refuse(g, n))
    return *e;
  return Infer(g, n);
}

// ------------------------------------------------------------------ shared by the kernels

/// Numpy broadcast of two shapes; nothing when they do not broadcast.
std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a,
                                                     const std::vector<int64_t>& b);

/// Applies an activation named as in FusedConv's `activation` attribute: ""
/// (none), "Relu", "Gelu" (erf), "GeluTanh" (GELU's tanh approximation), "Tanh", "Sigmoid", "Clip" (alpha = min, beta =
/// max), "HardSwish" (x * clip(alpha * x + beta, 0, 1); alpha 1/6, beta 1/2),
/// "Swish" (x * sigmoid(alpha * x); alpha 1 is SiLU).
float apply_activation(const std::string& act, float x, float alpha, float beta);

/// " (opset 17 selects Split-13)": how a check names the version it judged.
std::string selected_version(const graph& g, const node& n, int64_t version);

/// The refusal of attribute `attr`, which `n`'s operator defines from version
/// `first` on, when `version` is older and `n` has it; else nothing. ONNX
/// Runtime refuses such a model, and reading the attribute anyway would run
/// another version.
std::optional<std::string> attribute_from(const graph& g, const node& n, int64_t version,
                                          const char* attr, int64_t first);

/// The check of a reduction whose axes became its second input at version
/// `input_from` (ReduceSum-13, the others' 18): the attribute from then on, the
/// input before, and noop_with_empty_axes (from the same version) are refused.
std::optional<std::string> check_axes_input(const graph& g, const node& n, int64_t version,
                                            int64_t input_from);

namespace ops_internal {

using shape_t = std::vector<int64_t>;

/// The refusal of `n`'s input `i` when it is given and not a constant: `what`
/// (a shape-determining input) must be known before the model runs.
std::optional<std::string> need_constant(const graph& g, const node& n, size_t i,
                                         const char* what);

inline int64_t norm_axis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

/// The values of constant INT64 or INT32 value `v`; empty when `v` is not a constant.
inline std::vector<int64_t> const_ints(const graph& g, int v) {
  std::vector<int64_t> out;
  if (v < 0 || !g.values[v].constant)
    return out;
  const auto& t = *g.values[v].constant;
  for (int64_t i = 0; i < t.elements(); ++i)
    out.push_back(t.dtype == datatype::int32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i]);
  return out;
}

inline std::vector<int64_t> ref_ints(const tensor_ref& t) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t.elements(); ++i)
    out.push_back(t.dtype == datatype::int32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i]);
  return out;
}

inline shape_t strides_of(const shape_t& s) {
  shape_t st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i)
    st[i] = st[i + 1] * s[i + 1];
  return st;
}

/// Strides of `in` read as if broadcast to `out` (0 on broadcast dimensions).
inline shape_t broadcast_strides(const shape_t& in, const shape_t& out) {
  shape_t st(out.size(), 0);
  auto own = strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    st[off + i] = in[i] == 1 ? 0 : own[i];
  return st;
}

/// Calls f(out_index, offsets) for every element of `out`, with each input's
/// element offset under broadcasting.
template <size_t N, class F>
void broadcast_loop(const shape_t& out, const std::array<shape_t, N>& st, F f) {
  int64_t total = element_count(out);
  if (total == 0)
    return;
  size_t rank = out.size();
  shape_t idx(rank, 0);
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k)
        off[k] += st[k][d];
      if (idx[d] < out[d])
        break;
      for (size_t k = 0; k < N; ++k)
        off[k] -= st[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

/// Whether dispatch() has an element type for `t`: what the reference kernels
/// that dispatch on their input's type take.
inline bool dispatchable(datatype t) {
  return t == datatype::fp32 || t == datatype::int64 || t == datatype::int32
         || t == datatype::bool_ || t == datatype::uint8 || t == datatype::int8
         || t == datatype::int16 || t == datatype::uint16 || t == datatype::uint32
         || t == datatype::uint64;
}

template <class F>
void dispatch(datatype t, F f) {
  switch (t) {
    case datatype::fp32: f(float{}); break;
    case datatype::int64: f(int64_t{}); break;
    case datatype::int32: f(int32_t{}); break;
    case datatype::bool_: f(bool{}); break;
    case datatype::uint8: f(uint8_t{}); break;
    case datatype::int8: f(int8_t{}); break;
    case datatype::int16: f(int16_t{}); break;
    case datatype::uint16: f(uint16_t{}); break;
    case datatype::uint32: f(uint32_t{}); break;
    case datatype::uint64: f(uint64_t{}); break;
    default: assert(!"unsupported datatype in a reference kernel");
  }
}

/// GELU with erf, as ONNX's Gelu (approximate "none") and the engine's FusedGelu.
inline float gelu_erf(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}

/// GELU's tanh approximation, as ONNX's Gelu (approximate "tanh"), GPT-2's
/// activation and the engine's FusedGeluTanh:
/// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  constexpr float k = 0.79788456080286536f; // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

} // namespace ops_internal

} // namespace caf_serving::onnx
