#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace caf_serving::perf {

namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string fmt_text(const char* format, const char* a, const char* b) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), format, a, b);
  return buf;
}

std::string percentile_name(double p) {
  return "P" + fmt("%g", p);
}

double level_value(const step_result& s) {
  return s.level.concurrency > 0 ? static_cast<double>(s.level.concurrency)
                                 : s.level.arrivals.rate;
}

std::string level_text(const step_result& s) {
  return s.level.concurrency > 0 ? std::to_string(s.level.concurrency)
                                 : fmt("%.1f", s.level.arrivals.rate);
}

uint64_t error_count(const window_summary& w) {
  uint64_t n = 0;
  for (auto [status, count] : w.errors)
    n += count;
  return n;
}

std::string errors_text(const window_summary& w) {
  if (w.errors.empty())
    return "0";
  std::string s;
  for (auto [status, count] : w.errors) {
    if (!s.empty())
      s += " ";
    s += (status == 0 ? std::string("conn") : std::to_string(status)) + ":"
         + std::to_string(count);
  }
  return s;
}

/// Steps in level order (the search runs them out of order).
std::vector<const step_result*> ordered(const run_report& r) {
  std::vector<const step_result*> v;
  for (const auto& s : r.steps)
    v.push_back(&s);
  std::stable_sort(v.begin(), v.end(), [](auto* a, auto* b) {
    return level_value(*a) < level_value(*b);
  });
  return v;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt("\\u%04x", c);
    } else {
      out += c;
    }
  }
  out += '"';
}

std::string json_number(double v) {
  if (!std::isfinite(v))
    return "null";
  return fmt("%.6g", v);
}

void json_latency(std::string& j, const latency_summary& l) {
  j += "{\"count\":" + std::to_string(l.count)
       + ",\"avg\":" + json_number(l.avg_us) + ",\"min\":" + json_number(l.min_us)
       + ",\"max\":" + json_number(l.max_us) + ",\"p50\":" + json_number(l.p50_us)
       + ",\"p90\":" + json_number(l.p90_us) + ",\"p95\":" + json_number(l.p95_us)
       + ",\"p99\":" + json_number(l.p99_us)
       + ",\"p99.9\":" + json_number(l.p999_us)
       + ",\"chosen\":" + json_number(l.chosen_us) + "}";
}

void json_errors(std::string& j, const window_summary& w) {
  j += "{";
  bool first = true;
  for (auto [status, count] : w.errors) {
    if (!first)
      j += ",";
    first = false;
    j += "\"" + std::to_string(status) + "\":" + std::to_string(count);
  }
  j += "}";
}

void json_slo(std::string& j, const slo_summary& s) {
  j += "{\"good\":" + std::to_string(s.good) + ",\"late\":" + std::to_string(s.late)
       + ",\"shed\":" + std::to_string(s.shed) + ",\"failed\":" + std::to_string(s.failed)
       + ",\"goodput\":" + json_number(s.goodput)
       + ",\"good_share\":" + json_number(s.good_share)
       + ",\"shed_share\":" + json_number(s.shed_share) + "}";
}

// -- SVG -----------------------------------------------------------------------

/// A "nice" tick step (1, 2 or 5 times a power of ten) for about 5 ticks.
double tick_step(double range) {
  if (range <= 0)
    return 1;
  double raw = range / 5;
  double p = std::pow(10, std::floor(std::log10(raw)));
  double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

struct series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
};

struct panel_config {
  double x0, y0, width, height;
  std::string title, x_label, y_label;
};

std::string svg_panel(const panel_config& p, const std::vector<series>& all) {
  double xmax = 0, ymax = 0;
  for (const auto& s : all)
    for (auto [x, y] : s.points) {
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y);
    }
  double xstep = tick_step(xmax), ystep = tick_step(ymax);
  xmax = std::max(xstep, std::ceil(xmax / xstep) * xstep);
  ymax = std::max(ystep, std::ceil(ymax * 1.05 / ystep) * ystep);
  auto px = [&](double x) { return p.x0 + x / xmax * p.width; };
  auto py = [&](double y) { return p.y0 + p.height - y / ymax * p.height; };
  std::string s;
  s += "<text x=\"" + fmt("%.1f", p.x0 + p.width / 2) + "\" y=\""
       + fmt("%.1f", p.y0 - 12)
       + "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">"
       + p.title + "</text>\n";
  s += "<rect x=\"" + fmt("%.1f", p.x0) + "\" y=\"" + fmt("%.1f", p.y0)
       + "\" width=\"" + fmt("%.1f", p.width) + "\" height=\""
       + fmt("%.1f", p.height) + "\" fill=\"none\" stroke=\"#444\"/>\n";
  for (double x = 0; x <= xmax * 1.0001; x += xstep) {
    s += "<line x1=\"" + fmt("%.1f", px(x)) + "\" y1=\"" + fmt("%.1f", p.y0)
         + "\" x2=\"" + fmt("%.1f", px(x)) + "\" y2=\""
         + fmt("%.1f", p.y0 + p.height) + "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + fmt("%.1f", px(x)) + "\" y=\""
         + fmt("%.1f", p.y0 + p.height + 16)
         + "\" text-anchor=\"middle\" font-size=\"11\">" + fmt("%g", x)
         + "</text>\n";
  }
  for (double y = 0; y <= ymax * 1.0001; y += ystep) {
    s += "<line x1=\"" + fmt("%.1f", p.x0) + "\" y1=\"" + fmt("%.1f", py(y))
         + "\" x2=\"" + fmt("%.1f", p.x0 + p.width) + "\" y2=\""
         + fmt("%.1f", py(y)) + "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + fmt("%.1f", p.x0 - 6) + "\" y=\""
         + fmt("%.1f", py(y) + 4)
         + "\" text-anchor=\"end\" font-size=\"11\">" + fmt("%g", y)
         + "</text>\n";
  }
  s += "<text x=\"" + fmt("%.1f", p.x0 + p.width / 2) + "\" y=\""
       + fmt("%.1f", p.y0 + p.height + 34)
       + "\" text-anchor=\"middle\" font-size=\"12\">" + p.x_label
       + "</text>\n";
  s += "<text transform=\"translate(" + fmt("%.1f", p.x0 - 46) + ","
       + fmt("%.1f", p.y0 + p.height / 2)
       + ") rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">"
       + p.y_label + "</text>\n";
  double legend_y = p.y0 + 14;
  for (const auto& ser : all) {
    if (ser.points.empty())
      continue;
    std::string pts;
    for (auto [x, y] : ser.points)
      pts += fmt("%.1f", px(x)) + "," + fmt("%.1f", py(y)) + " ";
    s += "<polyline fill=\"none\" stroke=\"" + ser.color
         + "\" stroke-width=\"2\"" + (ser.dashed ? " stroke-dasharray=\"5,4\"" : "")
         + " points=\"" + pts + "\"/>\n";
    if (!ser.dashed)
      for (auto [x, y] : ser.points)
        s += "<circle cx=\"" + fmt("%.1f", px(x)) + "\" cy=\""
             + fmt("%.1f", py(y)) + "\" r=\"3\" fill=\"" + ser.color
             + "\"/>\n";
    s += "<line x1=\"" + fmt("%.1f", p.x0 + 10) + "\" y1=\""
         + fmt("%.1f", legend_y - 4) + "\" x2=\"" + fmt("%.1f", p.x0 + 30)
         + "\" y2=\"" + fmt("%.1f", legend_y - 4) + "\" stroke=\"" + ser.color
         + "\" stroke-width=\"2\"" + (ser.dashed ? " stroke-dasharray=\"5,4\"" : "")
         + "/>\n";
    s += "<text x=\"" + fmt("%.1f", p.x0 + 36) + "\" y=\""
         + fmt("%.1f", legend_y) + "\" font-size=\"11\">" + ser.name
         + "</text>\n";
    legend_y += 15;
  }
  return s;
}


std::string level_name(const run_report& r) {
  return r.mode == run_mode::concurrency ? "Concurrency" : "Rate/s";
}

bool has_targets(const goodput_targets& t) {
  return t.ttft_ms > 0 || t.tpot_ms > 0;
}

std::string targets_text(const goodput_targets& t) {
  std::string s;
  if (t.ttft_ms > 0)
    s += "TTFT <= " + fmt("%g", t.ttft_ms) + " ms";
  if (t.tpot_ms > 0)
    s += std::string(s.empty() ? "" : " and ") + "TPOT <= "
         + fmt("%g", t.tpot_ms) + " ms";
  return s;
}

double avg_tokens(uint64_t tokens, uint64_t requests) {
  return requests > 0 ? static_cast<double>(tokens) / static_cast<double>(requests)
                      : 0;
}

/// The generative mode's table: per level a summary line and the four
/// latencies' percentiles.
std::string generation_table(const run_report& r) {
  std::string out = "Model " + r.model + " at " + r.url + ", "
                    + std::string(generate_api_name(*r.generate))
                    + " streamed, latencies in ms";
  if (r.mode != run_mode::concurrency)
    out += ", " + r.distribution + " arrivals, open loop (from intended "
           "send time)";
  out += "\n";
  char line[256];
  for (const auto* s : ordered(r)) {
    auto g = summarize_generations(s->measured, r.targets, r.percentile);
    out += level_name(r) + " " + level_text(*s) + ": "
           + fmt("%.2f", g.requests_per_s) + " requests/s, "
           + fmt("%.1f", g.output_tokens_per_s) + " output tokens/s, "
           + fmt("%.1f", avg_tokens(g.prompt_tokens, g.requests)) + " prompt and "
           + fmt("%.1f", avg_tokens(g.output_tokens, g.requests))
           + " output tokens per request, errors " + errors_text(s->measured);
    if (has_targets(r.targets))
      out += ", goodput " + fmt("%.2f", g.goodput) + "/s ("
             + fmt("%.1f", g.requests > 0 ? 100.0 * static_cast<double>(g.good)
                                                / static_cast<double>(g.requests)
                                          : 0.0)
             + "% of requests) at " + targets_text(r.targets);
    out += "\n";
    std::snprintf(line, sizeof(line), "  %-6s %9s %9s %9s %9s %9s %9s %9s %8s\n",
                  "", "Avg", "Min", "P50", "P90", "P99", "P99.9", "Max", "Count");
    out += line;
    for (auto [name, l] : {std::pair{"TTFT", &g.ttft}, std::pair{"TPOT", &g.tpot},
                           std::pair{"ITL", &g.itl}, std::pair{"E2E", &g.e2e}}) {
      std::snprintf(line, sizeof(line),
                    "  %-6s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %8llu\n", name,
                    l->avg_us / 1e3, l->min_us / 1e3, l->p50_us / 1e3, l->p90_us / 1e3,
                    l->p99_us / 1e3, l->p999_us / 1e3, l->max_us / 1e3,
                    static_cast<unsigned long long>(l->count));
      out += line;
    }
  }
  return out;
}

std::string generation_csv(const run_report& r) {
  std::string out = r.mode == run_mode::concurrency ? "Concurrency" : "Request Rate";
  out += ",Requests/Second,Output Tokens/Second,Avg Prompt Tokens,"
         "Avg Output Tokens";
  for (const char* m : {"TTFT", "TPOT", "ITL", "E2E"})
    for (const char* p : {"avg", "p50", "p90", "p99", "p99.9"})
      out += std::string(",") + m + " " + p + " ms";
  out += ",TTFT Target ms,TPOT Target ms,Goodput/Second,Good Share,Errors\n";
  for (const auto* s : ordered(r)) {
    auto g = summarize_generations(s->measured, r.targets, r.percentile);
    out += level_text(*s) + "," + fmt("%.3f", g.requests_per_s) + ","
           + fmt("%.2f", g.output_tokens_per_s) + ","
           + fmt("%.2f", avg_tokens(g.prompt_tokens, g.requests)) + ","
           + fmt("%.2f", avg_tokens(g.output_tokens, g.requests));
    for (const auto* l : {&g.ttft, &g.tpot, &g.itl, &g.e2e})
      for (double v : {l->avg_us, l->p50_us, l->p90_us, l->p99_us, l->p999_us})
        out += "," + fmt("%.3f", v / 1e3);
    out += "," + fmt("%g", r.targets.ttft_ms) + "," + fmt("%g", r.targets.tpot_ms)
           + "," + fmt("%.3f", g.goodput) + ","
           + fmt("%.4f", g.requests > 0 ? static_cast<double>(g.good)
                                              / static_cast<double>(g.requests)
                                        : 0.0)
           + "," + std::to_string(error_count(s->measured)) + "\n";
  }
  return out;
}

void json_generation(std::string& j, const run_report& r, const window_summary& w) {
  auto g = summarize_generations(w, r.targets, r.percentile);
  j += "{\"requests\":" + std::to_string(g.requests)
       + ",\"requests_per_s\":" + json_number(g.requests_per_s)
       + ",\"output_tokens_per_s\":" + json_number(g.output_tokens_per_s)
       + ",\"prompt_tokens\":" + std::to_string(g.prompt_tokens)
       + ",\"output_tokens\":" + std::to_string(g.output_tokens)
       + ",\"good\":" + std::to_string(g.good)
       + ",\"goodput\":" + json_number(g.goodput) + ",\"ttft\":";
  json_latency(j, g.ttft);
  j += ",\"tpot\":";
  json_latency(j, g.tpot);
  j += ",\"itl\":";
  json_latency(j, g.itl);
  j += ",\"e2e\":";
  json_latency(j, g.e2e);
  j += "}";
}

} // namespace

std::string search_sentence(const run_report& r) {
  auto p = percentile_name(r.percentile);
  if (!r.search.found)
    return "at " + p + " under " + fmt("%g", r.target_ms)
           + " ms no rate tried met the target (lowest tried: "
           + fmt("%.1f", r.search.failed_rate) + " requests/s)";
  return "at " + p + " under " + fmt("%g", r.target_ms)
         + " ms the largest sustained rate is " + fmt("%.1f", r.search.rate)
         + " requests/s"
         + (r.search.failed_rate > 0
              ? " (" + fmt("%.1f", r.search.failed_rate) + " requests/s failed)"
              : std::string(" (the highest rate tried)"));
}

std::string format_table(const run_report& r) {
  if (r.generate)
    return generation_table(r);
  std::string level = r.mode == run_mode::concurrency ? "Concurrency"
                                                      : "Rate/s";
  std::string out;
  out += "Model " + r.model + " at " + r.url + ", latencies in ms";
  if (r.mode != run_mode::concurrency)
    out += ", " + r.distribution + " arrivals, open loop (from intended "
           "send time)";
  out += "\n";
  char line[512];
  bool goodput = r.target_ms > 0;
  std::snprintf(line, sizeof(line),
                "%11s %10s %s%8s %8s %8s %8s %8s %8s %7s %7s %7s %7s %7s %7s %6s  %s\n",
                level.c_str(), "Infer/s",
                goodput ? fmt_text("%10s %6s ", "Goodput/s", "Good%").c_str() : "", "Avg",
                "P50", "P90", "P95", "P99", "P99.9", "Queue", "CmpIn", "Infer", "CmpOut",
                "Ovhd", "Stable", "Shed%", "Errors");
  out += line;
  for (const auto* s : ordered(r)) {
    const auto& l = s->measured.latency;
    const auto& b = s->server;
    auto server = [&](double us) {
      return b.valid ? fmt("%.3f", us / 1e3) : std::string("-");
    };
    auto slo = summarize_slo(s->measured, r.target_ms * 1e3);
    std::string goodput_cells =
      goodput ? fmt_text("%10s %6s ", fmt("%.1f", slo.goodput).c_str(),
                         fmt("%.1f", 100 * slo.good_share).c_str())
              : std::string();
    std::snprintf(
      line, sizeof(line),
      "%11s %10.1f %s%8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %7s %7s %7s %7s %7s %7s %6.1f  "
      "%s\n",
      level_text(*s).c_str(), s->measured.throughput, goodput_cells.c_str(), l.avg_us / 1e3,
      l.p50_us / 1e3, l.p90_us / 1e3, l.p95_us / 1e3, l.p99_us / 1e3,
      l.p999_us / 1e3, server(b.queue_us).c_str(),
      server(b.compute_input_us).c_str(), server(b.compute_infer_us).c_str(),
      server(b.compute_output_us).c_str(), server(b.overhead_us).c_str(),
      s->stable ? "yes" : "no", 100 * slo.shed_share, errors_text(s->measured).c_str());
    out += line;
  }
  if (r.mode == run_mode::latency_target)
    out += search_sentence(r) + "\n";
  if (r.mode == run_mode::fixed_load)
    for (const auto& s : r.steps)
      out += goodput_sentence(r, s) + "\n";
  return out;
}

std::string goodput_sentence(const run_report& r, const step_result& step) {
  auto slo = summarize_slo(step.measured, r.target_ms * 1e3);
  std::string out = r.target_ms > 0 ? "goodput " + fmt("%.1f", slo.goodput) + "/s within "
                                        + fmt("%g", r.target_ms) + " ms ("
                                        + fmt("%.1f", 100 * slo.good_share)
                                        + "% of answered)"
                                    : "throughput " + fmt("%.1f", slo.goodput) + "/s";
  out += ", " + std::to_string(slo.late) + " late, " + std::to_string(slo.shed) + " shed ("
         + fmt("%.1f", 100 * slo.shed_share) + "%), " + std::to_string(slo.failed)
         + " failed, offered " + fmt("%.1f", step.level.arrivals.rate) + "/s " + r.distribution;
  return out;
}

std::string format_csv(const run_report& r) {
  if (r.generate)
    return generation_csv(r);
  // perf_analyzer's columns first, in its order and units (microseconds);
  // ours after them, so tools that read perf_analyzer's CSV read this one.
  std::string out = r.mode == run_mode::concurrency ? "Concurrency"
                                                    : "Request Rate";
  out += ",Inferences/Second,Client Send,Network+Server Send/Recv,"
         "Server Queue,Server Compute Input,Server Compute Infer,"
         "Server Compute Output,Client Recv,p50 latency,p90 latency,"
         "p95 latency,p99 latency,Avg latency,request/response,"
         "response wait,p99.9 latency,Errors,Stable,Server Overhead,"
         "Latency Target ms,Goodput/Second,Good Share,Late,Shed,Shed Share,"
         "Failed\n";
  for (const auto* s : ordered(r)) {
    const auto& l = s->measured.latency;
    const auto& b = s->server;
    double server_total = b.valid ? b.queue_us + b.compute_input_us
                                      + b.compute_infer_us
                                      + b.compute_output_us
                                  : 0;
    double network = std::max(0.0, l.avg_us - server_total);
    // Requests of batch b are b inferences each.
    double inferences = s->measured.throughput
                        * static_cast<double>(r.batch_size);
    out += level_text(*s) + "," + fmt("%.2f", inferences) + ",0,"
           + fmt("%.0f", network) + "," + fmt("%.0f", b.queue_us) + ","
           + fmt("%.0f", b.compute_input_us) + ","
           + fmt("%.0f", b.compute_infer_us) + ","
           + fmt("%.0f", b.compute_output_us) + ",0,"
           + fmt("%.0f", l.p50_us) + "," + fmt("%.0f", l.p90_us) + ","
           + fmt("%.0f", l.p95_us) + "," + fmt("%.0f", l.p99_us) + ","
           + fmt("%.0f", l.avg_us) + ",0," + fmt("%.0f", l.avg_us) + ","
           + fmt("%.0f", l.p999_us) + ","
           + std::to_string(error_count(s->measured)) + ","
           + (s->stable ? "1" : "0") + "," + fmt("%.0f", b.overhead_us);
    // Goodput counts requests; with -b n each is n inferences.
    auto slo = summarize_slo(s->measured, r.target_ms * 1e3);
    out += "," + fmt("%g", r.target_ms) + "," + fmt("%.2f", slo.goodput) + ","
           + fmt("%.4f", slo.good_share) + "," + std::to_string(slo.late) + ","
           + std::to_string(slo.shed) + "," + fmt("%.4f", slo.shed_share) + ","
           + std::to_string(slo.failed) + "\n";
  }
  return out;
}

std::string format_json(const run_report& r) {
  std::string j = "{\"tool\":\"caf-serving-perf\",\"model\":";
  json_string(j, r.model);
  j += ",\"url\":";
  json_string(j, r.url);
  j += std::string(",\"mode\":\"")
       + (r.mode == run_mode::concurrency    ? "concurrency"
          : r.mode == run_mode::request_rate ? "request_rate"
          : r.mode == run_mode::fixed_load   ? "fixed_load"
                                             : "latency_target")
       + "\",\"distribution\":";
  json_string(j, r.distribution);
  j += ",\"percentile\":" + json_number(r.percentile)
       + ",\"batch_size\":" + std::to_string(r.batch_size)
       + ",\"target_ms\":" + json_number(r.target_ms)
       + ",\"latency_unit\":\"us\"";
  if (r.generate) {
    j += ",\"generate\":\"" + std::string(generate_api_name(*r.generate))
         + "\",\"ttft_target_ms\":" + json_number(r.targets.ttft_ms)
         + ",\"tpot_target_ms\":" + json_number(r.targets.tpot_ms);
  }
  j += ",\"steps\":[";
  bool first = true;
  for (const auto& s : r.steps) {
    if (!first)
      j += ",";
    first = false;
    j += "{";
    if (s.level.concurrency > 0)
      j += "\"concurrency\":" + std::to_string(s.level.concurrency);
    else
      j += "\"request_rate\":" + json_number(s.level.arrivals.rate);
    j += ",\"throughput\":" + json_number(s.measured.throughput)
         + ",\"count\":" + std::to_string(s.measured.ok)
         + ",\"duration_ms\":"
         + json_number(static_cast<double>(s.measured.duration_ns) / 1e6)
         + ",\"errors\":";
    json_errors(j, s.measured);
    j += ",\"latency\":";
    json_latency(j, s.measured.latency);
    j += ",\"slo\":";
    json_slo(j, summarize_slo(s.measured, r.target_ms * 1e3));
    if (r.generate) {
      j += ",\"generation\":";
      json_generation(j, r, s.measured);
    }
    j += std::string(",\"stable\":") + (s.stable ? "true" : "false");
    if (r.mode == run_mode::latency_target)
      j += std::string(",\"meets_target\":")
           + (meets_target(s, r.target_ms * 1e3) ? "true" : "false");
    j += ",\"server\":";
    if (s.server.valid) {
      const auto& b = s.server;
      j += "{\"request_count\":" + std::to_string(b.request_count)
           + ",\"execution_count\":" + std::to_string(b.execution_count)
           + ",\"request\":" + json_number(b.request_us)
           + ",\"queue\":" + json_number(b.queue_us)
           + ",\"compute_input\":" + json_number(b.compute_input_us)
           + ",\"compute_infer\":" + json_number(b.compute_infer_us)
           + ",\"compute_output\":" + json_number(b.compute_output_us)
           + ",\"overhead\":" + json_number(b.overhead_us) + "}";
    } else {
      j += "null";
    }
    j += ",\"sent\":" + std::to_string(s.sent)
         + ",\"completed\":" + std::to_string(s.completed)
         + ",\"unsent\":" + std::to_string(s.unsent)
         + ",\"abandoned\":" + std::to_string(s.abandoned)
         + ",\"connections\":" + std::to_string(s.connections)
         + ",\"windows\":[";
    for (std::size_t i = 0; i < s.windows.size(); ++i) {
      const auto& w = s.windows[i];
      if (i > 0)
        j += ",";
      j += "{\"duration_ms\":"
           + json_number(static_cast<double>(w.duration_ns) / 1e6)
           + ",\"count\":" + std::to_string(w.ok)
           + ",\"throughput\":" + json_number(w.throughput) + ",\"errors\":";
      json_errors(j, w);
      j += ",\"latency\":";
      json_latency(j, w.latency);
      j += ",\"slo\":";
      json_slo(j, summarize_slo(w, r.target_ms * 1e3));
      j += "}";
    }
    j += "]";
    if (!s.error.empty()) {
      j += ",\"error\":";
      json_string(j, s.error);
    }
    j += "}";
  }
  j += "]";
  if (r.mode == run_mode::latency_target) {
    j += ",\"search\":{\"target_ms\":" + json_number(r.target_ms)
         + ",\"found\":" + (r.search.found ? "true" : "false")
         + ",\"rate\":" + json_number(r.search.rate)
         + ",\"failed_rate\":" + json_number(r.search.failed_rate)
         + ",\"summary\":";
    json_string(j, search_sentence(r));
    j += "}";
  }
  j += "}\n";
  return j;
}

std::string format_svg(const run_report& r) {
  auto steps = ordered(r);
  std::vector<const step_result*> ok_steps;
  for (auto* s : steps)
    if (s->measured.ok > 0)
      ok_steps.push_back(s);
  // Panel 1: latency percentiles against achieved throughput.
  std::vector<series> lat = {{"P50", "#1f77b4", {}},
                             {"P90", "#2ca02c", {}},
                             {"P99", "#d62728", {}},
                             {"P99.9", "#9467bd", {}}};
  // Sort by throughput so the lines run left to right.
  auto by_tput = ok_steps;
  std::stable_sort(by_tput.begin(), by_tput.end(), [](auto* a, auto* b) {
    return a->measured.throughput < b->measured.throughput;
  });
  for (auto* s : by_tput) {
    const auto& l = s->measured.latency;
    double x = s->measured.throughput;
    lat[0].points.emplace_back(x, l.p50_us / 1e3);
    lat[1].points.emplace_back(x, l.p90_us / 1e3);
    lat[2].points.emplace_back(x, l.p99_us / 1e3);
    lat[3].points.emplace_back(x, l.p999_us / 1e3);
  }
  if (r.target_ms > 0 && !by_tput.empty())
    lat.push_back({"target " + fmt("%g", r.target_ms) + " ms",
                   "#ff7f0e",
                   {{0, r.target_ms},
                    {by_tput.back()->measured.throughput, r.target_ms}},
                   true});
  // Panel 2: throughput against the load level.
  std::vector<series> tput = {{"throughput", "#1f77b4", {}}};
  for (auto* s : steps)
    tput[0].points.emplace_back(level_value(*s), s->measured.throughput);
  if (r.target_ms > 0) {
    tput.push_back({"goodput (within " + fmt("%g", r.target_ms) + " ms)", "#2ca02c", {}});
    for (auto* s : steps)
      tput.back().points.emplace_back(level_value(*s),
                                      summarize_slo(s->measured, r.target_ms * 1e3).goodput);
  }
  bool closed = r.mode == run_mode::concurrency;
  if (!closed && !steps.empty())
    tput.push_back({"offered = served", "#999999",
                    {{0, 0},
                     {level_value(*steps.back()),
                      level_value(*steps.back())}},
                    true});
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" "
                    "height=\"440\" viewBox=\"0 0 1000 440\" "
                    "font-family=\"sans-serif\">\n"
                    "<rect width=\"1000\" height=\"440\" fill=\"white\"/>\n";
  svg += "<text x=\"500\" y=\"20\" text-anchor=\"middle\" font-size=\"13\">"
         "caf-serving-perf: " + r.model + " at " + r.url
         + (closed ? ", closed loop" : ", open loop, " + r.distribution)
         + "</text>\n";
  svg += svg_panel({70, 60, 400, 320, "Latency vs throughput",
                    "throughput (requests/s)", "latency (ms)"},
                   lat);
  svg += svg_panel({570, 60, 400, 320,
                    closed ? "Throughput vs concurrency"
                           : "Throughput vs offered rate",
                    closed ? "concurrency (requests in flight)"
                           : "offered rate (requests/s)",
                    "throughput (requests/s)"},
                   tput);
  svg += "</svg>\n";
  return svg;
}

} // namespace caf_serving::perf
