#include "core/stats.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;

TEST_CASE("stats JSON carries every field perf_analyzer reads") {
  auto m = std::make_shared<model_stats>("m\"x", 3);
  m->success.add(1000);
  m->success.add(500);
  m->queue.add(7);
  m->cache_hit.add(300);
  m->cache_miss.add(40);
  m->cache_miss.add(60);
  m->inference_count = 5;
  m->execution_count = 2;
  auto json = stats_json({m});
  CHECK(json.find("\"name\":\"m\\\"x\"") != std::string::npos);
  CHECK(json.find("\"version\":\"3\"") != std::string::npos);
  CHECK(json.find("\"success\":{\"count\":2,\"ns\":1500}") != std::string::npos);
  CHECK(json.find("\"queue\":{\"count\":1,\"ns\":7}") != std::string::npos);
  CHECK(json.find("\"cache_hit\":{\"count\":1,\"ns\":300}") != std::string::npos);
  CHECK(json.find("\"cache_miss\":{\"count\":2,\"ns\":100}") != std::string::npos);
  CHECK(json.find("\"inference_count\":5") != std::string::npos);
  CHECK(json.find("\"execution_count\":2") != std::string::npos);
  for (auto key : {"fail", "compute_input", "compute_infer", "compute_output", "cache_hit",
                   "cache_miss"})
    CHECK(json.find(std::string("\"") + key + "\":{\"count\":") != std::string::npos);
}

TEST_CASE("histogram buckets are cumulative") {
  histogram h({1, 10});
  h.observe(0.5);
  h.observe(5);
  h.observe(50);
  std::string out;
  h.render(out, "x", "a=\"b\"");
  CHECK(out.find("x_bucket{a=\"b\",le=\"1\"} 1\n") != std::string::npos);
  CHECK(out.find("x_bucket{a=\"b\",le=\"10\"} 2\n") != std::string::npos);
  CHECK(out.find("x_bucket{a=\"b\",le=\"+Inf\"} 3\n") != std::string::npos);
  CHECK(out.find("x_count{a=\"b\"} 3\n") != std::string::npos);
  CHECK(out.find("x_sum{a=\"b\"} 55.5\n") != std::string::npos);
}

TEST_CASE("failures are counted by reason on /metrics") {
  auto m = std::make_shared<model_stats>("m", 1);
  m->record_failure(failure_reason::queue_full, 10);
  m->record_failure(failure_reason::queue_full, 10);
  auto text = prometheus_text({m});
  CHECK(text.find("caf_serving_inference_request_failure{model=\"m\",version=\"1\","
                  "reason=\"queue_full\"} 2")
        != std::string::npos);
  CHECK(m->fail.count == 2);
}

TEST_CASE("GPU memory per model version is a gauge on /metrics, 0 for CPU models") {
  auto gpu = std::make_shared<model_stats>("g", 1);
  gpu->gpu_memory_bytes = 123456789;
  gpu->gpu_pinned_bytes = 4096;
  auto cpu = std::make_shared<model_stats>("c", 1);
  auto text = prometheus_text({gpu, cpu});
  CHECK(text.find("# TYPE caf_serving_gpu_memory_bytes gauge\n") != std::string::npos);
  CHECK(text.find("\ncaf_serving_gpu_memory_bytes{model=\"g\",version=\"1\"} 123456789\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_gpu_pinned_bytes{model=\"g\",version=\"1\"} 4096\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_gpu_memory_bytes{model=\"c\",version=\"1\"} 0\n")
        != std::string::npos);
}

TEST_CASE("response cache hits and misses are counted on /metrics") {
  auto m = std::make_shared<model_stats>("m", 2);
  m->cache_hit.add(5000);
  m->cache_hit.add(7000);
  m->cache_miss.add(3000);
  auto text = prometheus_text({m});
  CHECK(text.find("\ncaf_serving_cache_hits{model=\"m\",version=\"2\"} 2\n") != std::string::npos);
  CHECK(text.find("\ncaf_serving_cache_misses{model=\"m\",version=\"2\"} 1\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_cache_hit_duration_us{model=\"m\",version=\"2\"} 12\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_cache_miss_duration_us{model=\"m\",version=\"2\"} 3\n")
        != std::string::npos);
}

TEST_CASE("the latency-target metrics appear for a model with a target, and only then") {
  auto plain = std::make_shared<model_stats>("plain", 1);
  auto m = std::make_shared<model_stats>("slo", 1);
  CHECK(prometheus_text({plain, m}).find("caf_serving_slo_") == std::string::npos);
  m->slo.target_us = 50000;
  m->slo.goodput = 7;
  m->slo.deadline_miss = 1;
  m->slo.shed = 3;
  m->slo.publish_cost_curve({{1, 2500}, {8, 9000}});
  m->slo.batch_size.observe(8);
  m->slo.wait_us.observe(1200);
  auto text = prometheus_text({plain, m});
  CHECK(text.find("\ncaf_serving_slo_target_us{model=\"slo\",version=\"1\"} 50000\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_slo_goodput_total{model=\"slo\",version=\"1\"} 7\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_slo_deadline_miss_total{model=\"slo\",version=\"1\"} 1\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_slo_shed_total{model=\"slo\",version=\"1\"} 3\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_slo_cost_us{model=\"slo\",version=\"1\",batch_size=\"1\"} 2.5\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_slo_cost_us{model=\"slo\",version=\"1\",batch_size=\"8\"} 9\n")
        != std::string::npos);
  CHECK(text.find("caf_serving_slo_batch_size_count{model=\"slo\",version=\"1\"} 1\n")
        != std::string::npos);
  CHECK(text.find("caf_serving_slo_wait_us_bucket{model=\"slo\",version=\"1\",le=\"2500\"} 1\n")
        != std::string::npos);
  CHECK(text.find("caf_serving_slo_goodput_total{model=\"plain\"") == std::string::npos);
  // The statistics endpoint shows them too, for that model only.
  auto json = stats_json({plain, m});
  CHECK(json.find("\"slo\":{\"target_us\":50000,\"goodput\":7,\"deadline_miss\":1,\"shed\":3,"
                  "\"cost_us\":{\"1\":2.5,\"8\":9}}")
        != std::string::npos);
  CHECK(json.find("\"slo\":{") == json.rfind("\"slo\":{"));
}
