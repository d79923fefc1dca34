#pragma once
/// Triton's classification extension, computed by the post-processor: an
/// output asked for with "parameters": {"classification": k} is answered as a
/// BYTES tensor of the k highest values of each row, "<value>:<index>" or
/// "<value>:<index>:<label>" (labels from config.pbtxt's label_filename).
///
///     classify_input in{datatype::fp32, {2, 10}, bytes, 3, batch_dimension::present};
///     auto t = classify(in);   // shape [2, 3], 6 BYTES elements

#include "core/datatype.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::postprocess {

/// Whether the first dimension of a tensor is its batch dimension.
enum class batch_dimension { absent, present };

struct classify_input {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  /// Raw little-endian bytes of the tensor.
  std::string_view data;
  /// How many classes to return per row (clamped to the number of classes).
  uint32_t k = 1;
  batch_dimension batch = batch_dimension::absent;
  /// Labels by class index; an index past the end gets no label.
  const std::vector<std::string>* labels = nullptr;
};

/// A BYTES tensor of "<value>:<index>" or "<value>:<index>:<label>" strings.
struct classified_tensor {
  std::vector<int64_t> shape;
  /// 4-byte length + bytes per element.
  std::string data;
};

/// Triton's classification extension: the k highest values of each row,
/// highest first (ties: lower index first). With a batch dimension of size B
/// the result has shape [B, k] and each row is the rest of the tensor; without
/// one the result has shape [k] over the whole tensor. Values are printed as
/// the KServe codec prints numbers in JSON (shortest round trip; nan, inf).
/// 400 for BYTES and BOOL tensors.
result<classified_tensor> classify(const classify_input& in);

} // namespace caf_serving::postprocess
