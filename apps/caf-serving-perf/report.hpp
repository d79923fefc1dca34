/// The outputs of a run: a readable table, CSV with perf_analyzer's column
/// names, JSON with every measurement, and an SVG plot. Each is a string
/// built from the same `run_report`; main writes them where asked.
#pragma once

#include <string>
#include <vector>

#include "measure.hpp"

namespace caf_serving::perf {

enum class run_mode { concurrency, request_rate, latency_target };

struct run_report {
  std::string model;
  std::string url;
  run_mode mode = run_mode::concurrency;
  std::string distribution = "constant";
  double percentile = 99;
  int64_t batch_size = 1;
  std::vector<step_result> steps;
  /// Set in latency_target mode.
  double target_ms = 0;
  search_result search;
};

/// "at P99 under 50 ms the largest sustained rate is N requests/s".
std::string search_sentence(const run_report& report);

std::string format_table(const run_report& report);
std::string format_csv(const run_report& report);
std::string format_json(const run_report& report);
std::string format_svg(const run_report& report);

} // namespace caf_serving::perf
