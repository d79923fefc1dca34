#include "latency.hpp"

#include <algorithm>
#include <cmath>

namespace caf_serving::perf {

double percentile_of(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty())
    return 0;
  auto rank = static_cast<std::size_t>(
    std::ceil(p / 100.0 * static_cast<double>(sorted.size()) - 1e-9));
  if (rank == 0)
    rank = 1;
  if (rank > sorted.size())
    rank = sorted.size();
  return static_cast<double>(sorted[rank - 1]);
}

latency_summary summarize(std::vector<int64_t> v, double chosen) {
  latency_summary s;
  if (v.empty())
    return s;
  std::sort(v.begin(), v.end());
  s.count = v.size();
  long double sum = 0;
  for (auto x : v)
    sum += x;
  s.avg_us = static_cast<double>(sum / v.size()) / 1e3;
  s.min_us = static_cast<double>(v.front()) / 1e3;
  s.max_us = static_cast<double>(v.back()) / 1e3;
  s.p50_us = percentile_of(v, 50) / 1e3;
  s.p90_us = percentile_of(v, 90) / 1e3;
  s.p95_us = percentile_of(v, 95) / 1e3;
  s.p99_us = percentile_of(v, 99) / 1e3;
  s.p999_us = percentile_of(v, 99.9) / 1e3;
  s.chosen_us = percentile_of(v, chosen) / 1e3;
  return s;
}

window_summary summarize_window(const std::vector<completion>& done,
                                int64_t duration_ns, double chosen) {
  window_summary w;
  w.duration_ns = duration_ns;
  w.latencies_ns.reserve(done.size());
  for (const auto& c : done) {
    if (c.status == 200) {
      ++w.ok;
      w.latencies_ns.push_back(c.end_ns - c.start_ns);
    } else {
      ++w.errors[c.status];
    }
  }
  std::sort(w.latencies_ns.begin(), w.latencies_ns.end());
  w.latency = summarize(w.latencies_ns, chosen);
  w.throughput = duration_ns > 0 ? static_cast<double>(w.ok) * 1e9
                                     / static_cast<double>(duration_ns)
                                 : 0;
  return w;
}

window_summary merge_windows(const std::vector<window_summary>& windows,
                             double chosen) {
  window_summary m;
  for (const auto& w : windows) {
    m.duration_ns += w.duration_ns;
    m.ok += w.ok;
    for (auto [status, n] : w.errors)
      m.errors[status] += n;
    m.latencies_ns.insert(m.latencies_ns.end(), w.latencies_ns.begin(),
                          w.latencies_ns.end());
    m.generations.insert(m.generations.end(), w.generations.begin(),
                         w.generations.end());
  }
  std::sort(m.latencies_ns.begin(), m.latencies_ns.end());
  m.latency = summarize(m.latencies_ns, chosen);
  m.throughput = m.duration_ns > 0 ? static_cast<double>(m.ok) * 1e9
                                       / static_cast<double>(m.duration_ns)
                                   : 0;
  return m;
}

bool is_shed_status(int status) {
  return status == 503 || status == 429;
}

slo_summary summarize_slo(const window_summary& w, double target_us) {
  slo_summary s;
  s.good = w.ok;
  if (target_us > 0) {
    auto limit = static_cast<int64_t>(target_us * 1e3);
    s.good = static_cast<uint64_t>(
      std::upper_bound(w.latencies_ns.begin(), w.latencies_ns.end(), limit)
      - w.latencies_ns.begin());
  }
  s.late = w.ok - s.good;
  for (auto [status, n] : w.errors)
    (is_shed_status(status) ? s.shed : s.failed) += n;
  auto answered = static_cast<double>(w.ok + s.shed + s.failed);
  if (answered > 0) {
    s.good_share = static_cast<double>(s.good) / answered;
    s.shed_share = static_cast<double>(s.shed) / answered;
  }
  if (w.duration_ns > 0)
    s.goodput = static_cast<double>(s.good) * 1e9 / static_cast<double>(w.duration_ns);
  return s;
}

bool is_stable(const std::vector<window_summary>& windows, double percent) {
  if (windows.size() < 3)
    return false;
  auto within = [percent](double a, double b, double c) {
    double mean = (a + b + c) / 3;
    if (mean <= 0)
      return false;
    double lo = std::min({a, b, c});
    double hi = std::max({a, b, c});
    return hi <= mean * (1 + percent / 100) && lo >= mean * (1 - percent / 100);
  };
  const auto& a = windows[windows.size() - 3];
  const auto& b = windows[windows.size() - 2];
  const auto& c = windows[windows.size() - 1];
  return within(a.throughput, b.throughput, c.throughput)
         && within(a.latency.chosen_us, b.latency.chosen_us,
                   c.latency.chosen_us);
}

} // namespace caf_serving::perf
