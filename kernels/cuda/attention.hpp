/// Fused multi-head attention for encoder models (FlashAttention-style tiling):
/// `O = softmax(scale · Q Kᵀ + padding mask) V` in one kernel, with the score
/// matrix never written to memory. fp16 or bf16 inputs, fp32 accumulation and
/// softmax, head dimension 64 or 128.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cpu/types.hpp"

namespace caf_serving::kernels {

/// Element strides of Q, K, V and O (all four share them); the head dimension is
/// contiguous. [batch, heads, seq, dim] has seq_stride = dim, head_stride = seq·dim;
/// the [batch, seq, heads, dim] output of a QKV projection has seq_stride = heads·dim.
struct attention_strides {
  std::int64_t batch = 0;
  std::int64_t head = 0;
  std::int64_t seq = 0;
};

struct attention_args {
  dtype type = dtype::f16; ///< f16 or bf16
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  attention_strides strides;
  int batch = 1;
  int heads = 1;
  int seq = 1;       ///< 1 to 65535·64; the target is encoder lengths up to 512
  int head_dim = 64; ///< 64 or 128
  /// Device array of `batch` valid lengths: keys at or past a sequence's length are
  /// masked (queries there are still computed). Null masks nothing. A length of 0
  /// gives zeros.
  const int* key_lengths = nullptr;
  float softmax_scale = 0.125f; ///< usually 1/sqrt(head_dim)
  /// Query rows per warp: 16 or 32 (two MMA row tiles sharing each K/V fragment);
  /// 0 lets the launcher pick. Only speed depends on it.
  int rows_per_warp = 0;
};

/// Enqueues the kernel on `stream`. Throws `std::invalid_argument` for an
/// unsupported type or head dimension, `cuda_error` if the launch fails.
void launch_attention(const attention_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
