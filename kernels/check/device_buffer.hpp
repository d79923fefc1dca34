#pragma once
/// An owned device allocation for the kernel checks' runners (case_runner.cpp,
/// case_runner_data.cpp): upload, fill, download.

#include "cuda/check.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace caf_serving::kernels {

class device_buffer {
public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0)
      CAF_CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {
  }
  device_buffer& operator=(device_buffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~device_buffer() {
    if (ptr_)
      cudaFree(ptr_);
  }
  void* get() const {
    return ptr_;
  }
  std::size_t bytes() const {
    return bytes_;
  }
  void upload(const void* host) const {
    if (bytes_ > 0)
      CAF_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice));
  }
  /// Every byte set to `byte` on `stream`.
  void set(int byte, cudaStream_t stream) const {
    if (bytes_ > 0)
      CAF_CUDA_CHECK(cudaMemsetAsync(ptr_, byte, bytes_, stream));
  }
  /// 0xff bytes: NaN in every float type, so an element a kernel skipped shows.
  void poison(cudaStream_t stream) const {
    set(0xff, stream);
  }
  std::vector<std::uint8_t> download() const {
    std::vector<std::uint8_t> host(bytes_);
    CAF_CUDA_CHECK(cudaDeviceSynchronize()); // whatever stream the kernel ran on
    if (bytes_ > 0)
      CAF_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }

private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

} // namespace caf_serving::kernels
