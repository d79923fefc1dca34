#pragma once
/// When a batch runs as row chunks, one whole plan per thread, and when as one
/// plan whose steps split across the threads (onnx_backend::execute).
///
/// Row chunks need no synchronisation between steps, which is what CNNs want.
/// But every chunk streams all of the model's weights again, for as many
/// matmul rows as its chunk has tokens: BERT-base at 16 tokens, batch 8 on 2
/// threads, ran 4 chunks of 32 rows, each reading 340 MB of weights for 2.7
/// GFLOP, and reached 1.07x ONNX Runtime where the whole batch (128 rows,
/// weights read once, split by columns) reached 1.45x (run_bench.py, same
/// run). A plan whose FLOPs are mostly matmuls with constant weights, at
/// fewer rows per chunk than a configured minimum, runs whole.
///
/// Usage:
///
///     auto work = measure_matmul_work(plan.g);   // once, at compile
///     if (chunks_starve_matmuls(work, cfg.chunk_min_matmul_rows)) ... run whole

#include "onnx/ir.hpp"

#include <cstdint>

namespace caf_serving::onnx {

/// The multiply-adds of an optimized graph, by kind of weighted operator.
struct matmul_work {
  /// 2 x multiply-adds of FusedMatMul, and of FusedGemm, with constant weights.
  double matmul_flop = 0;
  /// 2 x multiply-adds of FusedConv and Conv.
  double conv_flop = 0;
  /// Rows of A (elements over the inner dimension) of the matmul with the
  /// most FLOPs: the tokens a chunk gives each weight matrix it streams.
  int64_t matmul_rows = 0;
};

matmul_work measure_matmul_work(const graph& g);

/// Whether a chunk plan of this work gives its matmuls too few rows: most of
/// its FLOPs are matmuls and their rows are fewer than `min_rows` (0: never).
bool chunks_starve_matmuls(const matmul_work& chunk, int64_t min_rows);

} // namespace caf_serving::onnx
