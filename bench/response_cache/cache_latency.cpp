/// Response cache latency: starts caf-serving with --cache-config on a copy
/// of a model with response_cache { enable: true } and a copy without it, then
/// sends, at concurrency 1 and in turn so that all three see the same machine:
///   - miss:    a new input every time (the model runs, the answer is stored),
///   - hit:     one input again and again (answered from the cache),
///   - nocache: the same input to the copy without response_cache,
/// and prints each kind's latency percentiles as the client saw them, side by
/// side, with the server's own cache_hit / cache_miss / compute_infer means.
///
/// usage: response-cache-bench BINARY MODEL_DIR [REQUESTS] [CACHE_BYTES]
/// MODEL_DIR is a Triton model directory with one FP32 input and version 1
/// (examples/models/resnet_small). Binary tensor data both ways.

#include "support/http_client.hpp"
#include "support/json_document.hpp"
#include "support/server_process.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace caf_serving::support;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// `config` with its name replaced, plus `extra`.
std::string renamed(std::string config, const std::string& name, const std::string& extra) {
  auto at = config.find("name: \"");
  auto end = config.find('"', at + 7);
  config.replace(at, end + 1 - at, "name: \"" + name + "\"");
  return config + "\n" + extra;
}

/// The first "dims: [ ... ]" of the config: the first input's.
std::vector<int64_t> first_dims(const std::string& config) {
  std::vector<int64_t> dims;
  auto at = config.find("dims:");
  auto open = config.find('[', at);
  auto close = config.find(']', open);
  std::stringstream list(config.substr(open + 1, close - open - 1));
  std::string item;
  while (std::getline(list, item, ','))
    dims.push_back(std::stoll(item));
  return dims;
}

std::string first_input_name(const std::string& config) {
  auto at = config.find("input");
  at = config.find("name: \"", at);
  auto end = config.find('"', at + 7);
  return config.substr(at + 7, end - at - 7);
}

struct percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

percentiles summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[static_cast<size_t>(q * static_cast<double>(us.size() - 1))]; };
  percentiles p;
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  for (double v : us)
    p.mean += v;
  p.mean /= static_cast<double>(us.size());
  return p;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s BINARY MODEL_DIR [REQUESTS] [CACHE_BYTES]\n", argv[0]);
    return 2;
  }
  std::string binary = argv[1];
  fs::path model_dir = argv[2];
  int requests = argc > 3 ? std::atoi(argv[3]) : 200;
  std::string cache_bytes = argc > 4 ? argv[4] : "67108864";

  auto config = read_file(model_dir / "config.pbtxt");
  auto onnx = read_file(model_dir / "1" / "model.onnx");
  temp_repository repo;
  repo.write_file("cached/config.pbtxt",
                  renamed(config, "cached", "response_cache { enable: true }\n"));
  repo.write_file("cached/1/model.onnx", onnx);
  repo.write_file("nocache/config.pbtxt", renamed(config, "nocache", ""));
  repo.write_file("nocache/1/model.onnx", onnx);
  for (const auto& f : fs::directory_iterator(model_dir))
    if (f.path().extension() == ".txt") {
      repo.write_file(fs::path("cached") / f.path().filename(), read_file(f.path()));
      repo.write_file(fs::path("nocache") / f.path().filename(), read_file(f.path()));
    }
  server_process server({binary, repo.path().string(),
                         {"--cache-config", "local,size=" + cache_bytes}});
  http_client http(server.http_port());

  auto dims = first_dims(config);
  bool batched = config.find("max_batch_size: 0") == std::string::npos
                 && config.find("max_batch_size") != std::string::npos;
  std::vector<int64_t> shape;
  if (batched)
    shape.push_back(1);
  shape.insert(shape.end(), dims.begin(), dims.end());
  size_t elements = 1;
  for (auto d : shape)
    elements *= static_cast<size_t>(d);
  std::string shape_text;
  for (auto d : shape)
    shape_text += (shape_text.empty() ? "" : ",") + std::to_string(d);
  std::string header = "{\"inputs\":[{\"name\":\"" + first_input_name(config)
                       + "\",\"datatype\":\"FP32\",\"shape\":[" + shape_text
                       + "],\"parameters\":{\"binary_data_size\":"
                       + std::to_string(elements * 4)
                       + "}}],\"parameters\":{\"binary_data_output\":true}}";
  std::vector<float> image(elements);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (auto& v : image)
    v = uniform(rng);
  auto body_of = [&](const std::vector<float>& values) {
    std::string body = header;
    body.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    return body;
  };
  header_list headers = {{"Content-Type", "application/octet-stream"},
                         {"Inference-Header-Content-Length", std::to_string(header.size())}};
  auto fixed = body_of(image);

  auto timed = [&](const std::string& model, const std::string& body) {
    auto start = clock_type::now();
    auto r = http.post("/v2/models/" + model + "/infer", body, headers);
    auto us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
    if (r.status != 200) {
      std::fprintf(stderr, "%s answered %d: %s\n", model.c_str(), r.status, r.body.c_str());
      std::exit(1);
    }
    return us;
  };
  // Warm-up: compile plans, fill the one entry the hits use.
  for (int i = 0; i < 20; ++i) {
    timed("cached", fixed);
    timed("nocache", fixed);
  }
  auto stats_before = json_document::parse(http.get("/v2/models/cached/stats").body);
  std::vector<double> miss, hit, nocache;
  auto unique = image;
  for (int i = 0; i < requests; ++i) {
    // A new input: its first value counts up, so no two misses are equal.
    unique[0] = static_cast<float>(1000 + i);
    auto body = body_of(unique);
    switch (i % 3) { // rotate which goes first
      case 0:
        miss.push_back(timed("cached", body));
        hit.push_back(timed("cached", fixed));
        nocache.push_back(timed("nocache", fixed));
        break;
      case 1:
        hit.push_back(timed("cached", fixed));
        nocache.push_back(timed("nocache", fixed));
        miss.push_back(timed("cached", body));
        break;
      default:
        nocache.push_back(timed("nocache", fixed));
        miss.push_back(timed("cached", body));
        hit.push_back(timed("cached", fixed));
        break;
    }
  }
  auto stats = json_document::parse(http.get("/v2/models/cached/stats").body);
  auto delta_mean_us = [&](const std::string& what) {
    auto path = "/model_stats/0/inference_stats/" + what;
    double n = static_cast<double>(stats.uint_at(path + "/count") - stats_before.uint_at(path + "/count"));
    double ns = static_cast<double>(stats.uint_at(path + "/ns") - stats_before.uint_at(path + "/ns"));
    return n > 0 ? ns / n / 1e3 : 0.0;
  };
  auto delta_count = [&](const std::string& what) {
    auto path = "/model_stats/0/inference_stats/" + what + "/count";
    return stats.uint_at(path) - stats_before.uint_at(path);
  };

  std::printf("model %s, input [%s] FP32 (%zu bytes) as binary data, %d requests of each "
              "kind at concurrency 1, cache %s bytes\n",
              model_dir.filename().c_str(), shape_text.c_str(), elements * 4, requests,
              cache_bytes.c_str());
  std::printf("| kind | P50 us | P90 us | P99 us | mean us |\n|---|---:|---:|---:|---:|\n");
  auto row = [](const char* name, const percentiles& p) {
    std::printf("| %s | %.0f | %.0f | %.0f | %.0f |\n", name, p.p50, p.p90, p.p99, p.mean);
  };
  row("hit (answered from the cache)", summarize(hit));
  row("miss (model runs, answer stored)", summarize(miss));
  row("no cache (model without response_cache)", summarize(nocache));
  std::printf("server, during the run: %llu hits, mean cache_hit %.1f us; %llu misses, mean "
              "cache_miss %.1f us (lookup + key copy + insert); mean compute_infer %.0f us\n",
              static_cast<unsigned long long>(delta_count("cache_hit")), delta_mean_us("cache_hit"),
              static_cast<unsigned long long>(delta_count("cache_miss")),
              delta_mean_us("cache_miss"), delta_mean_us("compute_infer"));
  return 0;
}
