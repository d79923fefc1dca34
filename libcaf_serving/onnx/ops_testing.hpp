#pragma once
/// Helpers for the unit tests of single operators (ops_nd.test.cpp,
/// ops_more.test.cpp): one node on given tensors, some of them constants as an
/// exporter writes them, through the registry's shape inference and reference
/// kernels (op_registry.hpp).
///
/// Usage:
///
///     auto y = ok(run_node("Pad", {f32({2, 2}, {...}), constant(i64({4}, {...}))}));

#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx::testing {

/// A tensor given to or returned by one operator; `constant` inputs are known
/// before the model runs (initializers), the others are graph inputs.
struct tensor {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool constant = false;
  bool omitted = false; ///< an optional input left out ("" in ONNX)

  template <class T>
  std::vector<T> values() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};

template <class T>
tensor make(datatype dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  REQUIRE(static_cast<int64_t>(v.size()) == element_count(shape));
  tensor t{dtype, std::move(shape), std::vector<uint8_t>(v.size() * sizeof(T))};
  if (!v.empty())
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

inline tensor f32(std::vector<int64_t> shape, const std::vector<float>& v) {
  return make(datatype::fp32, std::move(shape), v);
}
inline tensor i64(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  return make(datatype::int64, std::move(shape), v);
}
inline tensor constant(tensor t) {
  t.constant = true;
  return t;
}
inline tensor omitted() {
  tensor t;
  t.omitted = true;
  return t;
}

inline attribute int_attr(int64_t v) {
  attribute a;
  a.kind = attribute::kind_t::i;
  a.i = v;
  return a;
}
inline attribute float_attr(float v) {
  attribute a;
  a.kind = attribute::kind_t::f;
  a.f = v;
  return a;
}
inline attribute string_attr(std::string v) {
  attribute a;
  a.kind = attribute::kind_t::s;
  a.s = std::move(v);
  return a;
}
inline attribute ints_attr(std::vector<int64_t> v) {
  attribute a;
  a.kind = attribute::kind_t::ints;
  a.ints = std::move(v);
  return a;
}

/// What one node and its settings are.
struct node_case {
  std::string op;
  std::vector<tensor> inputs;
  std::map<std::string, attribute> attrs = {};
  int64_t opset = 17;
  size_t outputs = 1;
};

/// Runs the node: its shape inference, then its reference kernel. The string
/// is inference's error.
inline std::variant<std::vector<tensor>, std::string> run_node(const node_case& c) {
  graph g;
  g.opset = c.opset;
  std::vector<int> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const auto& t = c.inputs[i];
    if (t.omitted) {
      ins.push_back(-1);
    } else if (t.constant) {
      auto data = make_tensor(t.dtype, t.shape);
      data->bytes.assign(t.bytes.begin(), t.bytes.end());
      ins.push_back(g.add_constant("in" + std::to_string(i), data));
    } else {
      ins.push_back(g.add_value("in" + std::to_string(i), t.dtype, t.shape, true));
    }
  }
  std::vector<int> outs;
  for (size_t o = 0; o < c.outputs; ++o) outs.push_back(g.add_value("out" + std::to_string(o)));
  auto& n = g.add_node(c.op, c.op + "_0", ins, outs);
  n.attrs = c.attrs;
  auto inf = infer_shapes(g, n);
  if (auto* e = std::get_if<std::string>(&inf))
    return *e;
  std::vector<tensor> results;
  for (const auto& o : std::get<std::vector<inferred>>(inf))
    results.push_back({o.dtype, o.shape,
                       std::vector<uint8_t>(element_count(o.shape) * element_size(o.dtype))});
  std::vector<tensor_ref> in_refs, out_refs;
  for (const auto& t : c.inputs) {
    auto* data = const_cast<uint8_t*>(t.bytes.data());
    in_refs.push_back(t.omitted ? tensor_ref{} : tensor_ref{t.dtype, t.shape, data});
  }
  for (auto& t : results) out_refs.push_back({t.dtype, t.shape, t.bytes.data()});
  run_reference(n, in_refs, out_refs);
  return results;
}

inline std::vector<tensor> ok(std::variant<std::vector<tensor>, std::string> r) {
  if (auto* e = std::get_if<std::string>(&r))
    FAIL("inference refused: " << *e);
  return std::get<std::vector<tensor>>(r);
}

/// The first output of a node that must run.
inline tensor ok1(const node_case& c) {
  return ok(run_node(c)).at(0);
}

/// Inference's error for a node that must be refused.
inline std::string refused(const node_case& c) {
  auto r = run_node(c);
  REQUIRE_MESSAGE(std::holds_alternative<std::string>(r), c.op << " was accepted");
  return std::get<std::string>(r);
}

} // namespace caf_serving::onnx::testing
