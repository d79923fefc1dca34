#pragma once
/// How an executor instance checks, at load, that each captured CUDA graph
/// computes what its steps compute when launched directly. No CUDA here: the
/// inputs and the comparison, tested without a GPU.
///
/// For every captured size and every staging slot the backend writes the same
/// random inputs (replay_inputs) into the slot, launches the size's steps
/// directly, reads every output the config declares (what clients receive; an
/// undeclared graph output lives in the arena and its bytes may be reused once
/// nothing reads it), overwrites them with NaN, replays the graph and compares
/// each output (compare_replay). A mismatch fails the load, naming the size,
/// the slot and the output.
///
/// Random inputs, not zeros: on zeros most layers compute zeros or a bias, so a
/// graph that reads a stale pointer or skips a step can still match.

#include "core/datatype.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::cuda {

/// Norm-wise relative difference allowed between a replay and the direct run,
/// ||replay - direct|| / ||direct|| over one floating-point output.
///
/// Why 1e-5: the graph replays the very kernels and library calls of the direct
/// run, with the algorithms chosen at load, on the same addresses, so with
/// deterministic kernels the two are bitwise equal. What may still differ is
/// the order of floating-point sums where a kernel reduces with atomics
/// (cuBLASLt split-K, cuDNN algorithms it reports non-deterministic): a
/// reordered fp32 sum moves each element by a few units in the last place
/// (2^-24 ~ 6e-8 relative), which stays below ~1e-6 norm-wise through a deep
/// network. A capture bug (a stale pointer, a step missing from the graph, the
/// other slot's buffers) changes outputs by order 1. Non-float outputs
/// (indices, masks) must match exactly, and NaN and infinity must fall on the
/// same elements.
inline constexpr double replay_tolerance = 1e-5;

/// Random bytes for an input of `elements` elements of `dtype`, the same for
/// the same seed. Floats are uniform in [-1, 1); integers and booleans are 0 or
/// 1, which is a valid token id, segment id, attention mask and index of any
/// embedding or gather (random integers could index out of range).
std::vector<uint8_t> replay_inputs(datatype dtype, size_t elements, uint64_t seed);

/// Empty when `replay` matches `direct` (same bytes for non-float types;
/// within replay_tolerance for fp32 and fp64); else what differs, naming
/// `output`.
std::optional<std::string> compare_replay(const std::string& output, datatype dtype,
                                          const std::vector<uint8_t>& replay,
                                          const std::vector<uint8_t>& direct);

} // namespace caf_serving::cuda
