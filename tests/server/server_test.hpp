#pragma once
/// What every whole-server test file shares: where the binary and the model
/// directories are (compile definitions from CMake), a server started on a
/// fresh repository, and small builders for KServe JSON requests.

#include "support/http_client.hpp"
#include "support/json_document.hpp"
#include "support/server_process.hpp"
#include "support/tensor_bytes.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::server_test {

namespace fs = std::filesystem;
using namespace caf_serving::support;

inline fs::path example_model(const std::string& name) {
  return fs::path(CAF_SERVING_EXAMPLE_MODELS) / name;
}

inline fs::path test_model(const std::string& name) {
  return fs::path(CAF_SERVING_TEST_MODELS) / name;
}

/// A caf-serving process serving copies of the given model directories.
struct test_server {
  temp_repository repo;
  std::unique_ptr<server_process> process;

  explicit test_server(const std::vector<fs::path>& models,
                       std::vector<std::string> extra_args = {}) {
    for (const auto& m : models)
      repo.add_model(m);
    process = std::make_unique<server_process>(
      server_config{CAF_SERVING_BINARY, repo.path().string(), std::move(extra_args)});
  }

  uint16_t port() const { return process->http_port(); }
  http_client client() const { return http_client(process->http_port()); }
};

inline const header_list json_content = {{"Content-Type", "application/json"}};

/// `extra` plus the flags under which the model control API is open and every
/// model loads at start (what the engine did before Triton's default mode,
/// none, refused the API): --model-control-mode explicit --load-model '*'.
inline std::vector<std::string> model_control_api(std::vector<std::string> extra = {}) {
  extra.insert(extra.end(), {"--model-control-mode", "explicit", "--load-model", "*"});
  return extra;
}

template <class T>
std::string json_list(const std::vector<T>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0)
      out += ',';
    if constexpr (std::is_floating_point_v<T>) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(values[i]));
      out += buf;
    } else {
      out += std::to_string(values[i]);
    }
  }
  return out + "]";
}

/// One element of "inputs" with JSON data (`data` is the JSON text).
inline std::string input_json(const std::string& name, const std::string& datatype,
                              const std::vector<int64_t>& shape, const std::string& data) {
  return "{\"name\":\"" + name + "\",\"datatype\":\"" + datatype + "\",\"shape\":"
         + json_list(shape) + ",\"data\":" + data + "}";
}

/// One element of "inputs" whose data follows the JSON as binary.
inline std::string binary_input_json(const std::string& name, const std::string& datatype,
                                     const std::vector<int64_t>& shape, size_t bytes) {
  return "{\"name\":\"" + name + "\",\"datatype\":\"" + datatype + "\",\"shape\":"
         + json_list(shape) + ",\"parameters\":{\"binary_data_size\":" + std::to_string(bytes)
         + "}}";
}

/// {"inputs":[...]<rest>}: `rest` adds fields, e.g. ",\"outputs\":[...]".
inline std::string infer_body(const std::vector<std::string>& inputs,
                              const std::string& rest = "") {
  std::string out = "{\"inputs\":[";
  for (size_t i = 0; i < inputs.size(); ++i)
    out += (i > 0 ? "," : "") + inputs[i];
  return out + "]" + rest + "}";
}

/// An identity request with FP32 input INPUT0 of shape [rows, values/rows].
inline std::string fp32_identity_body(const std::vector<float>& values, int64_t rows,
                                      const std::string& rest = "") {
  return infer_body({input_json("INPUT0", "FP32",
                                {rows, static_cast<int64_t>(values.size()) / rows},
                                json_list(values))},
                    rest);
}

/// The FP32 data of output `index` of a JSON inference response.
inline std::vector<float> fp32_output(const json_document& doc, int index = 0) {
  auto values = json_numbers(doc.at("/outputs/" + std::to_string(index) + "/data"));
  return {values.begin(), values.end()};
}

/// The value of one Prometheus sample "name{labels} value" in `text`, or -1
/// when the series is absent.
inline double metric_value(const std::string& text, const std::string& series) {
  auto at = text.find("\n" + series + " ");
  if (at == std::string::npos)
    return -1;
  return std::strtod(text.c_str() + at + 1 + series.size() + 1, nullptr);
}

/// Polls `condition` every 5 ms until it holds or `timeout` passes.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// Requests of `model` accepted and not yet answered, from /metrics.
inline double pending_requests(const test_server& server, const std::string& model) {
  http_client m(server.process->metrics_port());
  return metric_value(m.get("/metrics").body,
                      "caf_serving_pending_request_count{model=\"" + model + "\",version=\"1\"}");
}

/// Waits until `model` has `count` requests pending and every one of them has
/// reached its scheduler: queued there, or in a batch at an executor.
inline bool wait_pending(const test_server& server, const std::string& model, double count) {
  return eventually([&] {
    http_client m(server.process->metrics_port());
    auto text = m.get("/metrics").body;
    auto series = [&](const char* name) {
      return metric_value(text, std::string(name) + "{model=\"" + model + "\",version=\"1\"}");
    };
    return series("caf_serving_pending_request_count") == count
           && series("caf_serving_queued_request_count")
                  + series("caf_serving_executing_request_count")
                == count;
  });
}

} // namespace caf_serving::server_test
