/// Command-line options of caf-serving-perf. Names follow Triton's
/// perf_analyzer where it has one, so that a command line moves between the
/// two tools unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arrivals.hpp"
#include "generate.hpp"
#include "kserve.hpp"

namespace caf_serving::perf {

/// START:END:STEP, as in --concurrency-range.
struct level_range {
  double start = 1;
  double end = 1;
  double step = 1;
};

/// The levels of a range: start, start+step, ... up to end.
std::vector<double> range_levels(const level_range& range);

struct perf_options {
  std::string model;
  std::string model_version;
  std::string url = "localhost:8000";
  int64_t batch_size = 1;
  std::vector<shape_override> shapes;
  input_data_kind input_data = input_data_kind::random;
  std::string input_data_file;
  tensor_format input_format = tensor_format::binary;
  tensor_format output_format = tensor_format::binary;
  /// --request-parameter: request-level parameters of every request.
  std::vector<request_parameter> request_parameters;
  std::optional<level_range> concurrency;
  std::optional<level_range> request_rate;
  arrival_kind distribution = arrival_kind::constant;
  int64_t burst_on_ms = 100;
  int64_t burst_off_ms = 100;
  std::string request_intervals_file;
  /// `--load SHAPE`: one fixed open-loop load (steady, bursts or a step),
  /// measured in one window; with --latency-target-ms it reports goodput
  /// instead of searching the rate.
  std::optional<arrival_config> load;
  int64_t measurement_interval_ms = 5000;
  /// -1: as long as one measurement window.
  int64_t warmup_ms = -1;
  double stability_percent = 10;
  int max_trials = 10;
  double percentile = 99;
  std::optional<double> latency_target_ms;
  double search_precision = 0.05;
  int search_max_probes = 16;
  std::string csv_file;
  std::string json_file;
  std::string svg_file;
  std::size_t max_connections = 512;
  uint64_t seed = 1;
  /// Load a plain `GET PATH` instead of a model (for comparisons with wrk).
  std::string raw_path;
  bool server_stats = true;
  bool progress = true;
  int64_t drain_ms = 5000;
  /// --generate: measure a generative endpoint (token latencies) instead of
  /// a one-shot model.
  std::optional<generate_api> generate;
  length_spec prompt_tokens{128, 128, {}};
  length_spec output_tokens{128, 128, {}};
  /// --no-ignore-eos clears it: outputs may then end early at EOS.
  bool ignore_eos = true;
  /// --prompt-token-ids A:B: the ids completions' prompts are drawn from.
  int64_t first_token_id = 100;
  int64_t last_token_id = 499;
  /// Goodput targets (0: none); either sets goodput in the report.
  double ttft_target_ms = 0;
  double tpot_target_ms = 0;
};

struct options_result {
  perf_options value;
  /// Set when --help was asked for.
  bool help = false;
  std::string error;
};

options_result parse_options(const std::vector<std::string>& args);

std::string usage_text();

} // namespace caf_serving::perf
