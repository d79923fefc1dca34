#pragma once
/// ModelStreamInfer for generative (decoupled) models (issue 34), the
/// protocol half: a KServe gRPC request to a generative model in, the plain
/// `generate_request` of generate_codec.hpp out; one step of generated text
/// in, the ModelStreamInferResponse Triton's clients read out. No network,
/// no pipeline (generate_convert.test.cpp drives it alone).
///
/// Requests are read as Triton's vLLM backend reads them: the model's inputs
/// (text_input BYTES, stream BOOL, sampling_parameters BYTES holding JSON,
/// exclude_input_in_output BOOL, return_finish_reason, ...) and the request's
/// parameters (temperature, max_tokens, ... as typed InferParameters). They
/// are written out as the JSON body of Triton's generate endpoint and parsed
/// by parse_triton_generate, so that gRPC and HTTP take exactly the same
/// fields with the same checks and messages.
///
/// Usage (grpc_server.cpp):
///
///   auto read = grpc_api::to_generate_request(proto, generate_model_info_of(model.config), limits);
///   if (!read) write(grpc_api::to_generate_error({proto.id(), name, version}, read.error().message));
///   ... admit_generation(model, read->request), submit_generation ...
///   write(grpc_api::to_generate_response(step));      // one per update
///
/// Responses carry Triton's `triton_final_response` parameter (true on the
/// last response of a request, false before); a request with the parameter
/// `triton_enable_empty_final_response: true` gets its text in responses
/// that are not final and then an empty final response without outputs.

#include "core/error.hpp"
#include "ingress/generate_codec.hpp"
#include "ingress/kserve_codec.hpp"

#include "grpc_service.pb.h"

#include <cstdint>
#include <optional>
#include <string_view>

namespace caf_serving::ingress::grpc_api {

/// A ModelStreamInfer request to a generative model, read.
struct stream_generate_request {
  generate_request request;
  /// Triton's request parameter triton_enable_empty_final_response: the
  /// last response of the request is an empty one (no outputs) whose only
  /// news is triton_final_response: true.
  bool empty_final_response = false;
};

/// Reads `request` for the generative model `model` (generate_model_info_of
/// its config). Inputs come from typed contents or raw_input_contents
/// (to_infer_request's rules); every failure is a 400 naming the input or
/// parameter: an element count that does not match the shape, a prompt that
/// is not UTF-8, shared memory (not taken for generative requests), and
/// everything parse_triton_generate refuses.
result<stream_generate_request> to_generate_request(const inference::ModelInferRequest& request,
                                                    const generate_model_info& model,
                                                    const request_limits& limits);

/// What every response of one request names.
struct generate_response_meta {
  std::string_view id;
  std::string_view model_name;
  std::string_view model_version;
};

/// One response of a generative request.
struct generate_response {
  generate_response_meta meta;
  /// The output text_output (BYTES, shape [1]); none for Triton's empty
  /// final response, which has no outputs.
  std::optional<std::string_view> text_output;
  /// triton_final_response.
  bool final = false;
  /// vLLM's optional outputs, each written when set: finish_reason (BYTES
  /// "stop", "length", or "None" while running), num_input_tokens and
  /// num_output_tokens (UINT32), all of shape [1].
  std::optional<generation_finish> finish_reason;
  std::optional<uint32_t> num_input_tokens;
  std::optional<uint32_t> num_output_tokens;
};

inference::ModelStreamInferResponse to_generate_response(const generate_response& r);

/// A failed generative request, as Triton answers one on a stream: the
/// error_message set, the request's id, model and version, no outputs, and
/// triton_final_response: true (nothing more comes for it). The stream goes
/// on.
inference::ModelStreamInferResponse to_generate_error(const generate_response_meta& meta,
                                                      std::string_view message);

} // namespace caf_serving::ingress::grpc_api
