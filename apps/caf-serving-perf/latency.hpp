/// Latency summaries of measurement windows, and the stability rule that
/// decides when measuring can stop (perf_analyzer's: the last three windows'
/// throughput and latency each lie within a percentage of their mean).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "load_loop.hpp"

namespace caf_serving::perf {

/// Latency statistics in microseconds over successful requests.
struct latency_summary {
  uint64_t count = 0;
  double avg_us = 0;
  double min_us = 0;
  double max_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p95_us = 0;
  double p99_us = 0;
  double p999_us = 0;
  /// The percentile chosen with --percentile.
  double chosen_us = 0;
};

/// Nearest-rank percentile `p` (0..100] of sorted values, in the values'
/// unit; 0 for an empty list.
double percentile_of(const std::vector<int64_t>& sorted, double p);

/// Summarizes latencies given in nanoseconds (sorted here).
latency_summary summarize(std::vector<int64_t> latencies_ns,
                          double chosen_percentile);

/// One generative request reduced to its token latencies (generate.hpp
/// defines them and reads them off the answer's stream).
struct token_timing {
  /// Request sent -> first non-empty content chunk.
  int64_t ttft_ns = 0;
  /// Request sent -> the answer's last byte.
  int64_t e2e_ns = 0;
  /// (e2e - TTFT) / (output tokens - 1); -1 when there was one token.
  int64_t tpot_ns = -1;
  /// Gaps between successive content chunks.
  std::vector<int64_t> itl_ns;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};

/// One measurement window.
struct window_summary {
  int64_t duration_ns = 0;
  uint64_t ok = 0;
  /// Failed requests by HTTP status (0: connection or protocol failure).
  std::map<int, uint64_t> errors;
  double throughput = 0;
  latency_summary latency;
  /// The successful requests' latencies, sorted, in nanoseconds.
  std::vector<int64_t> latencies_ns;
  /// The successful generative requests (empty for one-shot models).
  std::vector<token_timing> generations;
};

/// Builds a window from its completions; a request with status 200 counts
/// as a success.
window_summary summarize_window(const std::vector<completion>& done,
                                int64_t duration_ns, double chosen_percentile);

/// Merges windows into one (throughput over their summed duration).
window_summary merge_windows(const std::vector<window_summary>& windows,
                             double chosen_percentile);

/// A window judged against a latency target: what was answered in time
/// (goodput), answered late, shed by the server, or failed otherwise.
struct slo_summary {
  /// Answered OK within the target (every OK answer when there is none).
  uint64_t good = 0;
  /// Answered OK, but after the target.
  uint64_t late = 0;
  /// Refused by an overloaded server: HTTP 503 (a shed request, a full
  /// queue, a queue timeout) or 429.
  uint64_t shed = 0;
  /// Every other failure (other statuses, broken connections).
  uint64_t failed = 0;
  /// Good requests per second.
  double goodput = 0;
  /// Shares of all answered requests (0 when none was answered).
  double good_share = 0;
  double shed_share = 0;
};

/// Whether an HTTP status means "the server shed this request".
bool is_shed_status(int status);

/// Judges a window against `target_us` (0: no target, every OK is good).
slo_summary summarize_slo(const window_summary& window, double target_us);

/// Whether the last three windows agree within `percent` in throughput and
/// in the chosen latency percentile.
bool is_stable(const std::vector<window_summary>& windows, double percent);

} // namespace caf_serving::perf
