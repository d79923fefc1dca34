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
  datatype storage = datatype::fp32; ///< the instance's (precision fp16/bf16: half)
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
  step_builder b{nullptr, g, std::vector<void*>(g.values.size(), nullptr), {}, 0, c.storage};
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

TEST_CASE("at half storage the fused kernel takes self-attention of head dimension 32, 64, 128") {
  for (datatype half : {datatype::fp16, datatype::bf16}) {
    const std::string storage(to_string(half));
    CAPTURE(storage);
    attention_case c;
    c.dtype = c.storage = half;
    for (auto [heads, kernel] : {std::pair{1, "attention_fused"},  // D 64
                                 std::pair{2, "attention_fused"},  // D 32 (MiniLM)
                                 std::pair{4, "attention"},        // D 16
                                 std::pair{8, "attention"}}) {     // D 8
      CAPTURE(heads);
      c.heads = heads;
      c.mask.clear();
      CHECK(chosen(c) == kernel);
      // Every mask the step reads, the kernel reads through the same strides.
      for (auto mask : std::vector<std::vector<int64_t>>{
             {2, 1, 1, 16}, {2, 1, 16, 16}, {16, 16}, {1, 1, 16, 16}, {2, heads, 16, 16},
             {1, heads, 1, 16}}) {
        CAPTURE(mask.size());
        c.mask = mask;
        CHECK(chosen(c) == kernel);
      }
    }
    attention_case d128;
    d128.q = d128.kv = {2, 16, 256};
    d128.heads = 2;
    d128.dtype = d128.storage = half;
    CHECK(chosen(d128) == "attention_fused");
    // Keys of another length than the queries: the cuBLASLt path.
    attention_case cross;
    cross.kv = {2, 24, 64};
    cross.heads = 1;
    cross.mask = {2, 1, 1, 24};
    cross.dtype = cross.storage = half;
    CHECK(chosen(cross) == "attention");
    // No scores in memory: sequences whose scores overflow the workspace's scores
    // part (6000 x 6000 half scores, 72 MB) run fused.
    attention_case huge;
    huge.q = huge.kv = {1, 6000, 64};
    huge.heads = 1;
    huge.dtype = huge.storage = half;
    CHECK(chosen(huge) == "attention_fused");
    // What neither takes stays on the host, as at fp32.
    huge.heads = 4;
    CHECK(chosen(huge) == "host:FusedAttention");
  }
  // fp32 tensors never take the fused kernel (fp16/bf16 MMAs only).
  attention_case fp32;
  fp32.heads = 1;
  CHECK(chosen(fp32) == "attention");
}
