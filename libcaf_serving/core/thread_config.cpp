#include "core/thread_config.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace caf_serving {

thread_config default_thread_config(unsigned cores) {
  cores = std::max(cores, 1u);
  thread_config cfg;
  // One HTTP event loop answers about 35k small requests/s on one core: on
  // 2-3 cores a second loop would only take time from the executors, on
  // larger machines a quarter of the cores (at most 8) keeps the ingress from
  // capping a GPU's rate.
  cfg.ingress_threads = cores < 4 ? 1u : std::clamp(cores / 4, 1u, 8u);
  cfg.caf_workers = std::clamp(cores / 4, 1u, 8u);
  unsigned used = cfg.ingress_threads + cfg.caf_workers;
  cfg.executor_threads = cores > used ? cores - used : 1;
  return cfg;
}

thread_config worker_thread_config(unsigned cores) {
  thread_config cfg = default_thread_config(cores);
  cfg.executor_threads += cfg.ingress_threads;
  cfg.ingress_threads = 0;
  return cfg;
}

namespace {

/// Cores' worth of a quota written as cpu.max ("QUOTA PERIOD"); 0 for none.
unsigned quota_cores(std::string_view cpu_max) {
  std::istringstream in{std::string(cpu_max)};
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || period <= 0 || quota == "max")
    return 0;
  char* end = nullptr;
  long long q = std::strtoll(quota.c_str(), &end, 10);
  if (*end != '\0' || q <= 0) // v1 writes -1 for no quota
    return 0;
  return static_cast<unsigned>(std::max(1LL, (q + period - 1) / period));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

/// This process's cgroup path for `controller` in /proc/self/cgroup: the v2
/// line ("0::/path") when `controller` is empty.
std::string cgroup_path(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos)
      continue;
    auto names = line.substr(a + 1, b - a - 1);
    bool match = controller.empty()
                   ? line.compare(0, a, "0") == 0 && names.empty()
                   : ("," + names + ",").find("," + controller + ",") != std::string::npos;
    if (match)
      return line.substr(b + 1);
  }
  return "/";
}

/// The smallest quota of this process's cgroup and those above it, as cpu.max
/// text ("" when none is set or the files are not there).
std::string cgroup_quota() {
  unsigned best = 0;
  std::string best_text;
  auto consider = [&](std::string text) {
    auto cores = quota_cores(text);
    if (cores && (!best || cores < best)) {
      best = cores;
      best_text = std::move(text);
    }
  };
  auto walk = [&](const std::string& root, std::string path, auto&& read) {
    for (;;) {
      read(root + (path == "/" ? "" : path));
      if (path.empty() || path == "/")
        break;
      auto slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  };
  // cgroup v2 (mounted at /sys/fs/cgroup, or at unified/ beside v1's); inside a
  // container the process's path may not exist below the mount, and the
  // mount's own cpu.max is the container's.
  for (const char* mount : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"})
    walk(mount, cgroup_path(""),
         [&](const std::string& dir) { consider(read_file(dir + "/cpu.max")); });
  // cgroup v1.
  for (const char* mount : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"})
    walk(mount, cgroup_path("cpu"), [&](const std::string& dir) {
      auto q = read_file(dir + "/cpu.cfs_quota_us"), p = read_file(dir + "/cpu.cfs_period_us");
      if (!q.empty() && !p.empty())
        consider(q + " " + p);
    });
  return best_text;
}

} // namespace

unsigned count_usable_cores(unsigned affinity_cpus, std::string_view cpu_max, unsigned fallback) {
  unsigned cores = affinity_cpus ? affinity_cpus : fallback;
  if (auto quota = quota_cores(cpu_max))
    cores = cores ? std::min(cores, quota) : quota;
  return std::max(cores, 1u);
}

unsigned usable_cores() {
  unsigned affinity = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    affinity = static_cast<unsigned>(CPU_COUNT(&set));
  return count_usable_cores(affinity, cgroup_quota(), std::thread::hardware_concurrency());
}

} // namespace caf_serving
