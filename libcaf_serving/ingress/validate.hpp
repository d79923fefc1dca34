#pragma once
/// Checks a parsed inference request against the model it is for, so that
/// nothing malformed reaches the scheduler. Every failure is a 400 whose
/// message says what was wrong and what the model expects.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/model_config.hpp"
#include "ingress/kserve_codec.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

/// What validation learned about a request that passed it.
struct validated_request {
  /// The shared batch dimension of all inputs; 1 for a model without batching.
  uint32_t batch_size = 1;
};

/// Checks `request` against `model`: every model input present, no unknown or
/// repeated input, datatypes, ranks and fixed dimensions, batch size within
/// max_batch_size and equal across inputs, element counts within
/// limits.max_elements, byte sizes that match the shape, well-formed BYTES
/// elements, requested outputs that exist, and classification only on numeric
/// outputs.
result<validated_request> validate(const infer_request& request, const model_config& model,
                                   const request_limits& limits = {});

/// Names a tensor in an error message: "input 'x'", or a text given whole
/// ("the output"). It holds views of its parts, which are joined only when a
/// message is written: a request that passes its checks builds no text.
class tensor_label {
public:
  tensor_label(const char* whole) : name_(whole) {}
  tensor_label(const std::string& whole) : name_(whole) {}
  tensor_label(std::string_view whole) : name_(whole) {}
  /// "<kind> '<name>'"; `kind` is a literal such as "input".
  tensor_label(const char* kind, std::string_view name) : kind_(kind), name_(name) {}

  std::string text() const;

private:
  const char* kind_ = nullptr;
  std::string_view name_;
};

/// The product of `shape`, checked: no negative dimension, no overflow, at most
/// `max_elements`. `what` names the tensor in the message.
result<uint64_t> checked_element_count(const std::vector<int64_t>& shape, uint64_t max_elements,
                                       const tensor_label& what);

/// Triton's message for a tensor whose byte size passes INT64_MAX ("byte size
/// overflow for input 'x': ..."), which its tests match on.
std::string byte_size_overflow(const tensor_label& what, uint64_t count, uint64_t element_bytes);

/// How many elements a BYTES tensor's data holds, checking that every 4-byte
/// length stays within the data. `what` names the tensor in the message.
result<uint64_t> count_bytes_elements(std::string_view data, const tensor_label& what);

/// "[1,3,224,224]".
std::string format_shape(const std::vector<int64_t>& shape);

} // namespace caf_serving::ingress
