// Device helpers shared by the data-movement kernels (strided_copy, permute,
// gather_axis); not part of any public header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cpu/data_layout.hpp"

namespace caf_serving::kernels::detail {

/// An unsigned type of `Bytes` bytes that loads and stores in one instruction.
template <int Bytes>
struct word;
template <>
struct word<1> {
  using type = std::uint8_t;
};
template <>
struct word<2> {
  using type = std::uint16_t;
};
template <>
struct word<4> {
  using type = std::uint32_t;
};
template <>
struct word<8> {
  using type = uint2;
};
template <>
struct word<16> {
  using type = uint4;
};

/// Calls `f` with a value of the word type of `bytes` (1, 2, 4, 8 or 16).
template <class F>
void dispatch_width(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f(word<1>::type{});
    case 2:
      return f(word<2>::type{});
    case 4:
      return f(word<4>::type{});
    case 8:
      return f(word<8>::type{});
    case 16:
      return f(word<16>::type{});
  }
  throw std::invalid_argument("data movement: no word of " + std::to_string(bytes) + " bytes");
}

/// One planned box with its buffers.
struct planned_copy {
  const void* src = nullptr;
  void* dst = nullptr;
  copy_plan plan;
};

/// Enqueues planned boxes (each already checked, collapsed and widened), as few
/// launches as the kernel's parameter space allows. Defined in strided_copy.cu.
void enqueue_planned_copies(const planned_copy* copies, int count, int threads,
                            cudaStream_t stream);

} // namespace caf_serving::kernels::detail
