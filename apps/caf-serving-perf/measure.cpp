#include "measure.hpp"

#include <algorithm>
#include <cmath>

#include "load_loop.hpp"

namespace caf_serving::perf {

namespace {

/// A rate counts as sustained when the server answered this fraction of it;
/// below 1 because a short window of Poisson arrivals varies by a few %.
constexpr double sustained_fraction = 0.9;

/// Reads the model's cumulative statistics, or nothing on any failure (the
/// breakdown is then left out, the measurement stays valid).
std::optional<model_stats> read_stats(const measure_config& config) {
  if (config.stats_model.empty())
    return std::nullopt;
  auto reply = http_get(config.target,
                        "/v2/models/" + config.stats_model + "/stats", 2000);
  if (!reply.error.empty() || reply.status != 200)
    return std::nullopt;
  auto parsed = parse_model_stats(reply.body, config.stats_model);
  if (!parsed.error.empty())
    return std::nullopt;
  return parsed.value;
}

} // namespace

step_result run_step(const measure_config& config, const load_level& level,
                     const progress_fn& progress) {
  step_result result;
  result.level = level;
  load_loop loop{{config.target, config.requests, config.max_connections,
                  config.generate ? response_capture::timed_bytes
                                  : response_capture::status}};
  auto err = level.concurrency > 0 ? loop.start_closed(level.concurrency)
                                   : loop.start_open(level.arrivals);
  if (!err.empty()) {
    result.error = err;
    return result;
  }
  loop.run_until(now_ns() + config.warmup_ns);
  result.completed += loop.take_completions().size();

  std::vector<std::optional<model_stats>> snapshots;
  snapshots.push_back(read_stats(config));
  auto window_start = now_ns();
  int trials = config.fixed_windows > 0 ? config.fixed_windows : config.max_trials;
  for (int trial = 0; trial < trials; ++trial) {
    loop.run_until(window_start + config.window_ns);
    auto done = loop.take_completions();
    auto window_end = now_ns();
    result.completed += done.size();
    std::vector<token_timing> generations;
    if (config.generate)
      generations = read_generations(*config.generate, done,
                                     config.prompt_tokens);
    result.windows.push_back(
      summarize_window(done, window_end - window_start, config.percentile));
    result.windows.back().generations = std::move(generations);
    snapshots.push_back(read_stats(config));
    // The stats request takes a moment; the next window starts after it so
    // that no completion falls between two windows.
    window_start = window_end;
    result.stable = config.fixed_windows == 0
                    && is_stable(result.windows, config.stability_percent);
    result.connections = loop.connection_count();
    if (progress)
      progress(result);
    if (result.stable)
      break;
    if (config.give_up_above_us > 0
        && result.windows.back().latency.chosen_us > config.give_up_above_us)
      break;
  }
  auto drained = loop.stop(config.drain_ns);
  result.completed += loop.take_completions().size();
  result.sent = loop.sent() + drained.unsent;
  result.unsent = drained.unsent;
  result.abandoned = drained.abandoned;

  auto used = config.fixed_windows > 0
                ? result.windows.size()
                : std::min<std::size_t>(3, result.windows.size());
  std::vector<window_summary> last(result.windows.end() - used,
                                   result.windows.end());
  result.measured = merge_windows(last, config.percentile);
  const auto& before = snapshots[snapshots.size() - 1 - used];
  const auto& after = snapshots.back();
  if (before && after)
    result.server = stats_delta(*before, *after);
  return result;
}

bool meets_target(const step_result& probe, double target_us) {
  if (!probe.error.empty() || probe.measured.ok == 0)
    return false;
  if (!probe.measured.errors.empty())
    return false;
  if (probe.measured.latency.chosen_us > target_us)
    return false;
  double offered = probe.level.arrivals.rate;
  return probe.measured.throughput >= sustained_fraction * offered;
}

search_result search_rate(const measure_config& config,
                          const arrival_config& arrivals,
                          const search_config& search,
                          const progress_fn& progress) {
  search_result result;
  auto probe_config = config;
  // A window twice over the target cannot turn into a pass.
  probe_config.give_up_above_us = 2 * search.target_us;
  double cap = search.max_rate > 0 ? search.max_rate : 1e7;
  double pass = 0;
  double fail = 0;
  double rate = std::min(search.start_rate, cap);
  for (int i = 0; i < search.max_probes; ++i) {
    load_level level;
    level.arrivals = arrivals;
    level.arrivals.rate = rate;
    auto probe = run_step(probe_config, level, progress);
    if (!probe.error.empty()) {
      result.error = probe.error;
      result.probes.push_back(std::move(probe));
      return result;
    }
    bool ok = meets_target(probe, search.target_us);
    result.probes.push_back(std::move(probe));
    if (ok) {
      pass = rate;
      if (fail == 0) {
        if (rate >= cap)
          break;
        rate = std::min(rate * 2, cap);
        continue;
      }
    } else {
      fail = rate;
      if (pass == 0) {
        rate /= 2;
        if (rate < 0.5)
          break;
        continue;
      }
    }
    if ((fail - pass) / pass <= search.precision)
      break;
    rate = (pass + fail) / 2;
  }
  result.found = pass > 0;
  result.rate = pass;
  result.failed_rate = fail;
  return result;
}

} // namespace caf_serving::perf
