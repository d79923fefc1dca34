#include "core/external_memory.hpp"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace caf_serving {
namespace {

struct registry {
  std::mutex lock;
  std::unordered_map<uint64_t, external_memory> bound;
};

registry& the_registry() {
  static registry r;
  return r;
}

} // namespace

uint64_t new_external_memory_handle() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

void bind_external_memory(uint64_t handle, external_memory memory) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.lock);
  r.bound[handle] = memory;
}

void unbind_external_memory(uint64_t handle) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.lock);
  r.bound.erase(handle);
}

std::optional<external_memory> find_external_memory(uint64_t handle) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.lock);
  auto i = r.bound.find(handle);
  if (i == r.bound.end())
    return std::nullopt;
  return i->second;
}

} // namespace caf_serving
