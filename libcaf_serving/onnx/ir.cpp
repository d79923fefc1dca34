#include "onnx/ir.hpp"

namespace caf_serving::onnx {

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

int64_t tensor_data::elements() const {
  return element_count(shape);
}

std::shared_ptr<tensor_data> make_tensor(datatype dtype, std::vector<int64_t> shape) {
  auto t = std::make_shared<tensor_data>();
  t->dtype = dtype;
  t->shape = std::move(shape);
  t->bytes.assign(static_cast<size_t>(element_count(t->shape)) * element_size(dtype), 0);
  return t;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t node::get_i(const std::string& a, int64_t fallback) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? fallback : it->second.i;
}

float node::get_f(const std::string& a, float fallback) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? fallback : it->second.f;
}

std::string node::get_s(const std::string& a, const std::string& fallback) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? fallback : it->second.s;
}

std::vector<int64_t> node::get_ints(const std::string& a, std::vector<int64_t> fallback) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? fallback : it->second.ints;
}

void node::set_i(const std::string& a, int64_t v) {
  auto& at = attrs[a];
  at.kind = attribute::kind_t::i;
  at.i = v;
}

void node::set_f(const std::string& a, float v) {
  auto& at = attrs[a];
  at.kind = attribute::kind_t::f;
  at.f = v;
}

void node::set_s(const std::string& a, std::string v) {
  auto& at = attrs[a];
  at.kind = attribute::kind_t::s;
  at.s = std::move(v);
}

void node::set_ints(const std::string& a, std::vector<int64_t> v) {
  auto& at = attrs[a];
  at.kind = attribute::kind_t::ints;
  at.ints = std::move(v);
}

int graph::add_value(std::string name, datatype dtype, std::vector<int64_t> shape,
                     bool shape_known) {
  values.push_back({std::move(name), dtype, std::move(shape), shape_known, nullptr});
  return static_cast<int>(values.size()) - 1;
}

int graph::add_constant(std::string name, constant_ptr data) {
  int v = add_value(std::move(name), data->dtype, data->shape, true);
  values[v].constant = std::move(data);
  return v;
}

node& graph::add_node(std::string op, std::string name, std::vector<int> in,
                      std::vector<int> out) {
  nodes.push_back({std::move(op), std::move(name), std::move(in), std::move(out), {}});
  return nodes.back();
}

std::vector<int> graph::producers() const {
  std::vector<int> p(values.size(), -1);
  for (size_t n = 0; n < nodes.size(); ++n)
    for (int o : nodes[n].outputs)
      if (o >= 0)
        p[o] = static_cast<int>(n);
  return p;
}

value_readers::value_readers(const graph& g)
  : readers(g.values.size()), is_output(g.values.size()) {
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int i : g.nodes[n].inputs)
      if (i >= 0)
        readers[i].push_back(static_cast<int>(n));
  for (int o : g.outputs)
    is_output[o] = true;
}

std::vector<int> graph::use_counts() const {
  std::vector<int> u(values.size(), 0);
  for (const auto& n : nodes)
    for (int i : n.inputs)
      if (i >= 0)
        ++u[i];
  for (int o : outputs)
    ++u[o];
  return u;
}

} // namespace caf_serving::onnx
