#pragma once
// The decoding loop without actors, for the step tests (decoder_steps,
// genai_steps): generation_policy plans every step, decoder_runner runs it
// over the executor's KV cache, greedy picks each token; and the fixtures'
// references (tools/generative_fixtures.py, tools/genai_fixtures.py) it is
// compared with.
#include "executor/decoder_runner.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "scheduler/generation_policy.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace caf_serving::generative_test {

struct reference_case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  std::vector<double> gaps; ///< top-1 minus top-2 logit at each step
};

struct reference {
  int32_t eos_id = -1;
  std::vector<reference_case> cases;
};

/// `<fixtures>/<model>_reference.json`.
reference load_reference(const std::string& fixtures, const std::string& model);

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

struct run_result {
  std::map<uint64_t, std::vector<int32_t>> generated;
  uint64_t preemptions = 0;
  uint32_t steps = 0;
};

struct greedy_config {
  scheduler::generation_limits limits;
  executor::decoder_runner_config runner;
  /// The end-of-sequence id is never picked (references made by transformers
  /// with min_new_tokens = max_new_tokens).
  bool never_eos = false;
};

/// Runs the cases `ids` of `ref` through policy and runner until all finish.
run_result generate(loaded& l, const reference& ref, const std::vector<uint64_t>& ids,
                    const greedy_config& cfg);

/// Sequences that differ from the reference; a step whose two best reference
/// logits are within 1e-4 may differ (counted in `near_ties`), and the rest of
/// that sequence is not compared.
int compare(const std::vector<reference_case>& cases, const run_result& r, int& near_ties,
            bool quiet = false);

} // namespace caf_serving::generative_test
