#include "cuda/capture_order.hpp"

#include <algorithm>
#include <functional>
#include <set>

namespace caf_serving::cuda {

const char* to_string(prepare_action a) {
  switch (a) {
    case prepare_action::warm_up: return "warm_up";
    case prepare_action::capture: return "capture";
    case prepare_action::verify: return "verify";
    case prepare_action::ready: return "ready";
  }
  return "?";
}

std::vector<prepare_step> capture_order(std::vector<uint32_t> buckets) {
  std::sort(buckets.begin(), buckets.end(), std::greater<>());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  std::vector<prepare_step> steps;
  for (uint32_t b : buckets)
    steps.push_back({prepare_action::warm_up, b});
  for (uint32_t b : buckets) {
    steps.push_back({prepare_action::capture, b});
    steps.push_back({prepare_action::verify, b});
  }
  steps.push_back({prepare_action::ready, 0});
  return steps;
}

std::string check_capture_order(const std::vector<prepare_step>& steps) {
  std::set<uint32_t> warmed, captured;
  bool any_capture = false;
  uint32_t last_warm = UINT32_MAX, last_capture = UINT32_MAX;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    auto at = " at step " + std::to_string(i);
    switch (s.action) {
      case prepare_action::warm_up:
        if (any_capture) return "warm-up of bucket " + std::to_string(s.bucket) + " after a capture" + at;
        if (s.bucket > last_warm) return "warm-ups not largest first" + at;
        last_warm = s.bucket;
        warmed.insert(s.bucket);
        break;
      case prepare_action::capture:
        if (!warmed.count(s.bucket)) return "capture of bucket " + std::to_string(s.bucket) + " without a warm-up" + at;
        if (s.bucket > last_capture) return "captures not largest first" + at;
        last_capture = s.bucket;
        any_capture = true;
        captured.insert(s.bucket);
        break;
      case prepare_action::verify:
        if (!captured.count(s.bucket)) return "verify of bucket " + std::to_string(s.bucket) + " before its capture" + at;
        break;
      case prepare_action::ready:
        if (i + 1 != steps.size()) return "ready is not the last step" + at;
        if (captured.size() != warmed.size()) return "ready before every warmed bucket was captured" + at;
        return "";
    }
  }
  return "no ready step";
}

} // namespace caf_serving::cuda
