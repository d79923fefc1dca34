#pragma once
/// KServe v2 gRPC messages (schemas/grpc_service.proto) to the ingress's plain
/// structs and back: the protocol half of the gRPC ingress, with no network
/// and no pipeline, so that it is tested alone (convert.test.cpp).
///
/// Usage (grpc_server.cpp):
///
///   auto parsed = grpc_api::to_infer_request(proto_request, limits);
///   if (!parsed) finish(grpc_api::to_status(parsed.error()));
///   ... validate(*parsed, model.config, limits), the pipeline ...
///   auto reply = grpc_api::to_infer_response(view, requested);
///
/// Tensor data: an input sent in raw_input_contents is viewed in place (the
/// request message must outlive the infer_request); typed contents are
/// converted once into the input's own bytes. Answers always carry
/// raw_output_contents, as Triton's do.

#include "core/error.hpp"
#include "ingress/kserve_codec.hpp"

#include "grpc_service.pb.h"

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::ingress::grpc_api {

/// Triton's gRPC status for an error the engine reports with an HTTP status:
/// 400 INVALID_ARGUMENT, 404 NOT_FOUND, 408 DEADLINE_EXCEEDED, 413
/// RESOURCE_EXHAUSTED, 429 and 503 UNAVAILABLE (a full queue, a shed
/// request, a model that is not ready), 403 PERMISSION_DENIED, 405 and 501
/// UNIMPLEMENTED, anything else INTERNAL. The message is kept.
::grpc::Status to_status(const serving_error& e);

/// A request's model version: "" is 0 (the newest served); otherwise a
/// positive integer, else a 400 naming the text.
result<int64_t> parse_version(const std::string& text, const std::string& model);

/// The request as the HTTP codec would have parsed it: id, the parameters
/// priority and timeout (microseconds), other parameters as text, inputs
/// (raw contents viewed in place, typed contents converted, shared-memory
/// references), and outputs (classification, shared memory). 400 with a
/// message naming the input and the field at fault for: raw contents whose
/// count is not the number of inputs, raw and typed contents both given, an
/// unknown datatype, typed contents in the wrong field for the datatype or
/// with a count that does not match the shape, FP16/BF16 sent typed, an
/// input without data, a parameter of the wrong kind.
result<infer_request> to_infer_request(const inference::ModelInferRequest& request,
                                       const request_limits& limits);

/// The answer to a request: model, version, id, and each output's name,
/// datatype, shape and raw contents (one copy of the bytes). An output the
/// request placed in shared memory gets an empty raw entry, so that the
/// entries stay aligned with the outputs as clients index them.
inference::ModelInferResponse to_infer_response(const response_view& view,
                                                const std::vector<requested_output>& requested);

/// Base64 of `bytes` (RFC 4648, padded): a load request's file:<path>
/// parameters arrive as raw bytes over gRPC and as base64 over HTTP, which
/// is what the model manager reads.
std::string base64_encode(std::string_view bytes);

} // namespace caf_serving::ingress::grpc_api
