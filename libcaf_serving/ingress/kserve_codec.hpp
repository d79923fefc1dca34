#pragma once
/// KServe v2 (Triton HTTP/REST) inference requests and responses: bytes in,
/// plain structs out, and back. No networking here; the HTTP server calls it.
///
/// Usage:
///
///   ingress::parse_input in;
///   in.body = body;                            // must outlive the request
///   in.header_length = inference_header_content_length;   // if the header came
///   in.content_type = content_type;
///   auto req = ingress::parse_infer_request(in);
///   if (!req) reply(req.error().status, ingress::serialize_error(req.error().message));
///   auto ok = ingress::validate(*req, config);             // validate.hpp
///   ...
///   auto out = ingress::serialize_infer_response(view, options);
///
/// Covered: the JSON request (flat or nested "data"), the binary tensor data
/// extension (Inference-Header-Content-Length), the raw binary request
/// (application/octet-stream, no JSON, one input), and the classification
/// extension's request parameter (the post-processor computes it). Tensor data is always raw little-endian bytes; a BYTES element is
/// a 4-byte little-endian length followed by its bytes, as in the binary
/// extension.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/json.hpp"
#include "core/model_config.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace caf_serving::ingress {

// -- limits -------------------------------------------------------------------

/// What one request may ask for. The HTTP server enforces max_body_bytes (400)
/// before it reads the body; the parser enforces the rest (400), and checks the
/// body length again so that it never trusts a caller that forgot.
struct request_limits {
  /// Largest request body, after decompression; a larger one is Triton's 400
  /// (body_too_large).
  size_t max_body_bytes = size_t{256} << 20;
  /// Most elements in one tensor (the product of its shape).
  uint64_t max_elements = uint64_t{1} << 28;
  /// Most dimensions in one shape.
  size_t max_rank = 16;
  /// Most inputs, and most requested outputs, in one request.
  size_t max_tensors = 1024;
  /// How deep a JSON tensor's "data" may nest, counting "data" itself as
  /// depth 0: an element at this depth is refused. Triton's limit
  /// (HTTP_MAX_JSON_NESTING_DEPTH), which its clients and tests rely on; the
  /// nesting need not follow the shape, only the element count must.
  size_t max_data_depth = 100;
};

// -- requests -----------------------------------------------------------------

/// Where a tensor lives instead of the request or response body: a window of
/// a registered shared-memory region (the parameters shared_memory_region,
/// shared_memory_offset and shared_memory_byte_size; shared_memory.hpp).
struct shared_memory_ref {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

/// One input tensor. `data` is raw little-endian bytes; it points either into
/// the request body (binary data, no copy) or into `owned` (converted from
/// JSON). Moving an infer_input keeps `data` valid only through
/// infer_input's own move operations, which re-point it.
struct infer_input {
  std::string name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::string_view data;
  std::string owned;
  /// Set when the data is in shared memory; `data` is empty until
  /// bind_shared_memory (shm_tensors.hpp) points it into the region.
  std::optional<shared_memory_ref> shared_memory;

  infer_input() = default;
  infer_input(const infer_input& other);
  infer_input(infer_input&& other) noexcept;
  infer_input& operator=(const infer_input& other);
  infer_input& operator=(infer_input&& other) noexcept;
  ~infer_input() = default;

  /// Whether `data` lives in `owned` rather than in the request body.
  bool owns_data() const;
};

/// One output the client asked for by name.
struct requested_output {
  std::string name;
  /// Whether to send this output as binary data: the output's own
  /// "binary_data" parameter, false without one. As in Triton, the request's
  /// "binary_data_output" does not apply to outputs listed in the request.
  bool binary = false;
  /// Classification extension: return the top `classification` classes
  /// instead of the tensor. 0: return the tensor itself.
  uint32_t classification = 0;
  /// Write the output into this shared-memory window; the response then
  /// carries only its name, datatype and shape (as Triton's does).
  std::optional<shared_memory_ref> shared_memory;
};

struct infer_request {
  std::string id;
  std::vector<infer_input> inputs;
  /// Empty: the client asked for every output, as JSON unless
  /// binary_data_output says otherwise.
  std::vector<requested_output> outputs;
  /// The request's "binary_data_output" parameter: whether the outputs sent
  /// because none were listed are binary. A raw binary request
  /// (Inference-Header-Content-Length: 0) sets it, as Triton does.
  bool binary_data_output = false;
  /// The request's "priority" parameter; 0 means the model's default level.
  uint32_t priority = 0;
  /// The request's "timeout" parameter in microseconds; 0 means none.
  uint64_t timeout_us = 0;
  /// Request-level parameters other than the ones above, as their JSON text
  /// (strings unquoted and unescaped, numbers and booleans as written).
  std::map<std::string, std::string> parameters;
};

/// What parse_infer_request reads.
struct parse_input {
  /// The whole (already decompressed) HTTP body. Binary inputs point into it,
  /// so it must stay alive and unmoved while the request is used.
  std::string_view body;
  /// Inference-Header-Content-Length, when the header was present.
  std::optional<uint64_t> header_length;
  /// The Content-Type header ("" when absent).
  std::string_view content_type;
  request_limits limits;
  /// How many bytes after the end of `body` may be read (not written). When
  /// these and the binary data after the JSON header make at least 64
  /// (SIMDJSON_PADDING), the JSON is parsed in place; otherwise the JSON part
  /// is copied once into a padded buffer. Binary data is never copied here.
  size_t readable_padding = 0;
  /// The model, needed only for a raw binary body (application/octet-stream
  /// without Inference-Header-Content-Length): such a body is the raw bytes of
  /// the model's single input. Null: raw binary bodies are rejected.
  const model_config* model = nullptr;
};

/// Triton's 400 for a request body over the input size limit (Triton's
/// --http-max-input-size; this server's --max-body-bytes, which also takes
/// Triton's name), in Triton's words: "Raw input has a byte_size (N bytes) that
/// exceeds the maximum allowed value of M bytes. Use --http-max-input-size to
/// increase the limit." for a raw request, else "request JSON size of N bytes
/// exceeds the maximum allowed input size of M bytes. Use ...". `size` is
/// empty when only "more than the limit" is known (a chunked body cut off).
serving_error body_too_large(std::optional<uint64_t> size, uint64_t limit, bool raw);

/// Parses a KServe v2 inference request. Every failure is a 400 with a message
/// that names the field at fault (a body over limits.max_body_bytes too, as
/// in Triton). Checks what the JSON alone can tell (types, shapes against data
/// counts, binary sizes against the body); validate() checks it against the
/// model.
result<infer_request> parse_infer_request(const parse_input& in);

// -- responses ----------------------------------------------------------------

/// One output tensor of a response, viewed, not owned.
struct output_view {
  std::string_view name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  /// Raw little-endian bytes; BYTES elements as 4-byte length + bytes.
  std::string_view data;
};

struct response_view {
  std::string_view model_name;
  std::string_view model_version;
  /// The request's id; omitted from the response when empty.
  std::string_view id;
  std::vector<output_view> outputs;
  /// Response-level "parameters", e.g. per-stage timings in microseconds.
  /// Written in this order.
  std::vector<std::pair<std::string, uint64_t>> parameters;
};

struct serialize_options {
  /// What the request asked for. Outputs of the response not listed here are
  /// written anyway (the caller decides which outputs to send); listed ones
  /// take their binary flag and shared-memory region from here. Classification
  /// is the post-processor's (postprocess/classification.hpp): its results
  /// arrive here as BYTES outputs.
  std::vector<requested_output> requested;
  /// The request's binary_data_output: the default for outputs not listed.
  bool binary_data_output = false;
  /// Binary output data: appended to `body` (a copy), or, with
  /// `by_reference`, left where the response_view points and listed in
  /// serialized_response::binary_data, for a writer that sends the pieces
  /// as they are (vectored) while it keeps the outputs alive.
  enum class binary_output { appended, by_reference };
  binary_output binary = binary_output::appended;
};

struct serialized_response {
  /// The JSON, followed by the binary data unless that is in binary_data.
  std::string body;
  /// With binary_output::by_reference: the binary data that follows `body`,
  /// in order, pointing into the response_view's outputs.
  std::vector<std::string_view> binary_data;
  /// Inference-Header-Content-Length: set when binary data follows the JSON.
  std::optional<size_t> header_length;
  /// "application/json", or "application/octet-stream" with binary data.
  std::string content_type;
};

/// Writes a KServe v2 inference response. Floating-point numbers are written
/// with the fewest digits that read back to the same value; NaN and infinities,
/// which JSON cannot hold, are written as null. FP16 and BF16 outputs sent as
/// JSON are converted to FP32 values (exactly: every FP16/BF16 value is an FP32
/// value); sent as binary they stay 16-bit. Fails (500) only on output data
/// that does not match its shape and datatype, which is a bug upstream.
result<serialized_response> serialize_infer_response(const response_view& response,
                                                     const serialize_options& options);

/// {"error":"<message>"}, the body of every error response. Control
/// characters, quotes and backslashes are escaped; invalid UTF-8 becomes U+FFFD.
std::string serialize_error(std::string_view message);

} // namespace caf_serving::ingress
