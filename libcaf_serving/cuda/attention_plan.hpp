#pragma once
/// The arithmetic of the CUDA backend's FusedAttention step (steps_attention.cpp),
/// apart from the device so that it is tested without one: which kernel runs a
/// node (the fused one or GEMM-softmax-GEMM), how the mask's shape
/// reads as strides over the scores [B, H, Sq, Sk], how the (batch row, head)
/// pairs are cut into chunks whose scores fit the workspace, and the launches
/// (strided-batched GEMMs as cuBLASLt runs them, and the masked softmax) over
/// fixed pointers. attention_plan.test.cpp runs those launches on the host and
/// compares them with FusedAttention's reference kernel.
///
/// Usage:
///
///     auto strides = cuda::attention_mask_strides(mask_shape, {B, H, Sq, Sk});
///     if (!strides) ...;  // a mask FusedAttention's device step does not read
///     auto chunks = cuda::plan_attention_chunks(B, H, budget / (Sq * Sk * 4));
///     if (cuda::choose_attention_kernel({half, B, H, Sq, Sk, D}) == attention_kernel::fused)
///       ...;  // kernels/cuda/attention, the mask through *strides
///     auto launches = cuda::plan_attention_launches({dims, q, k, v, mask, *strides, out,
///                                                    scores, scale}, chunks);

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

namespace caf_serving::cuda {

/// Which implementation runs a FusedAttention node on the device.
enum class attention_kernel {
  /// kernels/cuda/attention: one FlashAttention-style kernel reading Q, K, V and
  /// the mask in place; no scores in memory.
  fused,
  /// cuBLASLt, the masked softmax, cuBLASLt, with the scores in the workspace
  /// (chunked by plan_attention_chunks).
  gemm_softmax_gemm,
};

/// What the choice depends on: the storage type and the node's sizes. Q [B, Sq,
/// H*D], K and V [B, Sk, H*D]; the mask, when there is one, is any that
/// attention_mask_strides reads (the fused kernel takes the same strides).
struct attention_kernel_query {
  bool half_storage = false; ///< Q, K, V, the mask and the output are fp16 or bf16
  int64_t batch = 1, heads = 1, q_len = 1, k_len = 1, head_dim = 1;
};

/// The fused kernel for self-attention (Sq = Sk) stored in fp16/bf16 with head
/// dimension 32, 64 or 128 and batch and heads within its grid (65535 each);
/// GEMM-softmax-GEMM otherwise, and always at fp32 (the kernel's MMAs take
/// fp16/bf16 only).
attention_kernel choose_attention_kernel(const attention_kernel_query& q);

/// Element strides of a mask of shape `mask` (rank <= 4, right-aligned as ONNX
/// broadcasts) over scores of shape `scores` [B, H, Sq, Sk]: 0 on every
/// broadcast dimension. Nothing when a dimension neither matches nor is 1, or
/// when the mask is constant along the keys (its last dimension 1 while Sk > 1):
/// the softmax reads a mask row's keys contiguously.
std::optional<std::array<int64_t, 4>> attention_mask_strides(const std::vector<int64_t>& mask,
                                                             const std::array<int64_t, 4>& scores);

/// A block of (batch row, head) pairs whose scores are in the workspace at once:
/// batch rows [batch, batch + batches) times heads [head, head + heads), laid out
/// [batches, heads, Sq, Sk].
struct attention_chunk {
  int64_t batch = 0;
  int64_t batches = 1;
  int64_t head = 0;
  int64_t heads = 1;
  /// Its batched GEMMs run over the longer side, so that a chunk takes
  /// min(batches, heads) strided-batched calls per product: one per head over its
  /// batch rows (stride: a batch row) when heads <= batches, else one per batch row
  /// over its heads (stride: a head's columns).
  bool per_head() const { return heads <= batches; }
  int64_t pairs() const { return batches * heads; }
};

/// Chunks covering [0, batch) x [0, heads) once each, in memory order, each of at
/// most `max_pairs` pairs: whole batch rows (all heads) when a row fits, else the
/// heads of one row in pieces. As few chunks as that allows, their sizes balanced
/// (they differ by at most one row or head). Empty when `max_pairs` < 1.
std::vector<attention_chunk> plan_attention_chunks(int64_t batch, int64_t heads,
                                                   int64_t max_pairs);

/// One strided-batched product, column-major as cuBLASLt sees it: `count` times,
/// C[m, n] = alpha * op(A)[m, k] B[k, n], A, B and C advancing by their strides
/// (elements). A is stored k x m (leading dimension lda) when transposed, else
/// m x k; B is stored k x n, C m x n.
struct gemm_shape {
  bool transpose_a = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;

  /// Equal keys: the same descriptors serve both.
  std::array<int64_t, 11> key() const {
    return {transpose_a ? 1 : 0, m, n, k, lda, ldb, ldc, count, stride_a, stride_b, stride_c};
  }
};

/// A product over fixed pointers to elements of type T: float, or a 16-bit
/// element (uint16_t) for tensors stored in fp16/bf16 (precision, gpu_options.hpp);
/// only the address arithmetic depends on it.
template <class T>
struct basic_attention_gemm {
  gemm_shape shape;
  float alpha = 1.f;
  const T* a = nullptr;
  const T* b = nullptr;
  T* c = nullptr;
};
using attention_gemm = basic_attention_gemm<float>;

/// A softmax over `rows` x `cols` scores in place, adding the mask when there is
/// one: row r (of [batches, heads, Sq]) reads the mask row at mask + o * outer +
/// h * head + q * query (kernels' mask_strides).
template <class T>
struct basic_attention_softmax {
  T* scores = nullptr;
  int64_t rows = 0, cols = 0;
  const T* mask = nullptr; ///< null: no mask
  int64_t heads = 1, queries = 1;
  int64_t outer = 0, head = 0, query = 0;
};
using attention_softmax = basic_attention_softmax<float>;

/// One chunk's launches, in order: the scores products, the softmax, the output
/// products.
template <class T>
struct basic_attention_launches {
  std::vector<basic_attention_gemm<T>> scores;
  basic_attention_softmax<T> softmax;
  std::vector<basic_attention_gemm<T>> output;
};
using attention_launches = basic_attention_launches<float>;

/// A FusedAttention node over fixed pointers: Q [B, Sq, H*D], K and V [B, Sk, H*D],
/// the output like Q, the mask with its strides over [B, H, Sq, Sk] (or null), and
/// room for the largest chunk's scores, all of one element type T (the scores
/// are stored in the tensors' type; the softmax computes in fp32).
template <class T>
struct basic_attention_operands {
  int64_t batch = 1, q_len = 1, k_len = 1, heads = 1, head_dim = 1;
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const T* mask = nullptr;
  std::array<int64_t, 4> mask_strides{0, 0, 0, 0};
  T* out = nullptr;
  T* scores = nullptr;
  float scale = 1.f;
};
using attention_operands = basic_attention_operands<float>;

/// The launches of every chunk. Scores of pair (b, h) of a chunk lie at
/// ((b - chunk.batch) * chunk.heads + h - chunk.head) * Sq * Sk in `scores`. Row-
/// major S[Sq, Sk] = Q_h K_h^T is column-major S^T[Sk, Sq] = K_h (stored D x Sk,
/// transposed) times Q_h^T (D x Sq); row-major O_h[Sq, D] = P V_h is O_h^T[D, Sq]
/// = V_h^T (D x Sk) P^T (Sk x Sq). Q, K, V and O are read and written in place:
/// a head is D columns of rows H*D long.
/// Defined for T float and uint16_t (fp16/bf16 storage).
template <class T>
std::vector<basic_attention_launches<T>>
plan_attention_launches(const basic_attention_operands<T>& op,
                        const std::vector<attention_chunk>& chunks);

} // namespace caf_serving::cuda
