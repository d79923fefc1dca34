#pragma once
// The generation metrics of /metrics, as the server tests read them
// (scheduler/generation_actor.hpp render_generation_stats).
#include "support/http_client.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace caf_serving::generative_test {

/// A gauge or counter of version 1 of `model`; -1 when /metrics has none.
inline double metric(uint16_t port, const std::string& name,
                     const std::string& model = "tiny_gpt2") {
  support::http_client client(port);
  auto r = client.get("/metrics");
  std::string key = name + "{model=\"" + model + "\",version=\"1\"} ";
  auto at = r.body.find(key);
  if (at == std::string::npos)
    return -1;
  return std::stod(r.body.substr(at + key.size()));
}

/// Waits (at most 20 s) until `name` reads `value`. The server has no event
/// for it to wait on: it polls /metrics every 20 ms.
inline bool wait_metric(uint16_t port, const std::string& name, double value,
                        const std::string& model = "tiny_gpt2") {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    if (metric(port, name, model) == value)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

} // namespace caf_serving::generative_test
