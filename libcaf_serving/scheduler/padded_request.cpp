#include "scheduler/padded_request.hpp"

#include <algorithm>
#include <string>

namespace caf_serving::scheduler {

uint64_t padded_length(const padded_batching_config& pad, wire::InferRequest::Reader request) {
  uint64_t length = 0;
  if (!pad.enabled())
    return 0;
  for (auto t : request.getInputs()) {
    const auto* in = pad.input(t.getName().cStr());
    if (!in || in->dim >= t.getShape().size())
      continue;
    length = std::max<uint64_t>(length, static_cast<uint64_t>(t.getShape()[in->dim]));
  }
  return length;
}

std::optional<serving_error> check_padded_lengths(const padded_batching_config& pad,
                                                  wire::InferRequest::Reader request) {
  if (!pad.enabled())
    return std::nullopt;
  std::string first_name;
  int64_t first = -1;
  for (auto t : request.getInputs()) {
    const auto* in = pad.input(t.getName().cStr());
    if (!in || in->dim >= t.getShape().size())
      continue;
    int64_t len = t.getShape()[in->dim];
    if (first < 0) {
      first = len;
      first_name = in->name;
    } else if (len != first) {
      return bad_request("inputs '" + first_name + "' and '" + in->name
                         + "' have lengths " + std::to_string(first) + " and "
                         + std::to_string(len)
                         + " along their padded dimensions (padded_batching); send them "
                           "at one length");
    }
  }
  return std::nullopt;
}

} // namespace caf_serving::scheduler
