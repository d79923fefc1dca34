// onnxruntime-genai's model files (issue 34): a tiny Llama written by
// onnxruntime_genai.models.builder (GroupQueryAttention with rotary
// embeddings, SkipSimplifiedLayerNormalization, and int4 MatMulNBits weights in
// the int4 build) run through generation_policy + decoder_runner with the
// left-aligned past layout. 64 prompts of mixed lengths at once (with a roomy
// and a tight cache) and alone must give the references of
// tools/genai_fixtures.py: transformers' greedy tokens for the fp32 build,
// onnxruntime's greedy tokens for the int4 build.
#include "executor/decoder_runner.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "scheduler/generation_policy.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

using namespace caf_serving;

namespace {

const std::string fixtures = CAF_SERVING_GENERATIVE_FIXTURES;

struct reference_case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  std::vector<double> gaps; ///< top-1 minus top-2 logit at each step
};

std::vector<reference_case> load_reference(const std::string& model) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.load(fixtures + "/" + model + "_reference.json").value();
  std::vector<reference_case> cases;
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
  return cases;
}

/// genai_config.json's model.decoder: layers, KV heads, head size.
executor::cache_dims genai_dims(const std::string& model) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc =
    parser.load(fixtures + "/" + model + "/1/genai_config.json").value();
  simdjson::dom::element d = doc["model"]["decoder"].value();
  auto u = [&](const char* key) { return static_cast<uint32_t>(d[key].get_int64().value()); };
  return {u("num_hidden_layers"), u("num_key_value_heads"), u("head_size"),
          static_cast<uint32_t>(doc["model"]["vocab_size"].get_int64().value())};
}

uint32_t genai_head_size(const std::string& model) { return genai_dims(model).head_dim; }

struct loaded {
  onnx::onnx_model model;
  executor::decoder_signature sig;
};

loaded load_model(const std::string& name, executor::past_layout layout) {
  onnx::onnx_model_config cfg;
  cfg.model_file = fixtures + "/" + name + "/1/model.onnx";
  cfg.config.name = name;
  cfg.config.max_batch_size = 64;
  cfg.config = executor::with_cache_dims(cfg.config, genai_dims(name));
  cfg.plan_cache_size = 64;
  auto m = onnx::load_onnx_model(cfg);
  REQUIRE_MESSAGE(m, m.error().message);
  auto sig = executor::find_decoder_signature(m->config, {layout, genai_head_size(name)});
  REQUIRE_MESSAGE(sig, sig.error().message);
  return {std::move(*m), *sig};
}

struct run_result {
  std::map<uint64_t, std::vector<int32_t>> generated;
  uint64_t preemptions = 0;
  uint32_t steps = 0;
};

/// Runs `ids` of `cases` through policy and runner until all finish.
run_result generate(loaded& l, const std::vector<reference_case>& cases,
                    const std::vector<uint64_t>& ids, scheduler::generation_limits limits,
                    executor::decoder_runner_config rc) {
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
    REQUIRE_MESSAGE(!refused, refused->message);
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
    REQUIRE_MESSAGE(logits, logits.error().message);
    size_t row = 0;
    for (const auto& w : plan.work) {
      if (!w.emits_token)
        continue;
      const float* l0 = logits->data() + row++ * l.sig.vocab;
      tokens[w.id].push_back(
        static_cast<int32_t>(std::max_element(l0, l0 + l.sig.vocab) - l0));
    }
    ++out.steps;
    for (uint64_t done : policy.step_done())
      runner.release(done);
  }
  CHECK(runner.cache().used_blocks() == 0);
  out.preemptions = policy.preemptions();
  for (uint64_t id : ids)
    out.generated[id].assign(tokens[id].begin() + cases[id].prompt.size(), tokens[id].end());
  return out;
}

/// Sequences that differ from the reference; a step whose two best reference
/// logits are within 1e-4 may differ (counted in `near_ties`), and the rest of
/// that sequence is not compared.
int compare(const std::vector<reference_case>& cases, const run_result& r, int& near_ties,
            bool quiet = false) {
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

const scheduler::generation_limits roomy{.max_running = 64, .max_step_tokens = 128,
                                         .block_tokens = 16, .cache_blocks = 512,
                                         .max_context = 256, .max_waiting = 64};

/// The whole check of one build against its references.
void check_model(const std::string& name) {
  auto cases = load_reference(name);
  REQUIRE(cases.size() == 64);
  auto l = load_model(name, executor::past_layout::left_aligned);
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < cases.size(); ++i)
    all.push_back(i);
  int near_ties = 0;
  auto r = generate(l, cases, all, roomy, {.past_bucket = 32, .max_batch = 64});
  CHECK(compare(cases, r, near_ties) == 0);
  CHECK(r.preemptions == 0);
  // 24 blocks (384 positions) for 64 sequences: the youngest are preempted and recomputed.
  auto tight = roomy;
  tight.cache_blocks = 24;
  tight.max_step_tokens = 64;
  auto p = generate(l, cases, all, tight, {.past_bucket = 16, .max_batch = 8});
  CHECK(compare(cases, p, near_ties) == 0);
  CHECK(p.preemptions > 0);
  MESSAGE(name << ": steps " << r.steps << " (roomy) and " << p.steps << " (tight, "
               << p.preemptions << " preemptions); near ties " << near_ties);
  for (uint64_t id : {0u, 17u, 42u, 63u}) {
    auto alone = generate(l, cases, {id}, roomy, {.past_bucket = 32, .max_batch = 64});
    CHECK(alone.generated[id] == r.generated[id]);
  }
}

} // namespace

TEST_CASE("onnxruntime-genai's decoder is found by its tensors, its head size from "
          "genai_config.json") {
  onnx::onnx_model_config cfg;
  cfg.model_file = fixtures + "/genai_llama_fp32/1/model.onnx";
  cfg.config.name = "genai_llama_fp32";
  cfg.config.max_batch_size = 64;
  cfg.config = executor::with_cache_dims(cfg.config, genai_dims("genai_llama_fp32"));
  auto m = onnx::load_onnx_model(cfg);
  REQUIRE_MESSAGE(m, m.error().message);
  auto sig = executor::find_decoder_signature(
    m->config, {executor::past_layout::left_aligned, genai_head_size("genai_llama_fp32")});
  REQUIRE_MESSAGE(sig, sig.error().message);
  CHECK(sig->past_keys.size() == 2);
  CHECK(sig->kv_heads == 2);
  CHECK(sig->head_dim == 16);
  CHECK(sig->vocab == 512);
  CHECK(sig->position_ids.empty());
  CHECK(sig->layout == executor::past_layout::left_aligned);
  // A head size that disagrees with the cache tensors' is refused, naming genai_config.json's.
  auto wrong = executor::find_decoder_signature(
    m->config, {executor::past_layout::left_aligned, 32});
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().message.find("head_size 32") != std::string::npos);
}

TEST_CASE("the fp32 build: 64 prompts at once and alone give transformers' greedy tokens") {
  check_model("genai_llama_fp32");
}

TEST_CASE("the int4 build (MatMulNBits): 64 prompts give onnxruntime's greedy tokens") {
  check_model("genai_llama_int4");
}

TEST_CASE("the masked layout, wrong for GroupQueryAttention, gives other tokens") {
  // GroupQueryAttention takes positions [0, seqlens_k + 1 - S) as the past whatever the mask
  // says: the masked layout's placeholder slot 0 shifts every row's cache by one.
  auto cases = load_reference("genai_llama_fp32");
  auto l = load_model("genai_llama_fp32", executor::past_layout::masked);
  std::vector<uint64_t> some{0, 17, 42, 63};
  int near_ties = 0;
  auto r = generate(l, cases, some, roomy, {.past_bucket = 32, .max_batch = 64});
  CHECK(compare(cases, r, near_ties, true) > 0);
}
