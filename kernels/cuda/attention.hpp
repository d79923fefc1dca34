/// Fused multi-head self-attention (FlashAttention-style tiling):
/// `O = softmax(scale · Q Kᵀ + M) V` in one kernel, with the score matrix never
/// written to memory. fp16 or bf16 inputs, fp32 accumulation and softmax, head
/// dimension 32, 64 or 128. M is an additive mask read in place through strides
/// (padding [B,1,1,S], causal [S,S], both at once [B,1,S,S], per head
/// [B,H,S,S]) and/or per-sequence key lengths.
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

/// An additive mask over the scores [batch, heads, queries, keys], read in place:
/// element (b, h, q, k) is at data + b·batch + h·head + q·query + k (the keys
/// contiguous; a stride of 0 broadcasts). It is added to the scaled score before
/// the softmax, in natural-log units as ONNX and torch add it: -inf masks a key;
/// a finite value too negative for fp32 once in log2 units (below -2.4e38, as
/// torch's finfo(float32).min) counts as -3.4e38 there, so that a row masked
/// with it throughout gets the uniform softmax the reference gives.
struct attention_mask {
  const void* data = nullptr; ///< null: no mask
  dtype type = dtype::f32;    ///< f32, or the type of Q, K and V
  std::int64_t batch = 0;
  std::int64_t head = 0;
  std::int64_t query = 0;
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
  int head_dim = 64; ///< 32, 64 or 128
  /// Device array of `batch` valid lengths: keys at or past a sequence's length are
  /// masked (queries there are still computed). Null masks nothing.
  const int* key_lengths = nullptr;
  /// Added to the scores before the softmax; with key_lengths both apply. A query
  /// row with every key masked (-inf, or past its length) gives zeros; a NaN score
  /// or mask value makes its row NaN.
  attention_mask mask;
  float softmax_scale = 0.125f; ///< usually 1/sqrt(head_dim)
  /// Query rows per warp: 16 or 32 (two MMA row tiles sharing each K/V fragment);
  /// 0 lets the launcher pick. Only speed depends on it.
  int rows_per_warp = 0;
};

/// Enqueues the kernel on `stream`. Throws `std::invalid_argument` for an
/// unsupported type or head dimension, a mask of another type, Q/K/V/O or strides
/// not 16-byte aligned (cp.async), a mask not aligned to its element; `cuda_error`
/// if the launch fails.
void launch_attention(const attention_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
