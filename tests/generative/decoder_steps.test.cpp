// The decoding loop without actors (step_loop.hpp): generation_policy plans
// every step, decoder_runner runs it over the executor's KV cache, greedy
// picks each token. 64 prompts of mixed lengths sent at once (sequences join
// and leave mid-batch, long prompts prefilled in chunks, and with a small
// cache the youngest preempted and recomputed) must produce exactly the
// tokens of transformers' greedy generate, and what each prompt produces
// alone. The same for each fixture model: GPT-2 (learned positions,
// LayerNorm, GELU), Llama (grouped-query attention, RoPE, RMSNorm, SiLU MLP)
// and Qwen2 (as Llama, with Q/K/V biases); each as exported, with its
// attention rewritten into GroupQueryAttention, and paged.
#include "step_loop.hpp"

#include "core/external_memory.hpp"
#include "onnx/importer.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx/passes_decoder.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::generative_test;

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

/// How the model's attention runs: the exported chain of operators over
/// the masked past, or rewritten into GroupQueryAttention over the
/// left-aligned past (onnx/passes_decoder.hpp), or rewritten and then made
/// to read the KV cache's blocks in place (onnx/paged_attention.hpp), as the
/// generative loader serves it.
enum class attention { as_exported, rewritten, paged };

/// The handle the paged models' cache is bound to.
const uint64_t kv_pool = new_external_memory_handle();

loaded load_model(const fixture_model& fm, attention a = attention::as_exported) {
  onnx::onnx_model_config cfg;
  cfg.model_file = fixtures + "/" + fm.name + "/1/model.onnx";
  cfg.config.name = fm.name;
  cfg.config.max_batch_size = 64;
  cfg.plan_cache_size = 64;
  if (a == attention::paged) {
    auto g = onnx::import_model(cfg.model_file);
    REQUIRE_MESSAGE(g, error_of(g));
    auto rewritten = onnx::rewrite_decoder_attention(*g);
    REQUIRE_MESSAGE(rewritten.layers == 2, rewritten.refused);
    auto paged = onnx::rewrite_paged_attention(*g, {kv_pool, 16});
    REQUIRE_MESSAGE(paged.layers == 2, paged.refused);
    // As the loader serves it: the logits of the last position only.
    REQUIRE(onnx::last_position_logits(*g));
    auto m = onnx::load_onnx_graph(std::move(*g), cfg);
    REQUIRE_MESSAGE(m, error_of(m));
    auto sig = executor::find_decoder_signature(m->config);
    REQUIRE_MESSAGE(sig, error_of(sig));
    CHECK(sig->paged);
    CHECK(sig->past_keys.empty());
    return {std::move(*m), *sig};
  }
  cfg.passes.rewrite_decoder_attention = a == attention::rewritten;
  auto m = onnx::load_onnx_model(cfg);
  REQUIRE_MESSAGE(m, error_of(m));
  executor::decoder_hints hints;
  if (a == attention::rewritten) {
    // Both layers, or the test would compare the exported chain twice.
    REQUIRE_MESSAGE(m->decoder_attention.layers == 2, m->decoder_attention.refused);
    hints.layout = executor::past_layout::left_aligned;
  } else {
    CHECK(m->decoder_attention.layers == 0);
  }
  auto sig = executor::find_decoder_signature(m->config, hints);
  REQUIRE_MESSAGE(sig, error_of(sig));
  return {std::move(*m), *sig};
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

void check_greedy(const fixture_model& fm, attention a) {
  const std::string how = a == attention::rewritten ? " (GroupQueryAttention)"
                          : a == attention::paged   ? " (paged)"
                                                    : "";
  const uint64_t pool = a == attention::paged ? kv_pool : 0;
  CAPTURE(how);
  auto ref = load_reference(fixtures, fm.name);
  const auto& cases = ref.cases;
  REQUIRE(cases.size() == 64);
  auto l = load_model(fm, a);
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < cases.size(); ++i)
    all.push_back(i);
  scheduler::generation_limits roomy{.max_running = 64, .max_step_tokens = 128,
                                     .block_tokens = 16, .cache_blocks = 512,
                                     .max_context = 256, .max_waiting = 64};
  int near_ties = 0;
  auto started = std::chrono::steady_clock::now();
  auto r =
    generate(l, ref, all, {roomy, {.past_bucket = 32, .max_batch = 64, .kv_pool = pool}, true});
  auto roomy_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now()
                                                            - started).count();
  CHECK(compare(cases, r, near_ties) == 0);
  CHECK(r.preemptions == 0);
  // A cache of 24 blocks (384 positions) for 64 sequences: most wait, the
  // running ones grow into each other and the youngest are preempted.
  auto tight = roomy;
  tight.cache_blocks = 24;
  tight.max_step_tokens = 64;
  auto p =
    generate(l, ref, all, {tight, {.past_bucket = 16, .max_batch = 8, .kv_pool = pool}, true});
  CHECK(compare(cases, p, near_ties) == 0);
  CHECK(p.preemptions > 0);
  MESSAGE(fm.name << how << ": steps " << r.steps << " (roomy, " << roomy_ms << " ms) and "
                  << p.steps << " (tight, " << p.preemptions << " preemptions); near ties "
                  << near_ties);
  // Alone, each of a few gives the same as in the crowd.
  for (uint64_t id : {0u, 17u, 42u, 63u}) {
    auto alone =
      generate(l, ref, {id}, {roomy, {.past_bucket = 32, .max_batch = 64, .kv_pool = pool}, true});
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
  check_greedy(gpt2, attention::as_exported);
  check_greedy(gpt2, attention::rewritten);
  check_greedy(gpt2, attention::paged);
}

TEST_CASE("Llama (grouped-query attention, RoPE, RMSNorm): 64 prompts at once give "
          "transformers' greedy tokens, with and without preemption") {
  check_greedy(llama, attention::as_exported);
  check_greedy(llama, attention::rewritten);
  check_greedy(llama, attention::paged);
}

TEST_CASE("Qwen2 (grouped-query attention, QKV biases): 64 prompts at once give "
          "transformers' greedy tokens, with and without preemption") {
  check_greedy(qwen2, attention::as_exported);
  check_greedy(qwen2, attention::rewritten);
  check_greedy(qwen2, attention::paged);
}
