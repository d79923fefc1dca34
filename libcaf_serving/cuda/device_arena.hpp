#pragma once
/// Lays out the one device allocation an executor instance makes at load: the
/// weights, the activation arena shared by every bucket's plan (each bucket's
/// liveness plan from onnx/memory_plan.hpp reuses the same bytes, so the arena is
/// as large as the largest bucket needs), the model's input and output buffers
/// at the largest bucket, once per staging slot (double-buffered, so that one
/// batch's copies can overlap the next one's compute), and the cuBLASLt/cuDNN
/// workspace. Pinned host staging mirrors the input and output slots.
///
/// No CUDA here: pure arithmetic, tested without a GPU.
///
/// Usage:
///
///     auto layout = cuda::plan_device_arena({.weights = {...}, .bucket_arenas = {...}, ...});
///     CAF_CUDA_CHECK(cudaMalloc(&base, layout.total_bytes));
///     float* x = reinterpret_cast<float*>(base + layout.inputs[slot][i].offset);

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::cuda {

/// cudaMalloc returns 256-byte aligned memory; cuBLASLt and cuDNN want at least
/// 16, tensor-core loads 128. Every region starts on this boundary.
inline constexpr size_t device_alignment = 256;

struct region {
  size_t offset = 0;
  size_t bytes = 0;
  size_t end() const { return offset + bytes; }
};

struct device_arena_request {
  /// Bytes of each constant tensor (weights, folded constants), in plan order.
  std::vector<size_t> weights;
  /// Activation arena bytes of each bucket's plan (memory_plan::arena_bytes).
  std::vector<size_t> bucket_arenas;
  /// Bytes per batch row of each model input and output (dims without the batch,
  /// times the element size).
  std::vector<size_t> input_row_bytes;
  std::vector<size_t> output_row_bytes;
  /// Rows of the largest bucket (or max_batch_size, whichever is larger).
  uint32_t max_rows = 1;
  /// Staging slots (2: double-buffered).
  uint32_t slots = 2;
  /// cuBLASLt and cuDNN workspace, the largest any step asked for at load.
  size_t workspace = 0;
};

struct device_arena_layout {
  std::vector<region> weights;
  region activations;
  /// [slot][input] and [slot][output].
  std::vector<std::vector<region>> inputs;
  std::vector<std::vector<region>> outputs;
  region workspace;
  size_t total_bytes = 0;
  /// Pinned host bytes per slot: the slot's inputs and outputs, same offsets
  /// relative to the slot's start as on the device.
  size_t staging_bytes_per_slot = 0;
};

/// Places every region, aligned and non-overlapping, in the order listed in
/// device_arena_layout. A request with no slots gets one.
device_arena_layout plan_device_arena(const device_arena_request& request);

/// One line: MiB of weights, activations, I/O slots and workspace.
std::string describe(const device_arena_layout& layout);

/// Where an instance's one device allocation does not fit in what the device
/// has free (cudaMemGetInfo, with `reserve_bytes` kept back for cuDNN's and
/// cuBLASLt's own allocations and the CUDA graphs): the load error, naming the
/// model, the GPU, both sizes and what to change. Nothing when it fits.
std::optional<std::string> check_fits(const device_arena_layout& layout, size_t free_bytes,
                                      size_t reserve_bytes, const std::string& model, int device);

} // namespace caf_serving::cuda
