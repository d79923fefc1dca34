#pragma once
/// The backend that serves an ONNX model's STRING tensors (onnx/string_passthrough.hpp)
/// around its numeric part: each STRING output's bytes are copied from the
/// input the graph copies it from, and the other tensors go to the inner backend.
///
///     auto be = onnx::with_strings(inner, g.strings); // inner: null if nothing computes

#include "executor/backend.hpp"
#include "onnx/ir.hpp"

#include <memory>

namespace caf_serving::onnx {

/// A backend that writes the STRING outputs and hands the other tensors to
/// `inner` (null: the graph computes nothing else).
std::shared_ptr<executor::backend> with_strings(std::shared_ptr<executor::backend> inner,
                                                const string_passthrough& strings);

} // namespace caf_serving::onnx
