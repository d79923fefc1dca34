#pragma once
/// The pipeline's messages of an inference request, the same for every
/// ingress protocol: the Cap'n Proto InferRequest built from a parsed and
/// validated request, the answer's outputs as views, and the count of a
/// successful answer in the model's statistics. admission.hpp uses them; a
/// protocol calls admission.

#include "core/pipeline_messages.hpp"
#include "core/stats.hpp"
#include "ingress/kserve_codec.hpp"
#include "server/model_directory.hpp"

#include <cstdint>

namespace caf_serving::ingress {

/// The request message for `request` to `model`: its inputs in the model's
/// order (the scheduler gathers them by position), the outputs asked for, and
/// the received and validated timestamps. This is the one copy of tensor
/// bytes between the protocol's buffer and the executor; `rows` is the
/// validated batch size. Fails only when a shared-memory input cannot be
/// read.
result<request_message> make_request_message(const infer_request& request,
                                             const server::model_pipeline& model,
                                             uint32_t rows, int64_t received_ns);

/// Counts a successful answer sent `elapsed_ns` after the request arrived:
/// success, the request-latency histogram, the latency target's goodput or
/// deadline miss (against the target, or the request's tighter `timeout_us`),
/// and the time of the last inference.
void record_success(model_stats& stats, uint64_t elapsed_ns, uint64_t timeout_us);

/// The outputs of a successful answer `r` as views into its message (no
/// copy; `r` must outlive the view), and with `timing` the request's
/// per-stage times in microseconds as response parameters (ingress_us,
/// queue_us, compute_input_us, compute_infer_us, compute_output_us,
/// until_response_us). Model name, version and id are the caller's.
response_view make_response_view(wire::InferResponse::Reader r, bool timing);

} // namespace caf_serving::ingress
