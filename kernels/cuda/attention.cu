#include "cuda/attention.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <atomic>
#include <cfloat>
#include <stdexcept>
#include <string>
#include <type_traits>

// FlashAttention-2 forward, written with mma.sync.m16n8k16 (fp32 accumulators) and
// ldmatrix. A block of 4 warps owns 64 query rows (16 per warp) of one (batch, head)
// and walks the keys in tiles of 64, double-buffered in shared memory with cp.async.
// Scores and probabilities stay in registers: the accumulator layout of Q·Kᵀ is
// exactly the A-operand layout that P·V needs, so P never leaves the thread.
namespace caf_serving::kernels {
namespace {

constexpr int block_keys = 64; // keys per tile (queries per block: warps x 16 x MT)
constexpr int warps = 4;
constexpr int pad = 8;         // halves of padding per shared row: spreads ldmatrix over banks

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy; src_bytes = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a · b for one 16x8x16 tile.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                    std::uint32_t b0, std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
}

// 2^x on the special-function unit; -inf gives +0, which masking relies on.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Mask element `offset` in log2 units (the scores' units here). -inf stays -inf
// (a masked key) and NaN stays NaN; a finite value that overflows once scaled by
// log2(e) (torch's finfo(float32).min, or bf16's) becomes -FLT_MAX, so that a row
// masked with it throughout stays finite and uniform, as in the reference.
template <class T>
__device__ __forceinline__ float mask_log2(const attention_mask& m, std::int64_t offset) {
  float v = m.type == dtype::f32 ? static_cast<const float*>(m.data)[offset]
                                 : detail::to_f32(static_cast<const T*>(m.data)[offset]);
  float x = v * 1.4426950408889634f;
  return x == -INFINITY && v != -INFINITY ? -FLT_MAX : x;
}

// Copies `rows` rows of D elements starting at sequence position `row0` into a
// shared tile; rows at or past `seq` are zero-filled.
template <class T, int D>
__device__ __forceinline__ void load_tile(T* tile, const T* base, std::int64_t seq_stride,
                                          int rows, int row0, int seq) {
  constexpr int chunks_per_row = D / 8;
  for (int i = threadIdx.x; i < rows * chunks_per_row; i += warps * 32) {
    int r = i / chunks_per_row, c = (i % chunks_per_row) * 8;
    bool valid = row0 + r < seq;
    const T* src = valid ? base + (row0 + r) * seq_stride + c : base;
    cp_async16(tile + r * (D + pad) + c, src, valid ? 16 : 0);
  }
}

// MT is the number of 16-row m-tiles per warp (1 or 2). With 2, every K and V
// fragment read from shared memory feeds two MMAs instead of one, which halves the
// shared-memory traffic per FLOP (the limit of this kernel at MT = 1), at the cost of
// more registers; Q's fragments then stay in registers only for D = 64. The
// launcher picks MT from measurements (see launch_attention).
template <class T, int D, int MT>
__global__ void __launch_bounds__(warps * 32)
  attention_kernel(attention_args a) {
  constexpr int ld = D + pad;
  constexpr int block_rows = warps * 16 * MT;
  constexpr bool q_in_registers = MT == 1 || D <= 64;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_tile = reinterpret_cast<T*>(smem_raw);
  T* k_tile = q_tile + block_rows * ld;     // two stages
  T* v_tile = k_tile + 2 * block_keys * ld; // two stages

  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * block_rows;
  std::int64_t offset = b * a.strides.batch + h * a.strides.head;
  const T* q = static_cast<const T*>(a.q) + offset;
  const T* k = static_cast<const T*>(a.k) + offset;
  const T* v = static_cast<const T*>(a.v) + offset;
  T* o = static_cast<T*>(a.o) + offset;
  int keys = a.key_lengths ? min(max(a.key_lengths[b], 0), a.seq) : a.seq;
  int tiles = (keys + block_keys - 1) / block_keys;

  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int group = lane / 4, quad = lane % 4; // mma fragment coordinates
  const T* q_warp = q_tile + warp * 16 * MT * ld;

  load_tile<T, D>(q_tile, q, a.strides.seq, block_rows, q0, a.seq);
  if (tiles > 0) {
    load_tile<T, D>(k_tile, k, a.strides.seq, block_keys, 0, a.seq);
    load_tile<T, D>(v_tile, v, a.strides.seq, block_keys, 0, a.seq);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  // Q fragments (A operand) of m-tile m, k-chunk kk.
  auto load_q = [&](std::uint32_t (&frag)[4], int m, int kk) {
    ldmatrix_x4(frag, q_warp + (m * 16 + lane % 16) * ld + kk * 16 + (lane / 16) * 8);
  };
  std::uint32_t q_frag[q_in_registers ? MT : 1][q_in_registers ? D / 16 : 1][4];
  if constexpr (q_in_registers) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        load_q(q_frag[m][kk], m, kk);
  }

  float o_acc[MT][D / 8][4] = {};
  float row_max[MT][2];   // rows `group` and `group + 8` of each m-tile, log2 units
  float row_sum[MT][2];   // this thread's part of the row sums
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[m][r] = -INFINITY;
      row_sum[m][r] = 0.0f;
    }
  const float scale_log2 = a.softmax_scale * 1.4426950408889634f;
  // Where this thread's mask rows start (rows group and group + 8 of each m-tile);
  // a row past the sequence reads the last one, and is never stored.
  const bool masked = a.mask.data != nullptr;
  std::int64_t mask_row[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int row = min(q0 + (warp * MT + m) * 16 + group + r * 8, a.seq - 1);
      mask_row[m][r] = b * a.mask.batch + h * a.mask.head + row * a.mask.query;
    }

  for (int t = 0; t < tiles; ++t) {
    int stage = t & 1;
    if (t + 1 < tiles) { // prefetch the next tile while this one is computed
      load_tile<T, D>(k_tile + (stage ^ 1) * block_keys * ld, k, a.strides.seq, block_keys,
                      (t + 1) * block_keys, a.seq);
      load_tile<T, D>(v_tile + (stage ^ 1) * block_keys * ld, v, a.strides.seq, block_keys,
                      (t + 1) * block_keys, a.seq);
    }
    cp_async_commit();
    const T* ks = k_tile + stage * block_keys * ld;
    const T* vs = v_tile + stage * block_keys * ld;

    // S = Q Kᵀ: per m-tile 16 rows x 64 keys, as 8 n-tiles of 8 keys.
    float s[MT][block_keys / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t q_tmp[MT][4];
      if constexpr (!q_in_registers) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
          load_q(q_tmp[m], m, kk);
      }
#pragma unroll
      for (int np = 0; np < block_keys / 16; ++np) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, ks + (np * 16 + (lane / 16) * 8 + lane % 8) * ld + kk * 16
                          + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const std::uint32_t(&qa)[4] = q_in_registers ? q_frag[q_in_registers ? m : 0][q_in_registers ? kk : 0] : q_tmp[m];
          mma<T>(s[m][2 * np], qa, kb[0], kb[1]);
          mma<T>(s[m][2 * np + 1], qa, kb[2], kb[3]);
        }
      }
    }

    std::uint32_t p_frag[MT][block_keys / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      // Scale, add the mask, mask keys past the length, and update the running
      // max per row.
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < block_keys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int key = t * block_keys + n * 8 + quad * 2 + (e & 1);
          float x = -INFINITY;
          if (key < keys) {
            x = s[m][n][e] * scale_log2;
            if (masked)
              x += mask_log2<T>(a.mask, mask_row[m][e / 2] + key);
          }
          s[m][n][e] = x;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        float new_max = fmaxf(row_max[m][r], tile_max[r]);
        // A row with no unmasked key yet keeps max -inf; use 0 so exp2 gives 0, not NaN.
        float base = new_max == -INFINITY ? 0.0f : new_max;
        alpha[r] = exp2_approx(row_max[m][r] - base);
        row_max[m][r] = new_max;
        tile_max[r] = base;
      }
      // P = exp2(S - max), packed straight into the A fragments of P·V.
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int n = 0; n < block_keys / 8; ++n) {
        float p0 = exp2_approx(s[m][n][0] - tile_max[0]);
        float p1 = exp2_approx(s[m][n][1] - tile_max[0]);
        float p2 = exp2_approx(s[m][n][2] - tile_max[1]);
        float p3 = exp2_approx(s[m][n][3] - tile_max[1]);
        tile_sum[0] += p0 + p1;
        tile_sum[1] += p2 + p3;
        p_frag[m][n / 2][(n % 2) * 2] = pack2<T>(p0, p1);
        p_frag[m][n / 2][(n % 2) * 2 + 1] = pack2<T>(p2, p3);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
        row_sum[m][r] = row_sum[m][r] * alpha[r] + tile_sum[r];
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o_acc[m][d][0] *= alpha[0];
        o_acc[m][d][1] *= alpha[0];
        o_acc[m][d][2] *= alpha[1];
        o_acc[m][d][3] *= alpha[1];
      }
    }

    // O += P V: V's tile is [keys, D] row-major, read transposed by ldmatrix.
#pragma unroll
    for (int kk = 0; kk < block_keys / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, vs + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ld + dp * 16
                                + (lane / 16) * 8);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma<T>(o_acc[m][2 * dp], p_frag[m][kk], vb[0], vb[1]);
          mma<T>(o_acc[m][2 * dp + 1], p_frag[m][kk], vb[2], vb[3]);
        }
      }
    }
    cp_async_wait_all(); // the next tile has landed ...
    __syncthreads();     // ... and nobody still reads the stage it will overwrite
  }

  // Normalise and store. Each thread holds two adjacent columns of rows group and
  // group + 8 of each m-tile for every 8-column tile.
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[m][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      int row = q0 + (warp * MT + m) * 16 + group + r * 8;
      if (row >= a.seq)
        continue;
      T* out = o + row * a.strides.seq + quad * 2;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        std::uint32_t packed = pack2<T>(o_acc[m][d][2 * r] * inv, o_acc[m][d][2 * r + 1] * inv);
        *reinterpret_cast<std::uint32_t*>(out + d * 8) = packed;
      }
    }
}

template <class T, int D, int MT>
void launch_typed(const attention_args& a, cudaStream_t stream) {
  constexpr int block_rows = warps * 16 * MT;
  constexpr int smem = (block_rows + 4 * block_keys) * (D + pad) * static_cast<int>(sizeof(T));
  auto kernel = attention_kernel<T, D, MT>;
  // The shared-memory limit is a per-device attribute: raise it once per device.
  static std::atomic<std::uint64_t> configured{0};
  int device = 0;
  CAF_CUDA_CHECK(cudaGetDevice(&device));
  std::uint64_t bit = std::uint64_t{1} << (device % 64);
  if ((configured.load() & bit) == 0) {
    CAF_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured.fetch_or(bit);
  }
  dim3 grid((a.seq + block_rows - 1) / block_rows, a.heads, a.batch);
  kernel<<<grid, warps * 32, smem, stream>>>(a);
}

template <class T>
void launch_for_type(const attention_args& a, int rows_per_warp, cudaStream_t stream) {
  if (a.head_dim == 32)
    rows_per_warp == 16 ? launch_typed<T, 32, 1>(a, stream) : launch_typed<T, 32, 2>(a, stream);
  else if (a.head_dim == 64)
    rows_per_warp == 16 ? launch_typed<T, 64, 1>(a, stream) : launch_typed<T, 64, 2>(a, stream);
  else
    rows_per_warp == 16 ? launch_typed<T, 128, 1>(a, stream) : launch_typed<T, 128, 2>(a, stream);
}

} // namespace

void launch_attention(const attention_args& a, cudaStream_t stream) {
  if (a.type != dtype::f16 && a.type != dtype::bf16)
    throw std::invalid_argument(std::string("attention: ") + dtype_name(a.type)
                                + " is not supported; convert Q, K and V to f16 or bf16 "
                                  "(launch_convert) first");
  if (a.head_dim != 32 && a.head_dim != 64 && a.head_dim != 128)
    throw std::invalid_argument("attention: head dimension " + std::to_string(a.head_dim)
                                + " is not supported; it must be 32, 64 or 128");
  // cp.async moves 16 bytes: every row of Q, K, V and O must start 16-byte aligned.
  auto misaligned = [](std::uint64_t x) { return x % 16 != 0; };
  auto bytes = [](std::int64_t elements) { return static_cast<std::uint64_t>(elements) * 2; };
  if (misaligned(reinterpret_cast<std::uintptr_t>(a.q))
      || misaligned(reinterpret_cast<std::uintptr_t>(a.k))
      || misaligned(reinterpret_cast<std::uintptr_t>(a.v))
      || misaligned(reinterpret_cast<std::uintptr_t>(a.o)) || misaligned(bytes(a.strides.batch))
      || misaligned(bytes(a.strides.head)) || misaligned(bytes(a.strides.seq)))
    throw std::invalid_argument("attention: Q, K, V and O and their batch, head and sequence "
                                "strides must be 16-byte aligned (multiples of 8 elements)");
  if (a.mask.data) {
    if (a.mask.type != dtype::f32 && a.mask.type != a.type)
      throw std::invalid_argument(std::string("attention: a ") + dtype_name(a.mask.type)
                                  + " mask is not supported with " + dtype_name(a.type)
                                  + " Q, K and V; give it in f32 or " + dtype_name(a.type));
    if (reinterpret_cast<std::uintptr_t>(a.mask.data) % dtype_size(a.mask.type) != 0)
      throw std::invalid_argument("attention: the mask is not aligned to its element size");
  }
  if (a.batch > 65535 || a.heads > 65535)
    throw std::invalid_argument("attention: batch and heads must each be at most 65535");
  if (a.seq <= 0 || a.batch <= 0 || a.heads <= 0)
    return;
  int rows_per_warp = a.rows_per_warp;
  // Two m-tiles per warp once the sequence fills the taller block. For D = 128 that
  // spills ~100 bytes per thread (255 registers are not enough), yet it measured
  // faster on the H200 (bench/RESULTS.md: 149 vs 189 µs at 16x16x512, 60 vs 72 µs
  // at 64x16x128), because the halved shared-memory traffic matters more.
  if (rows_per_warp == 0)
    rows_per_warp = a.seq > 64 ? 32 : 16;
  if (rows_per_warp != 16 && rows_per_warp != 32)
    throw std::invalid_argument("attention: rows_per_warp = " + std::to_string(a.rows_per_warp)
                                + " is not supported; use 16, 32, or 0 to let the launcher pick");
  if (a.type == dtype::f16)
    launch_for_type<__half>(a, rows_per_warp, stream);
  else
    launch_for_type<__nv_bfloat16>(a, rows_per_warp, stream);
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
