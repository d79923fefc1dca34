#include "scheduler/bucket_padding.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::scheduler;

namespace {

uint32_t padded(const padding_choice& c) {
  auto* p = std::get_if<pad_now>(&c);
  return p ? p->bucket : 0;
}

} // namespace

TEST_CASE("no buckets, no padding decisions") {
  CHECK(std::holds_alternative<keep_waiting>(choose_padding({{}, 3, 10, 0})));
}

TEST_CASE("a batch that fills a bucket exactly goes now, unpadded") {
  CHECK(padded(choose_padding({{1, 2, 4, 8}, 4, 0, 1000})) == 4);
}

TEST_CASE("pads when the missing rows would arrive after the delay runs out") {
  // 6 rows, bucket 8: 2 rows missing, one row every 300 us -> 600 us > 500 us left.
  CHECK(padded(choose_padding({{1, 2, 4, 8}, 6, 300, 500})) == 8);
  // Same, but 700 us left: waiting fills the bucket for free.
  CHECK(std::holds_alternative<keep_waiting>(choose_padding({{1, 2, 4, 8}, 6, 300, 700})));
}

TEST_CASE("unknown arrival rate or rows above every bucket: keep waiting") {
  CHECK(std::holds_alternative<keep_waiting>(choose_padding({{1, 2, 4, 8}, 5, 0, 0})));
  CHECK(std::holds_alternative<keep_waiting>(choose_padding({{1, 2, 4, 8}, 9, 100, 0})));
}
