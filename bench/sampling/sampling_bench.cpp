// ns per sampled token of postprocess/sampling.hpp's sequence_sampler, one
// sequence on one thread, the same row of logits every step (the penalties'
// history is off, so every step does the same work).
//
//   sampling-bench [Google Benchmark flags]
//
// The logits are normal with a standard deviation of 3: flatter than a
// trained model's usual rows, so that top-p keeps thousands of tokens and the
// numbers lean to the worst case.
#include "postprocess/sampling.hpp"

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::postprocess;

namespace {

std::vector<float> logits_of(std::size_t vocab) {
  std::mt19937_64 rng(vocab);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> out(vocab);
  for (auto& x : out)
    x = normal(rng);
  return out;
}

void run(benchmark::State& state, const sampling_params& params) {
  const auto logits = logits_of(static_cast<std::size_t>(state.range(0)));
  sequence_sampler sampler(params, {});
  for (auto _ : state) {
    auto r = sampler.next(logits);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
}

void greedy(benchmark::State& state) {
  sampling_params p;
  p.seed = 1;
  p.temperature = 0.0f;
  run(state, p);
}

void top_p_0_9_temperature_0_8(benchmark::State& state) {
  sampling_params p;
  p.seed = 1;
  p.top_p = 0.9f;
  p.temperature = 0.8f;
  run(state, p);
}

void top_k_50(benchmark::State& state) {
  sampling_params p;
  p.seed = 1;
  p.top_k = 50;
  run(state, p);
}

void full_distribution(benchmark::State& state) {
  sampling_params p;
  p.seed = 1;
  run(state, p);
}

void top_p_with_penalties_and_logprobs(benchmark::State& state) {
  sampling_params p;
  p.seed = 1;
  p.top_p = 0.9f;
  p.temperature = 0.8f;
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.2f;
  p.logprobs = true;
  p.top_logprobs = 5;
  run(state, p);
}

} // namespace

BENCHMARK(greedy)->Arg(32000)->Arg(151936);
BENCHMARK(top_p_0_9_temperature_0_8)->Arg(32000)->Arg(151936);
BENCHMARK(top_k_50)->Arg(32000)->Arg(151936);
BENCHMARK(full_distribution)->Arg(32000)->Arg(151936);
BENCHMARK(top_p_with_penalties_and_logprobs)->Arg(32000)->Arg(151936);

BENCHMARK_MAIN();
