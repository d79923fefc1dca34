#include "cuda/capture_order.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::cuda;

TEST_CASE("warm-ups of every bucket, largest first, then capture+verify, then ready") {
  auto steps = capture_order({4, 1, 16, 4, 2});
  REQUIRE(steps.size() == 4 + 8 + 1);
  CHECK(steps[0].action == prepare_action::warm_up);
  CHECK(steps[0].bucket == 16);
  CHECK(steps[3].bucket == 1);
  CHECK(steps[4].action == prepare_action::capture);
  CHECK(steps[4].bucket == 16);
  CHECK(steps[5].action == prepare_action::verify);
  CHECK(steps[5].bucket == 16);
  CHECK(steps.back().action == prepare_action::ready);
  CHECK(check_capture_order(steps) == "");
}

TEST_CASE("no buckets: ready at once") {
  auto steps = capture_order({});
  REQUIRE(steps.size() == 1);
  CHECK(check_capture_order(steps) == "");
}

TEST_CASE("the checker catches each broken rule") {
  using a = prepare_action;
  CHECK(check_capture_order({{a::capture, 4}, {a::ready, 0}}).find("without a warm-up") != std::string::npos);
  CHECK(check_capture_order({{a::warm_up, 1}, {a::warm_up, 4}, {a::ready, 0}}).find("largest first") != std::string::npos);
  CHECK(check_capture_order({{a::warm_up, 4}, {a::capture, 4}, {a::warm_up, 2}, {a::ready, 0}}).find("after a capture") != std::string::npos);
  CHECK(check_capture_order({{a::warm_up, 4}, {a::warm_up, 2}, {a::capture, 4}, {a::ready, 0}}).find("ready before") != std::string::npos);
  CHECK(check_capture_order({{a::warm_up, 2}, {a::verify, 2}, {a::ready, 0}}).find("before its capture") != std::string::npos);
  CHECK(check_capture_order({{a::warm_up, 2}}) == "no ready step");
}
