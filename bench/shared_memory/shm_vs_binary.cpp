/// One large FP32 tensor through identity_image, by binary HTTP (the tensor in
/// the request body, the result in the response body) and by system shared
/// memory (the tensor written into a registered region, the result written
/// by the server into another), alternating request by request so that both
/// see the same machine. Prints the median and P90 round trip of each.
///
/// usage: shm-vs-binary PORT [ITERATIONS=60] [BATCH=16]
///   (a caf-serving on 127.0.0.1:PORT with bench/shared_memory/models and
///   --allow-client-shm=true; bench/shared_memory/run starts one)
///
/// What each round trip includes, from the client's side:
///   binary HTTP: building the body (the JSON header and one copy of the
///     tensor), sending it, the server's work, reading the response body.
///   shared memory: one memcpy of the tensor into the input region (the data
///     is assumed to be produced elsewhere, as in the binary case), the small
///     JSON request, the server's work, the small JSON response. The output is
///     then in the output region, to be used in place.
/// The output of every request is compared with its input, outside the timing.

#include "support/http_client.hpp"
#include "support/shm_object.hpp"
#include "support/tensor_bytes.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>


using namespace caf_serving::support;
using clock_type = std::chrono::steady_clock;

namespace {


void expect(const http_response& r, const char* what) {
  if (r.status != 200)
    throw std::runtime_error(std::string(what) + ": " + std::to_string(r.status) + " " + r.body);
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[i];
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: shm-vs-binary PORT [ITERATIONS] [BATCH]\n");
    return 2;
  }
  auto port = static_cast<uint16_t>(std::stoi(argv[1]));
  int iterations = argc > 2 ? std::stoi(argv[2]) : 60;
  int batch = argc > 3 ? std::stoi(argv[3]) : 16;
  const size_t elements = static_cast<size_t>(batch) * 3 * 224 * 224;
  const size_t bytes = elements * sizeof(float);
  std::string shape = "[" + std::to_string(batch) + ",3,224,224]";

  std::vector<float> tensor(elements);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (auto& x : tensor)
    x = dist(rng);
  std::string_view tensor_bytes(reinterpret_cast<const char*>(tensor.data()), bytes);

  http_client http(port);
  http.timeout = std::chrono::milliseconds(60000);
  shm_object in(bytes, "bench_in"), out(bytes, "bench_out");
  http.post("/v2/systemsharedmemory/unregister", "");
  expect(http.post("/v2/systemsharedmemory/region/bench_in/register",
                   "{\"key\":\"" + in.key + "\",\"offset\":0,\"byte_size\":" + std::to_string(bytes)
                     + "}"),
         "register bench_in");
  expect(http.post("/v2/systemsharedmemory/region/bench_out/register",
                   "{\"key\":\"" + out.key + "\",\"offset\":0,\"byte_size\":" + std::to_string(bytes)
                     + "}"),
         "register bench_out");

  const std::string binary_header
    = "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":" + shape
      + ",\"parameters\":{\"binary_data_size\":" + std::to_string(bytes)
      + "}}],\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]}";
  const std::string shm_request
    = "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":" + shape
      + ",\"parameters\":{\"shared_memory_region\":\"bench_in\",\"shared_memory_byte_size\":"
      + std::to_string(bytes)
      + "}}],\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"shared_memory_region\":"
        "\"bench_out\",\"shared_memory_byte_size\":"
      + std::to_string(bytes) + "}}]}";

  auto run_binary = [&]() {
    auto start = clock_type::now();
    std::string body;
    body.reserve(binary_header.size() + bytes);
    body += binary_header;
    body += tensor_bytes;
    auto r = http.post("/v2/models/identity_image/infer", std::move(body),
                       {{"Content-Type", "application/octet-stream"},
                        {"Inference-Header-Content-Length", std::to_string(binary_header.size())}});
    double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
    expect(r, "binary infer");
    auto split = split_binary(r);
    if (split.binary != tensor_bytes)
      throw std::runtime_error("binary HTTP: the output differs from the input");
    return ms;
  };
  auto run_shm = [&]() {
    std::memset(out.data, 0, 64);
    auto start = clock_type::now();
    std::memcpy(in.data, tensor.data(), bytes);
    auto r = http.post("/v2/models/identity_image/infer", shm_request,
                       {{"Content-Type", "application/json"}});
    double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
    expect(r, "shared-memory infer");
    if (std::memcmp(out.data, tensor.data(), bytes) != 0)
      throw std::runtime_error("shared memory: the output differs from the input");
    return ms;
  };

  for (int i = 0; i < 5; ++i) {
    run_binary();
    run_shm();
  }
  std::vector<double> binary_ms, shm_ms;
  for (int i = 0; i < iterations; ++i) {
    // Alternate which goes first, so neither always follows the other.
    if (i % 2 == 0) {
      binary_ms.push_back(run_binary());
      shm_ms.push_back(run_shm());
    } else {
      shm_ms.push_back(run_shm());
      binary_ms.push_back(run_binary());
    }
  }
  http.post("/v2/systemsharedmemory/unregister", "");

  double mb = static_cast<double>(bytes) / 1e6;
  std::printf("tensor: FP32 %s, %zu bytes (%.2f MB) each way; %d requests of each, alternating\n",
              shape.c_str(), bytes, mb, iterations);
  std::printf("%-16s %10s %10s %10s %14s\n", "path", "median ms", "p90 ms", "min ms",
              "MB/s (median)");
  for (auto [name, v] : {std::pair<const char*, std::vector<double>*>{"binary HTTP", &binary_ms},
                         {"shared memory", &shm_ms}}) {
    double med = percentile(*v, 0.5);
    std::printf("%-16s %10.2f %10.2f %10.2f %14.0f\n", name, med, percentile(*v, 0.9),
                *std::min_element(v->begin(), v->end()), 2 * mb / (med / 1e3));
  }
  std::printf("shared memory / binary HTTP, median: %.2f\n",
              percentile(shm_ms, 0.5) / percentile(binary_ms, 0.5));
  return 0;
}
