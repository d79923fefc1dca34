#pragma once
/// Splitting a batch's outputs into one response per request: plain functions the
/// post-processor actor calls, tested here without actors.

#include "core/error.hpp"
#include "core/pipeline_messages.hpp"
#include "scheduler/padded_batching.hpp"

#include <map>
#include <string>
#include <vector>

namespace caf_serving::postprocess {

/// Byte range [begin, end) of rows [first_row, first_row + rows) in a batched
/// tensor. For BYTES the elements are walked; a malformed length is an error.
struct byte_range {
  size_t begin = 0;
  size_t end = 0;
};
result<byte_range> row_range(const wire::Tensor::Reader& tensor, uint32_t first_row,
                             uint32_t rows);

struct response_config {
  /// Whether dimension 0 of every output is the batch dimension (max_batch_size > 0).
  bool batched = true;
  /// Class labels by output name (config.pbtxt's label_filename), for the
  /// classification extension.
  std::map<std::string, std::vector<std::string>> labels;
  /// Padded batching: each listed output is sliced back, along its dim, to the
  /// request's own length (the request's padded inputs' length).
  scheduler::padded_batching_config padding;
};

/// One response per job of `batch`, in job order. Output bytes are referenced from
/// the batch result, not copied (classification outputs are new bytes).
std::vector<response_message> split_batch(const finished_batch& batch,
                                          const response_config& cfg);

} // namespace caf_serving::postprocess
