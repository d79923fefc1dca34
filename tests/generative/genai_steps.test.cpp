// onnxruntime-genai's model files (issue 34): a tiny Llama and a tiny Qwen2 written by
// onnxruntime_genai.models.builder (GroupQueryAttention with rotary
// embeddings, SkipSimplifiedLayerNormalization, and int4 MatMulNBits weights in
// the int4 build) run through generation_policy + decoder_runner with the
// left-aligned past layout. 64 prompts of mixed lengths at once (with a roomy
// and a tight cache) and alone must give the references of
// tools/genai_fixtures.py: transformers' greedy tokens for the fp32 build,
// onnxruntime's greedy tokens for the int4 build. The same again with the
// engine's paged attention (onnx/paged_attention.hpp), which reads the cache's
// blocks in place instead of taking the past as tensors.
#include "step_loop.hpp"

#include "core/external_memory.hpp"
#include "onnx/importer.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx/passes_decoder.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::generative_test;

namespace {

const std::string fixtures = CAF_SERVING_GENERATIVE_FIXTURES;

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

/// `name`'s decoder; with a `kv_pool` handle, its attention rewritten to read
/// the cache of 16-position blocks bound to it.
loaded load_model(const std::string& name, executor::past_layout layout, uint64_t kv_pool = 0) {
  onnx::onnx_model_config cfg;
  cfg.model_file = fixtures + "/" + name + "/1/model.onnx";
  cfg.config.name = name;
  cfg.config.max_batch_size = 64;
  auto dims = genai_dims(name);
  auto g = onnx::import_model(cfg.model_file);
  REQUIRE_MESSAGE(g, error_of(g));
  if (kv_pool != 0) {
    auto paged = onnx::rewrite_paged_attention(*g, {kv_pool, 16});
    REQUIRE_MESSAGE(paged.layers == dims.layers, paged.refused);
    dims.paged = true;
    // As the loader serves it: the logits of the last position only (MatMul, MatMulNBits).
    REQUIRE(onnx::last_position_logits(*g));
  }
  cfg.config = executor::with_cache_dims(cfg.config, dims);
  cfg.plan_cache_size = 64;
  auto m = onnx::load_onnx_graph(std::move(*g), cfg);
  REQUIRE_MESSAGE(m, error_of(m));
  auto sig = executor::find_decoder_signature(m->config, {layout, genai_head_size(name)});
  REQUIRE_MESSAGE(sig, sig.error().message);
  return {std::move(*m), *sig};
}

const scheduler::generation_limits roomy{.max_running = 64, .max_step_tokens = 128,
                                         .block_tokens = 16, .cache_blocks = 512,
                                         .max_context = 256, .max_waiting = 64};

/// The whole check of one build against its references; with a `kv_pool`
/// handle, through the paged attention.
void check_model(const std::string& name, uint64_t kv_pool = 0) {
  auto ref = load_reference(fixtures, name);
  const auto& cases = ref.cases;
  REQUIRE(cases.size() == 64);
  auto l = load_model(name, executor::past_layout::left_aligned, kv_pool);
  CHECK(l.sig.paged == (kv_pool != 0));
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < cases.size(); ++i)
    all.push_back(i);
  int near_ties = 0;
  auto r = generate(l, ref, all, {roomy, {.past_bucket = 32, .max_batch = 64, .kv_pool = kv_pool}});
  CHECK(compare(cases, r, near_ties) == 0);
  CHECK(r.preemptions == 0);
  // 24 blocks (384 positions) for 64 sequences: the youngest are preempted and recomputed.
  auto tight = roomy;
  tight.cache_blocks = 24;
  tight.max_step_tokens = 64;
  auto p = generate(l, ref, all, {tight, {.past_bucket = 16, .max_batch = 8, .kv_pool = kv_pool}});
  CHECK(compare(cases, p, near_ties) == 0);
  CHECK(p.preemptions > 0);
  MESSAGE(name << ": steps " << r.steps << " (roomy) and " << p.steps << " (tight, "
               << p.preemptions << " preemptions); near ties " << near_ties);
  for (uint64_t id : {0u, 17u, 42u, 63u}) {
    auto alone =
      generate(l, ref, {id}, {roomy, {.past_bucket = 32, .max_batch = 64, .kv_pool = kv_pool}});
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

TEST_CASE("Qwen2 (biases on the query, key and value projections), fp32 and int4 builds, "
          "past as tensors and paged") {
  check_model("genai_qwen2_fp32");
  check_model("genai_qwen2_int4");
  check_model("genai_qwen2_fp32", new_external_memory_handle());
  check_model("genai_qwen2_int4", new_external_memory_handle());
}

TEST_CASE("paged attention, reading the cache's blocks in place: the fp32 build's tokens") {
  check_model("genai_llama_fp32", new_external_memory_handle());
}

TEST_CASE("paged attention: the int4 build's tokens") {
  check_model("genai_llama_int4", new_external_memory_handle());
}

TEST_CASE("a paged decoder takes no past tensors; a GroupQueryAttention it cannot read in "
          "place leaves the graph as it was") {
  auto l = load_model("genai_llama_fp32", executor::past_layout::left_aligned,
                      new_external_memory_handle());
  CHECK(l.sig.paged);
  CHECK(l.sig.past_keys.empty());
  CHECK(l.sig.present_keys.size() == 2);
  CHECK(l.sig.kv_heads == 2);
  CHECK(l.sig.head_dim == 16);
  // A graph whose past is read by another node too: refused, unchanged.
  auto g = onnx::import_model(fixtures + "/genai_llama_fp32/1/model.onnx");
  REQUIRE_MESSAGE(g, error_of(g));
  int past = -1;
  for (int v : g->inputs)
    if (g->values[v].name == "past_key_values.1.value")
      past = v;
  REQUIRE(past >= 0);
  int copy = g->add_value("extra", datatype::fp32);
  g->add_node("Identity", "extra_reader", {past}, {copy});
  g->outputs.push_back(copy);
  auto nodes = g->nodes.size();
  auto inputs = g->inputs;
  auto refused = onnx::rewrite_paged_attention(*g, {new_external_memory_handle(), 16});
  CHECK(refused.layers == 0);
  CHECK(refused.refused.find("read by other nodes") != std::string::npos);
  CHECK(g->nodes.size() == nodes);
  CHECK(g->inputs == inputs);
}

TEST_CASE("the masked layout, wrong for GroupQueryAttention, gives other tokens") {
  // GroupQueryAttention takes positions [0, seqlens_k + 1 - S) as the past whatever the mask
  // says: the masked layout's placeholder slot 0 shifts every row's cache by one.
  auto ref = load_reference(fixtures, "genai_llama_fp32");
  const auto& cases = ref.cases;
  auto l = load_model("genai_llama_fp32", executor::past_layout::masked);
  std::vector<uint64_t> some{0, 17, 42, 63};
  int near_ties = 0;
  auto r = generate(l, ref, some, {roomy, {.past_bucket = 32, .max_batch = 64}});
  CHECK(compare(cases, r, near_ties, true) > 0);
}
