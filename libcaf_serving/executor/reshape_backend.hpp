#pragma once
/// Triton's `reshape` for any backend (core/reshape.hpp): requests and
/// responses carry a tensor's config `dims`, the model runs on its
/// `reshape.shape`. The wrapper rewrites each input's shape before the inner
/// backend runs and each output's shape as the inner backend allocates it.
/// With batching the batch dimension stays in front.
///
/// Usage:
///
///     auto inner = std::make_shared<my_backend>(...);      // sees reshape shapes
///     auto be = executor::with_reshape(inner, cfg);        // serves dims shapes

#include "core/model_config.hpp"
#include "executor/backend.hpp"

#include <memory>

namespace caf_serving::executor {

/// `inner` (which runs on model_side(cfg) shapes) serving cfg's dims. Returns
/// `inner` itself when no tensor has a reshape.
std::shared_ptr<backend> with_reshape(std::shared_ptr<backend> inner, const model_config& cfg);

} // namespace caf_serving::executor
