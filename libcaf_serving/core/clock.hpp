#pragma once
/// The one clock of the pipeline: monotonic nanoseconds (schemas/serving.capnp,
/// "Times are nanoseconds on the process's monotonic clock").

#include <chrono>
#include <cstdint>

namespace caf_serving {

using steady = std::chrono::steady_clock;

inline int64_t to_ns(steady::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline int64_t now_ns() {
  return to_ns(steady::now());
}

} // namespace caf_serving
