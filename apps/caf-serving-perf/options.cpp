#include "options.hpp"

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <type_traits>

namespace caf_serving::perf {

namespace {

std::optional<double> to_number(const std::string& s) {
  if (s.empty())
    return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v))
    return std::nullopt;
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::string parse_range(const std::string& flag, const std::string& text,
                        std::optional<level_range>& out) {
  auto parts = split(text, ':');
  if (parts.size() > 3)
    return flag + " '" + text + "' has more than START:END:STEP";
  level_range r;
  std::vector<double> v;
  for (const auto& p : parts) {
    auto n = to_number(p);
    if (!n || *n <= 0)
      return flag + " '" + text
             + "' must be positive numbers as START:END:STEP";
    v.push_back(*n);
  }
  r.start = v[0];
  r.end = v.size() > 1 ? v[1] : v[0];
  r.step = v.size() > 2 ? v[2] : 1;
  if (r.end < r.start)
    return flag + " '" + text + "' ends below its start";
  out = r;
  return {};
}

} // namespace

std::vector<double> range_levels(const level_range& range) {
  std::vector<double> levels;
  for (double x = range.start; x <= range.end * (1 + 1e-9); x += range.step)
    levels.push_back(x);
  return levels;
}

options_result parse_options(const std::vector<std::string>& args) {
  options_result result;
  auto& o = result.value;
  using handler = std::function<std::string(const std::string&)>;
  auto positive_int = [](const std::string& flag, auto& field) {
    return [&field, flag](const std::string& v) -> std::string {
      auto n = to_number(v);
      if (!n || *n <= 0 || std::floor(*n) != *n)
        return flag + " needs a positive whole number, got '" + v + "'";
      field = static_cast<std::remove_reference_t<decltype(field)>>(*n);
      return {};
    };
  };
  auto positive = [](const std::string& flag, double& field) {
    return [&field, flag](const std::string& v) -> std::string {
      auto n = to_number(v);
      if (!n || *n <= 0)
        return flag + " needs a positive number, got '" + v + "'";
      field = *n;
      return {};
    };
  };
  auto text = [](std::string& field) {
    return [&field](const std::string& v) -> std::string {
      field = v;
      return {};
    };
  };
  auto format = [](const std::string& flag, tensor_format& field) {
    return [&field, flag](const std::string& v) -> std::string {
      if (v == "binary")
        field = tensor_format::binary;
      else if (v == "json")
        field = tensor_format::json;
      else
        return flag + " is binary or json, not '" + v + "'";
      return {};
    };
  };
  std::map<std::string, handler> with_value = {
    {"-m", text(o.model)},
    {"-x", text(o.model_version)},
    {"-u", text(o.url)},
    {"-i",
     [](const std::string& v) -> std::string {
       if (v == "http" || v == "HTTP")
         return {};
       return "-i " + v + " is not supported; this tool speaks HTTP only";
     }},
    {"-b", positive_int("-b", o.batch_size)},
    {"--shape",
     [&o](const std::string& v) -> std::string {
       auto colon = v.rfind(':');
       if (colon == std::string::npos || colon == 0)
         return "--shape '" + v + "' must be NAME:D1,D2,...";
       shape_override s;
       s.name = v.substr(0, colon);
       for (const auto& d : split(v.substr(colon + 1), ',')) {
         auto n = to_number(d);
         if (!n || *n < 0 || std::floor(*n) != *n)
           return "--shape '" + v + "' has a bad dimension '" + d + "'";
         s.dims.push_back(static_cast<int64_t>(*n));
       }
       o.shapes.push_back(std::move(s));
       return {};
     }},
    {"--input-data",
     [&o](const std::string& v) -> std::string {
       if (v == "zero") {
         o.input_data = input_data_kind::zero;
       } else if (v == "random") {
         o.input_data = input_data_kind::random;
       } else {
         o.input_data = input_data_kind::file;
         o.input_data_file = v;
       }
       return {};
     }},
    {"--input-tensor-format", format("--input-tensor-format", o.input_format)},
    {"--request-parameter",
     [&o](const std::string& v) -> std::string {
       auto p = parse_request_parameter(v);
       if (!p.error.empty())
         return p.error;
       o.request_parameters.push_back(std::move(p.value));
       return {};
     }},
    {"--output-tensor-format",
     format("--output-tensor-format", o.output_format)},
    {"--concurrency-range",
     [&o](const std::string& v) {
       return parse_range("--concurrency-range", v, o.concurrency);
     }},
    {"--request-rate-range",
     [&o](const std::string& v) {
       return parse_range("--request-rate-range", v, o.request_rate);
     }},
    {"--request-distribution",
     [&o](const std::string& v) -> std::string {
       auto kind = parse_arrival_kind(v);
       if (!kind)
         return "--request-distribution is constant, poisson or bursty, not '"
                + v + "'";
       o.distribution = *kind;
       return {};
     }},
    {"--load",
     [&o](const std::string& v) -> std::string {
       auto shape = parse_load_shape(v);
       if (!shape.error.empty())
         return shape.error;
       o.load = shape.value;
       return {};
     }},
    {"--burst-on-ms", positive_int("--burst-on-ms", o.burst_on_ms)},
    {"--burst-off-ms", positive_int("--burst-off-ms", o.burst_off_ms)},
    {"--request-intervals", text(o.request_intervals_file)},
    {"--measurement-interval",
     positive_int("--measurement-interval", o.measurement_interval_ms)},
    {"-p", positive_int("-p", o.measurement_interval_ms)},
    {"--warmup-interval", [&o](const std::string& v) -> std::string {
       auto n = to_number(v);
       if (!n || *n < 0)
         return "--warmup-interval needs milliseconds >= 0, got '" + v + "'";
       o.warmup_ms = static_cast<int64_t>(*n);
       return {};
     }},
    {"--stability-percentage",
     positive("--stability-percentage", o.stability_percent)},
    {"-s", positive("-s", o.stability_percent)},
    {"--max-trials", positive_int("--max-trials", o.max_trials)},
    {"-r", positive_int("-r", o.max_trials)},
    {"--percentile",
     [&o](const std::string& v) -> std::string {
       auto n = to_number(v);
       if (!n || *n <= 0 || *n > 100)
         return "--percentile needs a number in (0, 100], got '" + v + "'";
       o.percentile = *n;
       return {};
     }},
    {"--latency-target-ms",
     [&o](const std::string& v) -> std::string {
       auto n = to_number(v);
       if (!n || *n <= 0)
         return "--latency-target-ms needs a positive number, got '" + v
                + "'";
       o.latency_target_ms = *n;
       return {};
     }},
    {"--search-precision",
     positive("--search-precision", o.search_precision)},
    {"--search-max-probes",
     positive_int("--search-max-probes", o.search_max_probes)},
    {"-f", text(o.csv_file)},
    {"--json", text(o.json_file)},
    {"--svg", text(o.svg_file)},
    {"--max-connections",
     positive_int("--max-connections", o.max_connections)},
    {"--seed", positive_int("--seed", o.seed)},
    {"--raw-url", text(o.raw_path)},
    {"--drain-timeout-ms", positive_int("--drain-timeout-ms", o.drain_ms)},
    {"--model", text(o.model)},
    {"--generate",
     [&o](const std::string& v) -> std::string {
       auto api = parse_generate_api(v);
       if (!api)
         return "--generate is openai-completions, openai-chat or triton, "
                "not '" + v + "'";
       o.generate = *api;
       return {};
     }},
    {"--prompt-tokens",
     [&o](const std::string& v) -> std::string {
       auto spec = parse_length_spec(v, "--prompt-tokens");
       o.prompt_tokens = spec.value;
       return spec.error;
     }},
    {"--output-tokens",
     [&o](const std::string& v) -> std::string {
       auto spec = parse_length_spec(v, "--output-tokens");
       o.output_tokens = spec.value;
       return spec.error;
     }},
    {"--prompt-token-ids",
     [&o](const std::string& v) -> std::string {
       auto spec = parse_length_spec(v, "--prompt-token-ids");
       if (!spec.error.empty() || !spec.value.values.empty())
         return "--prompt-token-ids needs a range A:B of token ids, got '" + v
                + "'";
       o.first_token_id = spec.value.low;
       o.last_token_id = spec.value.high;
       return {};
     }},
    {"--ttft-target-ms", positive("--ttft-target-ms", o.ttft_target_ms)},
    {"--tpot-target-ms", positive("--tpot-target-ms", o.tpot_target_ms)},
  };
  std::map<std::string, std::function<void()>> switches = {
    {"--no-server-stats", [&o] { o.server_stats = false; }},
    {"--no-progress", [&o] { o.progress = false; }},
    {"--no-ignore-eos", [&o] { o.ignore_eos = false; }},
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> value;
    if (flag == "-h" || flag == "--help") {
      result.help = true;
      return result;
    }
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0
                                  && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (auto sw = switches.find(flag); sw != switches.end() && !value) {
      sw->second();
      continue;
    }
    auto it = with_value.find(flag);
    if (it == with_value.end()) {
      result.error = "unknown option '" + flag + "'; see --help";
      return result;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        result.error = "option " + flag + " needs a value";
        return result;
      }
      value = args[++i];
    }
    if (auto err = it->second(*value); !err.empty()) {
      result.error = err;
      return result;
    }
  }
  if (o.model.empty() && o.raw_path.empty()) {
    result.error = "no model given; use -m MODEL (or --raw-url PATH to load "
                   "a plain HTTP route)";
    return result;
  }
  if (o.generate && (o.latency_target_ms || !o.raw_path.empty())) {
    result.error = "--generate measures token latencies; judge them with "
                   "--ttft-target-ms and --tpot-target-ms (not "
                   "--latency-target-ms), and leave out --raw-url";
    return result;
  }
  if (!o.generate && (o.ttft_target_ms > 0 || o.tpot_target_ms > 0)) {
    result.error = "--ttft-target-ms and --tpot-target-ms need --generate";
    return result;
  }
  if (o.concurrency && o.request_rate) {
    result.error = "give --concurrency-range or --request-rate-range, not "
                   "both";
    return result;
  }
  if (o.load && (o.concurrency || o.request_rate
                 || !o.request_intervals_file.empty())) {
    result.error = "--load is one fixed load; it cannot be combined with "
                   "--concurrency-range, --request-rate-range or "
                   "--request-intervals";
    return result;
  }
  if (o.latency_target_ms && o.concurrency) {
    result.error = "--latency-target-ms searches the request rate; it cannot "
                   "be combined with --concurrency-range";
    return result;
  }
  if (!o.request_intervals_file.empty() && o.concurrency) {
    result.error = "--request-intervals is an open-loop schedule; it cannot "
                   "be combined with --concurrency-range";
    return result;
  }
  if (!o.concurrency && !o.request_rate && !o.latency_target_ms
      && o.request_intervals_file.empty() && !o.load)
    o.concurrency = level_range{};
  if (o.load && o.load->kind == arrival_kind::step) {
    auto last_ns = std::max(o.load->step_at_ns, o.load->step_back_ns);
    if (last_ns >= o.measurement_interval_ms * 1'000'000) {
      result.error = "--load " + describe_arrivals(*o.load)
                     + " changes after the measurement ends (--measurement-"
                       "interval " + std::to_string(o.measurement_interval_ms)
                     + " ms); measure longer than the step's times";
      return result;
    }
  }
  if (o.warmup_ms < 0)
    o.warmup_ms = o.measurement_interval_ms;
  return result;
}

std::string usage_text() {
  return R"(caf-serving-perf: latency and throughput of any KServe v2 HTTP server

usage: caf-serving-perf -m MODEL [-u HOST:PORT] [options]

What to load:
  -m MODEL                     model name (required unless --raw-url)
  -x VERSION                   model version (default: the server's choice)
  -u HOST:PORT                 server address (default localhost:8000)
  -i http                      protocol; only HTTP is supported
  -b N                         batch size: fills a leading -1 dimension (default 1)
  --shape NAME:D1,D2,...       shape of an input with variable dimensions;
                               all dimensions, or all but the batch one
  --input-data zero|random|FILE.json
                               input values (default random); FILE.json is
                               perf_analyzer's {"data":[{"INPUT0":[...]}, ...]}
  --input-tensor-format binary|json   (default binary)
  --output-tensor-format binary|json  (default binary)
  --request-parameter NAME:VALUE:TYPE
                               a request parameter of every request (TYPE
                               int, string or bool; repeatable), e.g.
                               timeout:50000:int, Triton's per-request
                               deadline in microseconds
  --raw-url PATH               load GET PATH instead of a model (tool check)

Load:
  --concurrency-range START:END:STEP   closed loop sweep (default 1:1:1)
  --request-rate-range START:END:STEP  open loop sweep, requests/s
  --request-distribution constant|poisson|bursty   (default constant)
  --burst-on-ms MS, --burst-off-ms MS  bursty phases (default 100, 100)
  --request-intervals FILE     open loop from a trace: one gap in us per line
  --load SHAPE                 one fixed open-loop load, measured in one
                               window (no stability trials) after the warm-up:
                                 poisson:RATE, constant:RATE
                                 bursts:ON_MS:OFF_MS:RATE  Poisson at RATE/s
                                   for ON_MS, silent for OFF_MS, repeated
                                 step:R1:R2:AT_S[:BACK_S]  Poisson at R1/s,
                                   R2/s from AT_S, R1/s again from BACK_S
                                   (seconds from the start of the window)
  --max-connections N          open-loop connection limit (default 512)
  --seed N                     random seed for data and Poisson arrivals

Measurement:
  --measurement-interval MS, -p MS   window length (default 5000)
  --warmup-interval MS         load before measuring (default: one window)
  --stability-percentage P, -s P     windows must agree within P% (default 10)
  --max-trials N, -r N         windows at most per level (default 10)
  --percentile N               latency percentile for stability and target
                               (default 99)
  --latency-target-ms X        search the largest request rate whose
                               percentile latency stays under X ms; with
                               --load, no search: report goodput (requests
                               answered OK within X ms per second)
  --search-precision F         stop searching when rates differ by F (0.05)
  --search-max-probes N        levels tried at most by the search (16)
  --no-server-stats            do not read /v2/models/{m}/stats
  --drain-timeout-ms MS        wait for answers at the end of a level (5000)

Generative models (--generate; see the README for the definitions):
  --generate openai-completions|openai-chat|triton
                               stream from POST /v1/completions (prompts as
                               token-id arrays of the exact length),
                               /v1/chat/completions or Triton's
                               /v2/models/{m}/generate_stream (prompts as
                               synthetic text of about that many tokens), and
                               report TTFT, ITL, TPOT, end-to-end latency,
                               output tokens/s and requests/s
  --model MODEL                the same as -m
  --prompt-tokens N|A:B|FILE   prompt lengths: fixed, uniform in [A, B], or a
                               file with one count per line (default 128)
  --output-tokens N|A:B|FILE   asked output lengths (max_tokens), as above
                               (default 128)
  --no-ignore-eos              do not send ignore_eos (outputs may end early)
  --prompt-token-ids A:B       ids of completions' prompt tokens (100:499)
  --ttft-target-ms X, --tpot-target-ms Y
                               goodput: requests per second whose TTFT and
                               TPOT both meet their targets (DistServe's)

Output:
  -f FILE.csv                  CSV with perf_analyzer's column names
  --json FILE                  every measurement, every window
  --svg FILE                   latency percentiles vs throughput, throughput
                               vs concurrency (or offered rate)
  --no-progress                no progress line on stderr

Every table, CSV and JSON counts shed requests (HTTP 503 or 429) apart from
other failures; with a latency target they also hold goodput and its share.

Exit status: 0 measured, 1 bad options, 2 server unreachable or refusing.
)";
}

} // namespace caf_serving::perf
