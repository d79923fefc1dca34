#pragma once
/// Every message type exchanged between the pipeline's actors, in one place
/// (STYLE.md). Payloads are Cap'n Proto messages (schemas/serving.capnp) shared by
/// reference inside a process; plain C++ rides alongside only for what never
/// leaves the process (where to deliver a response).

#include "core/message.hpp"
#include "schemas/serving.capnp.h"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace caf_serving {

using request_message = message<wire::InferRequest>;
using response_message = message<wire::InferResponse>;
using batch_message = message<wire::Batch>;
using batch_result_message = message<wire::BatchResult>;

/// Where a request's one response goes. The ingress implements it for each
/// connection's pending request; `deliver` may be called from any thread, once.
class response_sink {
public:
  virtual ~response_sink() = default;
  virtual void deliver(response_message response) = 0;
};

/// A request on its way through the pipeline (ingress -> scheduler).
struct infer_job {
  request_message request;
  std::shared_ptr<response_sink> sink;
};

/// A request the scheduler put into a batch, as the post-processor needs it.
struct batched_job {
  infer_job job;
  int64_t enqueued_ns = 0;
  int64_t batch_formed_ns = 0;
};

/// scheduler -> executor: one batch to run. The reply is a `batch_result_message`.
struct run_batch {
  batch_message batch;
};

/// scheduler -> post-processor: a finished batch and the requests it answers, in
/// the order of the batch's rows.
struct finished_batch {
  batch_result_message result;
  std::vector<batched_job> jobs;
  int64_t compute_start_ns = 0;
  int64_t compute_end_ns = 0;
};

/// Timer tick for the scheduler's batching delay and queue timeouts.
using tick_atom = caf::atom_constant<caf::atom("tick")>;
/// Finish what is queued and in flight, then stop (model unload, shutdown).
using drain_atom = caf::atom_constant<caf::atom("drain")>;

} // namespace caf_serving

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::infer_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::run_batch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::batch_result_message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::finished_batch)
