/// When an open-loop run sends each request: constant spacing, Poisson
/// (exponential gaps), bursty on/off, or the gaps of a trace file.
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

enum class arrival_kind { constant, poisson, bursty, trace };

struct arrival_config {
  arrival_kind kind = arrival_kind::constant;
  /// Mean requests per second (not used by `trace`).
  double rate = 100;
  /// `bursty`: requests are sent only during the on phase, at the rate that
  /// keeps the mean at `rate`.
  int64_t burst_on_ns = 100'000'000;
  int64_t burst_off_ns = 100'000'000;
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

/// Parses "constant", "poisson" or "bursty"; nothing for other text.
std::optional<arrival_kind> parse_arrival_kind(std::string_view text);

} // namespace caf_serving::perf
