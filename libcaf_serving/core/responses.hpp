#pragma once
/// The parts of an InferResponse every stage writes the same way: the request's
/// id, model, version and stage times at the head of its response, and the
/// response that carries only an error. The scheduler (requests it refuses or
/// times out) and the post-processor (batches that failed) both answer with
/// these.

#include "core/error.hpp"
#include "core/pipeline_messages.hpp"

namespace caf_serving {

/// Copies the request's id, model name and version and its stage times into `out`.
void start_response(wire::InferResponse::Builder out, const wire::InferRequest::Reader& request);

/// A response carrying only an error, for a request that got no outputs.
response_message error_response(const wire::InferRequest::Reader& request,
                                const serving_error& error);

} // namespace caf_serving
