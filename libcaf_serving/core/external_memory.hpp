#pragma once
/// Memory that one part of the engine owns and a compiled model reads in
/// place, found by a handle: the generative executor's KV cache, which the
/// paged attention operator (onnx/paged_attention.hpp) reads block by block
/// instead of taking the past as input tensors copied every step.
///
/// The model library stands without the executor (it may not link it), so the
/// graph names the memory by a number in a node attribute, and the owner binds
/// the number to its bytes when they exist:
///
///     uint64_t h = new_external_memory_handle();   // before the graph loads
///     ...rewrite the graph with h, load it...
///     bind_external_memory(h, {cache.data(), cache.floats()});  // the owner
///     ...                                          // runs read find_external_memory(h)
///     unbind_external_memory(h);                   // before the memory goes
///
/// The owner keeps the memory alive and unmoved while it is bound, and runs
/// the model only from the thread that binds and unbinds it (or after): the
/// registry's lock orders the lookups, not the bytes.

#include <cstddef>
#include <cstdint>
#include <optional>

namespace caf_serving {

struct external_memory {
  float* base = nullptr;
  size_t floats = 0;
};

/// A handle never given before in this process (never 0).
uint64_t new_external_memory_handle();

void bind_external_memory(uint64_t handle, external_memory memory);
void unbind_external_memory(uint64_t handle);

/// The memory bound to `handle`; nothing when none is (not yet, or no more).
std::optional<external_memory> find_external_memory(uint64_t handle);

} // namespace caf_serving
