#pragma once
/// Every thread pool of the engine is sized here, from the core count and the
/// command line (DESIGN.md, "Threads on a small machine").

#include <cstdint>

namespace caf_serving {

struct thread_config {
  /// CAF's shared workers: they run the scheduler and post-processor actors and
  /// cheap (non-blocking) executors. These do microseconds of work per message.
  unsigned caf_workers = 1;
  /// Compute threads each CPU executor instance may use for one batch.
  unsigned executor_threads = 1;
  /// Threads running the HTTP event loop (kj).
  unsigned ingress_threads = 1;
};

/// Defaults for a machine with `cores` cores: the ingress loop gets one thread,
/// CAF gets a quarter of the cores (at least 1, at most 8: its actors are light),
/// and executors share what is left.
thread_config default_thread_config(unsigned cores);

} // namespace caf_serving
