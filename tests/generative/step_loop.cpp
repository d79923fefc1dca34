// The test's own source implements doctest (caf_serving_add_test defines
// DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN for every source of the target); this
// one only uses its assertions.
#undef DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "step_loop.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <limits>

namespace caf_serving::generative_test {

reference load_reference(const std::string& fixtures, const std::string& model) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.load(fixtures + "/" + model + "_reference.json").value();
  reference out;
  out.eos_id = static_cast<int32_t>(doc["eos_id"].get_int64().value());
  // A named array for every loop: value() of a temporary result is a
  // reference into that temporary.
  auto numbers = [](simdjson::dom::element c, const char* key) {
    simdjson::dom::array a = c[key].get_array().value();
    std::vector<simdjson::dom::element> elements;
    for (simdjson::dom::element e : a)
      elements.push_back(e);
    return elements;
  };
  simdjson::dom::array all = doc["cases"].get_array().value();
  for (simdjson::dom::element c : all) {
    reference_case r;
    for (auto id : numbers(c, "prompt_ids"))
      r.prompt.push_back(static_cast<int32_t>(id.get_int64().value()));
    for (auto id : numbers(c, "generated_ids"))
      r.generated.push_back(static_cast<int32_t>(id.get_int64().value()));
    for (auto g : numbers(c, "top2_gaps"))
      r.gaps.push_back(g.get_double().value());
    out.cases.push_back(std::move(r));
  }
  return out;
}

run_result generate(loaded& l, const reference& ref, const std::vector<uint64_t>& ids,
                    const greedy_config& cfg) {
  const auto& cases = ref.cases;
  const auto& limits = cfg.limits;
  executor::kv_cache_layout layout{l.sig.layers(),
                                   l.sig.kv_heads, l.sig.head_dim, limits.block_tokens,
                                   limits.cache_blocks};
  executor::decoder_runner runner(l.sig, l.model.make_instance(), layout, cfg.runner);
  scheduler::generation_policy policy(limits);
  auto now = scheduler::clock_type::now();
  std::map<uint64_t, std::vector<int32_t>> tokens; // prompt + generated
  run_result out;
  for (uint64_t id : ids) {
    auto refused = policy.admit(id, static_cast<uint32_t>(cases[id].prompt.size()),
                                static_cast<uint32_t>(cases[id].generated.size()), now);
    REQUIRE_MESSAGE(!refused, (refused ? refused->message : std::string()));
    tokens[id] = cases[id].prompt;
  }
  const bool mask_eos = cfg.never_eos && ref.eos_id >= 0
                        && static_cast<uint32_t>(ref.eos_id) < l.sig.vocab;
  std::vector<float> row_logits(l.sig.vocab);
  for (;;) {
    const auto& plan = policy.plan_step();
    for (uint64_t p : plan.preempted)
      runner.release(p);
    if (plan.work.empty())
      break;
    std::vector<executor::decoder_step_item> items;
    for (const auto& w : plan.work) {
      const auto& t = tokens[w.id];
      REQUIRE(w.first_position + w.tokens <= t.size());
      items.push_back({w.id, w.first_position, t.data() + w.first_position, w.tokens,
                       w.emits_token});
    }
    auto logits = runner.run(items);
    REQUIRE_MESSAGE(logits, error_of(logits));
    size_t row = 0;
    for (const auto& w : plan.work) {
      if (!w.emits_token)
        continue;
      const float* first = logits->data() + row++ * l.sig.vocab;
      row_logits.assign(first, first + l.sig.vocab);
      if (mask_eos)
        row_logits[static_cast<size_t>(ref.eos_id)] = -std::numeric_limits<float>::infinity();
      auto best = std::max_element(row_logits.begin(), row_logits.end()) - row_logits.begin();
      tokens[w.id].push_back(static_cast<int32_t>(best));
    }
    ++out.steps;
    for (uint64_t done : policy.step_done())
      runner.release(done);
    CHECK(runner.cache().used_blocks() <= limits.cache_blocks);
  }
  CHECK(runner.cache().used_blocks() == 0);
  CHECK(policy.used_blocks() == 0);
  out.preemptions = policy.preemptions();
  for (uint64_t id : ids)
    out.generated[id].assign(tokens[id].begin() + cases[id].prompt.size(), tokens[id].end());
  return out;
}

int compare(const std::vector<reference_case>& cases, const run_result& r, int& near_ties,
            bool quiet) {
  int wrong = 0;
  for (auto& [id, got] : r.generated) {
    const auto& want = cases[id].generated;
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] == want[i])
        continue;
      if (cases[id].gaps[i] < 1e-4) {
        ++near_ties;
      } else {
        ++wrong;
        if (!quiet)
          MESSAGE("case " << id << " step " << i << ": " << got[i] << " instead of " << want[i]
                          << " (reference gap " << cases[id].gaps[i] << ")");
      }
      break;
    }
  }
  return wrong;
}

} // namespace caf_serving::generative_test
