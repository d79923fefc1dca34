#pragma once
/// Triton's `reshape` for any backend: requests and responses carry a
/// tensor's config `dims`, the model runs on its `reshape.shape`. The bytes
/// are the same, so only the shapes change hands: the wrapper rewrites each
/// input's shape before the inner backend runs and each output's shape as the
/// inner backend allocates it. With batching the batch dimension stays in
/// front.
///
/// Usage:
///
///     auto inner = std::make_shared<my_backend>(...);   // sees reshape shapes
///     auto be = onnx::with_reshape(inner, cfg);         // serves dims shapes
///
/// Variable dimensions (-1) carry over in order: the i-th -1 of the target
/// takes the value of the i-th -1 of the source. The config parser has
/// checked that dims and reshape hold the same elements between -1 entries
/// (Triton's rule), so the element count never changes.

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "executor/backend.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace caf_serving::onnx {

/// Whether any input or output of `cfg` has a reshape.
bool has_reshape(const model_config& cfg);

/// `cfg` as the model sees it: every tensor's dims replaced by its reshape
/// (the reshape itself is kept, so that the client's view can be restored).
model_config model_side(model_config cfg);

/// `actual` (a concrete shape that matches `from`, with the batch dimension in
/// front when `batched`) rewritten to the pattern `to`. Fails when the element
/// counts would differ.
result<std::vector<int64_t>> reshape_dims(const std::vector<int64_t>& actual,
                                          const std::vector<int64_t>& from,
                                          const std::vector<int64_t>& to, bool batched);

/// `inner` (which runs on model_side(cfg) shapes) serving cfg's dims. Returns
/// `inner` itself when no tensor has a reshape.
std::shared_ptr<executor::backend> with_reshape(std::shared_ptr<executor::backend> inner,
                                                const model_config& cfg);

} // namespace caf_serving::onnx
