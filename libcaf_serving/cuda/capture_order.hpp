#pragma once
/// The order in which an executor instance prepares its CUDA graphs at load.
///
/// Rules, each for a reason that bites on a real GPU:
/// 1. Every bucket runs once uncaptured (a warm-up) before any capture: cuBLASLt's
///    heuristic query, cuDNN's algorithm search, lazy module loading and the first
///    launch of each kernel allocate or synchronise, which is illegal while a
///    stream is being captured.
/// 2. Warm-ups go largest bucket first: the largest batch asks for the most
///    workspace, so the workspace is sized once and never grows (a graph holds
///    raw pointers; growing the workspace after a capture would dangle them).
/// 3. Captures go largest first too, for the same pointer reason, and each
///    capture is followed by an instantiation and one replay checked against the
///    warm-up's outputs before the next bucket.
/// 4. The model is ready only after the last step.
///
/// No CUDA here: a list of steps the backend walks, tested without a GPU.

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::cuda {

enum class prepare_action {
  warm_up,     ///< run the bucket's steps directly, outside capture
  capture,     ///< cudaStreamBeginCapture .. EndCapture, then instantiate
  verify,      ///< replay the graph once and compare with the warm-up outputs
  ready,       ///< the instance may accept batches
};

const char* to_string(prepare_action a);

struct prepare_step {
  prepare_action action = prepare_action::ready;
  uint32_t bucket = 0; ///< 0 for `ready`
};

/// Steps for `buckets` (any order, duplicates ignored). With no buckets: ready alone.
std::vector<prepare_step> capture_order(std::vector<uint32_t> buckets);

/// Empty when `steps` obeys the rules above, else the first broken rule with the
/// step index: what tests and the backend (as an assertion) check.
std::string check_capture_order(const std::vector<prepare_step>& steps);

} // namespace caf_serving::cuda
