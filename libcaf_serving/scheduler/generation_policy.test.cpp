#include "scheduler/generation_policy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

using namespace caf_serving::scheduler;

namespace {

time_point at(int ms) {
  return time_point{} + std::chrono::milliseconds(ms);
}

generation_limits small_limits() {
  generation_limits l;
  l.max_running = 4;
  l.max_step_tokens = 8;
  l.block_tokens = 4;
  l.cache_blocks = 100;
  l.max_context = 64;
  l.max_waiting = 3;
  return l;
}

const step_work* work_of(const step_plan& p, uint64_t id) {
  for (const auto& w : p.work)
    if (w.id == id)
      return &w;
  return nullptr;
}

} // namespace

TEST_CASE("limits: every running sequence must be able to decode in one step") {
  auto l = small_limits();
  CHECK_FALSE(check_limits(l));
  l.max_step_tokens = 3;
  REQUIRE(check_limits(l));
  CHECK(check_limits(l)->find("max_step_tokens (3)") != std::string::npos);
}

TEST_CASE("a long prompt is prefilled in chunks, then one token a step until max_tokens") {
  generation_policy p{small_limits()};
  REQUIRE_FALSE(p.admit(1, 10, 3, at(0)));
  auto s1 = p.plan_step();
  REQUIRE(s1.work.size() == 1);
  CHECK(s1.work[0].first_position == 0);
  CHECK(s1.work[0].tokens == 8); // the step's budget
  CHECK_FALSE(s1.work[0].emits_token);
  CHECK(p.used_blocks() == 2);
  CHECK(p.step_done().empty());
  auto s2 = p.plan_step();
  REQUIRE(s2.work.size() == 1);
  CHECK(s2.work[0].first_position == 8);
  CHECK(s2.work[0].tokens == 2);
  CHECK(s2.work[0].emits_token); // the whole prompt is in: the first token
  p.step_done();
  CHECK(p.generated(1) == 1);
  auto s3 = p.plan_step();
  CHECK(s3.work[0].first_position == 10);
  CHECK(s3.work[0].tokens == 1);
  CHECK(s3.work[0].emits_token);
  p.step_done();
  p.plan_step();
  auto done = p.step_done(); // the third token
  CHECK(done == std::vector<uint64_t>{1});
  CHECK(p.running() == 0);
  CHECK(p.used_blocks() == 0);
  CHECK(p.plan_step().work.empty());
}

TEST_CASE("a step's plan stands until it is done") {
  generation_policy p{small_limits()};
  REQUIRE_FALSE(p.admit(1, 3, 2, at(0)));
  auto first = p.plan_step();
  REQUIRE_FALSE(p.admit(2, 3, 2, at(1))); // joins at the next step, not this one
  auto again = p.plan_step();
  CHECK(again.work.size() == first.work.size());
  p.step_done();
  CHECK(work_of(p.plan_step(), 2) != nullptr);
}

TEST_CASE("an empty plan does not stand: a request admitted after it runs at the next") {
  generation_policy p{small_limits()};
  CHECK(p.plan_step().work.empty()); // idle: the actor waits for a request
  REQUIRE_FALSE(p.admit(1, 3, 2, at(0)));
  const auto& plan = p.plan_step();
  REQUIRE(work_of(plan, 1) != nullptr);
  CHECK(work_of(plan, 1)->tokens == 3);
}

TEST_CASE("decoding sequences go before a long prompt, which takes what is left") {
  generation_policy p{small_limits()};
  REQUIRE_FALSE(p.admit(1, 2, 5, at(0)));
  p.plan_step();
  p.step_done(); // 1 has its first token and decodes from now on
  REQUIRE_FALSE(p.admit(2, 20, 1, at(1)));
  auto s = p.plan_step();
  REQUIRE(work_of(s, 1));
  REQUIRE(work_of(s, 2));
  CHECK(work_of(s, 1)->tokens == 1);
  CHECK(work_of(s, 2)->tokens == 7); // 8 a step, one of them for the decode
  CHECK(s.tokens == 8);
  CHECK(s.work[0].id == 1); // admission order
}

TEST_CASE("refusals name the limit: context, the whole cache, max_tokens, a full queue") {
  auto l = small_limits();
  l.cache_blocks = 4; // 16 tokens
  generation_policy p{l};
  auto over_context = p.admit(1, 60, 10, at(0));
  REQUIRE(over_context);
  CHECK(over_context->status == 400);
  CHECK(over_context->message.find("context of 64 tokens") != std::string::npos);
  auto over_cache = p.admit(2, 10, 10, at(0));
  REQUIRE(over_cache);
  CHECK(over_cache->status == 400);
  CHECK(over_cache->message.find("whole KV cache (4 blocks of 4 tokens)") != std::string::npos);
  auto zero = p.admit(3, 4, 0, at(0));
  REQUIRE(zero);
  CHECK(zero->message.find("max_tokens") != std::string::npos);
  CHECK(p.admit(4, 0, 4, at(0)));
  for (uint64_t id = 10; id < 13; ++id)
    REQUIRE_FALSE(p.admit(id, 2, 2, at(0)));
  auto full = p.admit(13, 2, 2, at(5));
  REQUIRE(full);
  CHECK(full->status == 503);
  CHECK(p.oldest_waiting(at(5)) == std::chrono::milliseconds(5));
}

TEST_CASE("a full cache preempts the youngest sequence, which recomputes and ends the same") {
  auto l = small_limits();
  l.cache_blocks = 4; // 16 tokens: two sequences of 6 + 6 cannot both finish at once
  generation_policy p{l};
  REQUIRE_FALSE(p.admit(1, 6, 6, at(0)));
  REQUIRE_FALSE(p.admit(2, 6, 6, at(0)));
  std::map<uint64_t, uint32_t> tokens;
  std::vector<uint64_t> finished;
  bool saw_preemption = false;
  for (int step = 0; step < 100 && finished.size() < 2; ++step) {
    const auto& s = p.plan_step();
    saw_preemption = saw_preemption || !s.preempted.empty();
    for (auto id : s.preempted)
      CHECK(id == 2); // the younger one
    CHECK(p.used_blocks() <= 4);
    for (const auto& w : s.work)
      tokens[w.id] += w.emits_token;
    for (auto id : p.step_done())
      finished.push_back(id);
  }
  CHECK(saw_preemption);
  CHECK(p.preemptions() >= 1);
  CHECK(finished == std::vector<uint64_t>{1, 2});
  CHECK(tokens[1] == 6);
  CHECK(tokens[2] == 6);
  CHECK(p.used_blocks() == 0);
}

TEST_CASE("cancelled and finished sequences free their blocks, also while their step runs") {
  generation_policy p{small_limits()};
  REQUIRE_FALSE(p.admit(1, 5, 10, at(0)));
  REQUIRE_FALSE(p.admit(2, 3, 10, at(0)));
  p.plan_step();
  p.cancel(1); // the client went away mid-step
  CHECK(p.step_done().empty());
  CHECK(p.running() == 1);
  CHECK(p.used_blocks() == 1); // 2's three tokens
  p.finish(2);
  CHECK(p.used_blocks() == 0);
  // The same id again, while a step planned for the old one runs.
  REQUIRE_FALSE(p.admit(3, 2, 2, at(1)));
  p.plan_step();
  p.cancel(3);
  REQUIRE_FALSE(p.admit(3, 4, 2, at(2)));
  p.step_done(); // the old sequence's work is not the new one's
  auto s = p.plan_step();
  REQUIRE(work_of(s, 3));
  CHECK(work_of(s, 3)->first_position == 0);
  CHECK(work_of(s, 3)->tokens == 4);
}

TEST_CASE("randomized: no sequence lost, starved or stepped twice; the cache never overflows") {
  generation_limits l;
  l.max_running = 6;
  l.max_step_tokens = 24;
  l.block_tokens = 4;
  l.cache_blocks = 20; // 80 tokens
  l.max_context = 64;
  l.max_waiting = 500;
  uint64_t preemptions = 0;
  for (unsigned seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    generation_policy p{l};
    struct expected {
      uint32_t prompt, max_tokens, computed = 0, generated = 0;
      bool stopped_early = false;
    };
    std::map<uint64_t, expected> live;
    std::set<uint64_t> done;
    uint64_t next_id = 0, admitted = 0;
    const uint64_t total = 150;
    int steps = 0;
    while ((admitted < total || !live.empty()) && steps < 20000) {
      // Arrivals: a few at a time while any are left.
      for (int k = std::uniform_int_distribution<int>(0, 2)(rng); k > 0 && admitted < total; --k) {
        uint32_t prompt = std::uniform_int_distribution<uint32_t>(1, 40)(rng);
        uint32_t max_tokens = std::uniform_int_distribution<uint32_t>(1, 24)(rng);
        uint64_t id = next_id++;
        auto refused = p.admit(id, prompt, max_tokens, at(steps));
        if (refused) {
          CHECK(refused->status == 400);
          CHECK(prompt + max_tokens > 64);
          continue;
        }
        live[id] = {prompt, max_tokens};
        ++admitted;
      }
      const auto& s = p.plan_step();
      ++steps;
      CHECK(s.tokens <= l.max_step_tokens);
      CHECK(p.used_blocks() <= l.cache_blocks);
      for (auto id : s.preempted)
        live.at(id).computed = 0; // its cache is gone: it recomputes
      std::set<uint64_t> stepped;
      for (const auto& w : s.work) {
        CHECK(stepped.insert(w.id).second); // once a step
        auto& e = live.at(w.id);
        CHECK(w.first_position == e.computed);
        CHECK(w.first_position + w.tokens <= e.prompt + e.generated);
        CHECK(w.emits_token == (w.first_position + w.tokens == e.prompt + e.generated));
      }
      auto plan = s.work;
      auto finished = p.step_done();
      for (const auto& w : plan) {
        auto& e = live.at(w.id);
        e.computed = w.first_position + w.tokens;
        e.generated += w.emits_token;
      }
      for (auto id : finished) {
        CHECK(live.at(id).generated == live.at(id).max_tokens);
        done.insert(id);
        live.erase(id);
      }
      // Now and then a sequence stops early (a stop string) or is cancelled.
      if (!live.empty() && std::uniform_int_distribution<int>(0, 30)(rng) == 0) {
        auto it = std::next(live.begin(),
                            std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng));
        p.finish(it->first);
        done.insert(it->first);
        live.erase(it);
      }
    }
    CHECK(live.empty()); // every sequence finished: none lost or starved
    CHECK(done.size() == admitted);
    CHECK(p.used_blocks() == 0);
    CHECK(p.running() == 0);
    CHECK(p.waiting() == 0);
    preemptions += p.preemptions();
  }
  CHECK(preemptions > 0); // the cache was short enough to preempt
}

namespace {

/// Teaches `p` a machine whose steps cost 10 ms + 1 ms per token.
void learn(generation_policy& p) {
  for (uint32_t i = 0; i < 40; ++i) {
    uint32_t tokens = 1 + (i * 7) % 60;
    p.observe_step(tokens, std::chrono::milliseconds(10 + tokens));
  }
}

/// Runs steps until nothing runs or waits; returns the largest step's tokens.
uint32_t drain(generation_policy& p) {
  uint32_t largest = 0;
  for (int guard = 0; guard < 10000; ++guard) {
    const auto& plan = p.plan_step();
    if (plan.work.empty() && plan.preempted.empty())
      return largest;
    largest = std::max(largest, plan.tokens);
    p.step_done();
  }
  FAIL("the policy never drained");
  return largest;
}

} // namespace

TEST_CASE("a TPOT target bounds each step's tokens by the cost model, and every running "
          "sequence still decodes") {
  generation_limits l;
  l.max_running = 32;
  l.max_step_tokens = 512;
  l.block_tokens = 16;
  l.cache_blocks = 4096;
  l.max_context = 1024;
  l.max_waiting = 100;
  l.tpot_target = std::chrono::milliseconds(40); // 10 ms + 30 tokens
  generation_policy targeted(l);
  l.tpot_target = {};
  generation_policy untargeted(l);
  learn(targeted);
  learn(untargeted);
  for (uint64_t id = 0; id < 20; ++id) {
    REQUIRE_FALSE(targeted.admit(id, 100, 8, at(0)));
    REQUIRE_FALSE(untargeted.admit(id, 100, 8, at(0)));
  }
  CHECK(drain(untargeted) > 100);
  // Steps stay within the target's tokens, except where the running sequences' decodes alone
  // exceed them: at most 30 run at once, so never beyond 30 tokens.
  const auto& first = targeted.plan_step();
  CHECK(first.tokens == 30);
  std::set<uint64_t> seen;
  for (int guard = 0; guard < 10000; ++guard) {
    const auto& plan = targeted.plan_step();
    if (plan.work.empty())
      break;
    CHECK(plan.tokens <= 30);
    CHECK(targeted.running() <= 30);
    // Every sequence gets its turn.
    for (const auto& w : plan.work)
      seen.insert(w.id);
    targeted.step_done();
  }
  CHECK(seen.size() == 20);
  CHECK(targeted.running() == 0);
  CHECK(targeted.waiting() == 0);
  CHECK(targeted.shed() == 0);
}

TEST_CASE("a TTFT target sheds at once the request whose first token cannot come in time") {
  generation_limits l;
  l.max_running = 64;
  l.max_step_tokens = 64;
  l.block_tokens = 16;
  l.cache_blocks = 4096;
  l.max_context = 1024;
  l.max_waiting = 100;
  l.ttft_target = std::chrono::milliseconds(500);
  generation_policy p(l);
  // Before the cost model knows anything, nothing is shed.
  for (uint64_t id = 0; id < 3; ++id)
    CHECK_FALSE(p.admit(id, 200, 4, at(0)));
  learn(p);
  // Queued: 600 prompt tokens, 64 per step of 74 ms: 10 steps, 740 ms for the next one.
  CHECK(p.predicted_first_token(40) > std::chrono::milliseconds(500));
  auto refused = p.admit(10, 40, 4, at(0));
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(refused->message.find("time-to-first-token target of 500 ms") != std::string::npos);
  CHECK(p.shed() == 1);
  // A looser request-level target does not loosen the model's; a tighter one binds.
  CHECK(p.admit(11, 40, 4, at(0), std::chrono::milliseconds(5000)));
  // Once the queue has drained, the same request is admitted.
  drain(p);
  CHECK(p.predicted_first_token(40) < std::chrono::milliseconds(100));
  CHECK_FALSE(p.admit(12, 40, 4, at(0)));
  auto tight = p.admit(13, 40, 4, at(0), std::chrono::milliseconds(20));
  REQUIRE(tight);
  CHECK(tight->status == 503);
}

TEST_CASE("a TTFT target counts the wait for a running slot: behind a full batch of long "
          "outputs, a short prompt is shed") {
  generation_limits l;
  l.max_running = 4;
  l.max_step_tokens = 64;
  l.block_tokens = 16;
  l.cache_blocks = 4096;
  l.max_context = 1024;
  l.max_waiting = 100;
  l.ttft_target = std::chrono::milliseconds(500);
  generation_policy p(l);
  learn(p); // 10 ms + 1 ms per token
  for (uint64_t id = 0; id < 4; ++id)
    REQUIRE_FALSE(p.admit(id, 8, 100, at(0)));
  // The four prefill in one step, then each decodes: 99 more steps of 14 ms before a slot frees.
  p.plan_step();
  p.step_done();
  for (int i = 0; i < 10; ++i) {
    p.plan_step();
    p.step_done();
  }
  CHECK(p.running() == 4);
  // 89 steps of 14 ms ahead of its prefill: over a second, whatever its prompt's size.
  const auto predicted = p.predicted_first_token(8);
  CHECK(predicted > std::chrono::milliseconds(89 * 14));
  CHECK(predicted < std::chrono::milliseconds(91 * 14 + 30));
  auto refused = p.admit(10, 8, 4, at(0));
  REQUIRE(refused);
  CHECK(refused->status == 503);
  // Replaying stops once past the target.
  CHECK(p.predicted_first_token(8, std::chrono::milliseconds(100))
        < std::chrono::milliseconds(200));
  // With a free slot the same prompt comes in one step beside the four decodes.
  p.finish(0);
  CHECK(p.predicted_first_token(8) < std::chrono::milliseconds(30));
  CHECK_FALSE(p.admit(11, 8, 4, at(0)));
}

TEST_CASE("the TTFT prediction counts the step running now, and its admissions") {
  generation_limits l;
  l.max_running = 8;
  l.max_step_tokens = 64;
  l.block_tokens = 16;
  l.cache_blocks = 4096;
  l.max_context = 1024;
  l.max_waiting = 100;
  generation_policy p(l);
  learn(p);
  REQUIRE_FALSE(p.admit(0, 60, 4, at(0)));
  const auto idle = p.predicted_first_token(2);
  // Idle, the 2-token prompt joins request 0's prefill: 62 tokens in one step, 72 ms.
  CHECK(idle >= std::chrono::milliseconds(71));
  CHECK(idle <= std::chrono::milliseconds(73));
  // Once planned, request 0's prefill runs now without it (70 ms); the next step has
  // request 0's decode and the prompt (13 ms).
  p.plan_step();
  const auto running = p.predicted_first_token(2);
  CHECK(running >= std::chrono::milliseconds(82));
  CHECK(running <= std::chrono::milliseconds(84));
}

TEST_CASE("the TTFT prediction learns how late first tokens come, and sheds by it") {
  generation_limits l;
  l.max_running = 64;
  l.max_step_tokens = 64;
  l.block_tokens = 16;
  l.cache_blocks = 4096;
  l.max_context = 1024;
  l.max_waiting = 1000;
  l.ttft_target = std::chrono::milliseconds(150);
  generation_policy p(l);
  learn(p);
  CHECK(p.first_token_lateness() == doctest::Approx(1.0));
  // First tokens come twice as late as predicted, again and again.
  uint64_t id = 0;
  for (int round = 0; round < 200; ++round, ++id) {
    const auto predicted = p.predicted_first_token(30);
    REQUIRE_FALSE(p.admit(id, 30, 1, at(0)));
    p.observe_first_token(id, 2 * predicted);
    p.observe_first_token(id, 100 * predicted); // once per sequence
    drain(p);
  }
  CHECK(p.first_token_lateness() > 1.8);
  CHECK(p.first_token_lateness() < 2.2);
  // Behind a queued 60-token prompt: its step with 4 of the 30 tokens (74 ms), then the
  // other 26 (36 ms): 110 ms predicted, within the target, but about 220 ms as it comes.
  REQUIRE_FALSE(p.admit(1000, 60, 1, at(0)));
  const auto predicted = p.predicted_first_token(30);
  CHECK(predicted < std::chrono::milliseconds(150));
  CHECK(2 * predicted > std::chrono::milliseconds(150));
  auto refused = p.admit(2000, 30, 1, at(0));
  REQUIRE(refused);
  CHECK(refused->status == 503);
  // Unknown sequences and those without a prediction change nothing.
  const double before = p.first_token_lateness();
  p.observe_first_token(99999, std::chrono::seconds(10));
  CHECK(p.first_token_lateness() == before);
}
