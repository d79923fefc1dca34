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
/// (more_operator_table()). A new file of operators adds its table with one
/// line in op_registry.cpp's `tables`.
///
/// Usage:
///
///     if (auto v = operator_version("ReduceMean", 18)) ... // 18: axes is an input
///     if (auto why = check_node_version(g, n)) refuse(*why);

#include "onnx/ir.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::onnx {

/// One operator and its ONNX versions (since_version), ascending.
struct op_versions {
  std::string op;
  std::vector<int64_t> since;
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

} // namespace caf_serving::onnx
