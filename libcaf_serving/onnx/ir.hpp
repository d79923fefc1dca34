#pragma once
/// The ONNX backend's graph IR: values (tensors) and nodes in topological order.
///
/// Shapes are static except the batch dimension: a graph as imported may hold -1
/// in a dimension; `specialize()` (passes.hpp) copies the graph for one concrete
/// set of input shapes, and from then on every shape is known. Constant tensors
/// (initializers, folded values) are shared between copies, never duplicated.
///
/// Usage:
///
///     graph g;
///     int x = g.add_value("x", datatype::fp32, {-1, 3, 224, 224});
///     auto& n = g.add_node("Relu", "relu0", {x}, {g.add_value("y")});

#include "core/datatype.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::onnx {

/// Immutable tensor contents (weights, folded constants).
struct tensor_data {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  int64_t elements() const;
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
  template <class T>
  T* as_mut() { return reinterpret_cast<T*>(bytes.data()); }
};
using constant_ptr = std::shared_ptr<const tensor_data>;

/// A tensor flowing through the graph.
struct value {
  std::string name;
  datatype dtype = datatype::fp32;
  /// Empty while unknown (rank unknown); -1 in a dimension not yet known.
  std::vector<int64_t> shape;
  bool shape_known = false;
  /// Set when the value is known before the model runs.
  constant_ptr constant;
};

/// One attribute; which field is used depends on `kind`.
struct attribute {
  enum class kind_t { i, f, s, ints, floats, tensor } kind = kind_t::i;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  constant_ptr t;
};

struct node {
  /// ONNX op type, or an engine-internal fused op ("FusedConv", "FusedMatMul",
  /// "FusedLayerNorm", "FusedGelu", "FusedAttention").
  std::string op;
  std::string name;
  /// Value indices; -1 for an omitted optional input.
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::map<std::string, attribute> attrs;

  bool has(const std::string& a) const { return attrs.count(a) > 0; }
  int64_t get_i(const std::string& a, int64_t fallback) const;
  float get_f(const std::string& a, float fallback) const;
  std::string get_s(const std::string& a, const std::string& fallback) const;
  std::vector<int64_t> get_ints(const std::string& a, std::vector<int64_t> fallback = {}) const;
  void set_i(const std::string& a, int64_t v);
  void set_f(const std::string& a, float v);
  void set_s(const std::string& a, std::string v);
  void set_ints(const std::string& a, std::vector<int64_t> v);
};

struct graph {
  std::vector<value> values;
  std::vector<node> nodes;
  std::vector<int> inputs;  ///< graph inputs that are not initializers, in order
  std::vector<int> outputs;
  int64_t opset = 0;
  std::string producer;

  int add_value(std::string name, datatype dtype = datatype::fp32,
                std::vector<int64_t> shape = {}, bool shape_known = false);
  int add_constant(std::string name, constant_ptr data);
  node& add_node(std::string op, std::string name, std::vector<int> inputs,
                 std::vector<int> outputs);

  /// Node index producing each value (-1 for inputs and constants).
  std::vector<int> producers() const;
  /// How many node inputs (plus graph outputs) read each value.
  std::vector<int> use_counts() const;
};

/// "[2,3,-1]"
std::string shape_string(const std::vector<int64_t>& shape);
int64_t element_count(const std::vector<int64_t>& shape);

/// A new constant of `dtype` and `shape`, zero-filled.
std::shared_ptr<tensor_data> make_tensor(datatype dtype, std::vector<int64_t> shape);

} // namespace caf_serving::onnx
