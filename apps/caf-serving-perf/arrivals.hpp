/// When an open-loop run sends each request: constant spacing, Poisson
/// (exponential gaps), bursty on/off, or the gaps of a trace file; and the
/// load shapes of `--load`: Poisson bursts between silences, and a Poisson
/// rate that steps up and back down (the loads a latency target must survive).
///
/// The schedule is a plain object: `next()` returns the next intended send
/// time as an offset from the start of the run. The load loop measures each
/// request's latency from this intended time, not from when it was actually
/// written, so a stalled server cannot hide the queueing it causes.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::perf {

/// `bursts` and `step` are Poisson processes whose rate changes with time.
enum class arrival_kind { constant, poisson, bursty, trace, bursts, step };

struct arrival_config {
  arrival_kind kind = arrival_kind::constant;
  /// Mean requests per second (not used by `trace`); for `step`, the rate
  /// before the step and after the step back.
  double rate = 100;
  /// `bursty` and `bursts`: requests are sent only during the on phase, at
  /// the rate that keeps the mean at `rate` (evenly spaced for `bursty`,
  /// Poisson for `bursts`).
  int64_t burst_on_ns = 100'000'000;
  int64_t burst_off_ns = 100'000'000;
  /// `step`: the rate from `step_at_ns` on, until `step_back_ns` (0: never)
  /// when it returns to `rate`; both from the start of the schedule.
  double step_rate = 0;
  int64_t step_at_ns = 0;
  int64_t step_back_ns = 0;
  /// `trace`: gaps between consecutive requests, used in a cycle.
  std::vector<int64_t> trace_gaps_ns;
  uint64_t seed = 1;
};

class arrival_schedule {
public:
  explicit arrival_schedule(arrival_config config);

  /// The next intended send time, in nanoseconds from the start.
  int64_t next();

private:
  /// The time at which `arrivals` more requests are expected after `t` under
  /// the shape's piecewise-constant rate (a Poisson process whose rate
  /// changes: exponential work spent through the rate's segments).
  double advance(double t, double arrivals) const;

  arrival_config config_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> exp_;
  double t_ = 0;
  std::size_t trace_index_ = 0;
};

/// The gaps of a trace file: one number per line, in microseconds (as
/// perf_analyzer's --request-intervals); `error` says why a file is unusable.
struct trace_result {
  std::vector<int64_t> gaps_ns;
  std::string error;
};
trace_result parse_trace(std::string_view text);

/// What `--load` asks for: an arrival configuration, or why the text is not one.
struct load_shape_result {
  arrival_config value;
  std::string error;
};

/// Parses a `--load` shape: `poisson:RATE`, `constant:RATE`,
/// `bursts:ON_MS:OFF_MS:RATE` (Poisson at RATE/s for ON_MS, then nothing for
/// OFF_MS, repeated; the mean is RATE*ON/(ON+OFF)) or
/// `step:R1:R2:AT_S[:BACK_S]` (Poisson at R1/s, R2/s from AT_S seconds on,
/// R1/s again from BACK_S).
load_shape_result parse_load_shape(std::string_view text);

/// A short description of a schedule for tables and plots ("poisson",
/// "bursts 200/s for 100 ms every 500 ms", "step 50/s -> 150/s at 5 s ...").
std::string describe_arrivals(const arrival_config& config);

/// Parses "constant", "poisson" or "bursty"; nothing for other text.
std::optional<arrival_kind> parse_arrival_kind(std::string_view text);

} // namespace caf_serving::perf
