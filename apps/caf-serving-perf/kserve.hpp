/// The KServe v2 side of the load generator: reading a model's metadata,
/// turning `-b`/`--shape` into concrete input shapes, making input data
/// (zero, random or from a perf_analyzer-style JSON file), encoding infer
/// request bodies (JSON or the binary tensor extension), and reading the
/// `/v2/models/{m}/stats` document (Triton's field names).
///
/// Nothing here does I/O; every function takes text and returns values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::perf {

// -- model metadata ----------------------------------------------------------

/// One input or output as the server's metadata describes it.
struct tensor_meta {
  std::string name;
  std::string datatype;
  /// -1 marks a dimension the request chooses (batch or variable).
  std::vector<int64_t> shape;
};

struct model_metadata {
  std::string name;
  std::vector<tensor_meta> inputs;
  std::vector<tensor_meta> outputs;
};

struct metadata_result {
  model_metadata value;
  std::string error;
};

/// Parses the body of `GET /v2/models/{m}`.
metadata_result parse_model_metadata(std::string_view json);

// -- input shapes ------------------------------------------------------------

/// One `--shape NAME:D1,D2,...`.
struct shape_override {
  std::string name;
  std::vector<int64_t> dims;
};

struct shape_config {
  /// `-b`: fills a leading -1 (the batch dimension).
  int64_t batch_size = 1;
  std::vector<shape_override> shapes;
};

/// An input with every dimension known.
struct resolved_input {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::size_t element_count = 0;
};

struct resolve_result {
  std::vector<resolved_input> inputs;
  std::string error;
};

/// Size in bytes of one element, or 0 for BYTES and unknown types.
std::size_t datatype_size(std::string_view datatype);

/// Chooses each input's shape. A `--shape` with as many dimensions as the
/// metadata is the whole shape; with one fewer and a leading -1 in the
/// metadata, the batch size is put in front (perf_analyzer's convention).
/// Fixed dimensions must match the metadata.
resolve_result resolve_shapes(const model_metadata& meta,
                              const shape_config& config);

// -- input data ----------------------------------------------------------------

enum class input_data_kind { zero, random, file };

/// One input tensor of one request, its elements as little-endian bytes (for
/// BYTES: each element a 4-byte length and the bytes, as in the binary
/// extension).
struct tensor_value {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// All inputs of one request.
using input_set = std::vector<tensor_value>;

struct input_data_config {
  input_data_kind kind = input_data_kind::zero;
  /// The file's text when `kind` is `file`.
  std::string file_text;
  uint64_t seed = 1;
};

struct input_data_result {
  std::vector<input_set> sets;
  std::string error;
};

/// Makes the request inputs: one set for zero and random data, one per entry
/// of a file's `"data"` array.
input_data_result make_input_data(const std::vector<resolved_input>& inputs,
                                  const input_data_config& config);

// -- infer request bodies ------------------------------------------------------

enum class tensor_format { binary, json };

/// A request-level parameter of every request (perf_analyzer's
/// --request-parameter NAME:VALUE:TYPE), e.g. Triton's `timeout` in
/// microseconds, the request's own deadline.
struct request_parameter {
  std::string name;
  /// The value as JSON text: a number, true/false, or a quoted string.
  std::string json_value;
};

/// Parses NAME:VALUE:TYPE (TYPE int, string or bool); `error` says why not.
struct request_parameter_result {
  request_parameter value;
  std::string error;
};
request_parameter_result parse_request_parameter(std::string_view text);

struct infer_body_config {
  tensor_format input_format = tensor_format::binary;
  tensor_format output_format = tensor_format::binary;
  /// Outputs to ask for in binary; ignored for JSON output.
  std::vector<std::string> output_names;
  /// The request's "parameters" object (none when empty).
  std::vector<request_parameter> parameters;
};

/// A request body and the headers it needs (each line ending in "\r\n").
struct infer_body {
  std::string headers;
  std::string body;
};

infer_body build_infer_body(const input_set& inputs,
                            const infer_body_config& config);

// -- statistics ----------------------------------------------------------------

/// A count of requests (or executions) and their summed duration.
struct stat_duration {
  uint64_t count = 0;
  uint64_t ns = 0;
};

/// The cumulative statistics of one model (all versions summed).
struct model_stats {
  uint64_t inference_count = 0;
  uint64_t execution_count = 0;
  stat_duration success;
  stat_duration fail;
  stat_duration queue;
  stat_duration compute_input;
  stat_duration compute_infer;
  stat_duration compute_output;
};

struct stats_result {
  model_stats value;
  std::string error;
};

/// Parses the body of `GET /v2/models/{m}/stats`.
stats_result parse_model_stats(std::string_view json, std::string_view model);

/// Per-request averages over the interval between two snapshots, in
/// microseconds. `overhead_us` is what the server's request time holds beyond
/// queue and compute.
struct server_breakdown {
  bool valid = false;
  uint64_t request_count = 0;
  uint64_t execution_count = 0;
  double request_us = 0;
  double queue_us = 0;
  double compute_input_us = 0;
  double compute_infer_us = 0;
  double compute_output_us = 0;
  double overhead_us = 0;
};

server_breakdown stats_delta(const model_stats& before,
                             const model_stats& after);

} // namespace caf_serving::perf
