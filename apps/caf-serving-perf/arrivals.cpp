#include "arrivals.hpp"

#include <cmath>
#include <cstdio>
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
    case arrival_kind::bursts:
    case arrival_kind::step:
      t_ = advance(t_, exp_(rng_));
      break;
  }
  return static_cast<int64_t>(t_);
}

double arrival_schedule::advance(double t, double arrivals) const {
  constexpr double never = 1e30;
  for (;;) {
    double rate = 0;
    double segment_end = never;
    if (config_.kind == arrival_kind::bursts) {
      auto on = static_cast<double>(config_.burst_on_ns);
      auto period = on + static_cast<double>(config_.burst_off_ns);
      auto phase = std::fmod(t, period);
      if (phase < on) {
        rate = config_.rate * period / on;
        segment_end = t - phase + on;
      } else {
        segment_end = t - phase + period;
      }
    } else {
      auto at = static_cast<double>(config_.step_at_ns);
      auto back = config_.step_back_ns > 0
                    ? static_cast<double>(config_.step_back_ns)
                    : never;
      if (t < at) {
        rate = config_.rate;
        segment_end = at;
      } else if (t < back) {
        rate = config_.step_rate;
        segment_end = back;
      } else {
        rate = config_.rate;
      }
    }
    if (rate > 0) {
      double needed_ns = arrivals / rate * 1e9;
      if (t + needed_ns <= segment_end)
        return t + needed_ns;
      arrivals -= (segment_end - t) * rate / 1e9;
    }
    if (segment_end >= never)
      return 9e18; // a silent last segment: no more arrivals (fits int64)
    t = segment_end;
  }
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

namespace {

std::vector<std::string> split_colons(std::string_view text) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : text) {
    if (c == ':') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::optional<double> positive_number(const std::string& s) {
  if (s.empty())
    return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v) || v <= 0)
    return std::nullopt;
  return v;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

} // namespace

load_shape_result parse_load_shape(std::string_view text) {
  load_shape_result r;
  auto parts = split_colons(text);
  const auto& kind = parts[0];
  std::vector<double> v;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    auto n = positive_number(parts[i]);
    if (!n) {
      r.error = "--load '" + std::string(text) + "': '" + parts[i]
                + "' is not a positive number";
      return r;
    }
    v.push_back(*n);
  }
  auto& c = r.value;
  if ((kind == "poisson" || kind == "constant") && v.size() == 1) {
    c.kind = kind == "poisson" ? arrival_kind::poisson : arrival_kind::constant;
    c.rate = v[0];
  } else if (kind == "bursts" && v.size() == 3) {
    c.kind = arrival_kind::bursts;
    c.burst_on_ns = static_cast<int64_t>(v[0] * 1e6);
    c.burst_off_ns = static_cast<int64_t>(v[1] * 1e6);
    c.rate = v[2] * v[0] / (v[0] + v[1]);
  } else if (kind == "step" && (v.size() == 3 || v.size() == 4)) {
    c.kind = arrival_kind::step;
    c.rate = v[0];
    c.step_rate = v[1];
    c.step_at_ns = static_cast<int64_t>(v[2] * 1e9);
    if (v.size() == 4) {
      if (v[3] <= v[2]) {
        r.error = "--load '" + std::string(text)
                  + "': the step back (BACK_S) must come after the step (AT_S)";
        return r;
      }
      c.step_back_ns = static_cast<int64_t>(v[3] * 1e9);
    }
  } else {
    r.error = "--load '" + std::string(text)
              + "' is not a load shape; use poisson:RATE, constant:RATE, "
                "bursts:ON_MS:OFF_MS:RATE or step:R1:R2:AT_S[:BACK_S] "
                "(rates in requests/s)";
  }
  return r;
}

std::string describe_arrivals(const arrival_config& c) {
  switch (c.kind) {
    case arrival_kind::constant:
      return "constant";
    case arrival_kind::poisson:
      return "poisson";
    case arrival_kind::bursty:
      return "bursty";
    case arrival_kind::trace:
      return "trace";
    case arrival_kind::bursts: {
      auto on = static_cast<double>(c.burst_on_ns);
      auto period = on + static_cast<double>(c.burst_off_ns);
      return "poisson bursts of " + fmt("%g", c.rate * period / on) + "/s for "
             + fmt("%g", on / 1e6) + " ms every " + fmt("%g", period / 1e6)
             + " ms";
    }
    case arrival_kind::step:
      return "poisson step " + fmt("%g", c.rate) + "/s -> "
             + fmt("%g", c.step_rate) + "/s at "
             + fmt("%g", static_cast<double>(c.step_at_ns) / 1e9) + " s"
             + (c.step_back_ns > 0
                  ? ", back at "
                      + fmt("%g", static_cast<double>(c.step_back_ns) / 1e9)
                      + " s"
                  : std::string());
  }
  return "?";
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
