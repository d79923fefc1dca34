#pragma once
/// Operators whose result for one batch row depends on the other rows: the
/// executor runs a batch of several requests as one tensor, so through such a
/// graph a request's answer would depend on what it was batched with (a wrong
/// answer, and one that changes with the load). DynamicQuantizeLinear takes
/// one scale over the whole tensor; a Reduce, ArgMax, Softmax, CumSum, TopK or
/// normalization over axis 0 mixes rows. For such a model the backend turns
/// dynamic batching off at load (each request runs alone, as it would on
/// onnxruntime) and logs the node that made it.
///
/// What is seen: the node's own axis attribute or constant axes input. Axis 0
/// is taken as the batch axis; a negative axis counts as 0 where the input's
/// rank is known. A graph that moves the batch to another axis first
/// (Transpose, Reshape) and then reduces over it is not recognised.
///
///     if (auto why = batch_coupling(g)) turn_off_batching(*why);

#include "onnx/ir.hpp"

#include <optional>
#include <string>

namespace caf_serving::onnx {

/// The first node of `g` that computes across batch rows, described for a
/// log line ("node 'q' (DynamicQuantizeLinear) quantizes with one scale over
/// the whole tensor"); nothing when every operator keeps rows apart.
std::optional<std::string> batch_coupling(const graph& g);

} // namespace caf_serving::onnx
