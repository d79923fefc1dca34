#include "scheduler/bucket_padding.hpp"

#include <algorithm>

namespace caf_serving::scheduler {

padding_choice choose_padding(const padding_inputs& in) {
  auto it = std::lower_bound(in.buckets.begin(), in.buckets.end(), in.rows);
  if (in.rows == 0 || it == in.buckets.end())
    return keep_waiting{};
  if (*it == in.rows)
    return pad_now{*it};
  if (in.row_gap_us <= 0)
    return keep_waiting{};
  double expected_fill_us = (*it - in.rows) * in.row_gap_us;
  if (expected_fill_us > static_cast<double>(in.wait_left_us))
    return pad_now{*it};
  return keep_waiting{};
}

} // namespace caf_serving::scheduler
