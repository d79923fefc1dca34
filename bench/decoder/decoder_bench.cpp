// Time of one decoding step (decoder_runner::run) for `rows` sequences that
// each hold `context` cached positions, with the past given to the model as
// tensors (copied out of the cache into padded tensors every step, and the
// whole present copied back) and with the engine's paged attention (the
// cache's blocks read in place, only the new position written back).
//
//   decoder-bench [Google Benchmark flags]
//
// The sequences are prefilled once; every timed step decodes one token at
// position `context` for each of them (the same position each time, so the
// work stays the same from step to step).
#include "core/external_memory.hpp"
#include "executor/decoder_runner.hpp"
#include "onnx/importer.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx_cpu/onnx_backend.hpp"

#include <benchmark/benchmark.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace caf_serving;

namespace {

constexpr const char* model_name = "genai_llama_fp32";
constexpr uint32_t block_tokens = 16;

struct loaded_decoder {
  onnx::onnx_model model;
  executor::decoder_signature sig;
  uint64_t kv_pool = 0;
};

loaded_decoder load(bool paged) {
  onnx::onnx_model_config cfg;
  cfg.model_file =
    std::string(CAF_SERVING_GENERATIVE_FIXTURES) + "/" + model_name + "/1/model.onnx";
  cfg.config.name = model_name;
  cfg.config.max_batch_size = 64;
  cfg.plan_cache_size = 64;
  // genai_config.json of the fixture: 2 layers, 2 KV heads of 16, vocabulary 512.
  executor::cache_dims dims{2, 2, 16, 512};
  auto g = onnx::import_model(cfg.model_file);
  if (!g)
    throw std::runtime_error(g.error().message);
  uint64_t handle = 0;
  if (paged) {
    handle = new_external_memory_handle();
    auto r = onnx::rewrite_paged_attention(*g, {handle, block_tokens});
    if (r.layers != dims.layers)
      throw std::runtime_error("not rewritten: " + r.refused);
    dims.paged = true;
  }
  cfg.config = executor::with_cache_dims(cfg.config, dims);
  auto m = onnx::load_onnx_graph(std::move(*g), cfg);
  if (!m)
    throw std::runtime_error(m.error().message);
  auto sig = executor::find_decoder_signature(m->config,
                                              {executor::past_layout::left_aligned, 16});
  if (!sig)
    throw std::runtime_error(sig.error().message);
  return {std::move(*m), *sig, handle};
}

void decode_step(benchmark::State& state, bool paged) {
  const auto rows = static_cast<uint32_t>(state.range(0));
  const auto context = static_cast<uint32_t>(state.range(1));
  auto l = load(paged);
  const uint32_t per_sequence = (context + 1 + block_tokens - 1) / block_tokens;
  executor::kv_cache_layout layout{l.sig.layers(), l.sig.kv_heads, l.sig.head_dim, block_tokens,
                                   rows * per_sequence};
  executor::decoder_runner runner(l.sig, l.model.make_instance(), layout,
                                  {32, 64, l.kv_pool});
  std::vector<int32_t> prompt(context);
  for (uint32_t i = 0; i < context; ++i)
    prompt[i] = static_cast<int32_t>(1 + (i * 7) % 500);
  for (uint32_t r = 0; r < rows; ++r) {
    auto done = runner.run({{r, 0, prompt.data(), context, false}});
    if (!done)
      throw std::runtime_error(done.error().message);
  }
  std::vector<int32_t> next(rows, 3);
  std::vector<executor::decoder_step_item> step;
  for (uint32_t r = 0; r < rows; ++r)
    step.push_back({r, context, &next[r], 1, true});
  for (auto _ : state) {
    auto logits = runner.run(step);
    if (!logits)
      throw std::runtime_error(logits.error().message);
    benchmark::DoNotOptimize(logits->data());
  }
  state.counters["tokens/s"] =
    benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}

void past_as_tensors(benchmark::State& state) { decode_step(state, false); }
void paged_attention(benchmark::State& state) { decode_step(state, true); }

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "context"});
  for (int64_t rows : {1, 16, 64})
    for (int64_t context : {64, 240})
      b->Args({rows, context});
  b->Unit(benchmark::kMicrosecond);
}

} // namespace

BENCHMARK(past_as_tensors)->Apply(shapes);
BENCHMARK(paged_attention)->Apply(shapes);
BENCHMARK_MAIN();
