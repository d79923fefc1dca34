/// caf-serving-perf: latency percentiles at a throughput, for any KServe v2
/// HTTP server. Reads the model's metadata, prepares the requests, checks
/// that the server accepts one, runs the sweep or the latency-target search,
/// and writes the table, CSV, JSON and SVG.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "http.hpp"
#include "kserve.hpp"
#include "measure.hpp"
#include "options.hpp"
#include "report.hpp"

using namespace caf_serving::perf;

namespace {

constexpr int exit_bad_options = 1;
constexpr int exit_server_failed = 2;

/// Timeout of the control requests (metadata, the test request).
constexpr int control_timeout_ms = 10000;

/// How often, and how far apart, a shed test request is sent before the run
/// gives up.
constexpr int probe_attempts = 5;
constexpr std::chrono::milliseconds probe_retry_gap{200};

int fail(int code, const std::string& message) {
  std::cerr << "caf-serving-perf: error: " << message << "\n";
  return code;
}

struct file_text {
  std::string text;
  std::string error;
};

file_text read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return {{}, "cannot read " + what + " file '" + path + "'"};
  std::ostringstream ss;
  ss << in.rdbuf();
  return {ss.str(), {}};
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out)
    return "cannot write '" + path + "'";
  return {};
}

/// The prepared requests, or why there are none.
struct prepared {
  std::vector<std::string> requests;
  std::string stats_model;
  int exit_code = 0;
  std::string error;
};

prepared prepare_kserve(const perf_options& o, const endpoint& ep) {
  prepared p;
  auto host = ep.host + ":" + std::to_string(ep.port);
  auto model_path = "/v2/models/" + o.model
                    + (o.model_version.empty()
                         ? std::string()
                         : "/versions/" + o.model_version);
  auto meta_reply = http_get(ep, model_path, control_timeout_ms);
  if (!meta_reply.error.empty()) {
    p.exit_code = exit_server_failed;
    p.error = meta_reply.error;
    return p;
  }
  if (meta_reply.status != 200) {
    p.exit_code = exit_server_failed;
    p.error = "model '" + o.model + "' is not available on " + host
              + " (GET " + model_path + " answered HTTP "
              + std::to_string(meta_reply.status) + ": " + meta_reply.body
              + "); check -m and that the model is loaded";
    return p;
  }
  auto meta = parse_model_metadata(meta_reply.body);
  if (!meta.error.empty()) {
    p.exit_code = exit_server_failed;
    p.error = meta.error;
    return p;
  }
  if (meta.value.name.empty())
    meta.value.name = o.model;
  auto shapes = resolve_shapes(meta.value, {o.batch_size, o.shapes});
  if (!shapes.error.empty()) {
    p.exit_code = exit_bad_options;
    p.error = shapes.error;
    return p;
  }
  input_data_config data_config;
  data_config.kind = o.input_data;
  data_config.seed = o.seed;
  if (o.input_data == input_data_kind::file) {
    auto file = read_file(o.input_data_file, "--input-data");
    if (!file.error.empty()) {
      p.exit_code = exit_bad_options;
      p.error = file.error + " (--input-data is zero, random or a JSON file)";
      return p;
    }
    data_config.file_text = std::move(file.text);
  }
  auto data = make_input_data(shapes.inputs, data_config);
  if (!data.error.empty()) {
    p.exit_code = exit_bad_options;
    p.error = data.error;
    return p;
  }
  infer_body_config body_config;
  body_config.input_format = o.input_format;
  body_config.output_format = o.output_format;
  body_config.parameters = o.request_parameters;
  for (const auto& out : meta.value.outputs)
    body_config.output_names.push_back(out.name);
  for (const auto& set : data.sets) {
    auto body = build_infer_body(set, body_config);
    p.requests.push_back(build_request("POST", model_path + "/infer", host,
                                       body.headers, body.body));
  }
  // One request first: a bad shape or datatype is the server's to judge, and
  // its message is clearer than a table full of 400s. A server that sheds
  // (503, 429: a latency-target scheduler still busy with an earlier run's
  // work) says nothing about the request: it is asked again a few times.
  auto probe = http_exchange(ep, p.requests.front(), control_timeout_ms);
  int attempts = 1;
  for (; attempts < probe_attempts && probe.error.empty() && is_shed_status(probe.status);
       ++attempts) {
    std::this_thread::sleep_for(probe_retry_gap);
    probe = http_exchange(ep, p.requests.front(), control_timeout_ms);
  }
  if (!probe.error.empty()) {
    p.exit_code = exit_server_failed;
    p.error = "test request failed: " + probe.error;
    return p;
  }
  if (is_shed_status(probe.status)) {
    p.exit_code = exit_server_failed;
    p.error = "the server shed the test request for model '" + o.model + "' "
              + std::to_string(attempts) + " times (HTTP "
              + std::to_string(probe.status) + ": " + probe.body
              + "); it is overloaded, try again when it is idle";
    return p;
  }
  if (probe.status != 200) {
    p.exit_code = exit_server_failed;
    p.error = "the server rejected a test request for model '" + o.model
              + "' with HTTP " + std::to_string(probe.status) + ": "
              + probe.body + " (check -b, --shape and --input-data)";
    return p;
  }
  if (o.server_stats) {
    auto stats = http_get(ep, "/v2/models/" + o.model + "/stats",
                          control_timeout_ms);
    if (stats.error.empty() && stats.status == 200
        && parse_model_stats(stats.body, o.model).error.empty())
      p.stats_model = o.model;
    else
      std::cerr << "caf-serving-perf: note: no usable /v2/models/" << o.model
                << "/stats; the server-side breakdown is left out\n";
  }
  return p;
}

/// Distinct generative requests prepared (each its own prompt and lengths);
/// more when a length file has more lines.
constexpr std::size_t generate_request_count = 256;

/// The streamed requests of --generate, checked with one test request.
prepared prepare_generate(const perf_options& o, const endpoint& ep,
                          std::vector<int64_t>& prompt_lengths) {
  prepared p;
  auto host = ep.host + ":" + std::to_string(ep.port);
  auto n = std::max({generate_request_count, o.prompt_tokens.values.size(),
                     o.output_tokens.values.size()});
  prompt_lengths = draw_lengths(o.prompt_tokens, n, o.seed);
  auto output_lengths = draw_lengths(o.output_tokens, n, o.seed + 1);
  for (std::size_t i = 0; i < n; ++i) {
    generate_request_config c;
    c.api = *o.generate;
    c.model = o.model;
    c.prompt_tokens = prompt_lengths[i];
    c.output_tokens = output_lengths[i];
    c.ignore_eos = o.ignore_eos;
    c.first_token_id = o.first_token_id;
    c.last_token_id = o.last_token_id;
    c.seed = o.seed + 2 + i;
    auto body = build_generate_body(c);
    p.requests.push_back(build_request("POST", body.path, host,
                                       "Content-Type: application/json\r\n",
                                       body.body));
  }
  auto probe = http_exchange(ep, p.requests.front(), control_timeout_ms);
  for (int attempts = 1; attempts < probe_attempts && probe.error.empty()
                         && is_shed_status(probe.status);
       ++attempts) {
    std::this_thread::sleep_for(probe_retry_gap);
    probe = http_exchange(ep, p.requests.front(), control_timeout_ms);
  }
  if (!probe.error.empty()) {
    p.exit_code = exit_server_failed;
    p.error = "test request failed: " + probe.error;
    return p;
  }
  if (probe.status != 200) {
    p.exit_code = exit_server_failed;
    p.error = "the server rejected a test " + std::string(generate_api_name(*o.generate))
              + " request for model '" + o.model + "' with HTTP "
              + std::to_string(probe.status) + ": " + probe.body
              + " (check -m, --generate and --prompt-tokens/--output-tokens "
                "against the model's context)";
    return p;
  }
  return p;
}

std::string distribution_name(arrival_kind k) {
  switch (k) {
    case arrival_kind::constant:
      return "constant";
    case arrival_kind::poisson:
      return "poisson";
    case arrival_kind::bursty:
      return "bursty";
    case arrival_kind::trace:
      return "trace";
  }
  return "?";
}

} // namespace

int main(int argc, char** argv) {
  // Timers fire closer to the intended send times with a small slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  auto parsed = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  if (parsed.help) {
    std::cout << usage_text();
    return 0;
  }
  if (!parsed.error.empty())
    return fail(exit_bad_options, parsed.error);
  const auto& o = parsed.value;
  auto ep = parse_endpoint(o.url);
  if (!ep.error.empty())
    return fail(exit_bad_options, ep.error);

  prepared prep;
  std::vector<int64_t> prompt_lengths;
  if (o.generate) {
    prep = prepare_generate(o, ep.value, prompt_lengths);
    if (!prep.error.empty())
      return fail(prep.exit_code, prep.error);
  } else if (!o.raw_path.empty()) {
    auto host = ep.value.host + ":" + std::to_string(ep.value.port);
    prep.requests.push_back(build_request("GET", o.raw_path, host, "", ""));
    auto probe = http_exchange(ep.value, prep.requests.front(),
                               control_timeout_ms);
    if (!probe.error.empty())
      return fail(exit_server_failed, probe.error);
  } else {
    prep = prepare_kserve(o, ep.value);
    if (!prep.error.empty())
      return fail(prep.exit_code, prep.error);
  }

  measure_config mc;
  mc.target = ep.value;
  mc.requests = prep.requests;
  mc.max_connections = o.max_connections;
  mc.warmup_ns = o.warmup_ms * 1'000'000;
  mc.window_ns = o.measurement_interval_ms * 1'000'000;
  mc.stability_percent = o.stability_percent;
  mc.max_trials = o.max_trials;
  mc.percentile = o.percentile;
  mc.drain_ns = o.drain_ms * 1'000'000;
  mc.stats_model = prep.stats_model;
  mc.generate = o.generate;
  mc.prompt_tokens = prompt_lengths;

  arrival_config arrivals;
  arrivals.kind = o.distribution;
  arrivals.burst_on_ns = o.burst_on_ms * 1'000'000;
  arrivals.burst_off_ns = o.burst_off_ms * 1'000'000;
  arrivals.seed = o.seed;
  if (!o.request_intervals_file.empty()) {
    auto file = read_file(o.request_intervals_file, "--request-intervals");
    if (!file.error.empty())
      return fail(exit_bad_options, file.error);
    auto trace = parse_trace(file.text);
    if (!trace.error.empty())
      return fail(exit_bad_options, trace.error);
    arrivals.kind = arrival_kind::trace;
    arrivals.trace_gaps_ns = std::move(trace.gaps_ns);
    double total = 0;
    for (auto g : arrivals.trace_gaps_ns)
      total += static_cast<double>(g);
    arrivals.rate = 1e9 * static_cast<double>(arrivals.trace_gaps_ns.size())
                    / total;
  }

  bool tty = isatty(STDERR_FILENO) != 0;
  progress_fn progress;
  if (o.progress) {
    progress = [tty, &o, &mc](const step_result& s) {
      const auto& w = s.windows.back();
      char line[256];
      std::string level = s.level.concurrency > 0
                            ? "concurrency " + std::to_string(s.level.concurrency)
                            : "rate " + std::to_string(static_cast<long long>(
                                s.level.arrivals.rate)) + "/s";
      std::snprintf(line, sizeof(line),
                    "[%s] window %zu/%d: %.1f infer/s, P%g %.3f ms, %zu "
                    "connections%s",
                    level.c_str(), s.windows.size(),
                    mc.fixed_windows > 0 ? mc.fixed_windows : o.max_trials,
                    w.throughput, o.percentile, w.latency.chosen_us / 1e3,
                    s.connections, s.stable ? ", stable" : "");
      std::fprintf(stderr, tty ? "\r\033[K%s" : "%s\n", line);
      std::fflush(stderr);
    };
  }

  run_report report;
  report.model = o.raw_path.empty() ? o.model : "GET " + o.raw_path;
  report.url = ep.value.host + ":" + std::to_string(ep.value.port);
  report.percentile = o.percentile;
  report.batch_size = o.batch_size;
  report.distribution = distribution_name(arrivals.kind);
  if (o.latency_target_ms)
    report.target_ms = *o.latency_target_ms;
  report.generate = o.generate;
  report.targets = {o.ttft_target_ms, o.tpot_target_ms};

  auto run_one = [&](const load_level& level) -> std::string {
    auto step = run_step(mc, level, progress);
    if (!step.error.empty())
      return step.error;
    report.steps.push_back(std::move(step));
    return {};
  };
  if (o.load) {
    // One fixed load: its shape's times count from the end of the warm-up,
    // and the measurement is a timeline of windows of up to a second.
    report.mode = run_mode::fixed_load;
    load_level level;
    level.arrivals = *o.load;
    level.arrivals.seed = o.seed;
    if (level.arrivals.kind == arrival_kind::step) {
      level.arrivals.step_at_ns += mc.warmup_ns;
      if (level.arrivals.step_back_ns > 0)
        level.arrivals.step_back_ns += mc.warmup_ns;
    }
    report.distribution = describe_arrivals(*o.load);
    mc.window_ns = std::min<int64_t>(mc.window_ns, 1'000'000'000);
    mc.fixed_windows = static_cast<int>(
      (o.measurement_interval_ms * 1'000'000 + mc.window_ns - 1) / mc.window_ns);
    if (auto err = run_one(level); !err.empty())
      return fail(exit_server_failed, err);
  } else if (o.latency_target_ms) {
    report.mode = run_mode::latency_target;
    report.target_ms = *o.latency_target_ms;
    search_config sc;
    sc.target_us = *o.latency_target_ms * 1e3;
    sc.precision = o.search_precision;
    sc.max_probes = o.search_max_probes;
    if (o.request_rate) {
      sc.start_rate = o.request_rate->start;
      sc.max_rate = o.request_rate->end > o.request_rate->start
                      ? o.request_rate->end
                      : 0;
    }
    report.search = search_rate(mc, arrivals, sc, progress);
    report.steps = report.search.probes;
    if (!report.search.error.empty())
      return fail(exit_server_failed, report.search.error);
  } else if (o.concurrency) {
    report.mode = run_mode::concurrency;
    for (double c : range_levels(*o.concurrency)) {
      load_level level;
      level.concurrency = static_cast<std::size_t>(c);
      if (auto err = run_one(level); !err.empty())
        return fail(exit_server_failed, err);
    }
  } else {
    report.mode = run_mode::request_rate;
    std::vector<double> rates = o.request_rate
                                  ? range_levels(*o.request_rate)
                                  : std::vector<double>{arrivals.rate};
    for (double rate : rates) {
      load_level level;
      level.arrivals = arrivals;
      if (arrivals.kind != arrival_kind::trace)
        level.arrivals.rate = rate;
      if (auto err = run_one(level); !err.empty())
        return fail(exit_server_failed, err);
    }
  }
  if (o.progress && tty)
    std::fprintf(stderr, "\r\033[K");

  std::cout << format_table(report) << std::flush;
  for (auto [path, text] :
       {std::pair{o.csv_file, &format_csv}, std::pair{o.json_file, &format_json},
        std::pair{o.svg_file, &format_svg}}) {
    if (path.empty())
      continue;
    if (auto err = write_file(path, text(report)); !err.empty())
      return fail(exit_server_failed, err);
  }
  uint64_t ok = 0;
  uint64_t failed = 0;
  for (const auto& s : report.steps) {
    ok += s.measured.ok;
    for (auto [status, n] : s.measured.errors)
      failed += n;
  }
  if (failed > 0 && ok > 0)
    std::cerr << "caf-serving-perf: note: " << failed
              << " measured requests failed; see the Errors column\n";
  if (ok == 0)
    return fail(exit_server_failed,
                "no request succeeded during the measurement; see the errors "
                "column");
  return 0;
}
