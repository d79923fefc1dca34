/// Which FusedAttention nodes the CUDA backend's attention step takes, as a dry
/// run of the step selection (cuda/steps.hpp): no device needed. The numerics
/// run on a GPU in tests/gpu/cuda_backend.test.cpp, on every attention fixture.

#include "cuda/steps.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

struct attention_case {
  std::vector<int64_t> q{2, 16, 64}, kv{2, 16, 64};
  int64_t heads = 4;
  std::vector<int64_t> mask; ///< empty: no mask
  datatype dtype = datatype::fp32;
};

/// The kernel the dry run chooses for one FusedAttention node.
std::string chosen(const attention_case& c) {
  onnx::graph g;
  int q = g.add_value("q", c.dtype, c.q, true);
  int k = g.add_value("k", c.dtype, c.kv, true);
  int v = g.add_value("v", c.dtype, c.kv, true);
  std::vector<int> ins{q, k, v};
  if (!c.mask.empty()) ins.push_back(g.add_value("m", c.dtype, c.mask, true));
  int y = g.add_value("y", c.dtype, c.q, true);
  auto& n = g.add_node("FusedAttention", "attention", ins, {y});
  n.set_i("num_heads", c.heads);
  n.set_f("scale", 0.125f);
  step_builder b{nullptr, g, std::vector<void*>(g.values.size(), nullptr), {}};
  b.build();
  REQUIRE(b.steps.size() == 1);
  return b.steps[0].kernel;
}

} // namespace

TEST_CASE("FusedAttention with the masks the passes write is a device step") {
  attention_case c;
  CHECK(chosen(c) == "attention"); // no mask (ViT)
  for (auto mask : std::vector<std::vector<int64_t>>{
         {2, 1, 1, 16},   // padding
         {16, 16},        // causal, as a constant
         {1, 1, 16, 16},  // causal, 4-D
         {2, 4, 16, 16},  // full
         {1, 4, 1, 16}}) { // per head and key
    CAPTURE(mask.size());
    c.mask = mask;
    CHECK(chosen(c) == "attention");
  }
  // Keys and values of another length than the queries.
  attention_case cross;
  cross.kv = {2, 24, 64};
  cross.mask = {2, 1, 1, 24};
  CHECK(chosen(cross) == "attention");
  // Scores of 3000 x 3000 per pair (36 MB) fit one at a time.
  attention_case long_seq;
  long_seq.q = long_seq.kv = {1, 3000, 64};
  CHECK(chosen(long_seq) == "attention");
}

TEST_CASE("what the attention step does not take stays a host step") {
  attention_case c;
  c.mask = {2, 1, 16, 1}; // constant along the keys
  CHECK(chosen(c) == "host:FusedAttention");
  c.mask = {3, 1, 1, 16}; // does not broadcast to [2, 4, 16, 16]
  CHECK(chosen(c) == "host:FusedAttention");
  attention_case odd;
  odd.heads = 5; // 64 columns do not split into 5 heads
  CHECK(chosen(odd) == "host:FusedAttention");
  attention_case v_other;
  v_other.kv = {2, 16, 32}; // K and V narrower than Q
  CHECK(chosen(v_other) == "host:FusedAttention");
  attention_case half;
  half.dtype = datatype::fp16;
  CHECK(chosen(half) == "host:FusedAttention");
  // One pair's scores (4096 x 4096 floats, 64 MiB) exceed the workspace's scores part.
  attention_case huge;
  huge.q = huge.kv = {1, 4096, 64};
  CHECK(chosen(huge) == "host:FusedAttention");
}
