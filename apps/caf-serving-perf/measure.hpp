/// One load level measured the way serving engineers do it (warm-up, then
/// windows until three agree), sweeps over levels, and the search for the
/// largest request rate that meets a latency target.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "arrivals.hpp"
#include "generate.hpp"
#include "http.hpp"
#include "kserve.hpp"
#include "latency.hpp"

namespace caf_serving::perf {

/// How to measure one level.
struct measure_config {
  endpoint target;
  std::vector<std::string> requests;
  std::size_t max_connections = 512;
  int64_t warmup_ns = 1'000'000'000;
  int64_t window_ns = 5'000'000'000;
  double stability_percent = 10;
  int max_trials = 10;
  double percentile = 99;
  int64_t drain_ns = 5'000'000'000;
  /// Model whose `/v2/models/{m}/stats` are read at window boundaries;
  /// empty for none.
  std::string stats_model;
  /// Stop after a window whose chosen percentile exceeds this (0: never);
  /// the latency-target search uses it to leave a hopeless rate early.
  double give_up_above_us = 0;
  /// A fixed load (`--load`): exactly this many windows, all merged into
  /// the step's result, no stability rule (bursts and steps are not meant
  /// to be stable; the windows are their timeline). 0: the stability rule.
  int fixed_windows = 0;
  /// Generative mode: the answers are streams whose chunks are timed, and
  /// each window carries its requests' token timings.
  std::optional<generate_api> generate;
  /// Generative mode: the prompt length each request was made for.
  std::vector<int64_t> prompt_tokens;
};

/// A level: a closed-loop concurrency or an open-loop arrival schedule.
struct load_level {
  /// Set for closed loop.
  std::size_t concurrency = 0;
  /// Used when `concurrency` is 0.
  arrival_config arrivals;
};

/// Everything measured at one level.
struct step_result {
  load_level level;
  /// The last (up to) three windows merged: what the step reports.
  window_summary measured;
  std::vector<window_summary> windows;
  bool stable = false;
  server_breakdown server;
  /// Totals over the whole step, warm-up and drain included.
  uint64_t sent = 0;
  uint64_t completed = 0;
  uint64_t unsent = 0;
  uint64_t abandoned = 0;
  std::size_t connections = 0;
  /// Set when the step could not run at all.
  std::string error;
};

/// Called after each window with the step so far, for a progress line.
using progress_fn = std::function<void(const step_result&)>;

step_result run_step(const measure_config& config, const load_level& level,
                     const progress_fn& progress);

/// The latency-target search.
struct search_config {
  double target_us = 0;
  /// First rate tried; doubled until it fails.
  double start_rate = 10;
  /// Highest rate tried (0: no limit but 1e7).
  double max_rate = 0;
  /// Stop when the passing and failing rates are this close (relative).
  double precision = 0.05;
  int max_probes = 16;
};

struct search_result {
  /// Whether some rate met the target.
  bool found = false;
  double rate = 0;
  /// Lowest rate that failed (0 if none did).
  double failed_rate = 0;
  /// Every probe in the order run.
  std::vector<step_result> probes;
  std::string error;
};

/// Whether a probe meets the target: no errors, the chosen percentile under
/// the target, and at least `sustained_fraction` of the offered rate served.
bool meets_target(const step_result& probe, double target_us);

/// Open-loop search for the largest rate meeting `search.target_us`;
/// `arrivals` gives the distribution (its rate is overwritten).
search_result search_rate(const measure_config& config,
                          const arrival_config& arrivals,
                          const search_config& search,
                          const progress_fn& progress);

} // namespace caf_serving::perf
