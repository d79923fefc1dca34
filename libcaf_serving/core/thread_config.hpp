#pragma once
/// Every thread pool of the engine is sized here, from the cores this process
/// may use and the command line (DESIGN.md, "Threads on a small machine").
///
/// Usage (both binaries):
///
///     auto threads = default_thread_config(usable_cores());
///     cfg.set("scheduler.max-threads", threads.caf_workers);
///     auto compute = std::make_shared<onnx::work_pool>(threads.executor_threads);

#include <cstdint>
#include <string_view>

namespace caf_serving {

struct thread_config {
  /// CAF's shared workers: they run the scheduler and post-processor actors and
  /// cheap (non-blocking) executors. These do microseconds of work per message.
  unsigned caf_workers = 1;
  /// The process's compute-thread budget: every CPU executor of every model
  /// shares one pool of this many threads (onnx::work_pool), so instances x
  /// models never multiply it.
  unsigned executor_threads = 1;
  /// HTTP event loops (kj), one thread each (--http-threads); connections are
  /// spread across them.
  unsigned ingress_threads = 1;
};

/// Defaults for a machine with `cores` cores: the ingress gets one event loop
/// below 4 cores and a quarter of the cores (at most 8) from there, CAF gets a
/// quarter of the cores (at least 1, at most 8: its actors are light), and the
/// executors' compute budget is what is left.
thread_config default_thread_config(unsigned cores);

/// Defaults for caf-serving-worker, which has no HTTP or gRPC ingress: the
/// cores default_thread_config() would give the event loops go to the
/// executors (ingress_threads is 0).
thread_config worker_thread_config(unsigned cores);

/// The cores a process may use: `affinity_cpus` (the CPUs of its
/// sched_getaffinity mask; 0 if unknown), capped by the CPU quota `cpu_max`
/// written as cgroup v2's cpu.max ("max 100000" for none, "200000 100000" for
/// two cores' worth; a fractional quota rounds up), else `fallback`
/// (std::thread::hardware_concurrency). Never 0. An empty or unreadable quota
/// is no quota.
unsigned count_usable_cores(unsigned affinity_cpus, std::string_view cpu_max, unsigned fallback);

/// count_usable_cores() for this process: its affinity mask and the smallest
/// quota of its cgroup and the cgroups above it (v2 cpu.max, or v1's
/// cpu.cfs_quota_us and cpu.cfs_period_us).
unsigned usable_cores();

} // namespace caf_serving
