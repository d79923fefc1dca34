#pragma once
/// STRING tensors (Triton's BYTES) in ONNX models: a graph may carry a STRING
/// input that it only copies to an output (Identity), or does not use at all,
/// beside what it computes. The importer takes those tensors out of the graph
/// (graph::strings); these functions give their configs and the config of
/// the numeric rest, which the engine runs. The backend that serves the
/// STRING tensors around it is onnx_cpu/string_backend.hpp. A graph that
/// computes on strings is refused at import.
///
/// Usage:
///
///     auto tensors = string_tensors(g.strings, given_config, max_batch); // checked
///     auto numeric = without_strings(given_config, g);                  // loaded as usual

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "onnx/ir.hpp"

#include <vector>

namespace caf_serving::onnx {

/// The STRING inputs' and outputs' configs, dims from the graph (batch
/// dimension left out when `max_batch_size` > 0, which may be autofilled and
/// so differ from `given`'s), or names a contradiction with `given` (a STRING
/// tensor declared with another data_type or rank).
struct string_configs {
  std::vector<tensor_config> inputs, outputs;
};
result<string_configs> string_tensors(const string_passthrough& strings,
                                      const model_config& given, int max_batch_size);

/// `given` without the STRING tensors: what the numeric graph is loaded with.
model_config without_strings(model_config given, const graph& g);

} // namespace caf_serving::onnx
