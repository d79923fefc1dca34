#include "cuda/device_arena.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace caf_serving::cuda;

namespace {

std::vector<region> all_regions(const device_arena_layout& l) {
  std::vector<region> r = l.weights;
  r.push_back(l.activations);
  for (const auto& s : l.inputs) r.insert(r.end(), s.begin(), s.end());
  for (const auto& s : l.outputs) r.insert(r.end(), s.begin(), s.end());
  r.push_back(l.workspace);
  return r;
}

} // namespace

TEST_CASE("regions are aligned, disjoint and inside the total") {
  device_arena_request req;
  req.weights = {100, 4096, 1, 0, 300};
  req.bucket_arenas = {1000, 64000, 5000};
  req.input_row_bytes = {3 * 224 * 224 * 4};
  req.output_row_bytes = {1000 * 4, 7};
  req.max_rows = 32;
  req.slots = 2;
  req.workspace = 1 << 20;
  auto l = plan_device_arena(req);
  auto regions = all_regions(l);
  std::sort(regions.begin(), regions.end(),
            [](const region& a, const region& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < regions.size(); ++i) {
    CHECK(regions[i].offset % device_alignment == 0);
    CHECK(regions[i].end() <= l.total_bytes);
    if (i > 0) CHECK(regions[i - 1].end() <= regions[i].offset);
  }
  CHECK(l.total_bytes % device_alignment == 0);
}

TEST_CASE("activation arena is the largest bucket's; I/O sized at max rows per slot") {
  device_arena_request req;
  req.bucket_arenas = {1000, 64000, 5000};
  req.input_row_bytes = {12, 40};
  req.output_row_bytes = {8};
  req.max_rows = 16;
  req.slots = 2;
  auto l = plan_device_arena(req);
  CHECK(l.activations.bytes == 64000);
  REQUIRE(l.inputs.size() == 2);
  REQUIRE(l.outputs.size() == 2);
  CHECK(l.inputs[1][1].bytes == 40 * 16);
  CHECK(l.outputs[0][0].bytes == 8 * 16);
  // Both slots have the same shape relative to their start, so one pinned
  // staging block per slot mirrors them.
  size_t slot0 = l.inputs[0][0].offset, slot1 = l.inputs[1][0].offset;
  CHECK(l.outputs[0][0].offset - slot0 == l.outputs[1][0].offset - slot1);
  CHECK(l.staging_bytes_per_slot >= l.outputs[0][0].end() - slot0);
  CHECK(slot1 - slot0 >= l.staging_bytes_per_slot);
}

TEST_CASE("zero slots means one; an empty request is empty") {
  device_arena_request req;
  req.slots = 0;
  req.input_row_bytes = {4};
  auto l = plan_device_arena(req);
  CHECK(l.inputs.size() == 1);
  auto empty = plan_device_arena({});
  CHECK(empty.activations.bytes == 0);
  CHECK(describe(l).find("device arena") == 0);
}

TEST_CASE("an instance that does not fit in the GPU's free memory is a load error saying what to change") {
  device_arena_request req;
  req.weights = {100u << 20};
  req.input_row_bytes = {4096};
  req.output_row_bytes = {40};
  req.max_rows = 32;
  req.workspace = 64u << 20;
  auto l = plan_device_arena(req);
  CHECK_FALSE(check_fits(l, l.total_bytes + (256u << 20), 256u << 20, "m", 0));
  auto why = check_fits(l, l.total_bytes + (255u << 20), 256u << 20, "resnet", 1);
  REQUIRE(why);
  CHECK(why->find("model 'resnet' does not fit on GPU 1") == 0);
  CHECK(why->find("max_batch_size") != std::string::npos);
  CHECK(why->find("instance_group count") != std::string::npos);
}
