#pragma once
/// The one registry of the operators the engine runs, and the only way to
/// them: infer_shapes() and run_reference() look a node's operator up here and
/// call its entry's own shape inference and reference kernel, as ONNX
/// Runtime's kernel registry does.
///
/// Each operator is one entry (op_entry, ops_common.hpp): every ONNX version
/// of it (since_version) from its first up to the newest opset the engine
/// loads (max_opset), its shape inference, its reference kernel and, where a
/// version defines something the engine does not run, its check. The importer
/// refuses a model by it: for the model's opset, an operator's version is the
/// largest since_version <= opset; an operator absent here, or whose first
/// version is above the opset, is unsupported.
///
/// Entries come in tables, one per operator file: ops_elementwise.cpp,
/// ops_shape.cpp, ops_nn.cpp, ops_simple.cpp, ops_nd.cpp, ops_more.cpp,
/// ops_contrib.cpp (com.microsoft), ops_quant.cpp. The engine's own operators,
/// which passes write and no model names (FusedConv, QLinearAdd, ...), have
/// tables of their own: infer_shapes() and run_reference() find them, the
/// importer does not. A new operator is one entry of a table; a new file of
/// operators adds its table with one line in op_registry.cpp's `tables()`.
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
///     auto shapes = infer_shapes(g, n);
///     run_reference(n, inputs, outputs);

#include "onnx/ir.hpp"
#include "onnx/ops_common.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::onnx {

// ------------------------------------------------------------------ the operators

/// Every operator a model may name (ONNX's and the com.microsoft ones), from
/// every table, sorted by name.
const op_table& registered_operators();

/// The engine's own operators (the fused ones of passes.cpp, the 8-bit ones of
/// quant_passes.cpp, ...), sorted by name: no model names them, and the
/// importer refuses them.
const op_table& engine_operators();

/// How many entries the tables hold together: registered_operators().size()
/// plus engine_operators().size() unless two tables register one operator (the
/// first table's entry wins), which the registry's test refuses.
size_t table_entries();

/// The entry of `op`, an operator a model may name, or nullptr when the
/// engine does not run it.
const op_entry* find_operator(const std::string& op);

/// The entry of `op`, one of the engine's own operators, or nullptr.
const op_entry* find_engine_operator(const std::string& op);

/// The version of `op` that a model importing `opset` runs: the largest
/// since_version <= opset; nothing when the engine does not run `op` or ONNX
/// defines it only after `opset`.
std::optional<int64_t> operator_version(const std::string& op, int64_t opset);

/// What in `n`'s attributes or inputs the version of its operator that
/// `g.opset` selects does not define, or defines with a meaning the engine does
/// not implement (BatchNormalization's training_mode, Split's num_outputs
/// before opset 18, ReduceMean's axes attribute from 18 on, ...): the entry's
/// check; nothing when the engine runs `n` as ONNX defines it. The text names
/// the attribute, its value and what to do, without the node's name (the caller
/// adds it).
std::optional<std::string> check_node_version(const graph& g, const node& n);

// ------------------------------------------------------------------ running them

/// Output types and shapes of `n` given its input values (which must have known
/// shapes; shape-determining inputs such as Reshape's target must be constants):
/// its entry's shape inference. The error says what does not fit, without the
/// node's name (the caller adds it).
infer_result infer_shapes(const graph& g, const node& n);

/// Runs the reference kernel of `n`'s entry. Shapes are those infer_shapes()
/// gave. The reference kernels are plain, single-threaded C++ (MatMul and Gemm
/// call OpenBLAS): they fold constants at compile time, run the operators that
/// have no faster kernel, and are what every backend's kernel is checked against.
void run_reference(const node& n, const std::vector<tensor_ref>& inputs,
                   const std::vector<tensor_ref>& outputs);

/// Runs a specialized graph (every shape known) with the reference kernels
/// only: the baseline that optimized graphs and compiled plans are checked
/// against. `inputs` holds the graph inputs' bytes in order; returns the
/// outputs' bytes in order.
std::vector<std::vector<uint8_t>> run_reference_graph(const graph& g,
                                                      const std::vector<std::string>& inputs);

/// Whether folding `op` on constants is worth it (every op but those that
/// materialise large tensors from tiny ones).
bool foldable(const std::string& op);

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
