// The data-movement and reduction launchers refuse bad arguments with a message that
// says what was wrong, before they touch the device, and return at once on empty
// tensors: so this runs, and is labelled, without a GPU. (The kernels' results are
// checked on the device by kernels.test.cpp over the table's cases.)
#include "cuda/gather_axis.hpp"
#include "cuda/permute.hpp"
#include "cuda/reduce.hpp"
#include "cuda/strided_copy.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace caf_serving::kernels;

namespace {

// Never dereferenced: every call below throws or returns before launching.
int fake[4];

} // namespace

TEST_CASE("permute refuses a perm that is not a permutation and skips empty tensors") {
  permute_args a;
  a.input = fake;
  a.output = fake + 2;
  a.element_size = 4;
  a.shape.rank = 2;
  a.shape.dims[0] = 2;
  a.shape.dims[1] = 3;
  a.shape.perm[0] = 1;
  a.shape.perm[1] = 1;
  CHECK_THROWS_WITH_AS(launch_permute(a, nullptr), doctest::Contains("not a permutation"),
                       std::invalid_argument);
  a.shape.perm[0] = 0;
  a.shape.dims[0] = 0; // nothing to move: no launch, no device needed
  CHECK_NOTHROW(launch_permute(a, nullptr));
}

TEST_CASE("strided copies refuse boxes outside their buffers, before enqueuing any") {
  strided_copy_args good;
  good.src = fake;
  good.dst = fake + 2;
  good.element_size = 4;
  good.box.rank = 1;
  good.box.dims[0] = 2;
  good.box.src_strides[0] = good.box.dst_strides[0] = 1;
  strided_copy_args bad = good;
  bad.box.src_strides[0] = -1; // reaches element -1
  CHECK_THROWS_WITH_AS(launch_strided_copy(bad, nullptr),
                       doctest::Contains("before the buffer's start"), std::invalid_argument);
  // The good box comes first, the bad one second: nothing may have been launched when
  // the throw comes (there is no device here to launch on).
  CHECK_THROWS_AS(launch_strided_copies({good, bad}, nullptr), std::invalid_argument);
  bad = good;
  bad.element_size = 16;
  CHECK_THROWS_WITH_AS(launch_strided_copy(bad, nullptr), doctest::Contains("element size 16"),
                       std::invalid_argument);
  bad = good;
  bad.dst_elements = 1;
  CHECK_THROWS_WITH_AS(launch_strided_copy(bad, nullptr), doctest::Contains("past the 1"),
                       std::invalid_argument);
  fill_args f;
  f.dst = fake;
  f.element_size = 3;
  f.count = 1;
  CHECK_THROWS_AS(launch_fill(f, nullptr), std::invalid_argument);
}

TEST_CASE("gather needs an error flag and an axis inside the data's rank") {
  gather_axis_args a;
  a.data = fake;
  a.indices = fake;
  a.output = fake;
  a.element_size = 4;
  a.rank = 2;
  a.dims[0] = 4;
  a.dims[1] = 3;
  a.index_count = 1;
  CHECK_THROWS_WITH_AS(launch_gather_axis(a, nullptr), doctest::Contains("error_flag is required"),
                       std::invalid_argument);
  a.error_flag = fake;
  a.axis = -3;
  CHECK_THROWS_WITH_AS(launch_gather_axis(a, nullptr), doctest::Contains("axis -3 is outside"),
                       std::invalid_argument);
  a.axis = 0;
  a.index_count = 0; // no indices: an empty output
  CHECK_NOTHROW(launch_gather_axis(a, nullptr));
}

TEST_CASE("reduce refuses axes that are not adjacent") {
  reduce_args a;
  a.input = fake;
  a.output = fake;
  a.rank = 3;
  a.dims[0] = 2;
  a.dims[1] = 3;
  a.dims[2] = 4;
  a.axes[0] = 0;
  a.axes[1] = 2;
  a.axis_count = 2;
  CHECK_THROWS_WITH_AS(launch_reduce(a, nullptr), doctest::Contains("must be adjacent"),
                       std::invalid_argument);
}
