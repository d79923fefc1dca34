#include "core/stats.hpp"

#include "core/json.hpp"

#include <cstdio>

namespace caf_serving {

namespace {

std::vector<double> latency_bounds_us() {
  return {50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000};
}

std::vector<double> batch_bounds() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256};
}

void append_number(std::string& out, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += buf;
}

void append_duration(std::string& out, const char* key, const duration_stat& d) {
  out += '"';
  out += key;
  out += "\":{\"count\":";
  out += std::to_string(d.count.load(std::memory_order_relaxed));
  out += ",\"ns\":";
  out += std::to_string(d.ns.load(std::memory_order_relaxed));
  out += '}';
}


} // namespace

histogram::histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i)
    counts_[i].store(0);
}

void histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i])
    ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  total_.fetch_add(1, std::memory_order_relaxed);
  sum_micro_.fetch_add(static_cast<uint64_t>(value * 1e3), std::memory_order_relaxed);
}

void histogram::render(std::string& out, const std::string& name,
                       const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    out += name + "_bucket{" + labels + ",le=\"";
    if (i < bounds_.size())
      append_number(out, bounds_[i]);
    else
      out += "+Inf";
    out += "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} ";
  append_number(out, static_cast<double>(sum_micro_.load(std::memory_order_relaxed)) / 1e3);
  out += "\n" + name + "_count{" + labels + "} "
         + std::to_string(total_.load(std::memory_order_relaxed)) + "\n";
}

std::string prometheus_label_value(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out;
}

const char* to_string(failure_reason r) {
  switch (r) {
    case failure_reason::bad_request: return "bad_request";
    case failure_reason::queue_full: return "queue_full";
    case failure_reason::timeout: return "timeout";
    case failure_reason::unavailable: return "unavailable";
    case failure_reason::internal: return "internal";
  }
  return "internal";
}

model_stats::model_stats(std::string model_name, int64_t model_version)
    : name(std::move(model_name)),
      version(model_version),
      request_us(latency_bounds_us()),
      queue_us(latency_bounds_us()),
      compute_us(latency_bounds_us()),
      batch_size(batch_bounds()) {
}

slo_stats::slo_stats() : batch_size(batch_bounds()), wait_us(latency_bounds_us()) {
}

void slo_stats::publish_cost_curve(std::vector<std::pair<uint32_t, int64_t>> curve_ns) {
  std::lock_guard<std::mutex> guard(curve_mutex_);
  curve_ns_ = std::move(curve_ns);
}

std::vector<std::pair<uint32_t, int64_t>> slo_stats::cost_curve_ns() const {
  std::lock_guard<std::mutex> guard(curve_mutex_);
  return curve_ns_;
}

void model_stats::record_failure(failure_reason reason, uint64_t duration_ns) {
  failures[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  fail.add(duration_ns);
}

std::string stats_json(const std::vector<std::shared_ptr<model_stats>>& models) {
  std::string out = "{\"model_stats\":[";
  bool first = true;
  for (const auto& m : models) {
    if (!first)
      out += ',';
    first = false;
    out += "{\"name\":" + json_string(m->name) + ",\"version\":\""
           + std::to_string(m->version) + "\",\"last_inference\":"
           + std::to_string(m->last_inference_ms.load()) + ",\"inference_count\":"
           + std::to_string(m->inference_count.load()) + ",\"execution_count\":"
           + std::to_string(m->execution_count.load()) + ",\"inference_stats\":{";
    append_duration(out, "success", m->success);
    out += ',';
    append_duration(out, "fail", m->fail);
    out += ',';
    append_duration(out, "queue", m->queue);
    out += ',';
    append_duration(out, "compute_input", m->compute_input);
    out += ',';
    append_duration(out, "compute_infer", m->compute_infer);
    out += ',';
    append_duration(out, "compute_output", m->compute_output);
    out += ',';
    append_duration(out, "cache_hit", m->cache_hit);
    out += ',';
    append_duration(out, "cache_miss", m->cache_miss);
    out += '}';
    out += ",\"batch_stats\":[]";
    if (uint64_t target = m->slo.target_us.load()) {
      // The latency-target scheduler's figures (docs/latency-target.md); a
      // field Triton's clients do not know, and only on models with a target.
      out += ",\"slo\":{\"target_us\":" + std::to_string(target)
             + ",\"goodput\":" + std::to_string(m->slo.goodput.load())
             + ",\"deadline_miss\":" + std::to_string(m->slo.deadline_miss.load())
             + ",\"shed\":" + std::to_string(m->slo.shed.load()) + ",\"cost_us\":{";
      bool first_size = true;
      for (const auto& [rows, ns] : m->slo.cost_curve_ns()) {
        out += (first_size ? "\"" : ",\"") + std::to_string(rows) + "\":";
        append_number(out, static_cast<double>(ns) / 1e3);
        first_size = false;
      }
      out += "}}";
    }
    out += '}';
  }
  out += "]}";
  return out;
}

namespace {

/// The latency-target scheduler's metrics, for the models that have a target.
void render_slo(std::string& out, const std::vector<std::shared_ptr<model_stats>>& models) {
  std::vector<const model_stats*> with;
  for (const auto& m : models)
    if (m->slo.target_us.load() != 0)
      with.push_back(m.get());
  if (with.empty())
    return;
  auto labels = [](const model_stats& m) {
    return "model=\"" + prometheus_label_value(m.name) + "\",version=\""
           + std::to_string(m.version) + "\"";
  };
  auto series = [&](const char* name, const char* type, const char* help, auto value_of) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto* m : with)
      out += std::string(name) + "{" + labels(*m) + "} " + std::to_string(value_of(*m)) + "\n";
  };
  series("caf_serving_slo_target_us", "gauge", "The model's latency target, microseconds",
         [](const model_stats& m) { return m.slo.target_us.load(); });
  series("caf_serving_slo_goodput_total", "counter",
         "Requests answered successfully within their deadline (latency target or timeout)",
         [](const model_stats& m) { return m.slo.goodput.load(); });
  series("caf_serving_slo_deadline_miss_total", "counter",
         "Requests answered successfully past their deadline",
         [](const model_stats& m) { return m.slo.deadline_miss.load(); });
  series("caf_serving_slo_shed_total", "counter",
         "Requests shed because they could not finish before their deadline (HTTP 503)",
         [](const model_stats& m) { return m.slo.shed.load(); });
  out += "# HELP caf_serving_slo_cost_us Predicted compute time per batch size, microseconds "
         "(the scheduler's cost curve)\n# TYPE caf_serving_slo_cost_us gauge\n";
  for (const auto* m : with)
    for (const auto& [rows, ns] : m->slo.cost_curve_ns()) {
      out += "caf_serving_slo_cost_us{" + labels(*m) + ",batch_size=\"" + std::to_string(rows)
             + "\"} ";
      append_number(out, static_cast<double>(ns) / 1e3);
      out += "\n";
    }
  out += "# HELP caf_serving_slo_batch_size Rows per batch the latency-target scheduler chose\n"
         "# TYPE caf_serving_slo_batch_size histogram\n";
  for (const auto* m : with)
    m->slo.batch_size.render(out, "caf_serving_slo_batch_size", labels(*m));
  out += "# HELP caf_serving_slo_wait_us Time a request waited for its batch under the "
         "latency-target scheduler, microseconds\n# TYPE caf_serving_slo_wait_us histogram\n";
  for (const auto* m : with)
    m->slo.wait_us.render(out, "caf_serving_slo_wait_us", labels(*m));
}

} // namespace

std::string prometheus_text(const std::vector<std::shared_ptr<model_stats>>& models) {
  std::string out;
  auto counter = [&](const char* name, const char* help, auto value_of) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
    for (const auto& m : models)
      out += std::string(name) + "{model=\"" + prometheus_label_value(m->name) + "\",version=\""
             + std::to_string(m->version) + "\"} " + std::to_string(value_of(*m)) + "\n";
  };
  counter("caf_serving_inference_request_success", "Successful inference requests",
          [](const model_stats& m) { return m.success.count.load(); });
  counter("caf_serving_inference_count", "Inferences performed (batch rows)",
          [](const model_stats& m) { return m.inference_count.load(); });
  counter("caf_serving_inference_exec_count", "Batches executed",
          [](const model_stats& m) { return m.execution_count.load(); });
  // Triton's nv_cache_num_hits_per_model, nv_cache_num_misses_per_model,
  // nv_cache_hit_duration_per_model and nv_cache_miss_duration_per_model.
  counter("caf_serving_cache_hits", "Inference requests answered from the response cache",
          [](const model_stats& m) { return m.cache_hit.count.load(); });
  counter("caf_serving_cache_misses",
          "Successful inference requests looked up in the response cache and not found",
          [](const model_stats& m) { return m.cache_miss.count.load(); });
  counter("caf_serving_cache_hit_duration_us",
          "Time spent answering response cache hits, microseconds",
          [](const model_stats& m) { return m.cache_hit.ns.load() / 1000; });
  counter("caf_serving_cache_miss_duration_us",
          "Time spent on response cache lookups and inserts of misses, microseconds",
          [](const model_stats& m) { return m.cache_miss.ns.load() / 1000; });
  counter("caf_serving_executor_restarts", "Executors that stopped and were started again",
          [](const model_stats& m) { return m.executor_restarts.load(); });
  counter("caf_serving_stage_restarts", "Post-processors that stopped and were started again",
          [](const model_stats& m) { return m.stage_restarts.load(); });
  counter("caf_serving_executor_failures", "Batches that failed inside an executor",
          [](const model_stats& m) { return m.executor_failures.load(); });
  counter("caf_serving_executor_quarantines",
          "Times an executor was taken out of rotation after repeated failures",
          [](const model_stats& m) { return m.executor_quarantines.load(); });
  counter("caf_serving_batch_retries", "Batches sent again after their executor stopped",
          [](const model_stats& m) { return m.batch_retries.load(); });
  counter("caf_serving_padded_batches",
          "Batches of requests of different lengths, padded to the longest (padded_batching)",
          [](const model_stats& m) { return m.padded_batches.load(); });
  out += "# HELP caf_serving_healthy_executors Executors alive and not quarantined\n"
         "# TYPE caf_serving_healthy_executors gauge\n";
  for (const auto& m : models)
    out += "caf_serving_healthy_executors{model=\"" + prometheus_label_value(m->name)
           + "\",version=\"" + std::to_string(m->version) + "\"} "
           + std::to_string(m->healthy_executors.load()) + "\n";
  out += "# HELP caf_serving_inference_request_failure Failed inference requests by reason\n"
         "# TYPE caf_serving_inference_request_failure counter\n";
  for (const auto& m : models)
    for (size_t r = 0; r < failure_reason_count; ++r)
      out += "caf_serving_inference_request_failure{model=\"" + prometheus_label_value(m->name)
             + "\",version=\"" + std::to_string(m->version) + "\",reason=\""
             + to_string(static_cast<failure_reason>(r)) + "\"} "
             + std::to_string(m->failures[r].load()) + "\n";
  auto gauge = [&](const char* name, const char* help, auto get) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    for (const auto& m : models)
      out += std::string(name) + "{model=\"" + prometheus_label_value(m->name) + "\",version=\""
             + std::to_string(m->version) + "\"} " + std::to_string(get(*m)) + "\n";
  };
  gauge("caf_serving_gpu_memory_bytes",
        "GPU memory the model version holds (KIND_GPU instances; 0 otherwise)",
        [](const model_stats& m) { return m.gpu_memory_bytes.load(); });
  gauge("caf_serving_queued_request_count",
        "Requests in the scheduler's queue, waiting for a batch",
        [](const model_stats& m) { return m.queued.load(); });
  gauge("caf_serving_executing_request_count",
        "Requests in batches the scheduler has sent to executors and not yet seen answered",
        [](const model_stats& m) { return m.executing.load(); });
  gauge("caf_serving_gpu_pinned_bytes",
        "Page-locked host memory the model version's GPU instances stage batches in",
        [](const model_stats& m) { return m.gpu_pinned_bytes.load(); });
  out += "# HELP caf_serving_pending_request_count Requests accepted and not yet answered\n"
         "# TYPE caf_serving_pending_request_count gauge\n";
  for (const auto& m : models)
    out += "caf_serving_pending_request_count{model=\"" + prometheus_label_value(m->name)
           + "\",version=\"" + std::to_string(m->version) + "\"} "
           + std::to_string(m->pending.load()) + "\n";
  auto hist = [&](const char* name, const char* help, histogram model_stats::*h) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (const auto& m : models)
      ((*m).*h).render(out, name,
                       "model=\"" + prometheus_label_value(m->name) + "\",version=\""
                         + std::to_string(m->version) + "\"");
  };
  hist("caf_serving_request_duration_us", "Received to response sent, microseconds",
       &model_stats::request_us);
  hist("caf_serving_queue_duration_us", "Time in the scheduler queue, microseconds",
       &model_stats::queue_us);
  hist("caf_serving_compute_duration_us", "Model compute time per request, microseconds",
       &model_stats::compute_us);
  hist("caf_serving_batch_size", "Rows per executed batch", &model_stats::batch_size);
  render_slo(out, models);
  return out;
}

} // namespace caf_serving
