#include "arrivals.hpp"

#include <cmath>
#include <cstdlib>

namespace caf_serving::perf {

arrival_schedule::arrival_schedule(arrival_config config)
  : config_(std::move(config)), rng_(config_.seed), exp_(1.0) {
}

int64_t arrival_schedule::next() {
  double gap_ns = 1e9 / config_.rate;
  switch (config_.kind) {
    case arrival_kind::constant:
      t_ += gap_ns;
      break;
    case arrival_kind::poisson:
      t_ += exp_(rng_) * gap_ns;
      break;
    case arrival_kind::bursty: {
      auto on = static_cast<double>(config_.burst_on_ns);
      auto period = on + static_cast<double>(config_.burst_off_ns);
      t_ += gap_ns * on / period;
      auto phase = std::fmod(t_, period);
      if (phase >= on)
        t_ += period - phase;
      break;
    }
    case arrival_kind::trace:
      t_ += static_cast<double>(
        config_.trace_gaps_ns[trace_index_++ % config_.trace_gaps_ns.size()]);
      break;
  }
  return static_cast<int64_t>(t_);
}

trace_result parse_trace(std::string_view text) {
  trace_result result;
  std::size_t line_no = 0;
  while (!text.empty()) {
    auto eol = text.find('\n');
    auto line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{}
                                         : text.substr(eol + 1);
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
      line.remove_suffix(1);
    while (!line.empty() && line.front() == ' ')
      line.remove_prefix(1);
    if (line.empty() || line.front() == '#')
      continue;
    std::string s(line);
    char* end = nullptr;
    double us = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || us < 0 || !std::isfinite(us)) {
      result.error = "request intervals file line " + std::to_string(line_no)
                     + " is '" + s
                     + "'; expected a gap in microseconds per line";
      result.gaps_ns.clear();
      return result;
    }
    result.gaps_ns.push_back(static_cast<int64_t>(us * 1000.0));
  }
  int64_t total = 0;
  for (auto g : result.gaps_ns)
    total += g;
  if (total <= 0) {
    result.error = "request intervals file holds no positive intervals";
    result.gaps_ns.clear();
  }
  return result;
}

std::optional<arrival_kind> parse_arrival_kind(std::string_view text) {
  if (text == "constant")
    return arrival_kind::constant;
  if (text == "poisson")
    return arrival_kind::poisson;
  if (text == "bursty")
    return arrival_kind::bursty;
  return std::nullopt;
}

} // namespace caf_serving::perf
