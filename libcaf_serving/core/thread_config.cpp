#include "core/thread_config.hpp"

#include <algorithm>

namespace caf_serving {

thread_config default_thread_config(unsigned cores) {
  cores = std::max(cores, 1u);
  thread_config cfg;
  cfg.ingress_threads = 1;
  cfg.caf_workers = std::clamp(cores / 4, 1u, 8u);
  unsigned used = cfg.ingress_threads + cfg.caf_workers;
  cfg.executor_threads = cores > used ? cores - used : 1;
  return cfg;
}

} // namespace caf_serving
