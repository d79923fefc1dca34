// The decoding loop without actors: generation_policy plans every step,
// decoder_runner runs it over the executor's KV cache, greedy picks each token.
// 64 prompts of mixed lengths sent at once (sequences join and leave
// mid-batch, long prompts prefilled in chunks, and with a small cache the
// youngest preempted and recomputed) must produce exactly the tokens of
// transformers' greedy generate, and what each prompt produces alone. The
// same for each fixture model: GPT-2 (learned positions, LayerNorm, GELU),
// Llama (grouped-query attention, RoPE, RMSNorm, SiLU MLP) and Qwen2 (as
// Llama, with Q/K/V biases).
#include "executor/decoder_runner.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "scheduler/generation_policy.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace caf_serving;

namespace {

const std::string fixtures = CAF_SERVING_GENERATIVE_FIXTURES;

/// A model of fixtures/ and what tools/generative_fixtures.py built it with.
struct fixture_model {
  std::string name;
  uint32_t kv_heads = 0;
};

const fixture_model gpt2{"tiny_gpt2", 4};
const fixture_model llama{"tiny_llama", 2}; // 4 query heads share 2 KV heads
const fixture_model qwen2{"tiny_qwen2", 2};

struct reference_case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  std::vector<double> gaps; ///< top-1 minus top-2 logit at each step
};

struct reference {
  int32_t eos_id = -1;
  std::vector<reference_case> cases;
};

reference load_reference(const fixture_model& fm) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc =
    parser.load(fixtures + "/" + fm.name + "_reference.json").value();
  reference out;
  out.eos_id = static_cast<int32_t>(doc["eos_id"].get_int64().value());
  std::vector<reference_case>& cases = out.cases;
  // A named array for every loop: value() of a temporary result is a
  // reference into that temporary.
  auto numbers = [](simdjson::dom::element c, const char* key) {
    simdjson::dom::array a = c[key].get_array().value();
    std::vector<simdjson::dom::element> out;
    for (simdjson::dom::element e : a)
      out.push_back(e);
    return out;
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
    cases.push_back(std::move(r));
  }
  return out;
}

/// The message of a failed result, empty for a value: doctest also reports
/// a passing REQUIRE_MESSAGE's message (with -s), so it must not need an error.
template <class Expected>
std::string error_of(const Expected& e) {
  return e ? std::string() : e.error().message;
}

struct loaded {
  onnx::onnx_model model;
  executor::decoder_signature sig;
};

loaded load_model(const fixture_model& fm) {
  onnx::onnx_model_config cfg;
  cfg.model_file = fixtures + "/" + fm.name + "/1/model.onnx";
  cfg.config.name = fm.name;
  cfg.config.max_batch_size = 64;
  cfg.plan_cache_size = 64;
  auto m = onnx::load_onnx_model(cfg);
  REQUIRE_MESSAGE(m, error_of(m));
  auto sig = executor::find_decoder_signature(m->config);
  REQUIRE_MESSAGE(sig, error_of(sig));
  return {std::move(*m), *sig};
}

struct run_result {
  std::map<uint64_t, std::vector<int32_t>> generated;
  uint64_t preemptions = 0;
  uint32_t steps = 0;
};

/// Runs `ids` of the reference's cases through policy and runner until all
/// finish; greedy, with end of sequence never picked (the references were
/// made with min_new_tokens = max_new_tokens).
run_result generate(loaded& l, const reference& ref, const std::vector<uint64_t>& ids,
                    scheduler::generation_limits limits, executor::decoder_runner_config rc) {
  const auto& cases = ref.cases;
  executor::kv_cache_layout layout{static_cast<uint32_t>(l.sig.past_keys.size()),
                                   l.sig.kv_heads, l.sig.head_dim, limits.block_tokens,
                                   limits.cache_blocks};
  executor::decoder_runner runner(l.sig, l.model.make_instance(), layout, rc);
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
      std::vector<float> row_logits(logits->data() + row * l.sig.vocab,
                                    logits->data() + (row + 1) * l.sig.vocab);
      ++row;
      if (ref.eos_id >= 0 && static_cast<uint32_t>(ref.eos_id) < l.sig.vocab)
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

/// Differences from the reference; a step whose two best reference logits are
/// within 1e-4 may differ (float reassociation), and the rest of that sequence
/// is not compared.
int compare(const std::vector<reference_case>& cases, const run_result& r, int& near_ties) {
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
        MESSAGE("case " << id << " step " << i << ": " << got[i] << " instead of " << want[i]
                        << " (reference gap " << cases[id].gaps[i] << ")");
      }
      break;
    }
  }
  return wrong;
}

void check_signature(const fixture_model& fm) {
  auto l = load_model(fm);
  CHECK(l.sig.past_keys.size() == 2);
  CHECK(l.sig.kv_heads == fm.kv_heads);
  CHECK(l.sig.head_dim == 16);
  CHECK(l.sig.vocab == 512);
  CHECK(l.sig.position_ids == "position_ids");
  model_config not_decoder = l.model.config;
  not_decoder.inputs.erase(not_decoder.inputs.begin() + 3); // past_key_values.0.key
  auto bad = executor::find_decoder_signature(not_decoder);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("past_key_values.0.key") != std::string::npos);
}

void check_greedy(const fixture_model& fm) {
  auto ref = load_reference(fm);
  const auto& cases = ref.cases;
  REQUIRE(cases.size() == 64);
  auto l = load_model(fm);
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < cases.size(); ++i)
    all.push_back(i);
  scheduler::generation_limits roomy{.max_running = 64, .max_step_tokens = 128,
                                     .block_tokens = 16, .cache_blocks = 512,
                                     .max_context = 256, .max_waiting = 64};
  int near_ties = 0;
  auto r = generate(l, ref, all, roomy, {.past_bucket = 32, .max_batch = 64});
  CHECK(compare(cases, r, near_ties) == 0);
  CHECK(r.preemptions == 0);
  // A cache of 24 blocks (384 positions) for 64 sequences: most wait, the
  // running ones grow into each other and the youngest are preempted.
  auto tight = roomy;
  tight.cache_blocks = 24;
  tight.max_step_tokens = 64;
  auto p = generate(l, ref, all, tight, {.past_bucket = 16, .max_batch = 8});
  CHECK(compare(cases, p, near_ties) == 0);
  CHECK(p.preemptions > 0);
  MESSAGE(fm.name << ": steps " << r.steps << " (roomy) and " << p.steps << " (tight, "
                  << p.preemptions << " preemptions); near ties " << near_ties);
  // Alone, each of a few gives the same as in the crowd.
  for (uint64_t id : {0u, 17u, 42u, 63u}) {
    auto alone = generate(l, ref, {id}, roomy, {.past_bucket = 32, .max_batch = 64});
    CHECK(alone.generated[id] == r.generated[id]);
  }
}

} // namespace

TEST_CASE("a decoder exported with its cache is found by its tensors") {
  for (const auto& fm : {gpt2, llama, qwen2}) {
    CAPTURE(fm.name);
    check_signature(fm);
  }
}

TEST_CASE("GPT-2: 64 prompts at once give transformers' greedy tokens, with and without "
          "preemption") {
  check_greedy(gpt2);
}

TEST_CASE("Llama (grouped-query attention, RoPE, RMSNorm): 64 prompts at once give "
          "transformers' greedy tokens, with and without preemption") {
  check_greedy(llama);
}

TEST_CASE("Qwen2 (grouped-query attention, QKV biases): 64 prompts at once give "
          "transformers' greedy tokens, with and without preemption") {
  check_greedy(qwen2);
}
