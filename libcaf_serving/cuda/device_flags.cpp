#include "cuda/device_flags.hpp"

#include "cuda/cuda_check.hpp"

#include <cuda_runtime_api.h>

namespace caf_serving::cuda {

device_flags::~device_flags() {
  for (auto& b : blocks_) cudaFreeHost(b.host);
}

int* device_flags::add(std::string what, uint32_t group) {
  size_t i = flags_.size() % block_flags;
  if (i == 0) {
    block b;
    void* p = nullptr;
    CAF_CUDA_CHECK(cudaHostAlloc(&p, block_flags * sizeof(int), cudaHostAllocMapped));
    b.host = static_cast<int*>(p);
    for (size_t j = 0; j < block_flags; ++j) b.host[j] = 0;
    void* d = nullptr;
    CAF_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    b.device = static_cast<int*>(d);
    blocks_.push_back(b);
  }
  flags_.push_back({blocks_.back().host + i, group, std::move(what)});
  return blocks_.back().device + i;
}

std::optional<std::string> device_flags::take(uint32_t group) {
  std::optional<std::string> first;
  for (auto& fl : flags_) {
    if (fl.group != group) continue;
    volatile int* f = fl.host;
    if (*f != 0) {
      if (!first) first = fl.what;
      *f = 0;
    }
  }
  return first;
}

} // namespace caf_serving::cuda
