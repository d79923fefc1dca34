#pragma once
/// Which batch sizes a CUDA executor instance plans at load, and which of them
/// it captures as CUDA graphs. No CUDA here: tested without a GPU.
///
/// Every planned size gets, at load, its optimized graph, its memory plan
/// (inside the one activation arena), its steps for both staging slots and its
/// cuDNN algorithm search; nothing is planned, allocated or searched while a
/// request waits. A batch runs on the smallest planned size holding it, padding
/// rows zeroed in and dropped out: as the replay of that size's graph when the
/// size is captured, else as the size's steps launched directly.
///
/// Usage:
///
///     auto sizes = cuda::plan_sizes(opts.buckets, cfg.max_batch_size);
///     for (uint32_t rows : sizes.planned) plan(rows);       // at load
///     auto run = cuda::run_shape_for(sizes, batch.rows);    // per batch
///     if (!run) refuse();                                   // over max_batch_size
///     run->graph ? replay(run->size) : launch(run->size);

#include <cstdint>
#include <optional>
#include <vector>

namespace caf_serving::cuda {

struct size_plan {
  /// Batch sizes planned at load, ascending; never empty, and the last is the
  /// model's largest batch (max(1, max_batch_size)), so every batch has one.
  std::vector<uint32_t> planned;
  /// The planned sizes that get a captured graph each, ascending (the buckets).
  std::vector<uint32_t> captured;
};

/// The sizes for `buckets` (the captured sizes, as read_gpu_options gives them:
/// ascending, each in [1, max(1, max_batch_size)]):
/// - the buckets, plus max(1, max_batch_size) when they stop short of it (that
///   size runs uncaptured);
/// - no buckets ("cuda_graph_batch_sizes: none"): nothing is captured, and the
///   powers of two below max_batch_size plus max_batch_size are planned, so a
///   batch pads to less than twice its rows instead of to max_batch_size.
size_plan plan_sizes(const std::vector<uint32_t>& buckets, int max_batch_size);

/// How a batch of `rows` runs: on planned size `size` (`size - rows` padding
/// rows), replaying its graph when `graph`.
struct run_shape {
  uint32_t rows = 0;
  uint32_t size = 0;
  bool graph = false;
  uint32_t padding() const { return size - rows; }
};

/// The smallest planned size holding `rows`; nothing when `rows` is 0 or
/// exceeds every planned size (more than max_batch_size).
std::optional<run_shape> run_shape_for(const size_plan& sizes, uint32_t rows);

} // namespace caf_serving::cuda
