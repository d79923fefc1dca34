#include "scheduler/batching_policy.hpp"
#include "scheduler/padded_batching.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

using namespace caf_serving;
using namespace caf_serving::scheduler;

namespace {

const time_point origin = time_point{} + std::chrono::hours{1};
time_point at(int64_t us) { return origin + std::chrono::microseconds{us}; }

policy_config padded_policy(int max_batch_size, uint64_t delay_us, double max_waste) {
  policy_config cfg;
  cfg.max_batch_size = max_batch_size;
  cfg.dynamic_batching_enabled = true;
  cfg.dynamic_batching.max_queue_delay_us = delay_us;
  cfg.max_queue_size_default = 1000;
  cfg.max_padding_waste = max_waste;
  return cfg;
}

request_info seq(uint64_t id, uint64_t length, uint32_t rows = 1, uint64_t shape_class = 7) {
  request_info r{id, rows};
  r.shape_class = shape_class;
  r.padded_length = length;
  return r;
}

void admit(batching_policy& p, const request_info& r, time_point now) {
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(r, now)));
}

dispatch expect_dispatch(const poll_result& r) {
  REQUIRE(std::holds_alternative<dispatch>(r.next));
  return std::get<dispatch>(r.next);
}

using ids = std::vector<uint64_t>;

model_config bert_like() {
  model_config m;
  m.name = "bert";
  m.max_batch_size = 8;
  m.dynamic_batching_enabled = true;
  m.inputs = {{"input_ids", datatype::int64, {-1}}, {"attention_mask", datatype::int64, {-1}},
              {"scale", datatype::fp32, {4}}};
  m.outputs = {{"last_hidden_state", datatype::fp32, {-1, 16}}, {"pooled", datatype::fp32, {16}}};
  return m;
}

} // namespace

TEST_CASE("padding: requests of different lengths share a batch within the waste bound") {
  batching_policy p{padded_policy(8, 1000, 0.25)};
  // 100 + 90 + 80 + 100 over 4 * 100 positions: 7.5% padding.
  admit(p, seq(1, 100), at(0));
  admit(p, seq(2, 90), at(1));
  admit(p, seq(3, 80), at(2));
  admit(p, seq(4, 100), at(3));
  auto d = expect_dispatch(p.poll(at(2000), true));
  CHECK(d.ids == ids{1, 2, 3, 4});
}

TEST_CASE("padding: the request that would pass the bound closes the batch, which goes out at once") {
  batching_policy p{padded_policy(8, 100000, 0.25)};
  admit(p, seq(1, 100), at(0));
  admit(p, seq(2, 90), at(1));
  // Joining would make it (300 - 210) / 300 = 30% padding.
  admit(p, seq(3, 20), at(2));
  // Long before the delay runs out: the batch cannot grow, so it goes now.
  auto d = expect_dispatch(p.poll(at(3), true));
  CHECK(d.ids == ids{1, 2});
  // The short request starts the next batch; a longer one that would pad it
  // past the bound (1 - (20 + 200) / 400 = 45%) closes that one too.
  admit(p, seq(4, 200), at(4));
  CHECK(expect_dispatch(p.poll(at(5), true)).ids == ids{3});
  CHECK(p.queued() == 1);
}

TEST_CASE("padding: a longer request raises every earlier request's padding") {
  batching_policy p{padded_policy(8, 100000, 0.25)};
  admit(p, seq(1, 10), at(0));
  admit(p, seq(2, 10), at(1));
  // Alone it is not padded, but the two before it would be padded 10 -> 30:
  // 1 - 50 / 90 = 44%.
  admit(p, seq(3, 30), at(2));
  CHECK(expect_dispatch(p.poll(at(3), true)).ids == ids{1, 2});
}

TEST_CASE("padding: rows weigh a request's length, and shape classes still part batches") {
  batching_policy p{padded_policy(16, 100000, 0.2)};
  // 4 rows at 100 and 1 row at 50: 1 - 450 / 500 = 10%.
  admit(p, seq(1, 100, 4), at(0));
  admit(p, seq(2, 50, 1), at(1));
  // Another shape class (say a different hidden size) never joins.
  admit(p, seq(3, 100, 1, 8), at(2));
  CHECK(expect_dispatch(p.poll(at(3), true)).ids == ids{1, 2});
}

TEST_CASE("padding: a bound of 0 batches equal lengths only") {
  batching_policy p{padded_policy(8, 100000, 0.0)};
  admit(p, seq(1, 64), at(0));
  admit(p, seq(2, 64), at(1));
  admit(p, seq(3, 63), at(2));
  CHECK(expect_dispatch(p.poll(at(3), true)).ids == ids{1, 2});
}

TEST_CASE("padding: a waste bound outside [0, 1) is refused") {
  auto cfg = padded_policy(8, 0, 1.0);
  auto err = batching_policy::validate(cfg);
  REQUIRE(err);
  CHECK(err->message.find("padded_batching_max_waste") != std::string::npos);
}

TEST_CASE("padding: random sequences lose and duplicate no request and respect the bound") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng{seed};
    auto pick = [&](uint64_t lo, uint64_t hi) {
      return std::uniform_int_distribution<uint64_t>{lo, hi}(rng);
    };
    double bound = static_cast<double>(pick(0, 50)) / 100.0;
    int max_batch = static_cast<int>(pick(1, 16));
    uint64_t delay = pick(0, 3) * 500;
    batching_policy p{padded_policy(max_batch, delay, bound)};
    std::map<uint64_t, request_info> outstanding;
    std::set<uint64_t> done;
    uint64_t next_id = 1;
    int64_t now = 0;
    size_t batches = 0, mixed = 0;
    for (int step = 0; step < 2000; ++step) {
      now += static_cast<int64_t>(pick(0, 300));
      if (pick(0, 2) != 0) {
        auto r = seq(next_id++, pick(16, 256), static_cast<uint32_t>(pick(1, max_batch)),
                     pick(0, 4) == 0 ? 2 : 1);
        admit(p, r, at(now));
        outstanding[r.id] = r;
      }
      bool executor = pick(0, 3) != 0;
      for (;;) {
        auto res = p.poll(at(now), executor);
        CHECK(res.expired.empty());
        auto* d = std::get_if<dispatch>(&res.next);
        if (!d)
          break;
        REQUIRE(!d->ids.empty());
        uint64_t longest = 0, rows = 0;
        double elements = 0;
        std::set<uint64_t> lengths, classes;
        for (auto id : d->ids) {
          REQUIRE_MESSAGE(outstanding.count(id) == 1, "request " << id << " lost or duplicated");
          const auto& r = outstanding[id];
          longest = std::max(longest, r.padded_length);
          rows += r.rows;
          elements += double(r.rows) * double(r.padded_length);
          lengths.insert(r.padded_length);
          classes.insert(r.shape_class);
          done.insert(id);
          outstanding.erase(id);
        }
        CHECK(rows <= static_cast<uint64_t>(max_batch));
        CHECK(classes.size() == 1);
        CHECK(1.0 - elements / (double(rows) * double(longest)) <= bound + 1e-9);
        ++batches;
        mixed += lengths.size() > 1 ? 1 : 0;
      }
    }
    // Drain: whatever is left goes out once the delay has passed.
    for (int guard = 0; !outstanding.empty() && guard < 100000; ++guard) {
      now += 5000;
      auto res = p.poll(at(now), true);
      if (auto* d = std::get_if<dispatch>(&res.next))
        for (auto id : d->ids) {
          REQUIRE(outstanding.erase(id) == 1);
          done.insert(id);
        }
    }
    CHECK(outstanding.empty());
    CHECK(done.size() == next_id - 1);
    CHECK(p.queued() == 0);
    if (bound >= 0.2 && max_batch >= 4)
      CHECK_MESSAGE(mixed > 0, "seed " << seed << ": no batch mixed lengths in " << batches);
  }
}

TEST_CASE("padding config: parameters are read, and bad values are refused with the reason") {
  auto m = bert_like();
  auto off = read_padded_batching(m);
  REQUIRE(off.ok());
  CHECK_FALSE(off->enabled());

  m.parameters["padded_batching"] = "input_ids:1:0; attention_mask:1:0";
  m.parameters["padded_batching_max_waste"] = "0.3";
  m.parameters["padded_outputs"] = "last_hidden_state:1";
  auto on = read_padded_batching(m);
  REQUIRE(on.ok());
  CHECK(on->enabled());
  REQUIRE(on->inputs.size() == 2);
  CHECK(on->inputs[1].name == "attention_mask");
  CHECK(on->inputs[1].dim == 1);
  CHECK(on->max_waste == doctest::Approx(0.3));
  REQUIRE(on->outputs.size() == 1);
  CHECK(on->output("last_hidden_state")->dim == 1);
  CHECK(on->output("pooled") == nullptr);

  auto refused = [&](std::map<std::string, std::string> params, const std::string& says) {
    auto bad = bert_like();
    bad.parameters = std::move(params);
    auto r = read_padded_batching(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().status == status_code::bad_request);
    CHECK_MESSAGE(r.error().message.find(says) != std::string::npos, r.error().message);
  };
  refused({{"padded_batching", "token_type_ids:1:0"}}, "does not have");
  refused({{"padded_batching", "input_ids:1"}}, "input:dim:pad value");
  refused({{"padded_batching", "input_ids:0:0"}}, "past the batch dimension");
  refused({{"padded_batching", "scale:1:0"}}, "is fixed (4)");
  refused({{"padded_batching", "input_ids:1:0.5"}}, "TYPE_INT64");
  refused({{"padded_batching", "input_ids:1:x"}}, "is not a number");
  refused({{"padded_batching", "input_ids:1:0"}, {"padded_batching_max_waste", "1.5"}},
          "[0, 1)");
  refused({{"padded_batching", "input_ids:1:0"}, {"padded_outputs", "nope:1"}},
          "does not have");
  refused({{"padded_batching", "input_ids:1:0"}, {"padded_outputs", "pooled:2"}},
          "dimensions");
  refused({{"padded_outputs", "last_hidden_state:1"}}, "without padded_batching");
  auto unbatched = bert_like();
  unbatched.max_batch_size = 0;
  unbatched.parameters["padded_batching"] = "input_ids:1:0";
  CHECK(read_padded_batching(unbatched).error().message.find("max_batch_size") != std::string::npos);
  auto no_dynamic = bert_like();
  no_dynamic.dynamic_batching_enabled = false;
  no_dynamic.parameters["padded_batching"] = "input_ids:1:0";
  CHECK(read_padded_batching(no_dynamic).error().message.find("dynamic_batching") != std::string::npos);
}

TEST_CASE("padding: fill_pad writes the pad value in the input's datatype") {
  uint8_t buf[32];
  fill_pad(buf, 3, datatype::int64, -1);
  int64_t i64[3];
  std::memcpy(i64, buf, 24);
  CHECK(i64[0] == -1);
  CHECK(i64[2] == -1);
  fill_pad(buf, 2, datatype::fp32, 0.5);
  float f[2];
  std::memcpy(f, buf, 8);
  CHECK(f[1] == 0.5f);
}
