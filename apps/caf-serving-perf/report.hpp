/// The outputs of a run: a readable table, CSV with perf_analyzer's column
/// names, JSON with every measurement, and an SVG plot. Each is a string
/// built from the same `run_report`; main writes them where asked.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "measure.hpp"

namespace caf_serving::perf {

/// `fixed_load`: one `--load` shape, judged against the target if one is set.
enum class run_mode { concurrency, request_rate, latency_target, fixed_load };

struct run_report {
  std::string model;
  std::string url;
  run_mode mode = run_mode::concurrency;
  std::string distribution = "constant";
  double percentile = 99;
  int64_t batch_size = 1;
  std::vector<step_result> steps;
  /// The latency target (0: none): the search's in latency_target mode, the
  /// goodput's in the others.
  double target_ms = 0;
  search_result search;
  /// Set in generative mode: the table, CSV and JSON hold token latencies.
  std::optional<generate_api> generate;
  /// Generative mode's goodput targets.
  goodput_targets targets;
};

/// "at P99 under 50 ms the largest sustained rate is N requests/s".
std::string search_sentence(const run_report& report);

/// "goodput 412.0/s within 50 ms (82.4% of answered), 15.1% shed" for a
/// fixed load's step.
std::string goodput_sentence(const run_report& report, const step_result& step);

std::string format_table(const run_report& report);
std::string format_csv(const run_report& report);
std::string format_json(const run_report& report);
std::string format_svg(const run_report& report);

} // namespace caf_serving::perf
