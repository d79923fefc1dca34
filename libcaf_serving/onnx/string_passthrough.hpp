#pragma once
/// STRING tensors (Triton's BYTES) in ONNX models: a graph may carry a STRING
/// input that it only copies to an output (Identity), or does not use at all,
/// beside what it computes. The importer takes those tensors out of the graph
/// (graph::strings); this backend serves them around the numeric model,
/// copying each STRING output's bytes from its input, while the engine runs
/// the rest. A graph that computes on strings is refused at import.
///
/// Usage:
///
///     auto tensors = string_tensors(g, given_config);   // checked against config.pbtxt
///     auto be = with_strings(inner, g.strings, *tensors); // inner: null if nothing computes

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "executor/backend.hpp"
#include "onnx/ir.hpp"

#include <memory>
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

/// A backend that writes the STRING outputs and hands the other tensors to
/// `inner` (null: the graph computes nothing else).
std::shared_ptr<executor::backend> with_strings(std::shared_ptr<executor::backend> inner,
                                                const string_passthrough& strings);

} // namespace caf_serving::onnx
