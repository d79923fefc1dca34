#include "cuda/device_arena.hpp"

#include <algorithm>
#include <cstdio>

namespace caf_serving::cuda {

namespace {

size_t align_up(size_t n) {
  return (n + device_alignment - 1) / device_alignment * device_alignment;
}

/// Appends a region of `bytes` at the next aligned offset.
region place(size_t& cursor, size_t bytes) {
  region r{align_up(cursor), bytes};
  cursor = r.end();
  return r;
}

} // namespace

device_arena_layout plan_device_arena(const device_arena_request& req) {
  device_arena_layout l;
  size_t cursor = 0;
  for (size_t w : req.weights)
    l.weights.push_back(place(cursor, w));
  size_t act = 0;
  for (size_t a : req.bucket_arenas)
    act = std::max(act, a);
  l.activations = place(cursor, act);
  uint32_t slots = std::max(req.slots, 1u);
  size_t staging_start = 0;
  for (uint32_t s = 0; s < slots; ++s) {
    size_t slot_start = align_up(cursor);
    std::vector<region> in, out;
    for (size_t b : req.input_row_bytes)
      in.push_back(place(cursor, b * req.max_rows));
    for (size_t b : req.output_row_bytes)
      out.push_back(place(cursor, b * req.max_rows));
    if (s == 0) staging_start = slot_start;
    if (s == 0) l.staging_bytes_per_slot = align_up(cursor) - slot_start;
    l.inputs.push_back(std::move(in));
    l.outputs.push_back(std::move(out));
  }
  (void)staging_start;
  l.workspace = place(cursor, req.workspace);
  l.total_bytes = align_up(cursor);
  return l;
}

std::string describe(const device_arena_layout& l) {
  size_t weights = 0;
  for (const auto& r : l.weights) weights += r.bytes;
  size_t io = 0;
  for (const auto& slot : l.inputs) for (const auto& r : slot) io += r.bytes;
  for (const auto& slot : l.outputs) for (const auto& r : slot) io += r.bytes;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "device arena %.1f MiB: weights %.1f, activations %.1f, I/O %.1f (%zu slots), "
                "workspace %.1f",
                l.total_bytes / 1048576.0, weights / 1048576.0, l.activations.bytes / 1048576.0,
                io / 1048576.0, l.inputs.size(), l.workspace.bytes / 1048576.0);
  return buf;
}

std::optional<std::string> check_fits(const device_arena_layout& l, size_t free_bytes,
                                      size_t reserve_bytes, const std::string& model, int device) {
  if (l.total_bytes + reserve_bytes <= free_bytes) return std::nullopt;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "model '%s' does not fit on GPU %d: an instance needs %.1f MiB (%s) plus %.1f "
                "MiB for cuDNN, cuBLASLt and its CUDA graphs, and the GPU has %.1f MiB free; "
                "lower max_batch_size or the largest size in parameter cuda_graph_batch_sizes, "
                "use fewer instances per GPU (instance_group count), or unload other models",
                model.c_str(), device, l.total_bytes / 1048576.0, describe(l).c_str(),
                reserve_bytes / 1048576.0, free_bytes / 1048576.0);
  return std::string(buf);
}

} // namespace caf_serving::cuda
