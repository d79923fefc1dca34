#include "cuda/plan_sizes.hpp"

#include <algorithm>

namespace caf_serving::cuda {

size_plan plan_sizes(const std::vector<uint32_t>& buckets, int max_batch_size) {
  const auto top = static_cast<uint32_t>(std::max(max_batch_size, 1));
  size_plan p;
  for (uint32_t b : buckets)
    if (b >= 1 && b <= top)
      p.captured.push_back(b);
  std::sort(p.captured.begin(), p.captured.end());
  p.captured.erase(std::unique(p.captured.begin(), p.captured.end()), p.captured.end());
  p.planned = p.captured;
  if (p.captured.empty())
    for (uint32_t s = 1; s < top; s *= 2)
      p.planned.push_back(s);
  if (p.planned.empty() || p.planned.back() < top)
    p.planned.push_back(top);
  return p;
}

std::optional<run_shape> run_shape_for(const size_plan& sizes, uint32_t rows) {
  if (rows == 0)
    return std::nullopt;
  auto it = std::lower_bound(sizes.planned.begin(), sizes.planned.end(), rows);
  if (it == sizes.planned.end())
    return std::nullopt;
  bool graph = std::binary_search(sizes.captured.begin(), sizes.captured.end(), *it);
  return run_shape{rows, *it, graph};
}

} // namespace caf_serving::cuda
