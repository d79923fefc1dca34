#pragma once
/// What padded batching (padded_batching.hpp) reads of a request on the wire:
/// its length along the padded dimensions, and whether its padded inputs agree
/// on it. Apart from padded_batching.hpp so that the batching policies' library
/// stays without the wire types (schemas/serving.capnp.h).

#include "core/error.hpp"
#include "scheduler/padded_batching.hpp"
#include "schemas/serving.capnp.h"

#include <cstdint>
#include <optional>

namespace caf_serving::scheduler {

/// The length of `request` along the padded dimensions: the largest of them (a
/// request's padded inputs normally share one length). 0 when padding is off.
uint64_t padded_length(const padded_batching_config& pad,
                       wire::InferRequest::Reader request);

/// A request's padded inputs must share one length: padded to a batch's longest
/// they would otherwise agree where the request alone would be refused. Returns
/// the 400 that says so, or nothing.
std::optional<serving_error> check_padded_lengths(const padded_batching_config& pad,
                                                  wire::InferRequest::Reader request);

} // namespace caf_serving::scheduler
