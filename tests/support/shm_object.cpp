#include "support/shm_object.hpp"

#include <atomic>
#include <stdexcept>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace caf_serving::support {

shm_object::shm_object(size_t bytes, std::string_view tag) : size(bytes) {
  static std::atomic<int> serial{0};
  key = "/caf_serving_" + std::string(tag) + "_" + std::to_string(getpid()) + "_"
        + std::to_string(serial++);
  fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    throw std::runtime_error("cannot create the shared-memory object " + key);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    shm_unlink(key.c_str());
    throw std::runtime_error("cannot size the shared-memory object " + key);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    shm_unlink(key.c_str());
    throw std::runtime_error("cannot map the shared-memory object " + key);
  }
  data = static_cast<char*>(p);
}

shm_object::~shm_object() {
  munmap(data, size);
  close(fd);
  shm_unlink(key.c_str());
}

} // namespace caf_serving::support
