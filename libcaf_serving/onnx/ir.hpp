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

#include <cassert>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::onnx {

/// A tensor's bytes: owned, or a read-only view of a region that `keeper`
/// holds alive (a memory-mapped external data file, shared by every constant
/// read from it). Reads look like a std::vector<uint8_t>'s; writes (`assign`,
/// `resize`, the mutable `data()`) are for owned bytes only.
class tensor_bytes {
public:
  tensor_bytes() = default;
  /// A view of `[data, data + size)`, valid while `keeper` lives.
  static tensor_bytes view(std::shared_ptr<const void> keeper, const uint8_t* data,
                           size_t size) {
    tensor_bytes b;
    b.keeper_ = std::move(keeper);
    b.view_ = data;
    b.view_size_ = size;
    return b;
  }

  bool is_view() const { return keeper_ != nullptr; }
  const uint8_t* data() const { return is_view() ? view_ : owned_.data(); }
  /// Writable only when owned: a mapped file is read-only.
  uint8_t* data() {
    assert(!is_view() && "a constant viewing a mapped file is read-only");
    return owned_.data();
  }
  size_t size() const { return is_view() ? view_size_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size(); }
  uint8_t operator[](size_t i) const { return data()[i]; }
  uint8_t& operator[](size_t i) { return data()[i]; }

  void assign(size_t n, uint8_t v) { drop_view(); owned_.assign(n, v); }
  template <class It>
  void assign(It first, It last) { drop_view(); owned_.assign(first, last); }
  void resize(size_t n) { drop_view(); owned_.resize(n); }

private:
  void drop_view() {
    keeper_.reset();
    view_ = nullptr;
    view_size_ = 0;
  }

  std::vector<uint8_t> owned_;
  std::shared_ptr<const void> keeper_;
  const uint8_t* view_ = nullptr;
  size_t view_size_ = 0;
};

/// Immutable tensor contents (weights, folded constants).
struct tensor_data {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  tensor_bytes bytes;

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
  /// "FusedLayerNorm", "FusedGelu", "FusedGeluTanh", "FusedAttention").
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

/// STRING tensors (Triton's BYTES), which the engine passes through but never
/// computes on: they are not among the graph's inputs, outputs or nodes.
struct string_passthrough {
  struct input {
    std::string name;
    std::vector<int64_t> shape; ///< as the graph declares it; -1 where variable
  };
  struct output {
    std::string name;
    std::string input; ///< the STRING input it copies unchanged (through Identity nodes)
  };
  std::vector<input> inputs;
  std::vector<output> outputs;
};

struct graph {
  std::vector<value> values;
  std::vector<node> nodes;
  std::vector<int> inputs;  ///< graph inputs that are not initializers, in order
  std::vector<int> outputs;
  string_passthrough strings;
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

/// Who reads each value (the node indices, once per input slot) and which
/// values the graph outputs; the fusion passes use it to know when a pattern's
/// intermediate values may be removed. A snapshot: rebuild it after editing.
struct value_readers {
  std::vector<std::vector<int>> readers;
  std::vector<bool> is_output;

  explicit value_readers(const graph& g);
  /// The only node reading `v`, when `v` is read exactly once and is no graph output; else -1.
  int single(int v) const {
    if (v < 0 || is_output[v] || readers[v].size() != 1)
      return -1;
    return readers[v][0];
  }
};

/// "[2,3,-1]"
std::string shape_string(const std::vector<int64_t>& shape);
int64_t element_count(const std::vector<int64_t>& shape);

/// A new constant of `dtype` and `shape`, zero-filled.
std::shared_ptr<tensor_data> make_tensor(datatype dtype, std::vector<int64_t> shape);

} // namespace caf_serving::onnx
