#pragma once
/// A POSIX shared-memory object made and mapped the way a co-located client
/// (tritonclient's shared_memory utilities) makes one, for the tests and the
/// benchmark of the server's system shared memory. Unlinked when it goes.
///
///   support::shm_object in(4096);          // "/caf_serving_t_<pid>_<n>", 4096 bytes
///   in.put(0, std::vector<int32_t>{1, 2});
///   ... register in.key with the server, infer ...
///   auto sums = out.get<int32_t>(0, 16);

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::support {

struct shm_object {
  std::string key;
  size_t size = 0;
  char* data = nullptr;
  int fd = -1;

  /// A fresh object of `bytes` bytes named after `tag`, this process and a
  /// counter. Throws std::runtime_error when it cannot be made or mapped.
  explicit shm_object(size_t bytes, std::string_view tag = "t");
  ~shm_object();
  shm_object(const shm_object&) = delete;
  shm_object& operator=(const shm_object&) = delete;

  template <class T>
  void put(size_t offset, const std::vector<T>& values) {
    std::memcpy(data + offset, values.data(), values.size() * sizeof(T));
  }

  template <class T>
  std::vector<T> get(size_t offset, size_t count) const {
    std::vector<T> out(count);
    std::memcpy(out.data(), data + offset, count * sizeof(T));
    return out;
  }
};

} // namespace caf_serving::support
