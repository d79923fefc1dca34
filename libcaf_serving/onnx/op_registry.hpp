#pragma once
/// The one registry of the ONNX operators the engine runs: each operator once,
/// with every ONNX version of it (since_version) from its first up to the
/// newest opset the engine loads (max_opset). The importer refuses a model by
/// it: for the model's opset, an operator's version is the largest
/// since_version <= opset; an operator absent here, or whose first version is
/// above the opset, is unsupported.
///
/// Operators come in tables, one per source file that implements some:
/// ops.cpp's (written in op_registry.cpp), ops_simple.cpp's
/// (simple_operator_table()), ops_nd.cpp's (nd_operator_table()), ops_more.cpp's
/// (more_operator_table()), ... Each table comes with the file's shape
/// inference and reference kernel, which every operator of it has. A new file
/// of operators adds its table with one line in op_registry.cpp's `tables`.
///
/// Backends add kernels of their own through the same names and versions
/// (kernel_table, below): the CPU backend its oneDNN and engine steps
/// (onnx_cpu/cpu_kernels.hpp), the CUDA backend its device steps
/// (cuda/cuda_backend.cpp), each from its own library; a node that no backend
/// kernel takes runs the reference kernel. docs/onnx-backend-layout.md says
/// how to add an operator.
///
/// Usage:
///
///     if (auto v = operator_version("ReduceMean", 18)) ... // 18: axes is an input
///     if (auto why = check_node_version(g, n)) refuse(*why);
///     find_operator("Abs")->reference(n, inputs, outputs);

#include "onnx/ir.hpp"
#include "onnx/ops.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// Shape inference of an operator: its outputs' types and shapes, or what
/// does not fit (infer_shapes()).
using infer_function = std::variant<std::vector<inferred>, std::string> (*)(const graph& g,
                                                                           const node& n);
/// The reference kernel of an operator (run_reference()).
using reference_function = void (*)(const node& n, const std::vector<tensor_ref>& in,
                                    const std::vector<tensor_ref>& out);

/// One operator and its ONNX versions (since_version), ascending; in
/// registered_operators() and find_operator(), with its shape inference and
/// reference kernel (those of the source file whose table holds it).
struct op_versions {
  std::string op;
  std::vector<int64_t> since;
  infer_function infer = nullptr;
  reference_function reference = nullptr;
};

/// The operators of one source file.
using op_table = std::vector<op_versions>;

/// The names of a table of operators (a map from name to an entry with
/// `versions`), in the map's order.
template <class Map>
std::vector<std::string> table_names(const Map& table) {
  std::vector<std::string> names;
  for (const auto& entry : table)
    names.push_back(entry.first);
  return names;
}

/// Each operator of such a map with its versions.
template <class Map>
op_table table_versions(const Map& table) {
  op_table versions;
  for (const auto& entry : table)
    versions.push_back({entry.first, entry.second.versions});
  return versions;
}

/// The operators of ops.cpp.
const op_table& core_operator_table();

/// Every registered operator from every table, sorted by name.
const op_table& registered_operators();

/// How many entries the tables hold together: registered_operators().size()
/// unless two tables register one operator (the first table's entry wins),
/// which the registry's test refuses.
size_t table_entries();

/// The entry of `op`, or nullptr when the engine does not run it.
const op_versions* find_operator(const std::string& op);

/// The version of `op` that a model importing `opset` runs: the largest
/// since_version <= opset; nothing when the engine does not run `op` or ONNX
/// defines it only after `opset`.
std::optional<int64_t> operator_version(const std::string& op, int64_t opset);

/// What in `n`'s attributes or inputs the version of its operator that
/// `g.opset` selects does not define, or defines with a meaning the engine does
/// not implement (BatchNormalization's training_mode, Split's num_outputs
/// before opset 18, ReduceMean's axes attribute from 18 on, ...); nothing when
/// the engine runs `n` as ONNX defines it. The text names the attribute, its
/// value and what to do, without the node's name (the caller adds it).
std::optional<std::string> check_node_version(const graph& g, const node& n);

// ------------------------------------------------------------------ backends' kernels

/// The versions of an operator that a backend's kernel implements: from the
/// operator's since_version `first` up to `last` (0: every later version).
/// A node's version is the one its graph's opset selects (operator_version());
/// the engine's own fused operators (FusedConv, ...) have none, and every
/// range takes them.
struct version_range {
  int64_t first = 1;
  int64_t last = 0;

  bool holds(int64_t version) const {
    return version >= first && (last == 0 || version <= last);
  }
};

/// A backend's kernel for one operator over a range of its versions: `build`
/// makes the step that runs node `n` on the backend (a CPU step of onnx_cpu/,
/// a device step of cuda/), or returns nothing when `n`'s attributes, types
/// or shapes are not those the kernel takes. `Context` is what the backend
/// builds steps with (the graph, its handles, the node's pointers).
template <class Context, class Step>
struct backend_kernel {
  std::string op;
  version_range versions;
  std::string name; ///< what plans print ("onednn.conv", "cudnn_conv")
  std::function<std::optional<Step>(Context& ctx, const graph& g, const node& n)> build;
};

/// One backend's kernels, each registered once from the backend's own library
/// (the model knows no backend): the CPU backend's beyond the reference
/// kernels (onnx_cpu/cpu_kernels.hpp), the CUDA backend's device steps
/// (cuda/cuda_backend.cpp). An operator may have several kernels, tried in the
/// order given; a node that none takes runs the operator's reference kernel
/// (run_reference()), which every registered operator has.
template <class Context, class Step>
class kernel_table {
public:
  using kernel = backend_kernel<Context, Step>;

  explicit kernel_table(std::vector<kernel> kernels) : kernels_(std::move(kernels)) {}

  /// The step of the first kernel for `n.op` whose versions hold the version
  /// `g.opset` selects and that takes `n`; nothing: run the reference kernel.
  std::optional<Step> build(Context& ctx, const graph& g, const node& n) const {
    auto version = operator_version(n.op, g.opset);
    for (const auto& k : kernels_)
      if (k.op == n.op && (!version || k.versions.holds(*version)))
        if (auto s = k.build(ctx, g, n))
          return s;
    return std::nullopt;
  }

  /// Whether some kernel implements `op` (at some version).
  bool has(const std::string& op) const {
    for (const auto& k : kernels_)
      if (k.op == op)
        return true;
    return false;
  }

  /// The operators with a kernel, sorted, each once.
  std::vector<std::string> ops() const {
    std::vector<std::string> names;
    for (const auto& k : kernels_)
      names.push_back(k.op);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  const std::vector<kernel>& kernels() const { return kernels_; }

private:
  std::vector<kernel> kernels_;
};

} // namespace caf_serving::onnx
