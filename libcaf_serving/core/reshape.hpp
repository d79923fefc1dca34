#pragma once
/// Triton's `reshape` in a model's configuration: a tensor's `dims` are what
/// requests and responses carry, its `reshape.shape` what the model runs on.
/// The bytes are the same, so only shapes change: these functions translate
/// them. The backend wrapper that applies them to every batch is
/// executor/reshape_backend.hpp.
///
/// Variable dimensions (-1) carry over in order: the i-th -1 of the target
/// takes the value of the i-th -1 of the source. The config parser has
/// checked that dims and reshape hold the same elements between -1 entries
/// (Triton's rule), so the element count never changes.

#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
#include <vector>

namespace caf_serving {

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

} // namespace caf_serving
