#include "onnx/op_registry.hpp"

#include "onnx/ops_contrib.hpp"
#include "onnx/ops_elementwise.hpp"
#include "onnx/ops_more.hpp"
#include "onnx/ops_nd.hpp"
#include "onnx/ops_nn.hpp"
#include "onnx/ops_quant.hpp"
#include "onnx/ops_shape.hpp"
#include "onnx/ops_simple.hpp"

#include <cassert>
#include <cstring>
#include <map>

namespace caf_serving::onnx {

namespace {

/// A table of operators of one operator file.
using table_function = const op_table& (*)();

/// Every table of operators a model may name; a new file of operators adds its
/// table here.
const std::vector<table_function>& tables() {
  static const std::vector<table_function> all{
    &elementwise_operator_table, &shape_operator_table, &nn_operator_table,
    &simple_operator_table,      &nd_operator_table,    &more_operator_table,
    &contrib_operator_table,     &quant_operator_table,
  };
  return all;
}

/// Every table of the engine's own operators.
const std::vector<table_function>& engine_tables() {
  static const std::vector<table_function> all{
    &elementwise_engine_table,
    &nn_engine_table,
    &contrib_engine_table,
    &quant_engine_table,
  };
  return all;
}

std::map<std::string, op_entry> by_name(const std::vector<table_function>& from) {
  std::map<std::string, op_entry> m;
  for (auto table : from)
    for (const auto& e : table())
      m.emplace(e.op, e);
  return m;
}

const std::map<std::string, op_entry>& onnx_by_name() {
  static const auto all = by_name(tables());
  return all;
}

const std::map<std::string, op_entry>& engine_by_name() {
  static const auto all = by_name(engine_tables());
  return all;
}

op_table sorted(const std::map<std::string, op_entry>& m) {
  op_table v;
  for (const auto& [name, e] : m)
    v.push_back(e);
  return v;
}

const op_entry* find_in(const std::map<std::string, op_entry>& m, const std::string& op) {
  auto it = m.find(op);
  return it == m.end() ? nullptr : &it->second;
}

/// The entry of `op`, a model's operator or one of the engine's.
const op_entry* entry_of(const std::string& op) {
  if (const auto* e = find_operator(op))
    return e;
  return find_engine_operator(op);
}

} // namespace

const op_table& registered_operators() {
  static const op_table all = sorted(onnx_by_name());
  return all;
}

const op_table& engine_operators() {
  static const op_table all = sorted(engine_by_name());
  return all;
}

size_t table_entries() {
  size_t n = 0;
  for (const auto* from : {&tables(), &engine_tables()})
    for (auto table : *from)
      n += table().size();
  return n;
}

const op_entry* find_operator(const std::string& op) {
  return find_in(onnx_by_name(), op);
}

const op_entry* find_engine_operator(const std::string& op) {
  return find_in(engine_by_name(), op);
}

std::optional<int64_t> operator_version(const std::string& op, int64_t opset) {
  const auto* e = find_operator(op);
  if (!e)
    return std::nullopt;
  std::optional<int64_t> v;
  for (auto s : e->since)
    if (s <= opset)
      v = s;
  return v;
}

std::optional<std::string> check_node_version(const graph& g, const node& n) {
  const auto* e = find_operator(n.op);
  if (!e || !e->check)
    return std::nullopt;
  auto version = operator_version(n.op, g.opset);
  if (!version)
    return std::nullopt; // not at this opset: the importer refuses it
  return e->check(g, n, *version);
}

infer_result infer_shapes(const graph& g, const node& n) {
  const auto* e = entry_of(n.op);
  if (!e)
    return "no shape inference for operator '" + n.op + "'";
  return e->infer(g, n);
}

void run_reference(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  const auto* e = entry_of(n.op);
  if (!e) {
    assert(!"run_reference: operator without a reference kernel");
    return;
  }
  e->reference(n, in, out);
}

std::vector<std::vector<uint8_t>> run_reference_graph(const graph& g,
                                                      const std::vector<std::string>& inputs) {
  std::vector<std::vector<uint8_t>> buf(g.values.size());
  std::vector<void*> ptr(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (g.values[v].constant) {
      ptr[v] = const_cast<uint8_t*>(g.values[v].constant->bytes.data());
    } else {
      buf[v].resize(element_count(g.values[v].shape) * element_size(g.values[v].dtype) + 1);
      ptr[v] = buf[v].data();
    }
  }
  for (size_t i = 0; i < g.inputs.size() && i < inputs.size(); ++i)
    std::memcpy(ptr[g.inputs[i]], inputs[i].data(),
                std::min(inputs[i].size(), buf[g.inputs[i]].size()));
  for (const auto& n : g.nodes) {
    std::vector<tensor_ref> in, out;
    for (int i : n.inputs)
      in.push_back(i >= 0 ? tensor_ref{g.values[i].dtype, g.values[i].shape, ptr[i]}
                          : tensor_ref{});
    for (int o : n.outputs)
      out.push_back(o >= 0 ? tensor_ref{g.values[o].dtype, g.values[o].shape, ptr[o]}
                           : tensor_ref{});
    run_reference(n, in, out);
  }
  std::vector<std::vector<uint8_t>> outs;
  for (int o : g.outputs) {
    auto* b = static_cast<const uint8_t*>(ptr[o]);
    outs.emplace_back(b, b + element_count(g.values[o].shape) * element_size(g.values[o].dtype));
  }
  return outs;
}

bool foldable(const std::string& op) {
  // Shape arithmetic runs through ConstantOfShape and Expand too, so every
  // operator folds; outputs stay as small as the graph's own tensors.
  return !op.empty();
}

} // namespace caf_serving::onnx
