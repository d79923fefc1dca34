/// The expected_shapes syntax and the shape-plan cache's bounds (count and
/// bytes) and least-recently-used eviction.

#include "onnx/shape_plans.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::onnx;

TEST_CASE("expected_shapes parses sets of input shapes") {
  auto sets = parse_expected_shapes(" input_ids:1x128 ; attention_mask:1x128|input_ids:7;"
                                    "attention_mask:7 ");
  REQUIRE_MESSAGE(sets, sets.error().message);
  REQUIRE(sets->size() == 2);
  CHECK((*sets)[0].at("input_ids") == std::vector<int64_t>{1, 128});
  CHECK((*sets)[0].at("attention_mask") == std::vector<int64_t>{1, 128});
  CHECK((*sets)[1].at("input_ids") == std::vector<int64_t>{7});
  // A name with a colon: the dims follow the last one.
  auto colon = parse_expected_shapes("ns:x:3x4");
  REQUIRE(colon);
  CHECK((*colon)[0].at("ns:x") == std::vector<int64_t>{3, 4});
}

TEST_CASE("expected_shapes syntax errors say where and what to write") {
  struct bad_case {
    const char *text, *says;
  };
  for (auto c : {bad_case{"", "is empty"}, bad_case{"x:3|", "set 2 ('') is empty"},
                 bad_case{"x3", "entry 'x3', which is not 'input:dims'"},
                 bad_case{":3", "which is not 'input:dims'"},
                 bad_case{"x:3xa", "gives input 'x' dims '3xa'"},
                 bad_case{"x:0x3", "at least 1"}, bad_case{"x:-1", "at least 1"},
                 bad_case{"x:99999999999999999999", "whole number"},
                 bad_case{"x:3;x:4", "names input 'x' twice"}}) {
    CAPTURE(c.text);
    auto r = parse_expected_shapes(c.text);
    REQUIRE_FALSE(r);
    CHECK(r.error().status == status_code::bad_request);
    CHECK(r.error().message.find(c.says) != std::string::npos);
    CHECK(r.error().message.find("separated by '|'") != std::string::npos);
  }
}

TEST_CASE("a shape set must name every input with its rank and fixed dims") {
  input_dims inputs{{"ids", {-1}}, {"image", {3, -1, -1}}};
  CHECK(check_shape_set({{"ids", {5}}, {"image", {3, 8, 9}}}, inputs));
  auto unknown = check_shape_set({{"ids", {5}}, {"image", {3, 8, 9}}, {"other", {1}}}, inputs);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().message.find("names input 'other', but the model's inputs are 'ids', "
                                     "'image'")
        != std::string::npos);
  auto missing = check_shape_set({{"ids", {5}}}, inputs);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("gives no shape for input 'image' (dims [3,-1,-1])")
        != std::string::npos);
  auto fixed = check_shape_set({{"ids", {5}}, {"image", {4, 8, 9}}}, inputs);
  REQUIRE_FALSE(fixed);
  CHECK(fixed.error().message.find("gives input 'image' dims [4,8,9], but the model's are "
                                   "[3,-1,-1]")
        != std::string::npos);
  auto open = check_shape_set({{"ids", {-1}}, {"image", {3, 8, 9}}}, inputs);
  REQUIRE_FALSE(open);
  CHECK(open.error().message.find("'ids' dims [-1]") != std::string::npos);
  auto rank = check_shape_set({{"ids", {5, 1}}, {"image", {3, 8, 9}}}, inputs);
  REQUIRE_FALSE(rank);
  CHECK(rank.error().message.find("'ids' dims [5,1]") != std::string::npos);
}

namespace {

plan_key key_of(int64_t seq) {
  return {{{1, seq}}, 1u};
}

} // namespace

TEST_CASE("the shape-plan cache keeps within its bytes, evicting the least recently used") {
  shape_plan_cache<int> cache({8, 1000});
  cache.insert(key_of(1), std::make_shared<int>(1), 400);
  cache.insert(key_of(2), std::make_shared<int>(2), 400);
  CHECK(cache.bytes() == 800);
  // Using 1 makes 2 the least recently used: 2 goes for 3.
  REQUIRE(cache.find(key_of(1)));
  cache.insert(key_of(3), std::make_shared<int>(3), 300);
  CHECK(cache.size() == 2);
  CHECK(cache.bytes() == 700);
  CHECK(cache.evictions() == 1);
  CHECK(cache.find(key_of(2)) == nullptr);
  CHECK(*cache.find(key_of(1)) == 1);
  CHECK(*cache.find(key_of(3)) == 3);
  // A large plan evicts as many as it takes.
  cache.insert(key_of(4), std::make_shared<int>(4), 1000);
  CHECK(cache.size() == 1);
  CHECK(cache.bytes() == 1000);
  CHECK(cache.evictions() == 3);
  CHECK(cache.fits(1000));
  CHECK_FALSE(cache.fits(1001));
}

TEST_CASE("the shape-plan cache keeps within its count, and keeps the first of two inserts") {
  shape_plan_cache<int> cache({2, 1 << 20});
  for (int64_t s = 1; s <= 3; ++s)
    cache.insert(key_of(s), std::make_shared<int>(static_cast<int>(s)), 10);
  CHECK(cache.size() == 2);
  CHECK(cache.find(key_of(1)) == nullptr);
  // Two instances compiled the same shape: the second gets the first's plan.
  auto kept = cache.insert(key_of(3), std::make_shared<int>(33), 10);
  CHECK(*kept == 3);
  CHECK(cache.size() == 2);
  CHECK(cache.bytes() == 20);
  // Keys differ by threads too.
  cache.insert({{{1, 3}}, 2u}, std::make_shared<int>(32), 10);
  CHECK(*cache.find(key_of(3)) == 3);
  CHECK(cache.find(key_of(2)) == nullptr);
}
