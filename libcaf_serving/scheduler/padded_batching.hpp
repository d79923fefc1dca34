#pragma once
/// Padded batching (opt-in, a feature Triton lacks): requests whose input shapes
/// differ only in a named dimension (a sequence length) share a batch. The
/// scheduler pads each such input up to the batch's longest request with the
/// configured pad value, and slices each listed output back to the request's own
/// length on the way out.
///
/// The model must be mask-correct for this to leave results unchanged: padded
/// positions must not influence the real ones (BERT with attention_mask set to 0
/// on the padding is; a model that, say, averages over the whole sequence is not).
/// The user opts in per model; the engine cannot check it.
///
/// This header is the configuration, plain C++ for the policies; what padded
/// batching reads of a request on the wire is padded_request.hpp.
///
/// Configured in config.pbtxt's `parameters` (string values, Triton-loadable):
///   padded_batching           "input_ids:1:0;attention_mask:1:0"  input:dim:pad value
///   padded_batching_max_waste "0.25"  largest fraction of padded elements per batch
///   padded_outputs            "last_hidden_state:1"  output:dim sliced back; outputs
///                             not listed are returned whole
/// `dim` indexes the request tensor's shape with the batch dimension as 0 (so a
/// [batch, sequence] input names 1); it must be a variable (-1) dimension.

#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::scheduler {

struct padded_input {
  std::string name;
  /// Index into the request tensor's shape (batch dimension = 0).
  unsigned dim = 1;
  double pad_value = 0;
};

struct padded_output {
  std::string name;
  unsigned dim = 1;
};

struct padded_batching_config {
  /// Empty: padded batching is off.
  std::vector<padded_input> inputs;
  std::vector<padded_output> outputs;
  /// Largest fraction of a batch's elements (along the padded dimension) that
  /// may be padding, in [0, 1).
  double max_waste = 0.25;

  bool enabled() const { return !inputs.empty(); }
  const padded_input* input(const std::string& name) const;
  const padded_output* output(const std::string& name) const;
};

/// Reads the three parameters. Returns a load error saying what is wrong (an
/// unknown input, a fixed or batch dimension, an unparsable number, a datatype
/// that cannot be padded, a model without a batch dimension). No parameters:
/// a disabled config.
result<padded_batching_config> read_padded_batching(const model_config& model);

/// Writes `count` elements of `pad_value` as `dtype` at `out`.
void fill_pad(uint8_t* out, size_t count, datatype dtype, double pad_value);

} // namespace caf_serving::scheduler
