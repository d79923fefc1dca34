#include "onnx/op_registry.hpp"

#include "onnx/ops_contrib.hpp"
#include "onnx/ops_more.hpp"
#include "onnx/ops_nd.hpp"
#include "onnx/ops_quant.hpp"
#include "onnx/ops_simple.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace caf_serving::onnx {

const op_table& core_operator_table() {
  // Every version ONNX 1.23.2 defines (onnx.defs.get_all_schemas_with_history()),
  // from the first up to opset 28. Where a version from 13 on changed what the
  // operator means, the comment says so and check_node_version() or the kernel
  // (ops.cpp) follows the version the model selects. Every other version from
  // 13 on changed only the spec's type lists, which the engine checks by
  // datatype when inference meets them: bfloat16 (13 for most; Where,
  // GreaterOrEqual, LessOrEqual 16; ConstantOfShape 20; Conv, the pools 22),
  // float8 (19, 20), int4/uint4 (21), float4 (23), float8e8m0 (24), int2/uint2
  // (25), float6 (Cast-28), string (Equal-19), sequences and optionals
  // (Identity-14, 16); int8/uint8/int16/uint16 of Add, Sub, Mul, Div (14),
  // bfloat16 exponents of Pow (15), Range's float16/bfloat16 (27).
  static const op_table ops{
    {"Add", {1, 6, 7, 13, 14}},
    {"And", {1, 7}},
    {"AveragePool", {1, 7, 10, 11, 19, 22}}, // 10: ceil_mode; 19: dilations
    {"BatchNormalization", {1, 6, 7, 9, 14, 15}}, // 14: training_mode (refused unless 0)
    // 19: saturate, 24: round_mode; both only change casts to float8 types,
    // which the engine refuses by `to`.
    {"Cast", {1, 6, 9, 13, 19, 21, 23, 24, 25, 28}},
    {"CastLike", {15, 19, 21, 23, 24, 25}}, // Cast to the type of input 1
    {"Clip", {1, 6, 11, 12, 13}},           // 11: min and max are inputs
    {"Concat", {1, 4, 11, 13}},
    {"Constant", {1, 9, 11, 12, 13, 19, 21, 23, 24, 25}}, // 12: value_float(s), value_int(s)
    {"ConstantOfShape", {9, 20, 21, 23, 24, 25}},
    {"Conv", {1, 11, 22}},
    {"Div", {1, 6, 7, 13, 14}},
    {"Equal", {1, 7, 11, 13, 19}},
    {"Erf", {9, 13}},
    {"Expand", {8, 13}},
    {"Flatten", {1, 9, 11, 13, 21, 23, 24, 25}},
    {"Gather", {1, 11, 13}},
    {"Gemm", {1, 6, 7, 9, 11, 13}},
    {"GlobalAveragePool", {1, 22}},
    {"Greater", {1, 7, 9, 13}},
    {"GreaterOrEqual", {12, 16}},
    {"Identity", {1, 13, 14, 16, 19, 21, 23, 24, 25}},
    // 1: onnxruntime's own LayerNormalization in the default domain (ONNX defines it from
    // 17 on, alike), which its transformer optimizer writes into models of opsets below 17.
    {"LayerNormalization", {1, 17}},
    {"Less", {1, 7, 9, 13}},
    {"LessOrEqual", {12, 16}},
    {"MatMul", {1, 9, 13}},
    {"MaxPool", {1, 8, 10, 11, 12, 22}}, // 10: ceil_mode, dilations
    {"Mul", {1, 6, 7, 13, 14}},
    {"Not", {1}},
    {"Or", {1, 7}},
    {"Pow", {1, 7, 12, 13, 15}}, // 12: the exponent may have another type than the base
    {"Range", {11, 27}},         // 27: stash_type, for float16/bfloat16 only
    {"ReduceMean", {1, 11, 13, 18}}, // 18: axes is an input; noop_with_empty_axes
    {"ReduceSum", {1, 11, 13}},      // 13: axes is an input; noop_with_empty_axes
    {"Relu", {1, 6, 13, 14}},        // 14: signed integers
    {"Reshape", {1, 5, 13, 14, 19, 21, 23, 24, 25}}, // 14: allowzero
    {"Shape", {1, 13, 15, 19, 21, 23, 24, 25}},      // 15: start and end
    {"Sigmoid", {1, 6, 13}},
    {"Slice", {1, 10, 11, 13}},
    {"Softmax", {1, 11, 13}}, // 13: one axis, not the flattened tail
    {"Split", {1, 2, 11, 13, 18}}, // 13: split is an input; 18: num_outputs, uneven last part
    {"Sqrt", {1, 6, 13}},
    {"Squeeze", {1, 11, 13, 21, 23, 24, 25}},   // 13: axes is an input
    {"Sub", {1, 6, 7, 13, 14}},
    {"Tanh", {1, 6, 13}},
    {"Transpose", {1, 13, 21, 23, 24, 25}},
    {"Unsqueeze", {1, 11, 13, 21, 23, 24, 25}}, // 13: axes is an input
    {"Where", {9, 16}},
  };
  return ops;
}

namespace {

/// One source file's operators with its shape inference and reference kernel.
struct operator_file {
  const op_table& (*table)();
  infer_function infer;
  reference_function reference;
};

/// Every table of operators; a new file of operators adds its table here.
/// ops.cpp's own operators are inferred and run inline by infer_shapes() and
/// run_reference(), which hand the other files' operators to their functions.
const std::vector<operator_file>& tables() {
  static const std::vector<operator_file> all{
    {&core_operator_table, &infer_shapes, &run_reference},
    {&simple_operator_table, &infer_simple_op, &run_simple_op},
    {&nd_operator_table, &infer_nd_op, &run_nd_op},
    {&more_operator_table, &infer_more_op, &run_more_op},
    {&contrib_operator_table, &infer_contrib_op, &run_contrib_op},
    {&quant_operator_table, &infer_quant_op, &run_quant_op},
  };
  return all;
}

const std::map<std::string, op_versions>& by_name() {
  static const std::map<std::string, op_versions> all = [] {
    std::map<std::string, op_versions> m;
    for (const auto& file : tables())
      for (const auto& e : file.table())
        m.emplace(e.op, op_versions{e.op, e.since, file.infer, file.reference});
    return m;
  }();
  return all;
}

bool has_input(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

std::string version_name(const node& n, int64_t v) {
  return n.op + "-" + std::to_string(v);
}

} // namespace

const op_table& registered_operators() {
  static const op_table all = [] {
    op_table v;
    for (const auto& [name, e] : by_name())
      v.push_back(e);
    return v;
  }();
  return all;
}

size_t table_entries() {
  size_t n = 0;
  for (const auto& file : tables())
    n += file.table().size();
  return n;
}

const op_versions* find_operator(const std::string& op) {
  auto it = by_name().find(op);
  return it == by_name().end() ? nullptr : &it->second;
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
  if (is_contrib_op(n.op))
    return check_contrib_node(n);
  auto version = operator_version(n.op, g.opset);
  if (!version)
    return std::nullopt; // not an ONNX operator the registry knows: the importer refuses it
  int64_t v = *version;
  const std::string name = version_name(n, v);
  const std::string at = " (opset " + std::to_string(g.opset) + " selects " + name + ")";
  // An attribute that the selected version does not define: ONNX Runtime
  // refuses such a model, and reading it anyway would run another version.
  auto only_from = [&](const char* attr, int64_t first) -> std::optional<std::string> {
    if (v >= first || !n.has(attr))
      return std::nullopt;
    return "attribute '" + std::string(attr) + "' exists from " + n.op + "-"
           + std::to_string(first) + " on" + at + "; re-export the model with opset "
           + std::to_string(first) + " or newer, or without the attribute";
  };
  // The reductions whose axes became an input (ReduceSum at 13, these at 18).
  // ReduceMax, ReduceMin and ReduceProd are left to their shape inference
  // (ops_more.cpp), which refuses the axes input before opset 18.
  static const std::set<std::string> axes_input_reductions{
    "ReduceMean", "ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
    "ReduceLogSumExp"};
  if (axes_input_reductions.count(n.op)) {
    int64_t input_from = n.op == "ReduceSum" ? 13 : 18;
    if (v >= input_from && n.has("axes"))
      return "attribute 'axes' was replaced by the second input 'axes' in " + n.op + "-"
             + std::to_string(input_from) + at + "; pass the axes as a constant input";
    if (v < input_from && has_input(n, 1))
      return name + " takes its axes as an attribute; the second input 'axes' exists from "
             + n.op + "-" + std::to_string(input_from) + " on" + at
             + "; re-export with a newer opset";
    if (auto e = only_from("noop_with_empty_axes", input_from))
      return e;
  }
  if (n.op == "Split") {
    if (auto e = only_from("num_outputs", 18))
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
  }
  if (n.op == "Squeeze" || n.op == "Unsqueeze") {
    if (n.has("axes"))
      return "attribute 'axes' was replaced by the second input 'axes' in " + n.op + "-13" + at
             + "; pass the axes as a constant input";
    if (n.op == "Unsqueeze" && !has_input(n, 1)) // optional only for Squeeze
      return "the second input 'axes' is missing" + at + "; Unsqueeze needs it";
  }
  if (n.op == "BatchNormalization") {
    if (n.get_i("training_mode", 0) != 0)
      return "attribute 'training_mode' is " + std::to_string(n.get_i("training_mode", 0)) + at
             + ": the engine runs inference only (the running mean and variance); export the "
               "model in eval mode (model.eval()) or set training_mode=0";
    for (size_t i = 1; i < n.outputs.size(); ++i)
      if (n.outputs[i] >= 0)
        return "output " + std::to_string(i) + " (running mean or variance) is used" + at
               + ", which exists only in training mode; export the model in eval mode";
  }
  if (n.op == "Shape") {
    if (auto e = only_from("start", 15))
      return e;
    if (auto e = only_from("end", 15))
      return e;
  }
  if (n.op == "Reshape")
    if (auto e = only_from("allowzero", 14))
      return e;
  if (n.op == "AveragePool")
    if (auto e = only_from("dilations", 19))
      return e;
  if (n.op == "MaxPool" && n.get_i("storage_order", 0) != 0 && n.outputs.size() > 1
      && n.outputs[1] >= 0)
    return "attribute 'storage_order' is 1 with the Indices output" + at
           + ", which the engine does not compute; use only the first output";
  if (n.op == "Constant")
    for (const char* a : {"value_string", "value_strings", "sparse_value"})
      if (n.has(a))
        return "attribute '" + std::string(a) + "'" + at + " is a kind of constant the engine "
               "does not run (it runs value, value_float(s) and value_int(s)); fold the "
               "constant into the model's inputs";
  return std::nullopt;
}

} // namespace caf_serving::onnx
