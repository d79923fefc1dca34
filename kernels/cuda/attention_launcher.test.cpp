// The attention launcher refuses what the kernel cannot do with a message that says
// what was wrong, before it touches the device: so this runs, and is labelled,
// without a GPU. (The kernel's results are checked on the device by kernels.test.cpp
// over the table's cases.)
#include "cuda/attention.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace caf_serving::kernels;

namespace {

// Never dereferenced: every call below throws before launching.
alignas(16) unsigned char fake[64];

attention_args valid() {
  attention_args a;
  a.q = a.k = a.v = fake;
  a.o = fake + 16;
  a.strides = {2 * 64 * 64, 64, 2 * 64}; // [B, S, H*D], heads interleaved
  a.heads = 2;
  return a;
}

} // namespace

TEST_CASE("attention refuses head dimensions other than 32, 64 and 128") {
  auto a = valid();
  a.head_dim = 96;
  CHECK_THROWS_WITH_AS(launch_attention(a, nullptr),
                       doctest::Contains("head dimension 96 is not supported; it must be 32, 64 or 128"),
                       std::invalid_argument);
}

TEST_CASE("attention refuses rows cp.async cannot copy: misaligned tensors or strides") {
  auto a = valid();
  a.k = fake + 2;
  CHECK_THROWS_WITH_AS(launch_attention(a, nullptr), doctest::Contains("16-byte aligned"),
                       std::invalid_argument);
  a = valid();
  a.strides.seq = 2 * 64 + 4; // rows 8 bytes apart from the alignment
  CHECK_THROWS_WITH_AS(launch_attention(a, nullptr), doctest::Contains("16-byte aligned"),
                       std::invalid_argument);
}

TEST_CASE("attention takes a mask in f32 or the tensors' type only, aligned to its element") {
  auto a = valid();
  a.type = dtype::bf16;
  a.mask.data = fake;
  a.mask.type = dtype::f16;
  CHECK_THROWS_WITH_AS(launch_attention(a, nullptr),
                       doctest::Contains("f16 mask is not supported with bf16"),
                       std::invalid_argument);
  a.mask.type = dtype::f32;
  a.mask.data = fake + 2;
  CHECK_THROWS_WITH_AS(launch_attention(a, nullptr), doctest::Contains("not aligned"),
                       std::invalid_argument);
}
