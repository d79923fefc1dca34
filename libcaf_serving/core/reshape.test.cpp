#include "core/reshape.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;

namespace {

using dims = std::vector<int64_t>;

} // namespace

TEST_CASE("reshape_dims refuses shapes that would change the element count") {
  auto r = reshape_dims({2, 3}, {-1, 3}, {7}, false);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("cannot be reshaped from [-1,3] to [7]") != std::string::npos);
  // A shape of another rank than the pattern is refused too.
  CHECK_FALSE(reshape_dims({2, 3, 1}, {3}, {3}, true));
  CHECK(*reshape_dims({4, 6}, {6}, {2, 3}, true) == dims{4, 2, 3});
}
