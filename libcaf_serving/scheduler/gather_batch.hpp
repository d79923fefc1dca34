#pragma once
/// The requests of one batch, gathered into one Batch message: what the
/// scheduler actor does with the ids of a dispatch decision. Also the key under
/// which requests may share a batch (the policy's request_info::shape_class).
///
/// Wire types on purpose: this is where batching meets schemas/serving.capnp.
/// The policies (batching_policy.hpp, slo_policy.hpp) see plain structs only.

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "core/pipeline_messages.hpp"
#include "scheduler/padded_batching.hpp"

#include <cstdint>
#include <vector>

namespace caf_serving::scheduler {

/// Gathers the requests' inputs along the batch dimension into one Batch. A batch
/// of one request references that request's bytes instead of copying them.
/// Inputs of every request are in the model's input order (the ingress orders them).
/// Checks what batching relies on: every request has the first one's inputs with
/// equal datatypes and non-batch dims, and no input passes a Cap'n Proto `Data`
/// field. A failed check is an internal error naming what differs (the policy
/// batches only equal shapes, so it is a bug or a shape-key collision).
/// With padded batching, the padded dimension of each padded input may differ:
/// the batch takes the longest, and shorter requests are filled with the pad value.
result<batch_message> gather_batch(const model_config& model, uint64_t batch_id,
                                   const std::vector<batched_job>& jobs,
                                   const padded_batching_config& padding = {});

/// The key under which a request may share a batch (request_info::shape_class):
/// a hash of every input's non-batch dims when the model has a variable
/// non-batch dimension, else 0. The padded dimensions of `padding` are left out.
uint64_t shape_class_of(const model_config& model, wire::InferRequest::Reader request,
                        const padded_batching_config& padding = {});

} // namespace caf_serving::scheduler
